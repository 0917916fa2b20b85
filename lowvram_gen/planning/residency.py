"""Partial residency of the denoiser: which blocks stay on the GPU under a byte budget, which stream.

`offload = "budget"` (Forge's "GPU Weights", ComfyUI's partial loading, SD.Next's balanced offload)
keeps some of the UNet's or transformer's blocks on the GPU for the whole job and streams the others
in, block by block, every step. This module is the pure part of it, shared by the planner (which
calls it on a model built on the meta device from its config, no weights) and by
`engines/sd/apply.py` (which calls it on the loaded model and applies exactly that split), so the
number the plan was made with and what runs agree.

- `blocks_of(module)`: the streamable blocks in execution order, with their bytes.
- `split(blocks, resident_bytes)`: which blocks stay, which stream, and the bytes that cross the bus
  per denoising step.
- `fit(blocks, available)`: the split whose resident blocks plus the streamed blocks in flight fit
  in `available` bytes (what `apply` uses when no plan decided `resident_bytes`).

Blocks. Each element of a top-level ModuleList/Sequential is a block (a transformer's
`transformer_blocks`, Flux's `single_transformer_blocks`). A block (or a top-level child such as the
UNet's `mid_block`) that holds ModuleLists itself, as diffusers' UNet blocks do (`resnets`,
`attentions`, `downsamplers`/`upsamplers`), is split into their elements, so the unit of streaming
is one ResNet or one attention transformer (SDXL's largest, a 10-layer transformer at 1280 channels,
is 0.6 GB in fp16 instead of a 1.3 GB down block). Execution order inside such a block:
`resnets[i]` then `attentions[i]` for each i (diffusers' down, mid and up blocks all run that way),
then the other lists (the samplers) in definition order. Everything that is in no block (conv_in/out,
the time and text embeddings, the output norm, parameters of the blocks' own) is the fixed part: it
is always resident and is not counted in `resident_bytes` (`fixed_bytes`).

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

# UNet blocks run resnets[i] then attentions[i]; the other lists of a block (samplers) run after them.
_INTERLEAVED = ("resnets", "attentions")


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


def _is_list(module) -> bool:
    import torch

    return isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential))


def _units(name: str, module) -> list[tuple[str, object]]:
    """`module` as streamable units: itself, or the elements of its ModuleLists in execution order. A
    unit that itself holds one block list (a UNet attention's `transformer_blocks`: SDXL's 10-layer
    transformers are 0.6 GB each in fp16) is split into those blocks, so two units in flight stay small
    and the budget is filled to within a block of ~60 MB; what sits around the list (norm, proj_in,
    proj_out) joins the always-resident fixed part."""
    lists = [(n, c) for n, c in module.named_children() if _is_list(c)]
    if not lists:
        return [(name, module)]
    by_name = dict(lists)
    out = []
    interleaved = [by_name[n] for n in _INTERLEAVED if n in by_name]
    for i in range(max((len(x) for x in interleaved), default=0)):
        for list_name in _INTERLEAVED:
            if list_name in by_name and i < len(by_name[list_name]):
                out.extend(_inner_blocks(f"{name}.{list_name}.{i}", by_name[list_name][i]))
    for list_name, child in lists:
        if list_name not in _INTERLEAVED:
            for i, m in enumerate(child):
                out.extend(_inner_blocks(f"{name}.{list_name}.{i}", m))
    return out


def _inner_blocks(name: str, module) -> list[tuple[str, object]]:
    """`module` whole, or the elements of its one block list when it has exactly one (see `_units`)."""
    lists = [(n, c) for n, c in module.named_children() if _is_list(c)]
    if len(lists) == 1 and len(lists[0][1]) > 1:
        list_name, child = lists[0]
        return [(f"{name}.{list_name}.{i}", m) for i, m in enumerate(child)]
    return [(name, module)]


def _top_level(module) -> list[tuple[str, object]]:
    """Children in execution order: definition order, except that diffusers' UNets register `up_blocks`
    before `mid_block`, which runs between the down and the up blocks."""
    children = list(module.named_children())
    names = [n for n, _ in children]
    if "mid_block" in names and "up_blocks" in names and names.index("mid_block") > names.index("up_blocks"):
        mid = children.pop(names.index("mid_block"))
        children.insert(names.index("up_blocks"), mid)
    return children


def block_modules(module) -> list[tuple[str, object]]:
    """The streamable blocks of a denoiser as (name, submodule), in execution order (see the module doc)."""
    out = []
    for name, child in _top_level(module):
        if _is_list(child):
            for i, element in enumerate(child):
                out.extend(_units(f"{name}.{i}", element))
        elif any(_is_list(c) for c in child.children()):
            out.extend(_units(name, child))
    return out


def _tensor_bytes(tensors, bytes_per_element: int | None) -> int:
    total, seen = 0, set()
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        size = bytes_per_element if bytes_per_element and t.dtype.is_floating_point else t.element_size()
        total += t.numel() * size
    return total


def module_bytes(module, bytes_per_element: int | None = None) -> int:
    """Parameter and buffer bytes of `module` (`bytes_per_element`: count floating tensors at that size,
    e.g. 2 for a float16 plan of a model built in float32 on the meta device)."""
    return _tensor_bytes([*module.parameters(), *module.buffers()], bytes_per_element)


def blocks_of(module, bytes_per_element: int | None = None) -> list[tuple[str, int]]:
    """[(name, bytes)] of the denoiser's streamable blocks in execution order; works on a meta-device
    model (bytes from shapes and dtypes). Names are `module.get_submodule` paths."""
    return [(name, module_bytes(m, bytes_per_element)) for name, m in block_modules(module)]


def fixed_bytes(module, bytes_per_element: int | None = None) -> int:
    """Bytes of the denoiser outside every block: always resident under offload = "budget"."""
    return module_bytes(module, bytes_per_element) - sum(b for _, b in blocks_of(module, bytes_per_element))


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
