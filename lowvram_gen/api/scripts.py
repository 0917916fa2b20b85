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
