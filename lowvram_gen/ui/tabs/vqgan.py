"""The VQGAN-CLIP tab: prompts and options as VQGAN-CLIP users know them (⇅ swaps Width and Height, ♻ puts the shown
image's seed in Seed, 🎲 puts -1 there), a live preview every
save-every iterations, Cancel (stops at the next iteration and keeps the image so far), and the
retry report. Jobs share the app's queue and the session's lock: one GPU, one job. A refused or failed job says
why in "What ran" and leaves the preview as it was (ui/messages.py); the console says when a job starts and ends.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations.)
"""

from contextlib import closing

import gradio as gr

from lowvram_gen.engines.vqgan.request import (AUGMENTS, DEFAULT_AUGMENTS, INIT_NOISE, MAX_CUTN, MAX_INIT_WEIGHT,
                                     MAX_ITERATIONS, OPTIMIZERS, VqganRequest)
from lowvram_gen.errors import Cancelled, LowVramError
from lowvram_gen.jobs.progress import StepProgress
from lowvram_gen.jobs.registry import Job
from lowvram_gen.jobs.run import run as run_job
from lowvram_gen.ui import messages
from lowvram_gen.ui.context import GPU, TabContext, client_key, image_info, image_seed
from lowvram_gen.ui.widgets import ImagePath, Number, swap_button

DEFAULTS = VqganRequest()


def _key(request) -> str:
    """The client's job key: its Gradio session, so closing the tab cancels its VQGAN job too."""
    return client_key(request, ":vqgan")


def _playable(videos: list[str]) -> str | None:
    """The progress video if a browser plays it (mp4); an animated WebP stays a file in the outputs."""
    return next((v for v in videos if v.endswith(".mp4")), None)


def build(ctx: TabContext) -> None:

    session, options, jobs = ctx.session, ctx.options, ctx.jobs

    def run(prompts, image_prompt=None, init_image=None, width=256, height=256, iterations=100, save_every=10,
            cutn=DEFAULTS.cutn, cut_pow=DEFAULTS.cut_pow, lr=DEFAULTS.lr, optimizer=DEFAULTS.optimizer,
            augments=None, seed=-1, vqgan="tiny", clip="tiny", init_noise=DEFAULTS.init_noise,
            init_weight=DEFAULTS.init_weight, video=False, request: gr.Request = None, progress=gr.Progress()):
        try:
            job_request = VqganRequest(
                prompt=prompts or "", image_prompts=(image_prompt,) if image_prompt else (),
                init_image=init_image or None, init_noise=init_noise or DEFAULTS.init_noise, init_weight=init_weight,
                width=width, height=height, iterations=iterations, save_every=save_every, cutn=cutn, cut_pow=cut_pow,
                lr=lr, optimizer=optimizer or DEFAULTS.optimizer,
                augments=tuple(augments) if augments is not None else DEFAULTS.augments, seed=seed,
                vqgan=vqgan or "tiny", clip=clip or "tiny", video=bool(video), outdir=options.outdir,
            ).validated()
        except LowVramError as exc:
            yield gr.skip(), gr.skip(), messages.failure(exc, request), gr.skip()
            return
        key = _key(request)

        def work(on_step, cancel):
            return session.generate_vqgan(job_request, on_step=on_step, cancel=cancel,
                                  on_image=lambda path, iteration, final: job.events.put(("image", path, iteration)))

        job = Job(work)
        try:
            with closing(run_job(jobs, key, job, "vqgan", job_request, steps=job_request.iterations, unit="iterations",
                                 bar_unit="it", progress=StepProgress(unit="Iteration"),
                                 on_progress=lambda fraction, line: progress(fraction, desc=line))) as events:
                for event in events:
                    if event is None:  # a tick: a yield where gradio can close this generator (a cancel)
                        yield (gr.skip(),) * 4
                    elif event[0] == "image":
                        yield event[1], gr.update(), f"iteration {event[2]} of {job_request.iterations}", gr.update()
        except LowVramError as exc:  # the job failed with a user error: "What ran" says why
            yield gr.skip(), gr.skip(), messages.failure(exc, request), gr.skip()
            return
        summary = messages.for_ui(job.summary())
        if isinstance(job.error, Cancelled):
            kept = job.error.images
            yield (kept[0] if kept else None), (image_info(kept[0]) if kept else ""), summary, None
            return
        result = job.result
        yield result.images[0], image_info(result.images[0]), summary, _playable(result.videos)

    def cancel(request: gr.Request):
        answer = jobs.answer_cancel(_key(request), "cancelling at the next iteration…")
        return gr.update() if answer is None else messages.for_ui(answer)  # None: the summary already says how it ended

    def disconnected(request: gr.Request):
        jobs.cancel(_key(request))

    with gr.Tab("VQGAN-CLIP"):
        gr.Markdown("Prompts as in VQGAN-CLIP: `text:weight:stop` separated by `|` (negative weights push away). "
                    "`tiny` models have random weights and make noise: give a VQGAN "
                    "(`…/vqgan_imagenet_f16_16384.ckpt` with its `.yaml`) and a CLIP (`ViT-B/32`) for real images.")
        with gr.Row():
            with gr.Column(scale=3):
                prompts = gr.Textbox(label="Prompts", lines=2, elem_id="vq-prompts",
                                     placeholder="a lighthouse at dusk:1|oil painting:0.5|blurry:-0.5")
                with gr.Row():
                    image_prompt = ImagePath("Image prompt (optional)", elem_id="vq-image-prompt")
                    init_image = ImagePath("Init image (optional)", elem_id="vq-init")
                with gr.Row():
                    width = Number("Width (multiple of 16)", 256, elem_id="vq-width")
                    height = Number("Height (multiple of 16)", 256, elem_id="vq-height")
                    swap = gr.Button("⇅", elem_id="vq-swap-size", scale=0, min_width=40)
                    seed = Number("Seed (-1: random)", -1, elem_id="vq-seed")
                    with gr.Column(scale=0, min_width=110):
                        reuse = gr.Button("♻ last seed", size="sm", elem_id="vq-reuse-seed")
                        random = gr.Button("🎲 random", size="sm", elem_id="vq-random-seed")
                with gr.Row():
                    iterations = gr.Slider(1, MAX_ITERATIONS, value=100, step=1, label="Iterations",
                                           elem_id="vq-iterations")
                    save_every = gr.Slider(0, 500, value=10, step=1, label="Preview every N iterations (0: end only)",
                                           elem_id="vq-save-every")
                    video = gr.Checkbox(label="Progress video of the previews", value=False, elem_id="vq-video")
                with gr.Accordion("Cutouts, optimiser, models", open=False):
                    with gr.Row():
                        cutn = gr.Slider(1, MAX_CUTN, value=DEFAULTS.cutn, step=1, label="Cutouts (cutn)")
                        cut_pow = gr.Slider(0.1, 4, value=DEFAULTS.cut_pow, step=0.1, label="Cut power")
                    with gr.Row():
                        lr = gr.Number(label="Learning rate", value=DEFAULTS.lr)
                        optimizer = gr.Dropdown(list(OPTIMIZERS), value=DEFAULTS.optimizer, label="Optimizer")
                    augments = gr.CheckboxGroup([(f"{k} {v}", k) for k, v in AUGMENTS.items()],
                                                value=list(DEFAULT_AUGMENTS), label="Augmentations")
                    with gr.Row():
                        vqgan = gr.Textbox(label="VQGAN (tiny, folder, hub id or .ckpt)", value="tiny",
                                           elem_id="vq-vqgan")
                        clip = gr.Textbox(label="CLIP (tiny, ViT-B/32, hub id or folder)", value="tiny",
                                          elem_id="vq-clip")
                    with gr.Row():
                        init_noise = gr.Dropdown(list(INIT_NOISE), value=DEFAULTS.init_noise,
                                                 label="Init noise (without an init image)")
                        init_weight = gr.Number(label="Init weight (pull towards the init image)",
                                                value=DEFAULTS.init_weight, minimum=0, maximum=MAX_INIT_WEIGHT)
                with gr.Row():
                    go = gr.Button("Generate", variant="primary", elem_id="vq-generate")
                    stop = gr.Button("Cancel", variant="stop", elem_id="vq-cancel")
            with gr.Column(scale=2):
                preview = gr.Image(label="Preview / result", type="filepath", interactive=False, format="png",
                                   elem_id="vq-preview")
                info = gr.Textbox(label="Image parameters", lines=4, interactive=False, elem_id="vq-info")
                summary = gr.Textbox(label="What ran", lines=2, interactive=False, elem_id="vq-summary")
                movie = gr.Video(label="Progress video", interactive=False, elem_id="vq-video-out")
    go.click(run, [prompts, image_prompt, init_image, width, height, iterations, save_every, cutn, cut_pow, lr,
                   optimizer, augments, seed, vqgan, clip, init_noise, init_weight, video],
             [preview, info, summary, movie], api_name="vqgan",
             concurrency_id=GPU, concurrency_limit=1, show_progress_on=[preview])  # one progress line, not four
    swap_button(swap, width, height)
    # ♻: the seed of the image shown (the browser's last: each browser sees its own); read from its file, so queued
    reuse.click(lambda path: (image_seed(path) if path else None) or -1, [preview], [seed], api_visibility="private",
                show_progress="hidden")
    random.click(lambda: -1, None, [seed], queue=False, api_visibility="private")
    stop.click(cancel, None, [summary], queue=False, api_visibility="private")
    ctx.app.unload(disconnected)  # a closed tab stops its VQGAN job at the next iteration
