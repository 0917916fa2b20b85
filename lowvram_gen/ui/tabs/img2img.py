"""The img2img tab: an init image and the txt2img controls (Quantize, Clip skip, Batch count included; no hires fix);
it shares txt2img's job runner (queue, progress, Interrupt, Skip, live preview: ui/live.py), its LoRA/embedding
pickers and Ctrl+Enter. The width and
height follow the init image (rounded down to a multiple of 8). The controls start at the documented defaults,
each browser gets its own last values back (ui/remembered.py); the gallery (results only, no uploads) sends the
selected image to Upscale.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

import gradio as gr

from lowvram_gen.request import MAX_BATCH, MAX_BATCH_COUNT, MAX_CFG, MAX_CLIP_SKIP, MAX_STEPS
from lowvram_gen.samplers import DEFAULT, SAMPLERS
from lowvram_gen.ui import controlnet, live, messages, pickers, results, sendto
from lowvram_gen.ui.context import GPU, TabContext
from lowvram_gen.schedules import AUTOMATIC
from lowvram_gen.ui.widgets import (AS_PRESET, ImagePath, Number, ScheduleType, Slider, extra_seed_fields,
                                    quantize_field, seed_extras)


def size_from(init_image):
    from PIL import Image

    if not init_image:
        return gr.update(), gr.update()
    try:
        with Image.open(init_image) as im:
            return im.width // 8 * 8, im.height // 8 * 8
    except Exception:  # noqa: BLE001 - not an image Pillow reads (a bomb, a wrong file): Generate says why
        return gr.update(), gr.update()


def build(ctx: TabContext) -> None:
    options = ctx.options

    def img2img(init_image, prompt, negative_prompt=None, strength=0.75, width=512, height=512, steps=20,
                cfg_scale=7.0, seed=-1, batch_size=1, sampler=DEFAULT, model=None, quantize=AS_PRESET,
                schedule_type=AUTOMATIC, clip_skip=1, subseed=-1, subseed_strength=0.0, seed_resize_from_w=0,
                seed_resize_from_h=0, batch_count=1, preview_every=0, preview_method="auto", *units,
                request: gr.Request = None, progress=gr.Progress()):
        if not init_image:
            yield gr.skip(), gr.skip(), messages.failure("choose an init image first", request), gr.skip()
            return
        yield from ctx.run_job("img2img", dict(
            prompt=prompt, negative_prompt=negative_prompt or "", init_image=init_image, strength=strength,
            width=width, height=height, steps=steps, cfg_scale=cfg_scale, seed=seed, batch_size=batch_size,
            sampler=sampler or DEFAULT, model=model or options.model, quantize=quantize_field(quantize),
            schedule_type=schedule_type or AUTOMATIC, clip_skip=1 if clip_skip is None else clip_skip,
            batch_count=1 if batch_count is None else batch_count,
            **extra_seed_fields(subseed, subseed_strength, seed_resize_from_w, seed_resize_from_h),
            **controlnet.request_fields(units)), request,
            progress, preview_every, preview_method)

    with gr.Tab("img2img", id="img2img"):
        with gr.Row():
            with gr.Column(scale=3):
                sent = sendto.note("img2img")
                init = ImagePath("Init image", elem_id="i2i-init")
                prompt = gr.Textbox(value="", label="Prompt", lines=2, elem_id="i2i-prompt")
                negative = gr.Textbox(value="", label="Negative prompt", lines=1,
                                      elem_id="i2i-negative")
                strength = Slider(0, 1, value=0.75, step=0.01,
                                  label="Denoising strength (0 keeps the image)", elem_id="i2i-strength")
                with gr.Row():
                    width = Number("Width", 512, elem_id="i2i-width")
                    height = Number("Height", 512, elem_id="i2i-height")
                    batch_count = Slider(1, MAX_BATCH_COUNT, value=1, step=1, label="Batch count",
                                         elem_id="i2i-batch-count")
                    batch = Slider(1, MAX_BATCH, value=1, step=1, label="Batch size")
                with gr.Row():
                    steps = Slider(1, MAX_STEPS, value=20, step=1, label="Steps",
                                   elem_id="i2i-steps")
                    cfg = Slider(0, MAX_CFG, value=7, step=0.5, label="CFG scale")
                    clip_skip = Slider(1, MAX_CLIP_SKIP, value=1, step=1, label="Clip skip (1: off)",
                                       elem_id="i2i-clip-skip")
                with gr.Row():
                    seed = Number("Seed (-1: random)", -1, elem_id="i2i-seed")
                    extra = gr.Checkbox(False, label="Extra", elem_id="i2i-seed-extra")
                    names = [DEFAULT, *SAMPLERS]
                    sampler = gr.Dropdown(names, value=DEFAULT,
                                          label="Sampler", elem_id="i2i-sampler")
                    schedule_type = ScheduleType("i2i-schedule-type")
                extras = seed_extras(extra, prefix="i2i-")
                model, quantize = pickers.model_row(options, "i2i-")
                pickers.build(prompt, prefix="i2i-")
                units = controlnet.build("i2i-", width, height)
                go, stop, skip = live.buttons("i2i-", "i2i-generate")
                preview_every, preview_method = live.settings("i2i-")
            with gr.Column(scale=2):
                preview, gallery, info, summary, last_seed = results.column(ctx, "i2i-", "img2img",
                    ("inpaint", "upscale"))
    ctx.sent_notes["img2img"] = sent
    ctx.controls["img2img"] = dict(zip(sendto.IMG2IMG, [init, prompt, negative, strength, width, height, steps, cfg,
                                                        seed, batch, sampler, model, quantize, schedule_type,
                                                        clip_skip, extra, *extras]), **units,
                                batch_count=batch_count, preview_every=preview_every, preview_method=preview_method)
    init.change(size_from, [init], [width, height], queue=False, api_visibility="private")
    # the newer arguments last (batch count, the live preview's settings, the ControlNet units and control mode:
    # ui/controlnet.py): older positional calls keep working
    live.shown_while_running(ctx, go, preview_every, preview_method, preview)  # before Generate: it runs first
    ctx.generate_events["img2img"] = go.click(
        controlnet.appended(img2img), [init, prompt, negative, strength, width, height, steps, cfg, seed, batch, sampler,
                                       model, quantize, schedule_type, clip_skip, *extras, batch_count, preview_every,
                                       preview_method, *units.values()],
        [gallery, info, summary, last_seed], api_name="img2img", concurrency_id=GPU, concurrency_limit=1)
    live.wire(ctx, ctx.generate_events["img2img"], stop, skip, summary, preview)
