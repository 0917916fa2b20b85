"""The PNG Info tab (A1111's): drop a PNG, read the parameters it was made with (A1111's `parameters` text,
and our JSON chunk when lowvram-gen made it), and send them to txt2img, img2img or Inpaint, which fill their
controls the way `generate --from-png` reads a PNG (lowvram_gen/a1111/infotext.py, ui/sendto.py).

The image comes as the uploaded file itself (image_mode=None: Gradio converts nothing, so the text
chunks are still there). A PNG without parameters says so; sending it is refused with the same words.
"""

import json

import gradio as gr

from lowvram_gen.errors import LowVramError
from lowvram_gen.a1111.infotext import read_infotext
from lowvram_gen.ui import messages, sendto
from lowvram_gen.ui.context import TabContext
from lowvram_gen.ui.widgets import ImagePath


def show(path):
    """(parameters text, our JSON pretty-printed, what the user should know) of an uploaded image."""
    if not path:
        return "", "", ""
    try:
        text, ours = read_infotext(path)
    except LowVramError as exc:
        return "", "", f"**No generation parameters.** {exc.allowed[:1].upper()}{exc.allowed[1:]}."
    return text, (json.dumps(ours, indent=1, ensure_ascii=False) if ours else ""), ""


def to_send(path, _unused=None) -> tuple[str, bool]:
    if not path:
        raise messages.error("drop a PNG here first")
    return path, True


def build(ctx: TabContext) -> None:
    with gr.Tab("PNG Info", id="pnginfo"):
        with gr.Row():
            with gr.Column():
                image = ImagePath("PNG", image_mode=None, sources=["upload", "clipboard"], elem_id="pnginfo-image")
            with gr.Column():
                status = gr.Markdown(elem_id="pnginfo-status")
                parameters = gr.Textbox(label="Parameters", lines=6, interactive=False, elem_id="pnginfo-parameters")
                with gr.Row():
                    to_txt2img = gr.Button("Send to txt2img", elem_id="pnginfo-to-txt2img")
                    to_img2img = gr.Button("Send to img2img", elem_id="pnginfo-to-img2img")
                    to_inpaint = gr.Button("Send to Inpaint", elem_id="pnginfo-to-inpaint")
                with gr.Accordion("lowvram-gen's own record (JSON)", open=False):
                    ours = gr.Code(language="json", interactive=False, elem_id="pnginfo-json")
    image.change(show, [image], [parameters, ours, status], api_visibility="private")  # queued: its errors are shown
    for button, tab in ((to_txt2img, "txt2img"), (to_img2img, "img2img"), (to_inpaint, "inpaint")):
        ctx.later(lambda button=button, tab=tab: sendto.wire_send(ctx, button, tab, [image], to_send))
