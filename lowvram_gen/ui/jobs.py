"""Run a session job in a worker thread and stream its progress to a Gradio generator.

Gradio closes the generator when the user presses Cancel or the browser goes away; the `finally`
then sets the job's cancel event, and generation stops at the next denoising step. The session's
lock keeps one job on the GPU at a time, so a job queued behind a cancelled one simply waits.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator


class Job:
    def __init__(self, work: Callable[[Callable[[int, int], None], threading.Event], object]):
        self.cancel = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.result = None
        self.error: BaseException | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, daemon=True, name="lowvram-gen job")

    def _run(self) -> None:
        try:
            self.result = self._work(lambda step, total: self.events.put((step, total)), self.cancel)
        except BaseException as exc:  # noqa: BLE001 - handed to the UI thread, which reports it
            self.error = exc
        finally:
            self.events.put(None)

    def progress(self) -> Iterator[tuple[int, int]]:
        """Yield (step, total) until the job ends; closing this iterator cancels the job."""
        self._thread.start()
        finished = False
        try:
            while True:
                event = self.events.get()
                if event is None:
                    finished = True
                    return
                yield event
        finally:
            if not finished:
                self.cancel.set()


class Registry:
    """The running job of each browser session, so its Cancel button reaches it."""

    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, key: str, job: Job) -> Job:
        with self._lock:
            self._jobs[key] = job
        return job

    def cancel(self, key: str) -> bool:
        with self._lock:
            job = self._jobs.get(key)
        if job is None or job.result is not None or job.error is not None:
            return False
        job.cancel.set()
        return True

    def finish(self, key: str, job: Job) -> None:
        with self._lock:
            if self._jobs.get(key) is job:
                del self._jobs[key]
