"""The CLI's X/Y/Z plot: `lowvram-gen generate PROMPT --xyz-x "Seed: 1, 2, 3" --xyz-y "CFG Scale: 5, 7"` (img2img
too). Each flag is `AXIS: VALUES` (A1111's axis names, any case; its value syntax, lowvram_gen/xyz/values.py). The
cells run one after another in this process's Session, each saved as a generate saves its images; then the grid PNG.
stdout: the grid's path then each cell's, or with --json one object with `grid`, `cells` and `images`."""

from __future__ import annotations

import sys


def add_xyz_args(p) -> None:
    g = p.add_argument_group("X/Y/Z plot (A1111's script): a grid of jobs, one axis value replaced per cell")
    for axis in "xyz":
        g.add_argument(f"--xyz-{axis}", metavar='"AXIS: VALUES"',
                       help=(f"the {axis.upper()} axis: an axis name and its values, e.g. \"Seed: 1, 2, 3\", "
                             "\"Steps: 10-30 (+10)\", \"CFG Scale: 5-8 [4]\", \"Prompt S/R: cat, dog\", "
                             "\"Preset: cpu, medvram\"" if axis == "x" else f"the {axis.upper()} axis, as --xyz-x"))
    g.add_argument("--xyz-max-cells", metavar="N", type=int, default=None,
                   help="refuse a grid of more cells than this (default 64)")
    g.add_argument("--xyz-no-legend", action="store_true", help="draw the grid without its legends")
    g.add_argument("--xyz-keep-minus-one", action="store_true",
                   help="A1111's 'Keep -1 for seeds': a seed of -1 is drawn anew for each cell")


def wanted(args) -> bool:
    return any(getattr(args, f"xyz_{a}", None) for a in "xyz")


def parse_axis(text: str | None, which: str) -> tuple[str, str]:
    """'Seed: 1, 2, 3' -> ('Seed', '1, 2, 3'); None -> Nothing."""
    from lowvram_gen.errors import InvalidRequest

    if not text:
        return "Nothing", ""
    name, colon, values = text.partition(":")
    if not colon:
        raise InvalidRequest(f"--xyz-{which}", text, 'write it as "AXIS: VALUES", e.g. "Seed: 1, 2, 3"')
    return name.strip(), values.strip()


def run(args, request, session, said: list[str]) -> int:
    from lowvram_gen.cli.scripts import report
    from lowvram_gen.jobs.console import ProgressBar
    from lowvram_gen.xyz import grid as grids
    from lowvram_gen.xyz.runner import run_grid

    tab = "img2img" if request.init_image else "txt2img"
    grid = grids.build(request, *(parse_axis(getattr(args, f"xyz_{a}"), a) for a in "xyz"), tab=tab,
                       max_cells=args.xyz_max_cells or grids.DEFAULT_MAX_CELLS,
                       no_fixed_seeds=args.xyz_keep_minus_one, draw_legend=not args.xyz_no_legend)
    bar = ProgressBar("step")

    def on_cell(i: int, n: int) -> None:
        print(f"cell {i}/{n}", file=sys.stderr)

    try:
        result = run_grid(session, grid, on_cell=on_cell, on_step=bar.update)
    finally:
        bar.close()
    report(result, args.json, said, ([result.grid] if result.grid else []) + result.images)
    return 130 if result.interrupted else 0
