"""A1111's "SD VAE" box: Automatic, None and the VAEs of models/VAE (models/vae.py), and its value as the request's
`vae` field. As in A1111 it is a setting of the page, above the tabs (`row(ctx)`): its value is kept in
`ctx.vae`, which every SD tab's job takes (TabContext.run_job), so the tabs' API signatures stay as they were.

"Automatic" and "None" are the model's own VAE (models/vae.py says why both); a name is one of models/VAE's, looked
up when the job is planned, so a file removed since the list was made is a clear error naming what is there.
"""

from __future__ import annotations

import gradio as gr

from lowvram_gen.models import vae

LABEL = "SD VAE"


def choices() -> list[str]:
    """What the box offers: Automatic, None, then the VAEs found now, by name."""
    return [vae.AUTOMATIC, vae.NONE, *vae.available()]


def build(ctx, prefix: str = "", value: str = vae.AUTOMATIC) -> gr.Dropdown:
    """The SD VAE box (elem_id `{prefix}sd-vae`) at `value`; the folder is scanned when the page is built (and
    again by the Model row's Refresh where the tab wires it)."""
    del ctx  # the folder is the process's (models/VAE), not the tab's
    return gr.Dropdown(choices(), value=value, label=LABEL, allow_custom_value=False, elem_id=f"{prefix}sd-vae")


def refreshed() -> gr.Dropdown:
    """The box's update with the VAEs found now (for a Refresh button's click)."""
    return gr.Dropdown(choices=choices())


def request_field(value: str | None) -> dict:
    """The box's value as the request's field: {"vae": ...}; left empty (an API client's None): Automatic."""
    return {"vae": value if isinstance(value, str) and value.strip() else vae.AUTOMATIC}


def row(ctx) -> gr.Dropdown:
    """The SD VAE box with its Refresh, a column of the quicksettings row above the tabs (ui/app.py); a change sets
    `ctx.vae`. Both handlers are unqueued: they raise nothing (an unknown name is refused when a job is planned)."""
    from lowvram_gen.ui.pickers import refresh_button

    with gr.Column(scale=1, min_width=320):
        with gr.Row():
            box = build(ctx, value=ctx.vae)
            refresh = refresh_button("sd-vae-refresh")

    def chosen(value):
        ctx.vae = request_field(value)["vae"]

    box.change(chosen, [box], None, api_visibility="private", show_progress="hidden", queue=False)
    refresh.click(refreshed, None, [box], api_visibility="private", show_progress="hidden", queue=False)
    return box
