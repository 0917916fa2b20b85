"""The Upscale tab: one image, a scale and an upscaler (lanczos, or an ESRGAN-family model); it runs as a
Session job, so it waits for the GPU like generation does. A refused or failed upscale says why in "What ran"
and leaves the result as it was (ui/messages.py)."""

import time
from pathlib import Path

import gradio as gr

from lowvram_gen.errors import LowVramError
from lowvram_gen.jobs import console
from lowvram_gen.ui import messages
from lowvram_gen.ui.context import GPU, TabContext
from lowvram_gen.ui.widgets import ImagePath, upscaler_choices
from lowvram_gen.upscale.command import MAX_SCALE


def build(ctx: TabContext) -> None:
    def upscale(image, scale=2.0, upscaler="Lanczos", request: gr.Request = None):
        if not image:
            return gr.skip(), messages.failure("choose an image first", request)
        since = time.monotonic()
        console.say(f"upscale started: {Path(image).name} x{scale} with {upscaler}")
        try:
            result = ctx.session.upscale(image, scale, upscaler, outdir=ctx.options.outdir)
        except LowVramError as exc:
            return gr.skip(), messages.failure(exc, request)
        console.ended("upscale", since, result["summary"], result["images"])
        return result["images"][0], messages.for_ui(result["summary"])

    with gr.Tab("Upscale", id="upscale"):
        with gr.Row():
            with gr.Column():
                image = ImagePath("Image", elem_id="upscale-image")
                scale = gr.Slider(1, MAX_SCALE, value=2, step=0.25, label="Scale")
                upscaler = gr.Dropdown(upscaler_choices(), value="Lanczos", allow_custom_value=True,
                                       label="Upscaler (or a path to an ESRGAN-family model)")
                go = gr.Button("Upscale", variant="primary")
            with gr.Column():
                result = gr.Image(label="Result", type="filepath", format="png", interactive=False)
                summary = gr.Textbox(label="What ran", interactive=False)
    ctx.controls["upscale"] = {"image": image}
    go.click(upscale, [image, scale, upscaler], [result, summary], api_name="upscale", concurrency_id=GPU,
             concurrency_limit=1)
