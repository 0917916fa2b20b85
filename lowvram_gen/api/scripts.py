"""A1111's scripts in the API: `GET /sdapi/v1/scripts`, `GET /sdapi/v1/script-info`, a txt2img/img2img body's
`script_name: "x/y/z plot"` with its `script_args` in A1111's order (lowvram_gen/xyz runs it), and img2img's
"loopback" and "sd upscale" (lowvram_gen/img2img_scripts: their descriptors read the script_args).

A1111 1.6+'s X/Y/Z script_args: x type, x values, x dropdown values, the same for y and z, draw legend, include lone
images, include sub grids, no fixed seeds (Keep -1 for seeds), margin size, csv mode, raw mode (A1111 1.5's shorter
list without the dropdowns is read too). A type is the axis's index in A1111's list of that tab (or its name); an
axis with choices takes its dropdown values unless csv mode is on, as A1111's, and its text where no dropdown value
is sent. The answer's images: the grid first, the Z values' grids after it with include sub grids, then every
cell's first image with include lone images, as A1111's. Loopback answers its grid (A1111's return_grid) and then
every loop's image; SD upscale its assembled image(s).
"""

from __future__ import annotations

import dataclasses

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.img2img_scripts import loopback
from lowvram_gen.img2img_scripts import scripts as img2img_scripts
from lowvram_gen.xyz import grid as grids
from lowvram_gen.xyz.axes import axes_for
from lowvram_gen.xyz.values import join_csv

NAME = "x/y/z plot"
ARGS = ("x_type", "x_values", "x_values_dropdown", "y_type", "y_values", "y_values_dropdown", "z_type", "z_values",
        "z_values_dropdown", "draw_legend", "include_lone_images", "include_sub_grids", "no_fixed_seeds",
        "margin_size", "csv_mode", "raw_mode")
DEFAULTS = (1, "", [], 0, "", [], 0, "", [], True, False, False, False, 0, False, False)
OLD_ARGS = ("x_type", "x_values", "y_type", "y_values", "z_type", "z_values", "draw_legend", "include_lone_images",
            "include_sub_grids", "no_fixed_seeds", "margin_size")


def scripts() -> dict:
    """A1111's /scripts: the titles of the selectable scripts of each tab, lower case as it lists them."""
    return {"txt2img": [NAME], "img2img": [NAME, *img2img_scripts.SCRIPTS]}


def script_info() -> list[dict]:
    """A1111's /script-info: each script of each tab with its args (label, value, minimum, maximum, step, choices)."""
    def arg(label, value, choices=None, minimum=None, maximum=None, step=None):
        return {"label": label, "value": value, "minimum": minimum, "maximum": maximum, "step": step,
                "choices": choices}

    out = []
    for tab in ("txt2img", "img2img"):
        labels = [a.label for a in axes_for(tab)]
        args = []
        for i, axis in enumerate("XYZ"):
            args += [arg(f"{axis} type", labels[1 if i == 0 else 0], labels), arg(f"{axis} values", ""),
                     arg(f"{axis} values", [], [])]
        args += [arg("Draw legend", True), arg("Include Sub Images", False), arg("Include Sub Grids", False),
                 arg("Keep -1 for seeds", False), arg("Grid margins (px)", 0, minimum=0, maximum=500, step=2),
                 arg("Use text inputs instead of dropdowns", False), arg("Use raw text lines", False)]
        out.append({"name": NAME, "is_alwayson": False, "is_img2img": tab == "img2img", "args": args})
    return out + _img2img_script_info(arg)


def _img2img_script_info(arg) -> list[dict]:
    """Loopback's and SD upscale's args as A1111's /script-info describes its UI's controls, in script_args order."""
    from lowvram_gen.img2img_scripts import sd_upscale

    looped = img2img_scripts.LOOPBACK.defaults()
    upscaled = img2img_scripts.SD_UPSCALE.defaults()
    upscalers = sd_upscale.upscalers()
    return [
        {"name": "loopback", "is_alwayson": False, "is_img2img": True, "args": [
            arg("Loops", looped[0], minimum=1, maximum=loopback.MAX_LOOPS, step=1),
            arg("Final denoising strength", looped[1], minimum=0, maximum=1, step=0.01),
            arg("Denoising strength curve", looped[2], list(loopback.CURVES)),
            arg("Append interrogated prompt at each iteration", looped[3], list(loopback.INTERROGATE))]},
        {"name": "sd upscale", "is_alwayson": False, "is_img2img": True, "args": [
            arg(None, "<p style=\"margin-bottom:0.75em\">Will upscale the image by the selected scale factor; use "
                      "width and height sliders to set tile size</p>"),
            arg("Tile overlap", upscaled[1], minimum=0, maximum=sd_upscale.MAX_OVERLAP, step=16),
            arg("Upscaler", upscalers[upscaled[2]], upscalers),  # A1111's script_args order: the upscaler's index
            arg("Scale Factor", upscaled[3], minimum=1.0, maximum=4.0, step=0.05)]},
    ]


def img2img_script(name: str | None, args: list | None):
    """(descriptor, its keyword arguments) of a body's img2img script_name ("loopback", "sd upscale"); None for
    another (the X/Y/Z plot, or none)."""
    descriptor = img2img_scripts.find(name) if name else None
    if descriptor is None:
        return None
    return descriptor, descriptor.args_from_script_args(args)


def _named(args: list) -> dict:
    old = len(args) <= len(OLD_ARGS) and (len(args) < 3 or not isinstance(args[2], (list, type(None))))
    if old:
        named = dict(zip(ARGS, DEFAULTS))
        named.update(zip(OLD_ARGS, args))
        named["csv_mode"] = True
        return named
    if len(args) > len(ARGS):
        raise InvalidRequest("script_args", f"<{len(args)} values>", f"the X/Y/Z plot takes at most {len(ARGS)}: "
                                                                     + ", ".join(ARGS))
    return {**dict(zip(ARGS, DEFAULTS)), **dict(zip(ARGS, args))}


def _values(named: dict, which: str) -> str:
    text, dropdown = named[f"{which}_values"], named[f"{which}_values_dropdown"]
    if not named["csv_mode"] and isinstance(dropdown, list) and dropdown:
        return join_csv(dropdown)
    if text is None:
        return ""
    if not isinstance(text, str):
        text = join_csv(text) if isinstance(text, list) else str(text)
    if named["raw_mode"] and "\n" in text.strip():
        return join_csv(line for line in text.strip().split("\n"))
    return text


def grid_of(request, args: list, tab: str, max_cells: int = grids.DEFAULT_MAX_CELLS, find_model=None,
            allowed=()) -> grids.Grid:
    """The X/Y/Z grid of a body's request and script_args. Each cell's names are checked as a body's are
    (`cells_by_name`): a Checkpoint name value is a title of /sdapi/v1/sd-models (`find_model`), a VAE or hires
    upscaler a listed name, a path only inside `allowed` (--api-allow-paths)."""
    named = _named(args)
    try:
        margin = int(named["margin_size"] or 0)
    except (TypeError, ValueError):
        raise InvalidRequest("script_args margin_size", named["margin_size"], "a whole number of px, 0-500") from None
    axes = [(named[f"{w}_type"], _values(named, w)) for w in "xyz"]
    grid = grids.build(request, *axes, tab=tab, max_cells=max_cells, no_fixed_seeds=bool(named["no_fixed_seeds"]),
                       draw_legend=bool(named["draw_legend"]), include_lone_images=bool(named["include_lone_images"]),
                       include_sub_grids=bool(named["include_sub_grids"]), margin=max(0, min(500, margin)))
    return cells_by_name(grid, request, find_model, allowed) if find_model is not None else grid


def cells_by_name(grid: grids.Grid, request, find_model, allowed=()) -> grids.Grid:
    """The grid with each cell's model, VAE, hires upscaler and prompts' LoRA tags checked as the API checks a
    body's (api/names.py: names, not server paths), the model's title turned into its spec."""
    from lowvram_gen.api import names

    cells = []
    for cell in grid.cells:
        r = cell.request
        fields = {name: getattr(r, name) for name in ("vae", "hires_upscaler", *names.PROMPTS)}
        names.check(fields, allowed)
        model = r.model if r.model == request.model else find_model(r.model)
        if model is None:
            raise InvalidRequest("Checkpoint name value", r.model, "a title of GET /sdapi/v1/sd-models")
        cells.append(dataclasses.replace(cell, request=dataclasses.replace(r, model=model, **fields).validated()))
    return dataclasses.replace(grid, cells=tuple(cells))


def answer_images(grid: grids.Grid, result) -> list[str]:
    """The paths the answer's images are, in A1111's order."""
    paths = [result.grid] if result.grid else []
    if grid.include_sub_grids:
        paths += result.sub_grids
    if grid.include_lone_images:
        paths += [cell.images[0] for cell in result.cells if cell.images]
    return paths
