"""The Inpaint tab (A1111's img2img > Inpaint): an image editor whose brush draws the mask on the image (the eraser
takes strokes back), or an uploaded mask that overrides the drawing, A1111's inpaint options (Mask blur, Mask mode,
Masked content, Inpaint area, Only masked padding) and img2img's controls (Batch count, Clip skip, the Extra seed
options, Schedule type, Quantize, the LoRA/embedding pickers and the ControlNet accordion included, from the same
builder: ui/form.py). It
shares txt2img's job runner (queue, progress, Interrupt, Skip, live preview) and goes through the same request fields
as the CLI's `inpaint`. The inputs added after the first version come last in the Generate event's inputs (the
quantize, schedule type, clip skip, Extra seed and batch count, then the ControlNet units), so an older positional API
call keeps working.

The drawn mask is every layer's opaque pixels (masks.mask_of reads an RGBA layer's alpha), written to a temporary
PNG for the request, as an uploaded one is a file already. The width and height follow the image.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

import os
import tempfile

import gradio as gr

from lowvram_gen.inpaint.masks import MAX_BLUR, MAX_PADDING
from lowvram_gen.ui import messages
from lowvram_gen.ui.context import TabContext
from lowvram_gen.ui.form import DEFAULTS, SdForm, job_fields
from lowvram_gen.ui.tabs.img2img import size_from
from lowvram_gen.ui.widgets import AS_PRESET, ImagePath, Slider

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

    def inpaint(editor, prompt, negative_prompt=None, strength=DEFAULTS.strength, width=DEFAULTS.width,
                height=DEFAULTS.height, steps=DEFAULTS.steps, cfg_scale=DEFAULTS.cfg_scale, seed=DEFAULTS.seed,
                batch_size=DEFAULTS.batch_size, sampler=DEFAULTS.sampler, model=None, mask_blur=DEFAULTS.mask_blur,
                invert_mask=DEFAULTS.invert_mask, masked_content=DEFAULTS.masked_content,
                inpaint_area=DEFAULTS.inpaint_area, mask_padding=DEFAULTS.mask_padding, uploaded_mask=None,
                preview_every=0, preview_method="auto", quantize=AS_PRESET, schedule_type=DEFAULTS.schedule_type,
                clip_skip=DEFAULTS.clip_skip, subseed=DEFAULTS.subseed, subseed_strength=DEFAULTS.subseed_strength,
                seed_resize_from_w=DEFAULTS.seed_resize_from_w, seed_resize_from_h=DEFAULTS.seed_resize_from_h,
                batch_count=DEFAULTS.batch_count, img2img_fix_steps=DEFAULTS.img2img_fix_steps,
                resize_mode=DEFAULTS.resize_mode, styles=DEFAULTS.styles, *units,
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
            yield from ctx.run_job("inpaint", job_fields(
                options, units, prompt=prompt, negative_prompt=negative_prompt, init_image=init, mask=mask,
                strength=strength, width=width, height=height, steps=steps, cfg_scale=cfg_scale, seed=seed,
                batch_size=batch_size, sampler=sampler, model=model, mask_blur=mask_blur,
                invert_mask=bool(invert_mask), masked_content=masked_content or DEFAULTS.masked_content,
                inpaint_area=inpaint_area or DEFAULTS.inpaint_area, mask_padding=mask_padding, quantize=quantize,
                schedule_type=schedule_type, clip_skip=clip_skip, batch_count=batch_count, subseed=subseed,
                subseed_strength=subseed_strength, seed_resize_from_w=seed_resize_from_w,
                seed_resize_from_h=seed_resize_from_h, img2img_fix_steps=bool(img2img_fix_steps),
                resize_mode=resize_mode or DEFAULTS.resize_mode, styles=tuple(styles or ())), request, progress,
                preview_every, preview_method)
        finally:
            if drawn:  # the drawn mask's file lives as long as its job
                forget(drawn)

    form = SdForm(ctx, "inpaint", "inp-", unnamed=("batch", "cfg"))
    c = form.controls
    with gr.Tab("Inpaint", id="inpaint"):
        form.note()
        form.top(2, 1)
        with gr.Row():
            with gr.Column(scale=3):
                editor = c["init_image"] = gr.ImageEditor(
                    label="Image: paint the area to repaint (the eraser takes it back)", type="filepath",
                    brush=gr.Brush(colors=["#ffffff"], color_mode="fixed"), elem_id="inp-editor")
                with gr.Accordion("Upload a mask instead (white: repaint)", open=False):
                    uploaded = ImagePath("Mask", elem_id="inp-mask")
                with gr.Row():
                    c["mask_blur"] = Slider(0, MAX_BLUR, value=DEFAULTS.mask_blur, step=1, label="Mask blur",
                                            elem_id="inp-mask-blur")
                    c["invert_mask"] = gr.Checkbox(DEFAULTS.invert_mask, label="Inpaint not masked (invert the mask)",
                                                   elem_id="inp-invert")
                with gr.Row():
                    c["masked_content"] = gr.Radio(CONTENTS, value=DEFAULTS.masked_content, label="Masked content",
                                                   elem_id="inp-content")
                    c["inpaint_area"] = gr.Radio(AREAS, value=DEFAULTS.inpaint_area, label="Inpaint area",
                                                 elem_id="inp-area")
                    c["mask_padding"] = Slider(0, MAX_PADDING, value=DEFAULTS.mask_padding, step=4,
                                               label="Only masked padding, pixels", elem_id="inp-padding")
                form.strength("Denoising strength")
                form.resize_mode(latent=False)  # the mask is resized as the image is
                # A1111's 📐 beside Width/Height (an upload sets them by itself)
                form.settings(size_from_image=True)
            with gr.Column(scale=2):
                form.results(("inpaint", "upscale"))

    def editor_size(value):
        return size_from(background(value))

    editor.upload(editor_size, [editor], [c["width"], c["height"]], queue=False, api_visibility="private")
    form.size_button.click(editor_size, [editor], [c["width"], c["height"]], queue=False, api_visibility="private")
    form.generate(inpaint, ["init_image", "prompt", "negative_prompt", "strength", "width", "height", "steps",
                            "cfg_scale", "seed", "batch_size", "sampler", "model", "mask_blur", "invert_mask",
                            "masked_content", "inpaint_area", "mask_padding", uploaded, "preview_every",
                            "preview_method", "quantize", "schedule_type", "clip_skip", "subseed", "subseed_strength",
                            "seed_resize_from_w", "seed_resize_from_h", "batch_count", "img2img_fix_steps",
                            "resize_mode", "styles"],
                  api_name="inpaint")
