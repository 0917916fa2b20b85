"""Run a session job in a worker thread and stream its progress to a Gradio generator.

Gradio closes the generator when the user presses Cancel, the browser goes away, or an API client
cancels its job (gradio_client's `job.cancel()` posts /cancel, which closes the event's iterator); the
`finally` then sets the job's cancel event, and generation stops at the next denoising step. Gradio can
close a generator only between two of its yields, so `progress()` yields a tick (None) every TICK_S even
when no step has ended (a job waiting for the GPU, loading a model), and the handlers yield on every
tick. The session's lock keeps one job on the GPU at a time, so a job queued behind a cancelled one
simply waits.

The Cancel button waits (briefly) for the job to stop before it answers, so its answer and the
job's own last output say the same thing whichever reaches the browser first.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from lowvram_gen.errors import Cancelled
from lowvram_gen.ui.messages import for_ui


CANCEL_WAIT_S = 10.0  # how long Cancel waits for the job to stop before it answers "cancelling…"
TICK_S = 0.5  # the longest a handler goes without yielding: how soon a cancel from the API can close it


class Job:
    def __init__(self, work: Callable[[Callable[[int, int], None], threading.Event], object]):
        self.cancel = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.result = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        # live state the job thread updates, for A1111's /progress: the last step of `total`, when it started
        self.step, self.total, self.started = 0, 0, time.time()
        self._work = work
        self._thread = threading.Thread(target=self._run, daemon=True, name="lowvram-gen job")

    def _on_step(self, step: int, total: int) -> None:
        self.step, self.total = step, total
        self.events.put((step, total))

    def _run(self) -> None:
        self.started = time.time()
        try:
            self.result = self._work(self._on_step, self.cancel)
        except BaseException as exc:  # noqa: BLE001 - handed to the UI thread, which reports it
            self.error = exc
        finally:
            self.done.set()
            self.events.put(None)

    def summary(self) -> str | None:
        """The "what ran" text of a finished job, shared by its own output and Cancel's answer. It goes to a
        Textbox, which shows text (never HTML): not escaped. CLI flags in it are named as the UI's controls."""
        if isinstance(self.error, Cancelled):
            return for_ui(str(self.error))
        if self.error is None and self.result is not None:
            return for_ui("\n".join([self.result.summary, *self.result.warnings]))
        return None  # still running, or an error the job reports as a gr.Error

    def progress(self, tick: float | None = TICK_S) -> Iterator:
        """Yield each event of the job ((step, total), or what the work put) until it ends, and None every
        `tick` seconds without one; closing this iterator cancels the job."""
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
    """The running job of each browser session (and API client), so its Cancel button reaches it; the one
    place every front end that runs jobs in the web server registers them, so A1111's global /interrupt
    reaches whichever runs."""

    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, key: str, job: Job) -> Job:
        with self._lock:
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

    def answer_cancel(self, key: str, pending: str) -> str | None:
        """Cancel this session's job and say what the summary should show: the job's own summary once it
        stopped, `pending` while it is still stopping, None (leave it as it is) when nothing was running."""
        job = self.cancel(key)
        if job is None:
            return None
        return job.summary() if job.done.is_set() else pending

    def current(self) -> Job | None:
        """The job on the GPU, of any client: the one past its first step, else the first registered of those
        not finished (the others wait for the session's lock); None when none runs."""
        with self._lock:
            running = [j for j in self._jobs.values() if not j.done.is_set()]
        stepping = [j for j in running if j.step > 0]
        return (stepping or running or [None])[0]

    def others_running(self, key: str) -> bool:
        """Whether a job of another browser session is running (the GPU is taken)."""
        with self._lock:
            return any(k != key and not j.done.is_set() for k, j in self._jobs.items())

    def finish(self, key: str, job: Job) -> None:
        with self._lock:
            if self._jobs.get(key) is job:
                del self._jobs[key]
