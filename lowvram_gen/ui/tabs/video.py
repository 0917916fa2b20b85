"""The Video tab (issue 33): text- and image-to-video with Wan 2.1 / 2.2 and LTX-Video, as `lowvram-gen video` runs it.

Controls: prompt and negative prompt with Generate, Interrupt and the progress line beside them; an init image (its
first frame: image-to-video); frames, fps, width and height (with ⇅); steps, CFG scale, and CFG 2 (Wan 2.2 A14B's
low-noise expert's, shown only for a two-expert model); seed (♻ last seed, 🎲); the model (the video models found:
folders whose family record is a video one; any other spec may be typed, as other tabs take models), the memory
preset (or the planner's pick) and Quantize; "save frames" (PNGs beside the clip) and "allow upscale" (a lower
resolution upscaled after, as a last rung); the live preview settings. Picking a model sets frames, fps, size, steps
and CFG to its own (its record's Video facts and sampling defaults, read offline from its folder).

Generate runs `Session.generate(request)` with `request.frames` set, through jobs.run as every tab's job runs: the
same queue (the "gpu" concurrency group, one job at a time, behind the other tabs' and the API's jobs), registered
under this browser's key (with ":video", so this browser's image tab job and its video job never unregister each
other), the progress line (step and ETA, or the jobs ahead) under Interrupt, and the live preview (the middle frame
through the latent-to-RGB approximation: lowvram_gen/preview.py) every N steps above the player. Interrupt stops the
clip at the next step: the engine decodes and saves it as it was, and the player shows it. The clip plays in a
gr.Video with its parameters text (the file's own) and What ran (the summary and the warnings); a refused or failed
job says why in What ran and leaves the player as it was.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real annotations.)
"""

from contextlib import closing
from pathlib import Path
from typing import NamedTuple

import gradio as gr

from lowvram_gen import families
from lowvram_gen.errors import Cancelled, LowVramError
from lowvram_gen.jobs.progress import StepProgress
from lowvram_gen.jobs.registry import Job
from lowvram_gen.jobs.run import run as run_job
from lowvram_gen.preview import check_method
from lowvram_gen.request import MAX_CFG, MAX_STEPS, GenerationRequest
from lowvram_gen.ui import live, messages
from lowvram_gen.ui.context import GPU, TabContext, check_preview_every, client_key
from lowvram_gen.ui.widgets import (AS_PRESET, ImagePath, Number, Quantize, Slider, quantize_field, seed_buttons,
                                    swap_button)

PREFIX = "vid-"
AUTO_PRESET = "chosen by the planner"  # the preset box's choice that leaves the preset to the planner (preset=None)
CLIP_SUFFIXES = (".mp4", ".webm", ".webp", ".gif")
PLAYABLE = (".mp4", ".webm")  # what a browser's <video> plays; an animated WebP (no PyAV) stays a file
# the video options' CLI flags as this tab names them (ui/messages.py says the shared ones)
FLAGS = {"--frames": "the Frames box", "--fps": "the FPS box", "--cfg-2": "the CFG 2 slider",
         "--cfg": "the CFG scale slider", "--init-image": "the Init image", "--save-frames": "the Save frames box",
         "--allow-upscale": "the Allow upscale box", "--negative": "the Negative prompt"}


class VideoModel(NamedTuple):
    """What the tab knows of a video model before loading it: its record, its Video facts, its steps and CFG."""

    family: families.Family
    video: families.Video
    steps: int
    cfg: float


def video_model(spec) -> VideoModel | None:
    """The video facts of the model `spec` names, read offline (a local diffusers folder's model_index.json, a hub
    id's in the HF cache, a built-in's record); None for an image model or one that cannot be told without loading."""
    from lowvram_gen.families import sampling
    from lowvram_gen.families.spec import index_folder, record_of_index

    text = str(spec or "").strip()
    if not text:
        return None
    path = Path(text).expanduser()
    if not path.is_dir() and (path.exists() or text.startswith((".", "/", "~"))):
        return None  # a single file, or a path that is not there
    try:
        folder = index_folder(text)
        facts = sampling.folder_facts(text, folder)
    except (OSError, ValueError):
        return None
    record = (record_of_index(facts.model_index) if facts.model_index else None) or families.by_name(text)
    if record is None or not record.is_video:
        return None
    defaults = record.default_sampling(facts)
    return VideoModel(record, record.video_facts(facts), defaults.steps, defaults.cfg)


def model_choices(options) -> list[str]:
    """The Model list: the video models among those the other tabs list (the models folder, the HF cache), the UI's
    own model first when it is one."""
    from lowvram_gen.models.discover import model_choices as all_models

    found = [m for m in all_models(options.models_folder) if video_model(m) is not None]
    first = [options.model] if video_model(options.model) is not None else []
    return list(dict.fromkeys([*first, *found]))


def for_ui(text: str) -> str:
    """A message of the Python API as this tab says it: the shared flags (ui/messages.py), then the video ones."""
    text = messages.for_ui(text)
    for flag in sorted(FLAGS, key=len, reverse=True):
        text = text.replace(f"pass {flag}", f"fill in {FLAGS[flag]}").replace(flag, FLAGS[flag])
    return text


def clip_info(path: str | None) -> tuple[str, int | None]:
    """(parameters text, seed) of a clip as its JSON sidecar keeps them (lowvram_gen/video_out.py); ("", None)
    without one."""
    from lowvram_gen.video_out import read_clip

    if not path:
        return "", None
    parameters, meta = read_clip(path)
    seed = (meta or {}).get("seed")
    return parameters or "", seed if isinstance(seed, int) else None


def kept_clip(error: Cancelled) -> str | None:
    """The clip an interrupted job saved (decoded as it was): the error's `video`, else the clip among its files."""
    video = getattr(error, "video", None)
    if video:
        return str(video)
    return next((str(p) for p in error.images if str(p).lower().endswith(CLIP_SUFFIXES)), None)


def playable(path: str | None) -> str | None:
    return path if path and path.lower().endswith(PLAYABLE) else None


def _key(request) -> str:
    return client_key(request, ":video")


def build(ctx: TabContext) -> None:
    session, options, jobs = ctx.session, ctx.options, ctx.jobs
    choices = model_choices(options)
    first_model = choices[0] if choices else ""
    first = video_model(first_model)
    video = first.video if first is not None else families.Video(temporal=4, spatial=8, patch=2, frames=81, fps=16.0,
                                                                  size=(832, 480))  # Wan 2.1's, till a model is picked
    steps0, cfg0 = (first.steps, first.cfg) if first is not None else (50, 5.0)

    def generate(prompt, negative_prompt=None, init_image=None, frames=video.frames, fps=video.fps,
                 width=video.size[0], height=video.size[1], steps=steps0, cfg_scale=cfg0, cfg_scale_2=None, seed=-1,
                 model=first_model, preset=AUTO_PRESET, quantize=AS_PRESET, save_frames=False, allow_upscale=False,
                 preview_every=0, preview_method="auto", request: gr.Request = None, progress=gr.Progress()):
        known = video_model(model)
        two_experts = known is not None and known.video.experts
        try:
            job_request = GenerationRequest(
                prompt=prompt or "", negative_prompt=negative_prompt or "", init_image=init_image or None,
                frames=0 if frames is None else frames, fps=fps or None, width=width, height=height,
                steps=steps, cfg_scale=cfg_scale,
                cfg_scale_2=(cfg_scale_2 if two_experts or known is None else None),
                seed=-1 if seed is None else seed, model=model or options.model,
                preset=None if preset in (None, "", AUTO_PRESET) else preset, quantize=quantize_field(quantize),
                save_frames=bool(save_frames), allow_upscale=bool(allow_upscale), rng=ctx.rng,
                outdir=options.outdir).validated()
            every = check_preview_every(0 if preview_every is None else preview_every)
            how = check_method(preview_method or "auto")
        except LowVramError as exc:
            yield gr.skip(), gr.skip(), for_ui(messages.failure(exc, request)), gr.skip()
            return
        key = _key(request)

        def work(on_step, cancel):
            return session.generate(job_request, on_step=on_step, cancel=cancel, on_preview=job.on_preview,
                                    preview_every=every, preview_method=how)

        job = Job(work)
        # the browser reads the job's line (the refresh below); an API client gets it through gradio's progress
        said = None if messages.from_browser(request) else lambda fraction, line: progress(fraction, desc=line)
        try:
            with closing(run_job(jobs, key, job, "video", job_request, on_progress=said,
                                 progress=StepProgress())) as events:
                for _ in events:
                    yield (gr.skip(),) * 4  # a tick or a step: where gradio can close this handler (a cancel)
        except LowVramError as exc:  # the job failed with a user error: "What ran" says why
            yield gr.skip(), gr.skip(), for_ui(messages.failure(exc, request)), gr.skip()
            return
        summary = for_ui(job.summary() or "")
        clip = kept_clip(job.error) if isinstance(job.error, Cancelled) else job.result.video
        if clip is None:  # cancelled before its first step: no clip, the player stays as it was
            yield gr.skip(), gr.skip(), summary, gr.skip()
            return
        parameters, seed = clip_info(clip)  # an interrupted job's clip, decoded as it was, is shown as a finished one
        yield playable(clip), parameters, summary, gr.skip() if seed is None else seed

    def cancel(request: gr.Request):
        answer = jobs.answer_cancel(_key(request), "cancelling at the next step…")
        return gr.update() if answer is None else for_ui(answer)  # None: the summary already says how it ended

    def disconnected(request: gr.Request):
        jobs.cancel(_key(request))

    with gr.Tab("Video", id="video"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id=f"{PREFIX}prompt",
                                    placeholder="a red boat drifting on a calm lake at dawn")
                negative = gr.Textbox("", label="Negative prompt", lines=2, elem_id=f"{PREFIX}negative")
            with gr.Column(scale=1, min_width=160):
                go = gr.Button("Generate", variant="primary", size="lg", elem_id=f"{PREFIX}generate",
                               elem_classes=["lowvram-generate"])
                stop = gr.Button("Interrupt", variant="stop", size="sm", elem_id=f"{PREFIX}cancel", min_width=70)
                line = live.progress_line(PREFIX)
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                with gr.Row():  # the model first: picking it sets the controls below to its own
                    model = gr.Dropdown(choices, value=first_model, allow_custom_value=True, scale=3,
                                        label="Video model (Wan 2.1 / 2.2, LTX-Video)", elem_id=f"{PREFIX}model",
                                        info="the video folders found (models folder, HF cache); or type a "
                                             "diffusers folder or hub id")
                    refresh = gr.Button("Refresh", size="sm", scale=0, min_width=80, elem_id=f"{PREFIX}model-refresh")
                with gr.Row():
                    preset = gr.Dropdown([AUTO_PRESET, *session.presets()], value=AUTO_PRESET,
                                         label="Memory preset", elem_id=f"{PREFIX}preset")
                    preset.preprocess = lambda payload: payload  # another name reaches our validation, which says it
                    quantize = Quantize(AS_PRESET, f"{PREFIX}quantize")
                init = ImagePath("Init image (optional: image-to-video, its first frame)", height=160,
                                 elem_id=f"{PREFIX}init")
                with gr.Row():
                    frames = Number("Frames (Wan: 4k+1, LTX: 8k+1; 0: the model's)", video.frames,
                                    elem_id=f"{PREFIX}frames")
                    fps = Number("FPS (0: the model's)", video.fps, elem_id=f"{PREFIX}fps")
                    width = Number("Width", video.size[0], elem_id=f"{PREFIX}width")
                    height = Number("Height", video.size[1], elem_id=f"{PREFIX}height")
                    swap = gr.Button("⇅", elem_id=f"{PREFIX}swap-size", scale=0, min_width=40)
                with gr.Row():
                    steps = Slider(1, MAX_STEPS, value=steps0, step=1, label="Steps", elem_id=f"{PREFIX}steps")
                    cfg = Slider(0, MAX_CFG, value=cfg0, step=0.5, label="CFG scale", elem_id=f"{PREFIX}cfg")
                    cfg_2 = Slider(0, MAX_CFG, value=video.cfg_2 or cfg0, step=0.5,
                                   label="CFG 2 (the low-noise expert's)", visible=bool(video.experts),
                                   elem_id=f"{PREFIX}cfg-2")
                with gr.Row():
                    seed = Number("Seed (-1: random)", -1, elem_id=f"{PREFIX}seed")
                    with gr.Column(scale=0, min_width=110):
                        reuse = gr.Button("♻ last seed", size="sm", elem_id=f"{PREFIX}reuse-seed")
                        random = gr.Button("🎲 random", size="sm", elem_id=f"{PREFIX}random-seed")
                    save_frames = gr.Checkbox(False, label="Save frames", info="the frames as PNGs beside the clip",
                                              elem_id=f"{PREFIX}save-frames")
                    allow_upscale = gr.Checkbox(False, label="Allow upscale",
                                                info="where the size cannot fit: a smaller one, upscaled after",
                                                elem_id=f"{PREFIX}allow-upscale")
                preview_every, preview_method = live.settings(PREFIX)
            with gr.Column(scale=2):
                shown = live.image(PREFIX)
                player = gr.Video(label="Clip", interactive=False, autoplay=True, loop=True,
                                  elem_id=f"{PREFIX}player")
                info = gr.Textbox(label="Clip parameters", lines=4, interactive=False, elem_id=f"{PREFIX}info")
                summary = gr.Textbox(label="What ran", lines=2, interactive=False, elem_id=f"{PREFIX}summary")
                last_seed = gr.Number(visible=False, precision=0, elem_id=f"{PREFIX}last-seed")

    _shown_while_running(ctx, go, preview_every, preview_method, shown, line)  # before Generate: runs first
    event = go.click(generate, [prompt, negative, init, frames, fps, width, height, steps, cfg, cfg_2, seed, model,
                                preset, quantize, save_frames, allow_upscale, preview_every, preview_method],
                     [player, info, summary, last_seed], api_name="video", concurrency_id=GPU, concurrency_limit=1,
                     show_progress="hidden")  # the tab's one progress line is the refresh's
    ctx.generate_events["video"] = event
    _end_of_run(event, shown, line)
    stop.click(cancel, None, [summary], queue=False, api_visibility="private")
    seed_buttons(reuse, random, seed, last_seed)
    swap_button(swap, width, height)
    model.input(_on_pick, [model, cfg_2], [frames, fps, width, height, steps, cfg, cfg_2], queue=False,
                api_visibility="private", show_progress="hidden")
    refresh.click(lambda: gr.Dropdown(choices=model_choices(options)), None, [model], api_visibility="private",
                  show_progress="hidden")
    ctx.app.unload(disconnected)  # a closed tab stops its video job at the next step


def _on_pick(spec, cfg_2):
    """Picking a model sets frames, fps, size, steps and CFG to its own, and shows CFG 2 for a two-expert model; a
    model that cannot be told offline leaves them as they are."""
    known = video_model(spec)
    if known is None:
        return (gr.skip(),) * 6 + (gr.Slider(visible=True),)  # unknown: CFG 2 shown, sent, the engine decides
    v = known.video
    two = bool(v.experts)
    return (v.frames, v.fps, v.size[0], v.size[1], known.steps, known.cfg,
            gr.Slider(value=v.cfg_2 if two and v.cfg_2 is not None else cfg_2, visible=two))


def _shown_while_running(ctx: TabContext, go, every, method, preview: tuple, line) -> None:
    """As ui/live.py's for the image tabs, keyed by this tab's job: Generate shows the preview (when previews are
    on) and starts the timer whose ticks send the progress line and the newest preview."""
    image, timer, count = preview

    def start(every_n, how):
        return gr.Image(value=None, visible=bool(every_n) and how != "off"), gr.Timer(active=True), 0, ""

    def refresh(seen, request: gr.Request):
        key = _key(request)
        text = live.line_html(live.progress_text(ctx, key))
        job = ctx.jobs.get(key)
        if job is None or job.preview is None or job.previews == seen:
            return gr.skip(), gr.skip(), text
        return job.preview, job.previews, text

    go.click(start, [every, method], [image, timer, count, line], queue=False, api_visibility="private",
             show_progress="hidden")
    timer.tick(refresh, [count], [image, count, line], queue=False, api_visibility="private", show_progress="hidden")


def _end_of_run(event, preview: tuple, line) -> None:
    """The job ended: the preview hidden, the timer stopped, the line emptied."""
    image, timer, _ = preview
    event.then(lambda: (gr.Image(visible=False), gr.Timer(active=False), ""), None, [image, timer, line], queue=False,
               api_visibility="private", show_progress="hidden")
