"""The web UI's Script dropdown at the bottom of txt2img (None / X/Y/Z plot) and img2img (and A1111's img2img
scripts Loopback and SD upscale, lowvram_gen/img2img_scripts), A1111's layout. X/Y/Z plot: X, Y and Z rows of an
axis type and its values (A1111's value syntax, lowvram_gen/xyz/values.py), then Draw legend, Keep -1 for seeds,
Include Sub Images, Include Sub Grids and the grid margins. Loopback and SD upscale: their A1111 controls, labels and
defaults from their descriptors. Each script's controls are shown only when it is chosen.

The controls are Generate inputs at the end of the tab's positional list (`inputs(tab)`: the X/Y/Z ones, then on
img2img Loopback's and SD upscale's); `grid_maker` turns their values into a `Several`, the one shape of "a job that
runs several requests" that ui/context.py `run_job` runs through the same queue as a plain job, and the gallery
shows what A1111 shows: the grid first, then the cells; Loopback's grid, then every loop; SD upscale's image.

(No `from __future__ import annotations`: Gradio reads real annotations.)
"""

from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from lowvram_gen.img2img_scripts import loopback
from lowvram_gen.img2img_scripts import scripts as img2img_scripts
from lowvram_gen.jobs.progress import PartProgress
from lowvram_gen.xyz import grid as grids
from lowvram_gen.xyz.axes import axes_for

NONE, XYZ = "None", "X/Y/Z plot"
SCRIPTS = (NONE, XYZ)
LOOPBACK, SD_UPSCALE = img2img_scripts.LOOPBACK.title, img2img_scripts.SD_UPSCALE.title
IMG2IMG_SCRIPTS = (NONE, XYZ, LOOPBACK, SD_UPSCALE)
# the Generate inputs, in this order, after the tab's own
INPUTS = ("script", "xyz_x_type", "xyz_x_values", "xyz_y_type", "xyz_y_values", "xyz_z_type", "xyz_z_values",
          "xyz_draw_legend", "xyz_include_lone_images", "xyz_include_sub_grids", "xyz_no_fixed_seeds", "xyz_margin")
DEFAULTS = dict(script=NONE, xyz_x_type="Seed", xyz_x_values="", xyz_y_type="Nothing", xyz_y_values="",
                xyz_z_type="Nothing", xyz_z_values="", xyz_draw_legend=True, xyz_include_lone_images=True,
                xyz_include_sub_grids=False, xyz_no_fixed_seeds=False, xyz_margin=0)
# img2img's after them: Loopback's and SD upscale's script_args by their descriptors' names (SD upscale's info text
# is no control)
_LOOPED, _UPSCALED = img2img_scripts.LOOPBACK.args, img2img_scripts.SD_UPSCALE.args[1:]
IMG2IMG_INPUTS = tuple(f"loopback_{a.name}" for a in _LOOPED) + tuple(f"sd_upscale_{a.name}" for a in _UPSCALED)
IMG2IMG_DEFAULTS = {**{f"loopback_{a.name}": a.default for a in _LOOPED},
                    **{f"sd_upscale_{a.name}": a.default for a in _UPSCALED}, "sd_upscale_upscaler": "None"}


def inputs(tab: str) -> tuple[str, ...]:
    """The Script controls' Generate inputs of a tab, in order."""
    return INPUTS + (IMG2IMG_INPUTS if tab == "img2img" else ())


def build(controls: dict, prefix: str, tab: str) -> None:
    """The Script dropdown and the X/Y/Z plot's controls (shown when it is chosen), into `controls` by INPUTS' names."""
    labels = [a.label for a in axes_for(tab) if a.built]
    c = controls
    c["script"] = gr.Dropdown(list(IMG2IMG_SCRIPTS if tab == "img2img" else SCRIPTS), value=NONE, label="Script",
                              elem_id=f"{prefix}script")
    with gr.Column(visible=False, elem_id=f"{prefix}xyz") as box:
        for axis in "xyz":
            with gr.Row():
                c[f"xyz_{axis}_type"] = gr.Dropdown(labels, value=DEFAULTS[f"xyz_{axis}_type"],
                                                    label=f"{axis.upper()} type", elem_id=f"{prefix}xyz-{axis}-type")
                c[f"xyz_{axis}_values"] = gr.Textbox("", label=f"{axis.upper()} values", lines=1,
                                                     placeholder="1, 2, 3 or 1-5 or 1-10 (+2) or 1-10 [5]",
                                                     elem_id=f"{prefix}xyz-{axis}-values")
        with gr.Row():
            c["xyz_draw_legend"] = gr.Checkbox(True, label="Draw legend", elem_id=f"{prefix}xyz-legend")
            c["xyz_no_fixed_seeds"] = gr.Checkbox(False, label="Keep -1 for seeds", elem_id=f"{prefix}xyz-keep-seeds")
            c["xyz_include_lone_images"] = gr.Checkbox(True, label="Include Sub Images",
                                                       elem_id=f"{prefix}xyz-lone-images")
            c["xyz_include_sub_grids"] = gr.Checkbox(False, label="Include Sub Grids",
                                                     elem_id=f"{prefix}xyz-sub-grids")
            c["xyz_margin"] = gr.Slider(0, 500, value=0, step=2, label="Grid margins (px)",
                                        elem_id=f"{prefix}xyz-margin")
    if tab != "img2img":
        c["script"].change(lambda name: gr.update(visible=name == XYZ), [c["script"]], [box], queue=False,
                           api_visibility="private")
        return
    boxes = {XYZ: box, **_img2img_scripts(c, prefix)}
    c["script"].change(lambda name: [gr.update(visible=name == title) for title in boxes], [c["script"]],
                       list(boxes.values()), queue=False, api_visibility="private")


def _img2img_scripts(c: dict, prefix: str) -> dict:
    """Loopback's and SD upscale's controls (A1111's labels, ranges and defaults), hidden; their boxes by title."""
    from lowvram_gen.img2img_scripts import sd_upscale

    d, args = IMG2IMG_DEFAULTS, {a.name: a for a in (*_LOOPED, *_UPSCALED)}
    with gr.Column(visible=False, elem_id=f"{prefix}loopback") as looped:
        c["loopback_loops"] = gr.Slider(1, loopback.MAX_LOOPS, value=d["loopback_loops"], step=1,
                                        label=args["loops"].label, elem_id=f"{prefix}loopback-loops")
        c["loopback_final_denoising_strength"] = gr.Slider(
            0, 1, value=d["loopback_final_denoising_strength"], step=0.01,
            label=args["final_denoising_strength"].label, elem_id=f"{prefix}loopback-final-denoising")
        c["loopback_denoising_curve"] = gr.Dropdown(list(loopback.CURVES), value=d["loopback_denoising_curve"],
                                                    label=args["denoising_curve"].label,
                                                    elem_id=f"{prefix}loopback-curve")
        c["loopback_append_interrogation"] = gr.Dropdown(
            list(loopback.INTERROGATE), value=d["loopback_append_interrogation"],
            label=args["append_interrogation"].label, elem_id=f"{prefix}loopback-interrogate")
    with gr.Column(visible=False, elem_id=f"{prefix}sd-upscale") as upscaled:
        gr.Markdown("Will upscale the image by the selected scale factor; use width and height sliders to set tile "
                    "size")
        c["sd_upscale_overlap"] = gr.Slider(0, sd_upscale.MAX_OVERLAP, value=d["sd_upscale_overlap"], step=16,
                                            label=args["overlap"].label, elem_id=f"{prefix}sd-upscale-overlap")
        c["sd_upscale_scale_factor"] = gr.Slider(1.0, 4.0, value=d["sd_upscale_scale_factor"], step=0.05,
                                                 label=args["scale_factor"].label,
                                                 elem_id=f"{prefix}sd-upscale-scale")
        c["sd_upscale_upscaler"] = gr.Dropdown(sd_upscale.upscalers(), value=d["sd_upscale_upscaler"],
                                               label=args["upscaler"].label, elem_id=f"{prefix}sd-upscale-upscaler")
    return {LOOPBACK: looped, SD_UPSCALE: upscaled}


@dataclass(frozen=True)
class Several:
    """A job that runs several requests one after another (an X/Y/Z grid's cells, an img2img script's loops or
    tiles): `parts` of them; `run(session, progress, generate_kwargs)` runs them (telling `progress`, a
    PartProgress, each part), `shown(result)` the gallery's images, `seed(result)` the seed the tab keeps."""

    parts: int
    run: Callable[[Any, PartProgress, dict], Any]
    shown: Callable[[Any], list]
    seed: Callable[[Any], int]


def grid_maker(tab: str, values: dict):
    """None for script None; else a function of the validated request that makes its `Several` (raising what is
    wrong with an axis or a script's argument, which the tab shows as any refused job)."""
    script = values.get("script") or NONE
    if script in (LOOPBACK, SD_UPSCALE):
        return _script_maker(script, values)
    if script != XYZ:
        return None
    v = {**DEFAULTS, **{k: val for k, val in values.items() if val is not None}}

    def make(request):
        from lowvram_gen.xyz.runner import run_grid

        grid = grids.build(request, *((v[f"xyz_{a}_type"], v[f"xyz_{a}_values"]) for a in "xyz"), tab=tab,
                           no_fixed_seeds=bool(v["xyz_no_fixed_seeds"]), draw_legend=bool(v["xyz_draw_legend"]),
                           include_lone_images=bool(v["xyz_include_lone_images"]),
                           include_sub_grids=bool(v["xyz_include_sub_grids"]), margin=int(v["xyz_margin"] or 0))
        passes = 2 if request.hires else 1
        return Several(len(grid), lambda session, progress, kw: run_grid(
            session, grid, on_cell=lambda i, n: progress.cell(i, n, request.batch_count, passes), **kw),
            lambda result: shown(grid, result), lambda result: grid.base.seed)

    return make


def _script_maker(title: str, values: dict):
    """Loopback's or SD upscale's `Several` of a request, its keywords from the tab's controls."""
    descriptor = img2img_scripts.find(title)
    prefix = "loopback_" if descriptor is img2img_scripts.LOOPBACK else "sd_upscale_"
    v = {**IMG2IMG_DEFAULTS, **{k: val for k, val in values.items() if val is not None}}
    kwargs = {a.name: v[prefix + a.name] for a in descriptor.args if prefix + a.name in v}

    def make(request):
        def run(session, progress, kw):
            return img2img_scripts.run(descriptor, request, session, on_part=progress.part, outdir=request.outdir,
                                       run_one=lambda one: session.generate(one, **kw), **kwargs)

        return Several(1, run, lambda result: result.shown(), lambda result: result.seeds[0])

    return make


def shown(grid, result) -> list[str]:
    """The gallery's images of a grid: the grid first, its Z grids with Include Sub Grids, the cells with Include
    Sub Images (A1111's order)."""
    paths = [result.grid] if result.grid else []
    if grid.include_sub_grids:
        paths += result.sub_grids
    if grid.include_lone_images:
        paths += result.images
    return paths
