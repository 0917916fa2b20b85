"""The Gradio app: txt2img and System tabs over one Session, one GPU queue.

(No `from __future__ import annotations` here: Gradio finds its special `gr.Request` and
`gr.Progress` arguments through real annotations.)

Every GPU action (generate, free VRAM) is in the concurrency group "gpu" with a limit of 1, and the
queue has a maximum size (Gradio answers "queue is full" past it). Errors from the Python API reach
the user as `gr.Error` with user text escaped.
"""


import html
import uuid
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from lowvram_gen.device import GiB, format_size
from lowvram_gen.errors import Cancelled, LowVramError
from lowvram_gen.models.discover import model_choices
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.request import MAX_BATCH, MAX_CFG, MAX_SEED, MAX_STEPS, GenerationRequest
from lowvram_gen.samplers import DEFAULT, SAMPLERS
from lowvram_gen.ui.tabs.images import upscaler_choices
from lowvram_gen.session import Session
from lowvram_gen.ui.jobs import Job, Registry

GPU = "gpu"  # the one concurrency group of every action that uses the GPU
DEFAULTS = GenerationRequest()


@dataclass
class UiOptions:
    outdir: str
    model: str = "tiny"
    queue_size: int = 16
    models_folder: str | None = None


def _error(exc: BaseException) -> gr.Error:
    return gr.Error(html.escape(str(exc)))


def _client(request) -> str:
    """Jobs are keyed by Gradio's session (one per browser tab or API client)."""
    return getattr(request, "session_hash", None) or uuid.uuid4().hex


def _info(path: str) -> str:
    params, _ = read_png_metadata(path)
    return params or ""


def build_app(session: Session, options: UiOptions) -> gr.Blocks:
    jobs = Registry()
    state = {"last_seed": None}

    def run_job(fields: dict, request, progress):
        """Validate, queue behind the GPU, stream per-step progress, and return the outputs."""
        try:
            job_request = GenerationRequest(outdir=options.outdir, **fields).validated()
        except LowVramError as exc:
            raise _error(exc) from None
        client = _client(request)
        job = jobs.start(client, Job(lambda on_step, cancel: session.generate(job_request, on_step=on_step,
                                                                             cancel=cancel)))
        progress(0, desc="waiting for the GPU")
        try:
            for step, total in job.progress():
                progress((step, total), desc="denoising", unit="steps")
        finally:
            jobs.finish(client, job)
        if isinstance(job.error, Cancelled):
            kept = job.error.images
            return kept, (_info(kept[0]) if kept else ""), job.summary(), state["last_seed"]
        if isinstance(job.error, LowVramError):
            raise _error(job.error)
        if job.error is not None:
            raise job.error
        result = job.result
        state["last_seed"] = result.seeds[0]
        return result.images, _info(result.images[0]), job.summary(), result.seeds[0]

    def generate(prompt, negative_prompt=None, width=DEFAULTS.width, height=DEFAULTS.height,
                 steps=DEFAULTS.steps, cfg_scale=DEFAULTS.cfg_scale, seed=DEFAULTS.seed,
                 batch_size=DEFAULTS.batch_size, sampler=DEFAULTS.sampler, model=options.model,
                 hires_scale=DEFAULTS.hires_scale, hires_upscaler=DEFAULTS.hires_upscaler,
                 hires_steps=DEFAULTS.hires_steps, hires_denoise=DEFAULTS.hires_denoise,
                 request: gr.Request = None, progress=gr.Progress()):
        yield run_job(dict(prompt=prompt, negative_prompt=negative_prompt or "", width=width, height=height,
                           steps=steps, cfg_scale=cfg_scale, seed=seed, batch_size=batch_size,
                           sampler=sampler or DEFAULT, model=model or options.model, hires_scale=hires_scale,
                           hires_upscaler=hires_upscaler, hires_steps=hires_steps, hires_denoise=hires_denoise),
                      request, progress)

    def cancel(request: gr.Request):
        answer = jobs.answer_cancel(_client(request), "cancelling at the next step…")
        return gr.update() if answer is None else answer  # None: the summary already says how it ended

    def disconnected(request: gr.Request):
        """The tab was closed or lost its connection: stop its job at the next step."""
        jobs.cancel(_client(request))

    def show_selected(evt: gr.SelectData):
        value = evt.value
        path = value.get("image", {}).get("path") if isinstance(value, dict) else None
        return _info(path) if path else ""

    # -- System tab --------------------------------------------------------------------------
    def device_text():
        from lowvram_gen.oom import allocated_bytes

        d = session.device()
        used = allocated_bytes(d.kind)
        mem = (f"total {format_size(d.total_bytes)}, free {format_size(d.free_bytes)}, "
               f"usable {format_size(d.usable_bytes)}" if d.is_accelerator else "system RAM (no GPU)")
        loaded = session.model.name if session.model else "none"
        return (f"**{html.escape(d.name)}** ({d.kind}): {mem}. In use by lowvram-gen: {format_size(used)}. "
                f"Loaded model: `{html.escape(loaded)}`.")

    def set_memory(budget_gib, reserve_gib):
        session.vram_budget = int(budget_gib * GiB) if budget_gib else None
        session.reserve_vram = int(reserve_gib * GiB)
        return device_text()

    def plan_table(prompt, negative_prompt, width, height, steps, cfg_scale, seed, batch_size, sampler, model):
        try:
            request = GenerationRequest(prompt=prompt, width=width, height=height, steps=steps, cfg_scale=cfg_scale,
                                        seed=seed, batch_size=batch_size, sampler=sampler or DEFAULT,
                                        model=model or options.model).validated()
            result = session.plan(request)
        except LowVramError as exc:
            raise _error(exc) from None
        rows = [[e.name, format_size(e.estimate_bytes), "yes" if e.fits else "no", f"{e.width}x{e.height}", e.batch,
                 e.skipped_reason] for e in result.estimates]
        return rows, f"Would run: **{result.preset.name}** ({html.escape(result.reason)})"

    def presets_table():
        rows = []
        for p in session.presets().values():
            m = p.memory
            rows.append([p.name, p.rank, p.device, m.dtype, m.attention, m.offload, m.vae_slicing, m.vae_tiling,
                         m.fp8_storage, p.max_pixels, p.max_batch, p.description])
        forced = session.forced_preset()
        return rows, (f"Starting preset (from flags): **{forced.name}**" if forced
                      else "Starting preset: chosen by the planner for each job")

    def failures_table():
        from lowvram_gen import failures

        return [[r["device"], r["model"], r["preset"], r["pixels"], r["batch"]] for r in failures.load()]

    def forget_failures():
        from lowvram_gen import failures

        failures.forget()
        return failures_table()

    def free_vram():
        session.free()
        return device_text()

    with gr.Blocks(title="lowvram-gen") as app:
        gr.Markdown("# lowvram-gen\nStable Diffusion on small GPUs: a preset per job, and out-of-memory "
                    "recovery that finishes the job. The embedded `tiny` model has random weights and makes "
                    "abstract noise: pick a real model for real images.")
        with gr.Tab("txt2img"):
            with gr.Row():
                with gr.Column(scale=3):
                    prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt")
                    negative = gr.Textbox(label="Negative prompt", lines=2, elem_id="negative")
                    with gr.Row():
                        width = gr.Number(label="Width", value=DEFAULTS.width, precision=0, elem_id="width")
                        height = gr.Number(label="Height", value=DEFAULTS.height, precision=0, elem_id="height")
                        batch = gr.Slider(1, MAX_BATCH, value=1, step=1, label="Batch size", elem_id="batch")
                    with gr.Row():
                        steps = gr.Slider(1, MAX_STEPS, value=DEFAULTS.steps, step=1, label="Steps", elem_id="steps")
                        cfg = gr.Slider(0, MAX_CFG, value=DEFAULTS.cfg_scale, step=0.5, label="CFG scale")
                    with gr.Row():
                        seed = gr.Number(label="Seed (-1: random)", value=-1, precision=0, minimum=-1,
                                         maximum=MAX_SEED, elem_id="seed")
                        reuse = gr.Button("♻ last seed", size="sm")
                        sampler = gr.Dropdown([DEFAULT, *SAMPLERS], value=DEFAULT, label="Sampler", elem_id="sampler")
                        model = gr.Dropdown(model_choices(options.models_folder), value=options.model,
                                            allow_custom_value=True, label="Model (or type a hub id / path)", elem_id="model")
                    with gr.Accordion("Hires fix (a second pass at a larger size)", open=False):
                        with gr.Row():
                            hires_scale = gr.Slider(1, 4, value=1, step=0.05, label="Upscale by (1: off)")
                            hires_upscaler = gr.Dropdown(upscaler_choices(hires=True), value="latent",
                                                         allow_custom_value=True, label="Upscaler")
                        with gr.Row():
                            hires_steps = gr.Slider(0, MAX_STEPS, value=0, step=1, label="Hires steps (0: same)")
                            hires_denoise = gr.Slider(0, 1, value=0.7, step=0.01, label="Denoising strength")
                    with gr.Row():
                        go = gr.Button("Generate", variant="primary", elem_id="generate")
                        stop = gr.Button("Cancel", variant="stop", elem_id="cancel")
                with gr.Column(scale=2):
                    gallery = gr.Gallery(label="Results", columns=2, format="png", elem_id="gallery")
                    info = gr.Textbox(label="Image parameters", lines=4, interactive=False, elem_id="info")
                    summary = gr.Textbox(label="What ran", lines=2, interactive=False, elem_id="summary")
                    last_seed = gr.Number(visible=False, precision=0)
        inputs = [prompt, negative, width, height, steps, cfg, seed, batch, sampler, model]
        go.click(generate, [*inputs, hires_scale, hires_upscaler, hires_steps, hires_denoise],
                 [gallery, info, summary, last_seed], api_name="generate",
                 concurrency_id=GPU, concurrency_limit=1)
        stop.click(cancel, None, [summary], queue=False, api_visibility="private")
        reuse.click(lambda s: s if s is not None else -1, [last_seed], [seed], queue=False, api_visibility="private")
        gallery.select(show_selected, None, [info], queue=False, api_visibility="private")

        # -- more tabs: each is a build_*_tab(session, options, jobs) function in its own module --
        from lowvram_gen.ui.tabs.images import build_img2img_tab, build_upscale_tab

        build_img2img_tab(run_job, cancel, options)
        build_upscale_tab(session)
        from lowvram_gen.ui.tabs.vqgan import build_vqgan_tab

        build_vqgan_tab(session, options, jobs)

        with gr.Tab("System"):
            device_md = gr.Markdown(elem_id="device")
            with gr.Row():
                budget = gr.Slider(0, 80, value=(session.vram_budget or 0) / GiB, step=0.5,
                                   label="VRAM budget, GiB (0: no cap)")
                reserve = gr.Slider(0, 8, value=session.reserve_vram / GiB, step=0.1, label="Reserve for other programs, GiB")
            free = gr.Button("Free VRAM (unload the model)")
            gr.Markdown("### Plan for the current txt2img request")
            plan_btn = gr.Button("Estimate")
            plan_md = gr.Markdown()
            plan_df = gr.Dataframe(headers=["preset", "estimate", "fits", "size", "batch", "skipped"],
                                   interactive=False)
            gr.Markdown("### Presets")
            forced_md = gr.Markdown()
            presets_df = gr.Dataframe(headers=["name", "rank", "device", "dtype", "attention", "offload",
                                               "vae slicing", "vae tiling", "fp8", "max pixels", "max batch",
                                               "description"], interactive=False)
            gr.Markdown("### Remembered out-of-memory failures")
            failures_df = gr.Dataframe(headers=["device", "model", "preset", "pixels", "batch"], interactive=False)
            forget = gr.Button("Forget them")
            timer = gr.Timer(3.0)
        timer.tick(device_text, None, [device_md], queue=False, api_visibility="private", show_progress="hidden")
        budget.release(set_memory, [budget, reserve], [device_md], api_visibility="private")
        reserve.release(set_memory, [budget, reserve], [device_md], api_visibility="private")
        free.click(free_vram, None, [device_md], concurrency_id=GPU, concurrency_limit=1, api_visibility="private")
        plan_btn.click(plan_table, inputs, [plan_df, plan_md], api_visibility="private")
        forget.click(forget_failures, None, [failures_df], api_visibility="private")
        app.load(lambda: (device_text(), *presets_table(), failures_table()), None,
                 [device_md, presets_df, forced_md, failures_df], api_visibility="private")
        app.unload(disconnected)
    app.queue(max_size=options.queue_size, default_concurrency_limit=1)
    return app


def allowed_paths(outdir: str) -> list[str]:
    return [str(Path(outdir).resolve())]


__all__ = ["UiOptions", "allowed_paths", "build_app"]
