"""What every tab builder gets: `build(ctx: TabContext) -> None`.

The context holds what the tabs share: the Session (the tabs call its methods, never its fields or
its lock), the app's options, the registry of running jobs (one per browser session, so Interrupt, Skip, the
live preview and a closed tab reach it), the Stable Diffusion job runner of txt2img and img2img, the Blocks (for
load/unload events) and the Tabs (a "Send to" button selects its tab), each tab's controls by request
field (what a "Send to" fills) and its note of what a send did not use, wiring that needs a later tab's controls (run once every tab is built),
and each tab's Generate event (ui/remembered.py chains the browser's remembered values to it). Per-browser
state is never kept here: it lives in the browser (the hidden last-seed number, the remembered values in its
localStorage), so one client never sees another's.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations in the tabs.)
"""

import uuid
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import gradio as gr

from lowvram_gen.errors import Cancelled, LowVramError
from lowvram_gen.jobs.progress import PartProgress
from lowvram_gen.jobs.registry import Job, Registry
from lowvram_gen.jobs.run import run
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.preview import check_method
from lowvram_gen.request import MAX_STEPS, GenerationRequest, as_int
from lowvram_gen.session import Session
from lowvram_gen.ui import messages

GPU = "gpu"  # the one concurrency group of every action that uses the GPU


@dataclass
class UiOptions:
    outdir: str
    model: str = "tiny"
    queue_size: int = 16
    models_folder: str | None = None


def client_key(request, suffix: str = "") -> str:
    """Jobs are keyed by Gradio's session (one per browser tab or API client)."""
    return (getattr(request, "session_hash", None) or uuid.uuid4().hex) + suffix


def check_preview_every(value) -> int:
    """The live preview interval: 0 (off) to MAX_STEPS steps."""
    return as_int("live preview every", value, 0, MAX_STEPS, " steps (0: off)")


def image_info(path: str) -> str:
    params, _ = read_png_metadata(path)
    return params or ""


def image_seed(path: str) -> int | None:
    _, meta = read_png_metadata(path)
    seed = (meta or {}).get("seed")
    return seed if isinstance(seed, int) else None


@dataclass
class TabContext:
    session: Session
    options: UiOptions
    app: gr.Blocks
    jobs: Registry = field(default_factory=Registry)
    # txt2img's request inputs (prompt, negative, width, height, steps, cfg, seed, batch, sampler, model),
    # set by the txt2img tab; the System tab's "Estimate" plans them
    txt2img_inputs: list[Any] = field(default_factory=list)
    tabs: gr.Tabs | None = None
    controls: dict[str, dict[str, Any]] = field(default_factory=dict)  # tab id -> {request field: component}
    sent_notes: dict[str, Any] = field(default_factory=dict)  # tab id -> its note of what a send did not use
    generate_events: dict[str, Any] = field(default_factory=dict)  # tab id -> its Generate event (ui/remembered.py)
    wiring: list[Callable[[], None]] = field(default_factory=list)
    # the SD VAE box's value (ui/vae_picker.py): a setting of the page, as A1111's quicksetting is, for every SD tab
    vae: str = "Automatic"
    rng: str = "gpu"  # the RNG source radio's value (ui/rng_setting.py), a setting of the page as A1111's is
    page_controls: dict[str, Any] = field(default_factory=dict)  # request field -> a page setting's component
    style_lists: list[Any] = field(default_factory=list)  # every tab's Styles multi-select (ui/styles.py)
    # each page's (gradio session's) images filename pattern, from its Settings tab (ui/tabs/settings.py)
    filename_patterns: dict[str, str] = field(default_factory=dict)
    settings_loaded: Any = None  # the Settings tab's page-load event (ui/remembered.py restores after it)

    def later(self, wire: Callable[[], None]) -> None:
        """Run `wire` once every tab is built (it may use a later tab's controls)."""
        self.wiring.append(wire)

    def run_job(self, what: str, fields: dict, request, progress, preview_every=0,
                preview_method="auto", xyz=None) -> Iterator[tuple]:
        """Validate, queue behind the GPU, stream per-step progress; yield (images, info, summary, last seed).
        The progress is one line (jobs/progress.py: the jobs ahead while it waits, then step, batch i/n and ETA),
        shown by the tab once, under Interrupt and Skip (ui/form.py).
        The job runs through jobs.run (registered, queued behind the GPU, on the console); its Skip event and its
        live previews (every `preview_every` steps, by `preview_method`) are the job's own (jobs/registry.py); the
        tab shows the previews (ui/live.py).

        A generator: while the job runs it yields "no change" to every output at each step and every
        jobs.TICK_S, so gradio can close it there (an API client's cancel, a dropped connection): the job then
        stops at the next step. A cancelled job yields the images it kept and the seed of the first of them;
        with none kept the browser's last seed stays as it is (gr.update()). A refused or failed job says why in
        the summary and leaves the gallery, parameters and seed as they were (messages.failure). The console
        says when the job (`what`: its tab) starts and ends, with a tqdm bar of its steps (jobs/console.py).
        `xyz` (ui/xyz.py `grid_maker`): the Script's `Several` of the request (an X/Y/Z grid's cells, Loopback's
        loops, SD upscale's tiles), whose requests the job runs one by one (progress `cell i/n`, `loop i/n`,
        `tile i/n`); the gallery then shows what A1111 shows (the grid first).
        """
        try:
            job_request = GenerationRequest(outdir=self.options.outdir, **{
                "vae": self.vae, "rng": self.rng, "filename_pattern": self.filename_patterns.get(client_key(request), ""),
                **fields}).validated()
            preview_every = check_preview_every(0 if preview_every is None else preview_every)
            preview_method = check_method(preview_method or "auto")
            several = xyz(job_request) if xyz is not None else None
        except LowVramError as exc:
            yield gr.skip(), gr.skip(), messages.failure(exc, request), gr.skip()
            return
        client = client_key(request)

        parts = PartProgress(several.parts) if several is not None else None

        def work(on_step, cancel):
            kwargs = dict(on_step=on_step, cancel=cancel, skip=job.skip, on_preview=job.on_preview,
                          preview_every=preview_every, preview_method=preview_method)
            if several is not None:
                return several.run(self.session, parts, kwargs)
            return self.session.generate(job_request, **kwargs)

        job = Job(work)
        # the browser shows the job's line once (ui/live.py reads job.line); gradio's own progress would be drawn on
        # every output, so only an API client (gradio_client) gets the line through it
        said = None if messages.from_browser(request) else lambda fraction, line: progress(fraction, desc=line)
        try:
            with closing(run(self.jobs, client, job, what, job_request, on_progress=said, progress=parts)) as events:
                for _ in events:
                    yield (gr.skip(),) * 4
        except LowVramError as exc:  # the job failed with a user error: "What ran" says why
            yield gr.skip(), gr.skip(), messages.failure(exc, request), gr.skip()
            return
        summary = messages.for_ui(job.summary())
        if isinstance(job.error, Cancelled):
            kept = job.error.images
            seed = image_seed(kept[0]) if kept else None
            yield kept, (image_info(kept[0]) if kept else ""), summary, (gr.update() if seed is None else seed)
            return
        result = job.result
        if several is not None:  # A1111's images of a script: a grid first (ui/xyz.py)
            images = several.shown(result)
            yield images, (image_info(images[0]) if images else ""), summary, several.seed(result)
            return
        yield result.images, image_info(result.images[0]), summary, result.seeds[0]

    def skip(self, request: gr.Request) -> None:
        """The Skip button of txt2img and img2img: this browser's running batch stops at the next step (kept)."""
        self.jobs.skip(client_key(request))

    def cancel(self, request: gr.Request):
        """The Interrupt button of txt2img and img2img: stop this browser's job at the next step, keeping the image
        of the pass it stopped."""
        answer = self.jobs.answer_cancel(client_key(request), "cancelling at the next step…")
        return gr.update() if answer is None else messages.for_ui(answer)  # None: the summary already says how it ended

    def disconnected(self, request: gr.Request):
        """The tab was closed or lost its connection: stop its job at the next step."""
        self.filename_patterns.pop(client_key(request), None)
        self.jobs.cancel(client_key(request))
