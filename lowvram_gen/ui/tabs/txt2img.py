"""The txt2img tab: prompt (with LoRA/embedding pickers), size, batch count and size, steps, CFG, clip skip, seed (with
♻ last seed), model, the weights' storage (Quantize: as the preset says, none, int8, int4), hires fix; Generate,
Interrupt, Skip and the live preview above the gallery (ui/live.py); the gallery shows each
image whole (object-fit: contain), whatever its aspect, and sends the selected one to img2img or Upscale.
Hires fix has A1111 1.10's controls: Upscale by or Resize width/height to, the upscaler (A1111's names), steps,
denoising strength, and the second pass's own sampler, schedule type, CFG scale and prompts ("Use same ...", 0 and
empty: the first pass's). The controls start at the documented defaults; each browser gets its own last values back (ui/remembered.py).
The gallery shows results only (interactive=False: no "Drop Media Here"); selecting an image still works.
Beside the Model box, Refresh rescans the models; above the prompt, a note says what a Send to did not use.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

import gradio as gr

from lowvram_gen.request import (MAX_BATCH, MAX_BATCH_COUNT, MAX_CFG, MAX_CLIP_SKIP, MAX_HIRES_SCALE, MAX_STEPS,
                                 SAME_SAMPLER, SAME_SCHEDULER, GenerationRequest)
from lowvram_gen.samplers import DEFAULT, SAMPLERS
from lowvram_gen.schedules import SCHEDULE_TYPES
from lowvram_gen.ui import controlnet, live, pickers, results, sendto
from lowvram_gen.ui.context import GPU, TabContext, image_info
from lowvram_gen.ui.widgets import (AS_PRESET, Number, ScheduleType, Slider, extra_seed_fields,
                                    quantize_field, seed_extras, upscaler_choices)

DEFAULTS = GenerationRequest()


def show_selected(evt: gr.SelectData):
    value = evt.value
    path = value.get("image", {}).get("path") if isinstance(value, dict) else None
    return image_info(path) if path else ""


def build(ctx: TabContext) -> None:
    options = ctx.options

    def generate(prompt, negative_prompt=None, width=DEFAULTS.width, height=DEFAULTS.height,
                 steps=DEFAULTS.steps, cfg_scale=DEFAULTS.cfg_scale, seed=DEFAULTS.seed,
                 batch_size=DEFAULTS.batch_size, sampler=DEFAULTS.sampler, model=options.model,
                 hires_scale=DEFAULTS.hires_scale, hires_upscaler=DEFAULTS.hires_upscaler,
                 hires_steps=DEFAULTS.hires_steps, hires_denoise=DEFAULTS.hires_denoise, quantize=AS_PRESET,
                 schedule_type=DEFAULTS.schedule_type, clip_skip=DEFAULTS.clip_skip, subseed=DEFAULTS.subseed,
                 subseed_strength=DEFAULTS.subseed_strength, seed_resize_from_w=0, seed_resize_from_h=0,
                 hires_resize_w=0, hires_resize_h=0, hires_sampler=SAME_SAMPLER, hires_schedule_type=SAME_SCHEDULER,
                 hires_cfg=0, hires_prompt="", hires_negative="", batch_count=DEFAULTS.batch_count, preview_every=0,
                 preview_method="auto", *units, request: gr.Request = None, progress=gr.Progress()):
        yield from ctx.run_job("txt2img", dict(
            prompt=prompt, negative_prompt=negative_prompt or "", width=width, height=height, steps=steps,
            cfg_scale=cfg_scale, seed=seed, batch_size=batch_size, sampler=sampler or DEFAULT,
            model=model or options.model, hires_scale=hires_scale, hires_upscaler=hires_upscaler,
            hires_steps=hires_steps, hires_denoise=hires_denoise, quantize=quantize_field(quantize),
            schedule_type=schedule_type or DEFAULTS.schedule_type,
            clip_skip=DEFAULTS.clip_skip if clip_skip is None else clip_skip,
            **extra_seed_fields(subseed, subseed_strength, seed_resize_from_w, seed_resize_from_h),
            hires_resize_w=hires_resize_w or 0, hires_resize_h=hires_resize_h or 0, hires_sampler=hires_sampler,
            hires_schedule_type=hires_schedule_type, hires_cfg=hires_cfg or 0, hires_prompt=hires_prompt or "",
            hires_negative=hires_negative or "",
            batch_count=DEFAULTS.batch_count if batch_count is None else batch_count,
            **controlnet.request_fields(units)), request, progress,
            preview_every, preview_method)

    with gr.Tab("txt2img", id="txt2img"):
        with gr.Row():
            with gr.Column(scale=3):
                sent = sendto.note("txt2img")
                prompt = gr.Textbox(value="", label="Prompt", lines=3, elem_id="prompt")
                negative = gr.Textbox(value="", label="Negative prompt", lines=2,
                                      elem_id="negative")
                with gr.Row():
                    width = Number("Width", DEFAULTS.width, elem_id="width")
                    height = Number("Height", DEFAULTS.height, elem_id="height")
                    batch_count = Slider(1, MAX_BATCH_COUNT, value=1, step=1, label="Batch count",
                                         elem_id="batch-count")
                    batch = Slider(1, MAX_BATCH, value=1, step=1, label="Batch size",
                                   elem_id="batch")
                with gr.Row():
                    steps = Slider(1, MAX_STEPS, value=DEFAULTS.steps, step=1, label="Steps",
                                   elem_id="steps")
                    cfg = Slider(0, MAX_CFG, value=DEFAULTS.cfg_scale, step=0.5,
                                 label="CFG scale", elem_id="cfg")
                    clip_skip = Slider(1, MAX_CLIP_SKIP, value=DEFAULTS.clip_skip, step=1, label="Clip skip (1: off)",
                                       elem_id="clip-skip")
                with gr.Row():
                    seed = Number("Seed (-1: random)", -1, elem_id="seed")
                    reuse = gr.Button("♻ last seed", size="sm", elem_id="reuse-seed")
                    extra = gr.Checkbox(False, label="Extra", elem_id="seed-extra")
                    names = [DEFAULT, *SAMPLERS]
                    sampler = gr.Dropdown(names, value=DEFAULT,
                                          label="Sampler", elem_id="sampler")
                    schedule_type = ScheduleType("schedule-type")
                extras = seed_extras(extra, prefix="")
                model, quantize = pickers.model_row(options, "", "Model (or type a hub id / path)")
                pickers.build(prompt, prefix="")
                with gr.Accordion("Hires fix (a second pass at a larger size)", open=False):
                    with gr.Row():
                        hires_scale = Slider(1, MAX_HIRES_SCALE, value=1, step=0.05,
                                             label="Upscale by (1: off)", elem_id="hires-scale")
                        hires_upscaler = gr.Dropdown(upscaler_choices(hires=True),
                                                     value=DEFAULTS.hires_upscaler,
                                                     allow_custom_value=True, label="Upscaler",
                                                     elem_id="hires-upscaler")
                    with gr.Row():
                        hires_steps = Slider(0, MAX_STEPS, value=0, step=1,
                                             label="Hires steps (0: same)")
                        hires_denoise = Slider(0, 1, value=0.7, step=0.01,
                                               label="Denoising strength")
                    with gr.Row():  # A1111's "Resize width to" / "Resize height to": they win over Upscale by
                        hires_resize_w = Slider(0, 2048, value=0, step=8, label="Resize width to (0: by the scale)",
                                                elem_id="hires-resize-w")
                        hires_resize_h = Slider(0, 2048, value=0, step=8, label="Resize height to (0: by the scale)",
                                                elem_id="hires-resize-h")
                    with gr.Row():
                        hires_sampler = gr.Dropdown([SAME_SAMPLER, DEFAULT, *SAMPLERS], value=SAME_SAMPLER,
                                                    label="Hires sampler", elem_id="hires-sampler")
                        hires_sampler.preprocess = lambda payload: payload  # an API client's value: our validation's
                        hires_schedule_type = gr.Dropdown(
                            [SAME_SCHEDULER, *((label, key) for key, (label, _) in SCHEDULE_TYPES.items())],
                            value=SAME_SCHEDULER, label="Hires schedule type", elem_id="hires-schedule-type")
                        hires_schedule_type.preprocess = lambda payload: payload
                        hires_cfg = Slider(0, MAX_CFG, value=0, step=0.5, label="Hires CFG Scale (0: same)",
                                           elem_id="hires-cfg")
                    with gr.Row():
                        hires_prompt = gr.Textbox(value="", label="Hires prompt (empty: the prompt)", lines=2,
                                                  elem_id="hires-prompt")
                        hires_negative = gr.Textbox(value="", label="Hires negative prompt (empty: the negative prompt)",
                                                    lines=2, elem_id="hires-negative")
                units = controlnet.build("", width, height)
                go, stop, skip = live.buttons("", "generate")
                preview_every, preview_method = live.settings("")
            with gr.Column(scale=2):
                preview, gallery, info, summary, last_seed = results.column(ctx, "", "txt2img",
                    ("img2img", "inpaint", "upscale"))
    ctx.sent_notes["txt2img"] = sent
    ctx.txt2img_inputs[:] = [prompt, negative, width, height, steps, cfg, seed, batch, sampler, model]
    hires_more = [hires_resize_w, hires_resize_h, hires_sampler, hires_schedule_type, hires_cfg, hires_prompt,
                  hires_negative]
    ctx.controls["txt2img"] = dict(zip(sendto.TXT2IMG, [*ctx.txt2img_inputs, hires_scale, hires_upscaler,
                                                        hires_steps, hires_denoise, quantize, schedule_type,
                                                        clip_skip, extra, *extras, *hires_more]), **units,
                                batch_count=batch_count, preview_every=preview_every, preview_method=preview_method)
    # the newer arguments last (quantize, schedule type, clip skip, the Extra seed options, hires fix's resize,
    # sampler, schedule type, CFG and prompts, batch count, the live preview's settings, the ControlNet units and control
    # mode (ui/controlnet.py)): the API's positional order
    # of the older ones stays as it was
    live.shown_while_running(ctx, go, preview_every, preview_method, preview)  # before Generate: it runs first
    ctx.generate_events["txt2img"] = go.click(
        controlnet.appended(generate), [*ctx.txt2img_inputs, hires_scale, hires_upscaler, hires_steps, hires_denoise,
                                        quantize, schedule_type, clip_skip, *extras, *hires_more, batch_count,
                                        preview_every, preview_method, *units.values()],
        [gallery, info, summary, last_seed], api_name="generate", concurrency_id=GPU, concurrency_limit=1)
    live.wire(ctx, ctx.generate_events["txt2img"], stop, skip, summary, preview)
    reuse.click(lambda s: s if s is not None else -1, [last_seed], [seed], queue=False, api_visibility="private")
    gallery.select(show_selected, None, [info], api_visibility="private", show_progress="hidden")  # reads a file
