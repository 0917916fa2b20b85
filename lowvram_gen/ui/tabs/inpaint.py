"""The Inpaint tab (A1111's img2img > Inpaint): an image editor whose brush draws the mask on the image (the eraser
takes strokes back), or an uploaded mask that overrides the drawing, A1111's inpaint options (Mask blur, Mask mode,
Masked content, Inpaint area, Only masked padding) and img2img's controls (Batch count, Clip skip, the Extra seed
options, Schedule type, Quantize and the ControlNet accordion included, from the same builders: ui/widgets.py,
ui/controlnet.py). It shares txt2img's job runner (queue, progress, Interrupt, Skip, live preview) and goes through
the same request fields as the CLI's `inpaint`. The inputs added after the first version come last in the Generate
event's inputs (the quantize, schedule type, clip skip, Extra seed and batch count, then the ControlNet units), so
an older positional API call keeps working.

The drawn mask is every layer's opaque pixels (masks.binary reads an RGBA layer's alpha), written to a temporary
PNG for the request, as an uploaded one is a file already. The width and height follow the image.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

import os
import tempfile

import gradio as gr

from lowvram_gen.inpaint.masks import MAX_BLUR, MAX_PADDING
from lowvram_gen.request import MAX_BATCH, MAX_BATCH_COUNT, MAX_CFG, MAX_CLIP_SKIP, MAX_STEPS
from lowvram_gen.samplers import DEFAULT, SAMPLERS
from lowvram_gen.schedules import AUTOMATIC
from lowvram_gen.ui import controlnet, live, messages, pickers, results, sendto
from lowvram_gen.ui.context import GPU, TabContext
from lowvram_gen.ui.tabs.img2img import size_from
from lowvram_gen.ui.widgets import (AS_PRESET, ImagePath, Number, ScheduleType, Slider, extra_seed_fields,
                                    quantize_field, seed_extras)

AREAS = [("Whole picture", "whole"), ("Only masked", "masked")]
CONTENTS = [("fill", "fill"), ("original", "original"), ("latent noise", "latent-noise"),
            ("latent nothing", "latent-nothing")]


def drawn_mask(editor) -> str | None:
    """The editor's layers as one mask PNG (white where any layer is drawn), or None when nothing is drawn."""
    from PIL import Image, ImageChops

    layers = [layer for layer in (editor or {}).get("layers") or [] if layer]
    mask = None
    for layer in layers:
        with Image.open(layer) as im:
            alpha = im.convert("RGBA").getchannel("A")
        mask = alpha if mask is None else ImageChops.lighter(mask, alpha)
    if mask is None or mask.getbbox() is None:
        return None
    with tempfile.NamedTemporaryFile(prefix="lowvram-mask-", suffix=".png", delete=False) as f:
        mask.point(lambda v: 255 if v > 0 else 0).save(f, format="PNG")
        return f.name


def forget(path: str) -> None:
    """Remove a drawn mask's file once its job has ended."""
    os.unlink(path)


def background(editor) -> str | None:
    """The image the mask is drawn on (the editor's background)."""
    return (editor or {}).get("background") if isinstance(editor, dict) else editor


def build(ctx: TabContext) -> None:
    options = ctx.options

    def inpaint(editor, prompt, negative_prompt=None, strength=0.75, width=512, height=512, steps=20,
                cfg_scale=7.0, seed=-1, batch_size=1, sampler=DEFAULT, model=None, mask_blur=4, invert_mask=False,
                masked_content="original", inpaint_area="whole", mask_padding=32, uploaded_mask=None,
                preview_every=0, preview_method="auto", quantize=AS_PRESET, schedule_type=AUTOMATIC, clip_skip=1,
                subseed=-1, subseed_strength=0.0, seed_resize_from_w=0, seed_resize_from_h=0, batch_count=1, *units,
                request: gr.Request = None, progress=gr.Progress()):
        init = background(editor)
        if not init:
            yield gr.skip(), gr.skip(), messages.failure("choose an image first", request), gr.skip()
            return
        drawn = None if uploaded_mask else drawn_mask(editor)
        mask = uploaded_mask or drawn
        if not mask:
            yield gr.skip(), gr.skip(), messages.failure("draw the mask on the image with the brush (or upload a "
                                                         "mask): nothing to repaint", request), gr.skip()
            return
        try:
            yield from ctx.run_job("inpaint", dict(
                prompt=prompt, negative_prompt=negative_prompt or "", init_image=init, mask=mask, strength=strength,
                width=width, height=height, steps=steps, cfg_scale=cfg_scale, seed=seed, batch_size=batch_size,
                sampler=sampler or DEFAULT, model=model or options.model, mask_blur=mask_blur,
                invert_mask=bool(invert_mask), masked_content=masked_content or "original",
                inpaint_area=inpaint_area or "whole", mask_padding=mask_padding, quantize=quantize_field(quantize),
                schedule_type=schedule_type or AUTOMATIC, clip_skip=1 if clip_skip is None else clip_skip,
                batch_count=1 if batch_count is None else batch_count,
                **extra_seed_fields(subseed, subseed_strength, seed_resize_from_w, seed_resize_from_h),
                **controlnet.request_fields(units)), request, progress, preview_every, preview_method)
        finally:
            if drawn:  # the drawn mask's file lives as long as its job
                forget(drawn)

    with gr.Tab("Inpaint", id="inpaint"):
        with gr.Row():
            with gr.Column(scale=3):
                sent = sendto.note("inpaint")
                editor = gr.ImageEditor(label="Image: paint the area to repaint (the eraser takes it back)",
                                        type="filepath", brush=gr.Brush(colors=["#ffffff"], color_mode="fixed"),
                                        elem_id="inp-editor")
                with gr.Accordion("Upload a mask instead (white: repaint)", open=False):
                    uploaded = ImagePath("Mask", elem_id="inp-mask")
                prompt = gr.Textbox(value="", label="Prompt", lines=2, elem_id="inp-prompt")
                negative = gr.Textbox(value="", label="Negative prompt", lines=1, elem_id="inp-negative")
                with gr.Row():
                    blur = Slider(0, MAX_BLUR, value=4, step=1, label="Mask blur", elem_id="inp-mask-blur")
                    invert = gr.Checkbox(False, label="Inpaint not masked (invert the mask)", elem_id="inp-invert")
                with gr.Row():
                    content = gr.Radio(CONTENTS, value="original", label="Masked content", elem_id="inp-content")
                    area = gr.Radio(AREAS, value="whole", label="Inpaint area", elem_id="inp-area")
                    padding = Slider(0, MAX_PADDING, value=32, step=4, label="Only masked padding, pixels",
                                     elem_id="inp-padding")
                strength = Slider(0, 1, value=0.75, step=0.01, label="Denoising strength", elem_id="inp-strength")
                with gr.Row():
                    width = Number("Width", 512, elem_id="inp-width")
                    height = Number("Height", 512, elem_id="inp-height")
                    # A1111's 📐: the size of the image being edited again, after Width/Height were changed (an
                    # upload sets them by itself)
                    size_button = gr.Button("\U0001F4D0", elem_id="inp-size-from-image", scale=0, min_width=40)
                    batch_count = Slider(1, MAX_BATCH_COUNT, value=1, step=1, label="Batch count",
                                         elem_id="inp-batch-count")
                    batch = Slider(1, MAX_BATCH, value=1, step=1, label="Batch size")
                with gr.Row():
                    steps = Slider(1, MAX_STEPS, value=20, step=1, label="Steps", elem_id="inp-steps")
                    cfg = Slider(0, MAX_CFG, value=7, step=0.5, label="CFG scale")
                    clip_skip = Slider(1, MAX_CLIP_SKIP, value=1, step=1, label="Clip skip (1: off)",
                                       elem_id="inp-clip-skip")
                with gr.Row():
                    seed = Number("Seed (-1: random)", -1, elem_id="inp-seed")
                    extra = gr.Checkbox(False, label="Extra", elem_id="inp-seed-extra")
                    sampler = gr.Dropdown([DEFAULT, *SAMPLERS], value=DEFAULT, label="Sampler",
                                          elem_id="inp-sampler")
                    schedule_type = ScheduleType("inp-schedule-type")
                extras = seed_extras(extra, prefix="inp-")
                model, quantize = pickers.model_row(options, "inp-")
                units = controlnet.build("inp-", width, height)
                go, stop, skip = live.buttons("inp-", "inp-generate")
                preview_every, preview_method = live.settings("inp-")
            with gr.Column(scale=2):
                preview, gallery, info, summary, last_seed = results.column(ctx, "inp-", "inpaint",
                    ("inpaint", "upscale"))
    ctx.sent_notes["inpaint"] = sent
    ctx.controls["inpaint"] = dict(zip(sendto.INPAINT, [editor, prompt, negative, strength, width, height, steps, cfg,
                                                        seed, batch, sampler, model, blur, invert, content, area,
                                                        padding, quantize, schedule_type, clip_skip, extra, *extras]),
                                   **units, batch_count=batch_count, preview_every=preview_every,
                                   preview_method=preview_method)

    def editor_size(value):
        return size_from(background(value))

    editor.upload(editor_size, [editor], [width, height], queue=False, api_visibility="private")
    size_button.click(editor_size, [editor], [width, height], queue=False, api_visibility="private")
    live.shown_while_running(ctx, go, preview_every, preview_method, preview)  # before Generate: it runs first
    ctx.generate_events["inpaint"] = go.click(
        controlnet.appended(inpaint), [editor, prompt, negative, strength, width, height, steps, cfg, seed, batch,
                                       sampler, model, blur, invert, content, area, padding, uploaded, preview_every,
                                       preview_method, quantize, schedule_type, clip_skip, *extras, batch_count,
                                       *units.values()],
        [gallery, info, summary, last_seed], api_name="inpaint", concurrency_id=GPU, concurrency_limit=1)
    live.wire(ctx, ctx.generate_events["inpaint"], stop, skip, summary, preview)
