"""A1111's "Random number generator source" setting in the web UI (lowvram_gen/rng.py): GPU, CPU or NV. As A1111's
Settings value (and the SD VAE box, ui/vae_picker.py) it is a setting of the page, above the tabs: its value is kept
in `ctx.rng`, which every SD tab's job takes (TabContext.run_job), so the tabs' API signatures stay as they were. A
PNG sent to a tab sets it (`RNG: NV` to NV; a PNG without the field was made with A1111's default, GPU, as A1111's own
parser reads it): ui/sendto.py fills it through `ctx.page_controls`.
"""

from __future__ import annotations

import gradio as gr

from lowvram_gen.rng import DEFAULT, SOURCES, WORDS, check_rng

KEY = "rng"  # the request field, and its key in ctx.page_controls and a send's fields
LABEL = "Random number generator source"
INFO = "CPU: the same image on any machine; NV: an NVIDIA card's noise on any device"


def request_field(value) -> dict:
    """The radio's value as the request's field: {"rng": ...}; left empty (an API client's None): GPU."""
    return {KEY: check_rng(value) if value else DEFAULT}


def row(ctx) -> gr.Radio:
    """The radio, a column of the quicksettings row above the tabs (ui/app.py); a change sets `ctx.rng` (unqueued:
    it raises nothing for the three values it offers)."""
    with gr.Column(scale=1, min_width=320):
        box = gr.Radio([(WORDS[s], s) for s in SOURCES], value=ctx.rng, label=LABEL, info=INFO,
                       elem_id="rng-source")

    def chosen(value):
        ctx.rng = request_field(value)[KEY]

    box.change(chosen, [box], None, api_visibility="private", show_progress="hidden", queue=False)
    ctx.page_controls[KEY] = box
    return box
