"""The plan of an X/Y/Z grid before its first cell: every cell's request built from the base request and validated,
the grid capped, and each axis value that cannot run named with its axis and what is allowed.

A grid is a list of cells (axes.Cell: a GenerationRequest with the axis values replaced, and the VRAM budget it runs
under), in A1111's grid order (x fastest, then y, then z), and the order it runs them in: A1111's, the costliest
axis in the outer loop (a checkpoint or a quantize setting loads its model once per value, not once per cell).
As A1111 does (unless `no_fixed_seeds`, its "Keep -1 for seeds"), a base seed of -1 is drawn once for the whole grid
and a Seed or Var. seed value of -1 once per value, so the cells differ by their axes alone.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_SEED, GenerationRequest
from lowvram_gen.xyz.axes import TXT2IMG, Axis, Cell, find_axis, resolve_seeds

DEFAULT_MAX_CELLS = 64  # a grid past it is refused before its first cell; --xyz-max-cells raises it
SCRIPT_TITLE = "X/Y/Z plot"  # A1111's title, what `script_name` names (any case) and the infotext's Script says


@dataclass(frozen=True)
class AxisValues:
    axis: Axis
    text: str  # as the user gave it (the infotext's "X Values")
    values: tuple  # converted, Seed -1 resolved

    @property
    def legends(self) -> list[str]:
        return [self.axis.legend(v) for v in self.values]

    @property
    def active(self) -> bool:
        return self.axis.label != "Nothing"


@dataclass(frozen=True)
class Grid:
    base: GenerationRequest
    x: AxisValues
    y: AxisValues
    z: AxisValues
    cells: tuple[Cell, ...]  # grid order: index ix + iy * nx + iz * nx * ny
    order: tuple[int, ...]  # the order the cells run in
    draw_legend: bool = True
    include_lone_images: bool = False  # the API's answer: the cells' images after the grid
    include_sub_grids: bool = False  # with a Z axis: each Z value's grid too
    margin: int = 0  # px between the sub grids
    no_fixed_seeds: bool = False

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.x.values), len(self.y.values), len(self.z.values)

    def __len__(self) -> int:
        return len(self.cells)

    @property
    def memory_axes(self) -> bool:
        """Whether an axis is one of ours (Preset, VRAM budget, Quantize): its cells are labelled s/step and peak."""
        return any(a.axis.ours for a in (self.x, self.y, self.z))


def _axis_values(name, text, tab: str, which: str, fixed: bool) -> AxisValues:
    axis = find_axis(name if name not in (None, "") else "Nothing", tab, which)
    if axis.label == "Nothing":
        return AxisValues(axis, "", (None,))
    values = axis.values(text if text is not None else "")
    return AxisValues(axis, text or "", tuple(resolve_seeds(axis, values) if fixed else values))


def _with_value(cell: Cell, axes: AxisValues, value) -> Cell:
    return axes.axis.apply(cell, value, list(axes.values)) if axes.active else cell


def fixed_base(base: GenerationRequest) -> GenerationRequest:
    """A1111's fix_seed: the base request's -1 seed and variation seed drawn once, for every cell."""
    draw = random.SystemRandom().randrange
    return dataclasses.replace(base, seed=base.seed if base.seed >= 0 else draw(0, MAX_SEED + 1),
                               subseed=base.subseed if base.subseed >= 0 else draw(0, MAX_SEED + 1))


def build(base: GenerationRequest, x=("Nothing", ""), y=("Nothing", ""), z=("Nothing", ""), *, tab: str = TXT2IMG,
          max_cells: int = DEFAULT_MAX_CELLS, no_fixed_seeds: bool = False, **options) -> Grid:
    """The grid of `base` over the axes `x`, `y`, `z` ((name or A1111 index, values text) each, () for none): every
    cell built and
    validated, or the first problem raised as InvalidRequest naming the axis, the value and what is allowed."""
    base = base.validated()
    fixed = not no_fixed_seeds
    if fixed:
        base = fixed_base(base)
    xs, ys, zs = (_axis_values(*(pair or ("Nothing", "")), tab, w, fixed)
                  for pair, w in ((x, "X"), (y, "Y"), (z, "Z")))
    count = len(xs.values) * len(ys.values) * len(zs.values)
    if count > max_cells:
        raise InvalidRequest("X/Y/Z plot", f"{len(xs.values)}x{len(ys.values)}x{len(zs.values)}",
                             f"that is {count} cells and a grid may have at most {max_cells} (raise the cap with "
                             f"--xyz-max-cells)")
    for axes in (xs, ys, zs):  # each value alone on the base request: its error names its axis
        for value in axes.values:
            _checked(_with_value(Cell(base), axes, value), [(axes, value)])
    cells = []
    for iz, vz in enumerate(zs.values):
        for iy, vy in enumerate(ys.values):
            for ix, vx in enumerate(xs.values):
                cell = Cell(base)
                for axes, value in ((xs, vx), (ys, vy), (zs, vz)):  # A1111 applies x, then y, then z
                    cell = _with_value(cell, axes, value)
                cell = dataclasses.replace(cell, labels=(xs.legends[ix], ys.legends[iy], zs.legends[iz]))
                cells.append(_checked(cell, [(xs, vx), (ys, vy), (zs, vz)]))
    return Grid(base, xs, ys, zs, tuple(cells), run_order(xs, ys, zs), no_fixed_seeds=no_fixed_seeds, **options)


def _checked(cell: Cell, made_by: list[tuple[AxisValues, object]]) -> Cell:
    try:
        return dataclasses.replace(cell, request=cell.request.validated())
    except InvalidRequest as exc:
        said = ", ".join(f"{a.axis.label} {a.axis.legend(v)!r}" for a, v in made_by if a.active)
        axis = next((a.axis for a, _ in made_by if a.active), None)
        raise InvalidRequest(f"X/Y/Z plot cell ({said})" if len(made_by) > 1 else f"{axis.label} value",
                             made_by[0][1] if len(made_by) == 1 else exc.value,
                             f"{exc.field}: {exc.allowed}"
                             + (axis._allowed() if axis and len(made_by) == 1 and "one of" not in exc.allowed else "")) \
            from None


def run_order(xs: AxisValues, ys: AxisValues, zs: AxisValues) -> tuple[int, ...]:
    """A1111's loop order: z, then y, then x innermost, unless one axis costs more than both others (it goes
    outermost, the costlier of the other two next)."""
    nx, ny, nz = len(xs.values), len(ys.values), len(zs.values)
    cost = {"x": xs.axis.cost, "y": ys.axis.cost, "z": zs.axis.cost}
    first, second = "z", "y"
    for axis in "xyz":
        others = [a for a in "xyz" if a != axis]
        if all(cost[axis] > cost[o] for o in others):
            first = axis
            second = others[0] if cost[others[0]] > cost[others[1]] else others[1]
    third = next(a for a in "xyz" if a not in (first, second))
    sizes = {"x": nx, "y": ny, "z": nz}
    order = []
    for a in range(sizes[first]):
        for b in range(sizes[second]):
            for c in range(sizes[third]):
                at = {first: a, second: b, third: c}
                order.append(at["x"] + at["y"] * nx + at["z"] * nx * ny)
    return tuple(order)


def largest(grid: Grid) -> list[Cell]:
    """The cells whose plans are checked before the first runs: for each setting that changes the memory a job
    needs (the model, its VAE, the preset, quantize, the VRAM budget), the cell of the largest images x batch."""
    best: dict[tuple, Cell] = {}
    for cell in grid.cells:
        r = cell.request
        key = (r.model, r.config, r.vae, r.preset, r.quantize, cell.vram_budget, r.tiling, bool(r.controlnets))
        w, h = r.output_size()
        size = (w * h * r.batch_size, r.steps or 0)
        if key not in best or size > _size(best[key]):
            best[key] = cell
    return list(best.values())


def _size(cell: Cell) -> tuple[int, int]:
    w, h = cell.request.output_size()
    return w * h * cell.request.batch_size, cell.request.steps or 0

