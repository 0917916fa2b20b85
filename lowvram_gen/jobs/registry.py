"""A job (one request run in a worker thread) and the registry of the running jobs of every front end in a process.

A front end (a web UI tab, the REST API) runs a job through `jobs.run.run`, which streams the job's events: each
(step, total), what the work put on `events`, and a tick (None) every TICK_S when nothing came. Gradio closes a
handler's generator when the user presses Cancel, the browser goes away, or an API client cancels its job
(gradio_client's `job.cancel()` posts /cancel, which closes the event's iterator), and can close it only between two
of its yields: the ticks give it those, even while a job waits for the GPU or loads a model. Closing the stream sets
the job's cancel event, and generation stops at the next denoising step. The session's lock keeps one job on the
GPU at a time, so a job queued behind a cancelled one simply waits.

The Interrupt button (A1111's; it was Cancel) waits (briefly) for the job to stop before it answers, so its answer
and the job's own last output say the same thing whichever reaches the browser first. Skip sets the job's `skip`:
the running batch stops and is kept, the job goes on (Session.generate).

A job keeps its live state for the UI's live preview and for A1111's progress API: `step`/`total` of the running
pass, the latest `preview` (a PIL image, or None) and how many came (`previews`), its progress `line` (the jobs ahead
of it, or its step, batch and ETA), and when it `started`. The
Registry is the one place every front end that runs jobs in the web server registers its job (the tabs and the
REST API), so A1111's global /interrupt and /skip reach whichever job runs (`current()`).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from lowvram_gen.errors import Cancelled


CANCEL_WAIT_S = 10.0  # how long Cancel waits for the job to stop before it answers "cancelling…"
TICK_S = 0.5  # the longest a handler goes without yielding: how soon a cancel from the API can close it


class Job:
    """`work(on_step, cancel)` run in a thread; it may use the job's `skip` and `on_preview` too."""

    def __init__(self, work: Callable[[Callable[[int, int], None], threading.Event], object]):
        self.cancel = threading.Event()  # A1111's Interrupt
        self.skip = threading.Event()  # A1111's Skip
        self.step, self.total = 0, 0  # the running pass's progress (0 of 0: not denoising yet)
        self.preview = None  # the latest live preview (PIL image), None before the first
        self.previews = 0  # how many previews came: a new one changes it
        self.line = ""  # the job's progress line (jobs/progress.py), set by jobs.run: what the web UI shows of it
        self.started = time.time()  # when the job was registered; again when its thread starts
        self.events: queue.Queue = queue.Queue()
        self.result = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._work = work
        self._thread = threading.Thread(target=self._run, daemon=True, name="lowvram-gen job")

    def _on_step(self, step: int, total: int) -> None:
        self.step, self.total = step, total
        self.events.put((step, total))

    def on_preview(self, image, step: int, total: int) -> None:
        """The job's `on_preview`: keep the latest preview for whoever shows it."""
        self.preview, self.previews = image, self.previews + 1

    def _run(self) -> None:
        try:
            self.result = self._work(self._on_step, self.cancel)
        except BaseException as exc:  # noqa: BLE001 - handed to the front end's thread, which reports it
            self.error = exc
        finally:
            self.done.set()
            self.events.put(None)

    def summary(self) -> str | None:
        """The "what ran" text of a finished job, shared by its own output and Cancel's answer, as the Python API
        says it (CLI flags; the web UI names its controls instead: ui/messages.for_ui). Not escaped: a Textbox
        shows text, never HTML."""
        if isinstance(self.error, Cancelled):
            return str(self.error)
        if self.error is None and self.result is not None:
            return "\n".join([self.result.summary, *self.result.warnings])
        return None  # still running, or an error the front end reports as such (jobs.run raises it)

    def progress(self, tick: float | None = TICK_S) -> Iterator:
        """Yield each event of the job ((step, total), or what the work put) until it ends, and None every
        `tick` seconds without one; closing this iterator cancels the job."""
        self.started = time.time()
        self._thread.start()
        finished = False
        try:
            while True:
                try:
                    event = self.events.get(timeout=tick)
                except queue.Empty:
                    yield None
                    continue
                if event is None:
                    finished = True
                    return
                yield event
        finally:
            if not finished:
                self.cancel.set()


class Registry:
    """The running job of each browser session (or API client), so its Interrupt and Skip buttons reach it."""

    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, key: str, job: Job) -> Job:
        with self._lock:
            self._jobs.pop(key, None)  # registered last: the dict's order is the order the jobs came in
            self._jobs[key] = job
        return job

    def cancel(self, key: str, wait: float = CANCEL_WAIT_S) -> Job | None:
        """Ask this session's running job to stop, wait up to `wait` seconds for it; None if none runs."""
        with self._lock:
            job = self._jobs.get(key)
        if job is None or job.done.is_set():
            return None
        job.cancel.set()
        job.done.wait(wait)
        return job

    def get(self, key: str) -> Job | None:
        """This session's job (running or waiting for the GPU); None if it has none."""
        with self._lock:
            return self._jobs.get(key)

    def skip(self, key: str) -> Job | None:
        """A1111's Skip: this session's running batch stops at its next step and is kept, and the job goes on with
        its next batch; None if none runs."""
        job = self.get(key)
        if job is None or job.done.is_set():
            return None
        job.skip.set()
        return job

    def current(self) -> Job | None:
        """The job that runs now, whichever client's: of the jobs not done, one that is denoising (only the one
        holding the GPU steps), else the earliest started (it holds the GPU while it loads); None when none runs."""
        with self._lock:
            running = [j for j in self._jobs.values() if not j.done.is_set()]
        pool = [j for j in running if j.total] or running
        return min(pool, key=lambda j: j.started) if pool else None

    def answer_cancel(self, key: str, pending: str) -> str | None:
        """Cancel this session's job and say what the summary should show: the job's own summary once it
        stopped, `pending` while it is still stopping, None (leave it as it is) when nothing was running."""
        job = self.cancel(key)
        if job is None:
            return None
        return job.summary() if job.done.is_set() else pending

    def ahead(self, key: str) -> int:
        """How many jobs of other clients, not done, came in before this session's: the jobs it waits behind for
        the GPU (the running one included), whichever front end started them (web UI or REST API)."""
        with self._lock:
            count = 0
            for k, j in self._jobs.items():
                if k == key:
                    return count
                count += not j.done.is_set()
            return count  # not registered (yet): behind every job there is

    def finish(self, key: str, job: Job) -> None:
        with self._lock:
            if self._jobs.get(key) is job:
                del self._jobs[key]
