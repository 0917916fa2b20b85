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

Pieces. `blocks` may be `models.blocks.piece_tree`'s list: each block followed by the finer pieces it may be cut
into. `split` cuts each block only as fine as the bytes that stream ask (`piece_limit`: a unit that streams is at
most SHARE of them), so where much streams the units stay whole blocks' pieces (few hooks) and where little streams
the two in flight stay a few percent of it; a plain Linear larger than that is cut by output rows (`[rows=N]`, its
chunks named `<layer>.parts.<i>`, models/row_split.py), and what a cut module holds outside its finer pieces (its
norms, its own parameters) stays resident with it. A flat list of blocks is a tree with nothing to cut: `split` then
is the plain first-fit decreasing below.

Held pieces. A `[held]` piece (a child its block calls twice: CogView4's `ff`, 256 MiB) stays on the card from its
first call until its block's forward ends (models/held.py), and so do the finer pieces it is cut into, all held by
that block: while it runs, the held units of the block that stream are on the card beside the two in flight
(`largest_held`: the most held bytes of one block that stream). So a held piece is cut like any other, and among
units of one size the first held unit of every block stays resident before the second of any: what streams of them
is spread over the blocks, one unit each where the budget allows. CogView4 on 8 GiB streamed one whole `ff` of a
block beside the two in flight (1.071 x the lower bound); cut and spread, 64 MiB of one block's (1.035 x).

Per step. diffusers batches CFG's two halves into one forward, so every streamed block moves once
per step (`streamed_bytes_per_step`); a pipeline that runs several forwards per step (true CFG run
as two passes) moves it once per forward. Nothing moves back: the offload drops the GPU copy and
keeps the (pinned) host copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The largest unit that streams, as a share of the bytes that stream (see "Pieces" above): two are in flight, so the
# split streams about 2 * SHARE beyond what cannot stay, plus what whole pieces leave over; finer costs more hooks
# (benchmarks/bench_hook_overhead.py measures what a hook costs a step; docs/benchmarks.md).
SHARE = 0.02
_LABEL = re.compile(r"^(?P<name>.*?)(?:\[rows=(?P<rows>\d+)\])?(?P<held>\[held\])?$")


@dataclass(frozen=True)
class Residency:
    resident: tuple[str, ...]  # block names kept on the GPU, in execution order
    streamed: tuple[str, ...]  # block names streamed in every step, in execution order
    resident_bytes: int  # bytes of the resident blocks (the fixed part comes on top)
    streamed_bytes_per_step: int  # bytes moved host-to-device per denoiser forward (= per step with CFG batched)
    largest_streamed: int = 0  # bytes of the largest streamed block (a held one aside)
    held: tuple[str, ...] = ()  # the streamed pieces held on the card until their block's forward ends
    largest_held: int = 0  # the most bytes of them one block holds (all on the card until its forward ends)
    streamed_sizes: tuple[int, ...] = ()  # bytes of each streamed piece, as `streamed` lists them

    @property
    def in_flight_bytes(self) -> int:
        """Streamed weights on the GPU at once: the running block and the prefetched next one, and the held pieces
        of one block, which stay until it ends."""
        return 2 * self.largest_streamed + self.largest_held

    def as_dict(self) -> dict:
        return {"resident": list(self.resident), "streamed": list(self.streamed),
                "resident_bytes": self.resident_bytes, "streamed_bytes_per_step": self.streamed_bytes_per_step,
                "largest_streamed": self.largest_streamed, "held": list(self.held), "largest_held": self.largest_held}


def piece_limit(streamed_bytes: int) -> int:
    """The largest unit a split that streams `streamed_bytes` cuts its blocks to (the one rule, see "Pieces")."""
    return max(1, int(SHARE * streamed_bytes))


class _Piece:
    __slots__ = ("name", "nbytes", "rows", "held", "children", "parts")

    def __init__(self, label: str, nbytes: int):
        m = _LABEL.match(label)
        self.name, self.nbytes = m["name"], nbytes
        self.rows, self.children = int(m["rows"] or 0), []
        # held: the name of the module whose forward holds it (the parent of the topmost held piece above it), "" if not
        self.held = self.name.rpartition(".")[0] if m["held"] else ""
        self.parts: dict[int, list] = {}  # a row-cut Linear's units by the number of parts (_cut), made once each

    def own(self) -> int:
        """What a cut module holds outside its finer pieces (its norms, its own parameters)."""
        return self.nbytes - sum(c.nbytes for c in self.children)


# Parsed piece trees of the block tuples split was given, by identity, each with the splits made of it: the planner's
# bisection over the resident bytes splits one model's tree (a few hundred to a thousand labels) a few dozen times per
# candidate, the ladder sizes every budget candidate again under each rung, and `plan`'s nearest-card search plans the
# same job on a dozen cards, asking the same splits again (HiDream's plan: 16,538 splits, 2,046 of them different);
# parsing the labels and cutting the pieces was most of a plan's time. Keyed by id() with the tuple itself kept in the
# entry, so that the id cannot be reused while the entry lives; a tuple is immutable, so it always parses to the forest
# stored and splits (a pure function of it, the resident bytes and `rows`) as stored. Lists are parsed anew each call.
class _Tree:
    __slots__ = ("blocks", "roots", "splits")

    def __init__(self, blocks: tuple, roots: tuple):
        self.blocks, self.roots, self.splits = blocks, roots, {}


_TREES: dict[tuple[int, bool], _Tree] = {}
_TREES_KEPT = 16  # trees (a model x storage x ControlNets each; a search plans one or two)
_SPLITS_KEPT = 4096  # splits of one tree


def _tree(blocks: list[tuple[str, int]] | tuple[tuple[str, int], ...], rows: bool) -> _Tree:
    """The parsed tree of `blocks` (see _TREES); a list's is parsed and not kept."""
    if type(blocks) is not tuple:
        return _Tree(tuple(blocks), _parse(blocks, rows))
    hit = _TREES.get((id(blocks), rows))
    if hit is not None and hit.blocks is blocks:
        return hit
    tree = _Tree(blocks, _parse(blocks, rows))
    if len(_TREES) >= _TREES_KEPT:
        _TREES.clear()
    _TREES[(id(blocks), rows)] = tree
    return tree


def _forest(blocks: list[tuple[str, int]], rows: bool = True) -> tuple[_Piece, ...]:
    """The blocks of a piece tree (pre-order; a piece is below the one before it whose name is its prefix); the
    pieces are never changed after they are parsed (but for the row parts _cut keeps, a function of the piece)."""
    return _tree(blocks, rows).roots


def _parse(blocks, rows: bool) -> tuple[_Piece, ...]:
    names = [n for n, _ in blocks]
    if len(set(names)) != len(names):
        raise ValueError(f"block names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    roots, stack = [], []
    for label, nbytes in blocks:
        piece = _Piece(label, nbytes)
        piece.rows = piece.rows if rows else 0
        while stack and not piece.name.startswith(stack[-1].name + "."):
            stack.pop()
        if piece.held and stack and stack[-1].held:  # below a held piece: held by the same forward
            piece.held = stack[-1].held
        (stack[-1].children if stack else roots).append(piece)
        stack.append(piece)
    return tuple(roots)


def roots(blocks: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """[(name, bytes)] of a piece tree's blocks, without the finer pieces below them or the labels: what adds up
    with the fixed part to the whole model (models.blocks.blocks_of's list)."""
    return [(r.name, r.nbytes) for r in _forest(blocks)]


def _cut(piece: _Piece, limit: int, units: list) -> int:
    """Append the units of `piece` cut to at most `limit` bytes where it can be, as (name, bytes, held by); return the
    bytes it leaves resident (what a cut module holds outside its finer pieces)."""
    if piece.nbytes <= limit or not (piece.children or piece.rows > 1):
        units.append((piece.name, piece.nbytes, piece.held))
        return 0
    if not piece.children:  # a plain Linear: k chunks of rows, as models/row_split.py cuts it
        k = -(-piece.rows // max(1, limit * piece.rows // piece.nbytes))  # parts of whole rows, none over limit
        parts = piece.parts.get(k)
        if parts is None:  # (the same k for many limits: the names made once)
            bounds = [piece.rows * i // k for i in range(k + 1)]
            parts = piece.parts[k] = [(f"{piece.name}.parts.{i}", piece.nbytes * bounds[i + 1] // piece.rows
                                       - piece.nbytes * bounds[i] // piece.rows, piece.held) for i in range(k)]
        units.extend(parts)
        return 0
    left = piece.own()
    for c in piece.children:
        left += _cut(c, limit, units)
    return left


def split(blocks: list[tuple[str, int]], resident_bytes: int, rows: bool = True) -> Residency:
    """Keep blocks resident, largest first, while their bytes stay within `resident_bytes`; stream the rest. A piece
    tree's blocks are cut first to `piece_limit` of the bytes that would stream (see "Pieces"); `rows` False: no
    layer is cut by rows (the plan of a quantized or fp8-stored denoiser, whose layers are no plain Linears)."""
    if isinstance(resident_bytes, bool) or not isinstance(resident_bytes, int) or resident_bytes < 0:
        raise ValueError(f"resident_bytes = {resident_bytes!r} must be a whole number of bytes, 0 or more")
    tree = _tree(blocks, rows)  # (raises where block names repeat)
    found = tree.splits.get(resident_bytes)
    if found is None:
        if len(tree.splits) >= _SPLITS_KEPT:
            tree.splits.clear()
        found = tree.splits[resident_bytes] = _split(tree.roots, resident_bytes)
    return found


def _split(roots: tuple[_Piece, ...], resident_bytes: int) -> Residency:
    total = sum(r.nbytes for r in roots)
    units: list[tuple[str, int, str]] = []
    if resident_bytes >= total:  # everything stays: nothing to cut
        units = [(r.name, r.nbytes, r.held) for r in roots]
        kept = 0
    else:
        limit = piece_limit(total - resident_bytes)
        kept = 0
        for r in roots:
            kept += _cut(r, limit, units)
    left = resident_bytes - kept
    sizes = [b for _, b, _ in units]
    # largest first, ties in execution order (sorted is stable); among held units of one size, the first of each
    # holder before the second of any, so that what streams of them is spread over the holders (see "Held pieces")
    if any(h for _, _, h in units):
        rank, seen = [], {}
        for _, _, held in units:
            rank.append(seen.get(held, 0) if held else 0)
            if held:
                seen[held] = rank[-1] + 1
        order = sorted(range(len(units)), key=lambda i: (-sizes[i], rank[i]))
    else:
        order = sorted(range(len(units)), key=sizes.__getitem__, reverse=True)
    keep = [False] * len(units)
    for i in order:
        if sizes[i] <= left:
            keep[i] = True
            left -= sizes[i]
    resident_sum, streamed = 0, []
    for i, unit in enumerate(units):
        if keep[i]:
            resident_sum += unit[1]
        else:
            streamed.append(unit)
    by_holder: dict[str, int] = {}
    for _, b, h in streamed:
        if h:
            by_holder[h] = by_holder.get(h, 0) + b
    return Residency(resident=tuple(units[i][0] for i in range(len(units)) if keep[i]),
                     streamed=tuple(n for n, _, _ in streamed),
                     resident_bytes=kept + resident_sum,
                     streamed_bytes_per_step=sum(b for _, b, _ in streamed),
                     largest_streamed=max((b for _, b, h in streamed if not h), default=0),
                     held=tuple(n for n, _, h in streamed if h),
                     largest_held=max(by_holder.values(), default=0),
                     streamed_sizes=tuple(b for _, b, _ in streamed))


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
