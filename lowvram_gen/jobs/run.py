"""Running a registered job: the one way the web UI's tabs, the VQGAN tab and the REST API run a job.

`run` registers the job under its client's key (so Interrupt, Skip, /interrupt, /skip, /progress and a closed tab
reach it), says on the console when it starts, streams its events with the console's tqdm bar following its steps,
unregisters it when it ends or its stream is closed (which cancels it), and says how it ended. The job waits for
the GPU in the Session's lock (its work calls a Session method); `on_progress` gets the job's one progress line
(jobs/progress.py): how many jobs it waits behind, of the web UI's and the REST API's alike (the registry knows them
all), while it waits, then its step, batch and ETA.

What the caller shows is decided by how the job ended: `job.result` (done) or a Cancelled `job.error` (kept images)
after the stream ends; any other error is raised from the stream's end, a LowVramError for the caller to show as a
user error (the UI's "What ran", the API's error body), anything else a bug with its traceback.
"""

from __future__ import annotations

from typing import Callable, Iterator

from lowvram_gen.errors import Cancelled
from lowvram_gen.jobs import console
from lowvram_gen.jobs.progress import STARTING, StepProgress, waiting
from lowvram_gen.jobs.registry import TICK_S, Job, Registry


def is_step(event) -> bool:
    """Whether an event of the stream is a step (step, total), not a tick (None) or what the work put."""
    return isinstance(event, tuple) and len(event) == 2 and all(isinstance(n, int) for n in event)


def run(registry: Registry, key: str, job: Job, what: str, request, *, steps: int | None = None,
        unit: str = "steps", bar_unit: str = "step", tick: float | None = TICK_S,
        on_progress: Callable[[float, str], None] | None = None, progress: StepProgress | None = None) -> Iterator:
    """Run `job` (its work calls the Session) registered as `key`'s and yield its events: (step, total) after each
    step, what the work put on `job.events`, and None every `tick` seconds without one (None: no ticks).

    The console says "`what` started" with the request's prompt, size, `steps` (the request's own by default; in
    `unit`) and seed, draws a bar of the steps (in `bar_unit`), and says "`what` ended" with the summary and the
    files of a job that finished or was cancelled. A job that failed raises its error when the stream ends.
    Close the stream (contextlib.closing) when the caller stops early: that cancels the job at its next step.

    The job's progress line (jobs/progress.py; `job.line`, which the web UI shows) is set when the job is registered,
    at each tick until its first step (how many jobs it waits behind, or that it starts), and at each step
    (`progress`, by default a StepProgress of the request's batch count and hires passes, says the step, the batch
    and the ETA); `on_progress(fraction,
    line)` is told each new one."""
    registry.start(key, job)
    if progress is None:  # an SD job's: its batch count, two passes a batch with hires fix
        progress = StepProgress(getattr(request, "batch_count", 1), 2 if getattr(request, "hires", False) else 1)
    said = [None]

    def say_waiting():
        job.line = waiting(ahead) if (ahead := registry.ahead(key)) else STARTING
        if job.line != said[0] and on_progress is not None:
            on_progress(0.0, job.line)
        said[0] = job.line

    say_waiting()
    since = console.started(what, request.prompt, request.width, request.height,
                            request.steps if steps is None else steps, request.seed, unit=unit)
    bar = console.ProgressBar(bar_unit)
    events = job.progress(tick)
    try:
        for event in events:
            if is_step(event):
                bar.update(*event)
                progress.update(*event)
                job.line = progress.line()
                if on_progress is not None:
                    on_progress(progress.fraction(), job.line)
            elif event is None and not progress.total:
                say_waiting()  # still waiting: the jobs ahead may have ended, or more have come in
            yield event
    finally:
        events.close()  # closed before the job ended (this stream was closed): the job is cancelled
        bar.close()
        registry.finish(key, job)
    if isinstance(job.error, Cancelled):
        console.ended(what, since, str(job.error), job.error.images)
    elif job.error is not None:
        raise job.error
    else:
        result = job.result  # a clip's files are its video and frames (it has no images)
        console.ended(what, since, result.summary,
                      [result.video, *result.frames] if getattr(result, "video", None) else result.images)
