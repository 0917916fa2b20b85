"""The img2img tab: an init image, A1111's Resize mode, and the txt2img controls (Quantize, Clip skip, Batch count
included; no hires fix);
it shares txt2img's job runner (queue, progress, Interrupt, Skip, live preview: ui/live.py), its LoRA/embedding
pickers and Ctrl+Enter. The width and
height follow the init image (rounded down to a multiple of 8). The controls start at the documented defaults,
each browser gets its own last values back (ui/remembered.py); the gallery (results only, no uploads) sends the
selected image to Upscale. The controls it shares with txt2img and Inpaint are ui/form.py's; the init image and
the Generate handler (with the API's order of its inputs) are its own.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

import gradio as gr

from lowvram_gen.engines.sd.edit import img2img_as_edit
from lowvram_gen.ui import messages, xyz
from lowvram_gen.ui.context import TabContext
from lowvram_gen.ui.form import DEFAULTS, SdForm, job_fields
from lowvram_gen.ui.widgets import AS_PRESET, ImagePath


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

    def img2img(init_image, prompt, negative_prompt=None, strength=DEFAULTS.strength, width=DEFAULTS.width,
                height=DEFAULTS.height, steps=DEFAULTS.steps, cfg_scale=DEFAULTS.cfg_scale, seed=DEFAULTS.seed,
                batch_size=DEFAULTS.batch_size, sampler=DEFAULTS.sampler, model=None, quantize=AS_PRESET,
                schedule_type=DEFAULTS.schedule_type, clip_skip=DEFAULTS.clip_skip, subseed=DEFAULTS.subseed,
                subseed_strength=DEFAULTS.subseed_strength, seed_resize_from_w=DEFAULTS.seed_resize_from_w,
                seed_resize_from_h=DEFAULTS.seed_resize_from_h, batch_count=DEFAULTS.batch_count, preview_every=0,
                preview_method="auto", img2img_fix_steps=DEFAULTS.img2img_fix_steps,
                resize_mode=DEFAULTS.resize_mode, tiling=DEFAULTS.tiling, styles=DEFAULTS.styles, refiner=None,
                refiner_switch_at=DEFAULTS.refiner_switch_at, script=xyz.NONE, xyz_x_type="Seed", xyz_x_values="", xyz_y_type="Nothing", xyz_y_values="",
                xyz_z_type="Nothing", xyz_z_values="", xyz_draw_legend=True, xyz_include_lone_images=True,
                xyz_include_sub_grids=False, xyz_no_fixed_seeds=False, xyz_margin=0,
                loopback_loops=4, loopback_final_denoising_strength=0.5, loopback_denoising_curve="Linear",
                loopback_append_interrogation="None", sd_upscale_overlap=64, sd_upscale_upscaler="None",
                sd_upscale_scale_factor=2.0, *units,
                request: gr.Request = None, progress=gr.Progress()):
        if not init_image:
            yield gr.skip(), gr.skip(), messages.failure("choose an init image first", request), gr.skip()
            return
        # an editing model (Qwen-Image-Edit, Kontext, Flux.2) edits the init image: engines/sd/edit.py
        yield from ctx.run_job("img2img", img2img_as_edit(job_fields(
            options, units, prompt=prompt, negative_prompt=negative_prompt, init_image=init_image, strength=strength,
            width=width, height=height, steps=steps, cfg_scale=cfg_scale, seed=seed, batch_size=batch_size,
            sampler=sampler, model=model, quantize=quantize, schedule_type=schedule_type, clip_skip=clip_skip,
            batch_count=batch_count, subseed=subseed, subseed_strength=subseed_strength,
            seed_resize_from_w=seed_resize_from_w, seed_resize_from_h=seed_resize_from_h,
            img2img_fix_steps=bool(img2img_fix_steps), resize_mode=resize_mode or DEFAULTS.resize_mode,
            tiling=bool(tiling), styles=tuple(styles or ()), refiner=refiner or None,
            refiner_switch_at=DEFAULTS.refiner_switch_at if refiner_switch_at is None else refiner_switch_at)),
            request,
            progress, preview_every, preview_method, xyz.grid_maker("img2img", dict(zip(xyz.inputs("img2img"), (
                script, xyz_x_type, xyz_x_values, xyz_y_type, xyz_y_values, xyz_z_type, xyz_z_values,
                xyz_draw_legend, xyz_include_lone_images, xyz_include_sub_grids, xyz_no_fixed_seeds, xyz_margin,
                loopback_loops, loopback_final_denoising_strength, loopback_denoising_curve,
                loopback_append_interrogation, sd_upscale_overlap, sd_upscale_upscaler, sd_upscale_scale_factor)))))

    form = SdForm(ctx, "img2img", "i2i-", unnamed=("batch", "cfg"))
    with gr.Tab("img2img", id="img2img"):
        form.note()
        form.top(2, 1)
        with gr.Row():
            with gr.Column(scale=3):
                init = form.controls["init_image"] = ImagePath("Init image", elem_id="i2i-init")
                form.strength("Denoising strength (0 keeps the image)")
                form.resize_mode()
                form.settings(tiling=True, refiner=True)
                xyz.build(form.controls, "i2i-", "img2img")  # A1111's Script at the bottom
            with gr.Column(scale=2):
                form.results(("inpaint", "upscale"))
    c = form.controls
    init.change(size_from, [init], [c["width"], c["height"]], queue=False, api_visibility="private")
    # the newer arguments last (batch count, the live preview's settings, the ControlNet units and control mode:
    # ui/controlnet.py): older positional calls keep working
    form.generate(img2img, ["init_image", "prompt", "negative_prompt", "strength", "width", "height", "steps",
                            "cfg_scale", "seed", "batch_size", "sampler", "model", "quantize", "schedule_type",
                            "clip_skip", "subseed", "subseed_strength", "seed_resize_from_w", "seed_resize_from_h",
                            "batch_count", "preview_every", "preview_method", "img2img_fix_steps", "resize_mode",
                            "tiling", "styles", "refiner", "refiner_switch_at", *xyz.inputs("img2img")],
                  api_name="img2img")
