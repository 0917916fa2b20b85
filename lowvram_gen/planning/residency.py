"""Partial residency of the denoiser: which blocks stay on the GPU under a byte budget, which stream.

`offload = "budget"` (Forge's "GPU Weights", ComfyUI's partial loading, SD.Next's balanced offload)
keeps some of the UNet's or transformer's blocks on the GPU for the whole job and streams the others
in, block by block, every step. This module is the pure part of it, shared by the planner (which
calls it on a model built on the meta device from its config, no weights) and by
`engines/sd/apply.py` (which calls it on the loaded model and applies exactly that split), so the
number the plan was made with and what runs agree.

- `models.blocks.blocks_of(module)`: the streamable blocks in execution order, with their bytes.
- `split(blocks, resident_bytes)`: which blocks stay, which stream, and the bytes that cross the bus
  per denoising step.
- `fit(blocks, available)`: the split whose resident blocks plus the streamed blocks in flight fit
  in `available` bytes (what `apply` uses when no plan decided `resident_bytes`).

Blocks: models/blocks.py says what a block is and in which order they run (`blocks_of`).

Which blocks stay. Every streamed byte crosses the bus once per forward, so for the same resident
bytes any choice streams the same. What differs is the peak: while one streamed block runs, the next
is prefetched (diffusers' group offloading on a CUDA stream), so the GPU holds the resident blocks
plus up to two streamed ones. `split` therefore keeps the largest blocks first (first-fit decreasing,
ties in execution order): the streamed blocks are the small ones, which keeps the pair in flight
small and uses the budget about as fully as any order (a block that does not fit is skipped and the
smaller ones after it still fill the rest). In a UNet the small blocks are the high-resolution ones,
which also have the most compute per byte to hide their transfer behind.

Per step. diffusers batches CFG's two halves into one forward, so every streamed block moves once
per step (`streamed_bytes_per_step`); a pipeline that runs several forwards per step (true CFG run
as two passes) moves it once per forward. Nothing moves back: the offload drops the GPU copy and
keeps the (pinned) host copy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Residency:
    resident: tuple[str, ...]  # block names kept on the GPU, in execution order
    streamed: tuple[str, ...]  # block names streamed in every step, in execution order
    resident_bytes: int  # bytes of the resident blocks (the fixed part comes on top)
    streamed_bytes_per_step: int  # bytes moved host-to-device per denoiser forward (= per step with CFG batched)
    largest_streamed: int = 0  # bytes of the largest streamed block

    @property
    def in_flight_bytes(self) -> int:
        """Streamed weights on the GPU at once: the running block and the prefetched next one."""
        return 2 * self.largest_streamed

    def as_dict(self) -> dict:
        return {"resident": list(self.resident), "streamed": list(self.streamed),
                "resident_bytes": self.resident_bytes, "streamed_bytes_per_step": self.streamed_bytes_per_step,
                "largest_streamed": self.largest_streamed}


def split(blocks: list[tuple[str, int]], resident_bytes: int) -> Residency:
    """Keep blocks resident, largest first, while their bytes stay within `resident_bytes`; stream the rest."""
    if isinstance(resident_bytes, bool) or not isinstance(resident_bytes, int) or resident_bytes < 0:
        raise ValueError(f"resident_bytes = {resident_bytes!r} must be a whole number of bytes, 0 or more")
    names = [n for n, _ in blocks]
    if len(set(names)) != len(names):
        raise ValueError(f"block names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    left = resident_bytes
    keep = set()
    for i, (_, nbytes) in sorted(enumerate(blocks), key=lambda ib: (-ib[1][1], ib[0])):
        if nbytes <= left:
            keep.add(i)
            left -= nbytes
    resident = [(n, b) for i, (n, b) in enumerate(blocks) if i in keep]
    streamed = [(n, b) for i, (n, b) in enumerate(blocks) if i not in keep]
    return Residency(resident=tuple(n for n, _ in resident), streamed=tuple(n for n, _ in streamed),
                     resident_bytes=sum(b for _, b in resident),
                     streamed_bytes_per_step=sum(b for _, b in streamed),
                     largest_streamed=max((b for _, b in streamed), default=0))


def fit(blocks: list[tuple[str, int]], available: int) -> Residency:
    """The split with the most resident bytes found by shrinking the budget until the resident blocks
    plus the two streamed blocks in flight fit in `available` bytes (all streamed when nothing fits)."""
    budget = max(0, int(available))
    while True:
        result = split(blocks, budget)
        if result.resident_bytes + result.in_flight_bytes <= available or budget == 0:
            return result
        # resident > available - in_flight >= the new budget: strictly smaller, so this ends
        budget = max(0, int(available) - result.in_flight_bytes)
