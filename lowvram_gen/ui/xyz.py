"""The web UI's Script dropdown (None / X/Y/Z plot) at the bottom of txt2img and img2img, A1111's layout: X, Y and Z
rows of an axis type and its values (A1111's value syntax, lowvram_gen/xyz/values.py), then Draw legend, Keep -1 for
seeds, Include Sub Images, Include Sub Grids and the grid margins. The controls are Generate inputs at the end of the
tab's positional list (`INPUTS`); `grid_of` turns their values into the grid the job runs (ui/context.py `run_job`),
through the same queue as a plain job, and the gallery shows the grid first, then the cells.

(No `from __future__ import annotations`: Gradio reads real annotations.)
"""

import gradio as gr

from lowvram_gen.xyz import grid as grids
from lowvram_gen.xyz.axes import axes_for

NONE, XYZ = "None", "X/Y/Z plot"
SCRIPTS = (NONE, XYZ)
# the Generate inputs, in this order, after the tab's own
INPUTS = ("script", "xyz_x_type", "xyz_x_values", "xyz_y_type", "xyz_y_values", "xyz_z_type", "xyz_z_values",
          "xyz_draw_legend", "xyz_include_lone_images", "xyz_include_sub_grids", "xyz_no_fixed_seeds", "xyz_margin")
DEFAULTS = dict(script=NONE, xyz_x_type="Seed", xyz_x_values="", xyz_y_type="Nothing", xyz_y_values="",
                xyz_z_type="Nothing", xyz_z_values="", xyz_draw_legend=True, xyz_include_lone_images=True,
                xyz_include_sub_grids=False, xyz_no_fixed_seeds=False, xyz_margin=0)


def build(controls: dict, prefix: str, tab: str) -> None:
    """The Script dropdown and the X/Y/Z plot's controls (shown when it is chosen), into `controls` by INPUTS' names."""
    labels = [a.label for a in axes_for(tab) if a.built]
    c = controls
    c["script"] = gr.Dropdown(list(SCRIPTS), value=NONE, label="Script", elem_id=f"{prefix}script")
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
    c["script"].change(lambda name: gr.update(visible=name == XYZ), [c["script"]], [box], queue=False,
                       api_visibility="private")


def grid_maker(tab: str, values: dict):
    """None for script None; else a function of the validated request that builds its grid (raising what is
    wrong with an axis, which the tab shows as any refused job)."""
    if (values.get("script") or NONE) != XYZ:
        return None
    v = {**DEFAULTS, **{k: val for k, val in values.items() if val is not None}}

    def make(request):
        return grids.build(request, *((v[f"xyz_{a}_type"], v[f"xyz_{a}_values"]) for a in "xyz"), tab=tab,
                           no_fixed_seeds=bool(v["xyz_no_fixed_seeds"]), draw_legend=bool(v["xyz_draw_legend"]),
                           include_lone_images=bool(v["xyz_include_lone_images"]),
                           include_sub_grids=bool(v["xyz_include_sub_grids"]), margin=int(v["xyz_margin"] or 0))

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
