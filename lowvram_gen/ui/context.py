"""What every tab builder gets: `build(ctx: TabContext) -> None`.

The context holds what the tabs share: the Session (the tabs call its methods, never its fields or
its lock), the app's options, the registry of running jobs (one per browser session, so Cancel and
a closed tab reach it), the Stable Diffusion job runner of txt2img and img2img, the Blocks (for
load/unload events) and the Tabs (a "Send to" button selects its tab), each tab's controls by request
field (what a "Send to" fills), wiring that needs a later tab's controls (run once every tab is built),
and the values remembered from the last run (ui/remembered.py). Per-browser state is never kept here: it lives in the browser's own components
(e.g. the hidden last-seed number), so one client never sees another's.

(No `from __future__ import annotations`: Gradio finds `gr.Request` and `gr.Progress` through real
annotations in the tabs.)
"""

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import gradio as gr

from lowvram_gen.errors import Cancelled, LowVramError
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session
from lowvram_gen.ui import messages, remembered
from lowvram_gen.ui.jobs import Job, Registry

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
    saved: dict[str, dict] = field(default_factory=dict)  # remembered.load(), read once when the UI is built
    wiring: list[Callable[[], None]] = field(default_factory=list)

    def later(self, wire: Callable[[], None]) -> None:
        """Run `wire` once every tab is built (it may use a later tab's controls)."""
        self.wiring.append(wire)

    def initial(self, tab: str, name: str, default, choices: list | None = None):
        """A control's starting value: the one remembered from the last run (one of `choices`, if given),
        else `default`."""
        value = remembered.initial(self.saved, tab, name, default)
        return default if choices is not None and value not in choices else value

    def run_job(self, fields: dict, request, progress, remember: str | None = None) -> tuple:
        """Validate, queue behind the GPU, stream per-step progress; return (images, info, summary, last seed).

        A valid request's fields are remembered as tab `remember`'s (all but the model and the init image).
        A cancelled job returns the images it kept and the seed of the first of them; with none kept the
        browser's last seed stays as it is (gr.update()).
        """
        try:
            job_request = GenerationRequest(outdir=self.options.outdir, **fields).validated()
        except LowVramError as exc:
            raise messages.error(exc, request) from None
        if remember:
            remembered.save(remember, {k: v for k, v in fields.items() if k not in ("model", "init_image")})
        client = client_key(request)
        job = self.jobs.start(client, Job(lambda on_step, cancel: self.session.generate(
            job_request, on_step=on_step, cancel=cancel)))
        progress(0, desc="waiting for the GPU")
        try:
            for step, total in job.progress():
                progress((step, total), desc="denoising", unit="steps")
        finally:
            self.jobs.finish(client, job)
        if isinstance(job.error, Cancelled):
            kept = job.error.images
            seed = image_seed(kept[0]) if kept else None
            return kept, (image_info(kept[0]) if kept else ""), job.summary(), (gr.update() if seed is None else seed)
        if isinstance(job.error, LowVramError):
            raise messages.error(job.error, request)
        if job.error is not None:
            raise job.error
        result = job.result
        return result.images, image_info(result.images[0]), job.summary(), result.seeds[0]

    def cancel(self, request: gr.Request):
        """The Cancel button of txt2img and img2img: stop this browser's job at the next step."""
        answer = self.jobs.answer_cancel(client_key(request), "cancelling at the next step…")
        return gr.update() if answer is None else answer  # None: the summary already says how it ended

    def disconnected(self, request: gr.Request):
        """The tab was closed or lost its connection: stop its job at the next step."""
        self.jobs.cancel(client_key(request))
