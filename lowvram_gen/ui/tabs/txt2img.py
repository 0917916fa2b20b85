"""The txt2img tab: prompt (with LoRA/embedding pickers) with Generate, Interrupt, Skip and the progress line beside
it, size (with ⇅), batch count and size, steps, CFG, clip skip, seed (with ♻ last seed and 🎲), model, the weights'
storage (Quantize: as the preset says, none, int8, int4), hires fix; the live preview above the gallery
(ui/live.py); the gallery shows each image whole (object-fit: contain), whatever its aspect, and sends the selected
one to img2img or Upscale.
Hires fix has A1111 1.10's controls: Upscale by or Resize width/height to, the upscaler (A1111's names), steps,
denoising strength, and the second pass's own sampler, schedule type, CFG scale and prompts ("Use same ...", 0 and
empty: the first pass's). The controls start at the documented defaults; each browser gets its own last values back (ui/remembered.py).
The gallery shows results only (interactive=False: no "Drop Media Here"); selecting an image still works.
Beside the Model box, Refresh rescans the models; above the prompt, a note says what a Send to did not use.
The controls it shares with img2img and Inpaint are ui/form.py's; what is its own here is hires fix, the
gallery's selected image's parameters, and the Generate handler with the API's order of its inputs.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

import gradio as gr

from lowvram_gen.request import SAME_SAMPLER, SAME_SCHEDULER
from lowvram_gen.ui import xyz
from lowvram_gen.ui.context import TabContext, image_info
from lowvram_gen.ui.form import DEFAULTS, SdForm, job_fields
from lowvram_gen.ui.widgets import AS_PRESET


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
                 subseed_strength=DEFAULTS.subseed_strength, seed_resize_from_w=DEFAULTS.seed_resize_from_w,
                 seed_resize_from_h=DEFAULTS.seed_resize_from_h, hires_resize_w=DEFAULTS.hires_resize_w,
                 hires_resize_h=DEFAULTS.hires_resize_h, hires_sampler=SAME_SAMPLER,
                 hires_schedule_type=SAME_SCHEDULER, hires_cfg=DEFAULTS.hires_cfg, hires_prompt=DEFAULTS.hires_prompt,
                 hires_negative=DEFAULTS.hires_negative, batch_count=DEFAULTS.batch_count, preview_every=0,
                 preview_method="auto", tiling=DEFAULTS.tiling, styles=DEFAULTS.styles, refiner=None,
                 refiner_switch_at=DEFAULTS.refiner_switch_at,
                 script=xyz.NONE, xyz_x_type="Seed", xyz_x_values="", xyz_y_type="Nothing", xyz_y_values="",
                 xyz_z_type="Nothing", xyz_z_values="", xyz_draw_legend=True, xyz_include_lone_images=True,
                 xyz_include_sub_grids=False, xyz_no_fixed_seeds=False, xyz_margin=0, *units,
                 request: gr.Request = None, progress=gr.Progress()):
        yield from ctx.run_job("txt2img", job_fields(
            options, units, prompt=prompt, negative_prompt=negative_prompt, width=width, height=height, steps=steps,
            cfg_scale=cfg_scale, seed=seed, batch_size=batch_size, sampler=sampler, model=model,
            hires_scale=hires_scale, hires_upscaler=hires_upscaler, hires_steps=hires_steps,
            hires_denoise=hires_denoise, quantize=quantize, schedule_type=schedule_type, clip_skip=clip_skip,
            subseed=subseed, subseed_strength=subseed_strength, seed_resize_from_w=seed_resize_from_w,
            seed_resize_from_h=seed_resize_from_h, hires_resize_w=hires_resize_w or DEFAULTS.hires_resize_w,
            hires_resize_h=hires_resize_h or DEFAULTS.hires_resize_h, hires_sampler=hires_sampler,
            hires_schedule_type=hires_schedule_type, hires_cfg=hires_cfg or DEFAULTS.hires_cfg,
            hires_prompt=hires_prompt or DEFAULTS.hires_prompt,
            hires_negative=hires_negative or DEFAULTS.hires_negative, batch_count=batch_count,
            tiling=bool(tiling), styles=tuple(styles or ()), refiner=refiner or None,
            refiner_switch_at=DEFAULTS.refiner_switch_at if refiner_switch_at is None else refiner_switch_at),
            request, progress,
            preview_every, preview_method, xyz.grid_maker("txt2img", dict(zip(xyz.INPUTS, (
                script, xyz_x_type, xyz_x_values, xyz_y_type, xyz_y_values, xyz_z_type, xyz_z_values,
                xyz_draw_legend, xyz_include_lone_images, xyz_include_sub_grids, xyz_no_fixed_seeds, xyz_margin)))))

    form = SdForm(ctx, "txt2img", "")
    with gr.Tab("txt2img", id="txt2img"):
        form.note()
        form.top(3, 2)
        with gr.Row():
            with gr.Column(scale=3):
                form.settings(model_label="Model (or type a hub id / path)", hires=True, tiling=True,
                              refiner=True)
                xyz.build(form.controls, "", "txt2img")  # A1111's Script at the bottom
            with gr.Column(scale=2):
                out = form.results(("img2img", "inpaint", "upscale"))
    c = form.controls
    # the System tab's Estimate plans these
    ctx.txt2img_inputs[:] = [c[k] for k in ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale",
                                            "seed", "batch_size", "sampler", "model")]
    # the newer arguments last (quantize, schedule type, clip skip, the Extra seed options, hires fix's resize,
    # sampler, schedule type, CFG and prompts, batch count, the live preview's settings, the ControlNet units and
    # control mode (ui/controlnet.py)): the API's positional order of the older ones stays as it was
    form.generate(generate, [*ctx.txt2img_inputs, "hires_scale", "hires_upscaler", "hires_steps", "hires_denoise",
                             "quantize", "schedule_type", "clip_skip", "subseed", "subseed_strength",
                             "seed_resize_from_w", "seed_resize_from_h", "hires_resize_w", "hires_resize_h",
                             "hires_sampler", "hires_schedule_type", "hires_cfg", "hires_prompt", "hires_negative",
                             "batch_count", "preview_every", "preview_method", "tiling", "styles", "refiner",
                             "refiner_switch_at", *xyz.INPUTS],
                  api_name="generate")
    # queued: it reads a file
    out.gallery.select(show_selected, None, [out.info], api_visibility="private", show_progress="hidden")
