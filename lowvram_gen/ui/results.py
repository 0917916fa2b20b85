"""The results column txt2img, img2img and Inpaint share: the live preview, the gallery with its Send to buttons,
the image's parameters, what ran, and the browser's last seed (hidden)."""

from __future__ import annotations

from typing import NamedTuple

import gradio as gr

from lowvram_gen.ui import live, sendto
from lowvram_gen.ui.context import TabContext


class Results(NamedTuple):
    preview: gr.Image
    gallery: gr.Gallery
    info: gr.Textbox
    summary: gr.Textbox
    last_seed: gr.Number  # this browser's last seed: the browser holds it, so no other client can see or change it


def column(ctx: TabContext, prefix: str, tab: str, send_to: tuple[str, ...]) -> Results:
    """The column's components, elem_ids `{prefix}gallery`, `{prefix}info`, `{prefix}summary`, `{prefix}last-seed`;
    call inside the tab's results column. `tab`: the tab the Send to buttons send from."""
    preview = live.image(prefix)
    gallery = gr.Gallery(label="Results", columns=2, format="png", object_fit="contain", interactive=False,
                         elem_id=f"{prefix}gallery")
    sendto.gallery_buttons(ctx, gallery, send_to, prefix=tab)
    info = gr.Textbox(label="Image parameters", lines=4, interactive=False, elem_id=f"{prefix}info")
    summary = gr.Textbox(label="What ran", lines=2, interactive=False, elem_id=f"{prefix}summary")
    last_seed = gr.Number(visible=False, precision=0, elem_id=f"{prefix}last-seed")
    return Results(preview, gallery, info, summary, last_seed)
