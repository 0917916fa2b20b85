"""The one progress line of a job as a front end shows it: "Step 7/20 · batch 2/4 · ETA 0:12" while it denoises,
"Waiting: 1 job ahead" while it waits for the GPU behind other clients' jobs (the web UI's and the REST API's alike:
jobs/registry.py knows them all), "Starting (loading the model)" once it is next.

The denoiser reports (step, total) of each pass; the job's batches are not reported, so they are counted from the
passes: a step that is not one more than the last starts a pass, and a batch of the batch count is one pass (two
with hires fix). A batch split into smaller passes, or a pass retried after an out-of-memory step-down, counts as
more passes than planned: the batch number is then capped at the batch count, and the ETA (the seconds per step so
far times the steps still planned) is an estimate, as A1111's is.
"""

from __future__ import annotations

import time


def waiting(ahead: int) -> str:
    """The line of a job that waits behind `ahead` jobs of other clients."""
    return f"Waiting: {ahead} job{'' if ahead == 1 else 's'} ahead"


STARTING = "Starting (loading the model)"


def clock(seconds: float) -> str:
    """0:12, 1:05:00: as A1111's ETA."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StepProgress:
    """Follows a job's (step, total) events: `line()` says where it is, `fraction()` how far it is in all.
    `batch_count`: the request's; `passes_per_batch`: 2 with hires fix, else 1; `unit`: what a step is called
    ("Step", "Iteration"); `now`: the clock (a test's own)."""

    def __init__(self, batch_count: int = 1, passes_per_batch: int = 1, unit: str = "Step", now=time.monotonic):
        self.batch_count, self.passes_per_batch, self.unit = max(1, batch_count), max(1, passes_per_batch), unit
        self.now = now
        self.passes = 0  # passes started
        self.step, self.total = 0, 0
        self.steps_done = 0  # steps of every pass so far, for the seconds per step
        self.first_step_at: float | None = None

    @property
    def planned_passes(self) -> int:
        return self.batch_count * self.passes_per_batch

    @property
    def batch(self) -> int:
        """The batch of the batch count that runs now (1-based), from the passes started."""
        return min(self.batch_count, (max(1, self.passes) - 1) // self.passes_per_batch + 1)

    def update(self, step: int, total: int) -> None:
        if step != self.step + 1 or not self.passes:  # a new pass starts (its step 1, or the first event seen)
            self.passes += 1
        now = self.now()
        if self.first_step_at is None:
            self.first_step_at, self.steps_done = now, 0  # timed from the first step: loading is not denoising
        else:
            self.steps_done += 1  # one event a step
        self.step, self.total = step, total

    def remaining_steps(self) -> int:
        later = max(0, self.planned_passes - self.passes) * self.total  # the passes to come, as long as this one
        return max(0, self.total - self.step) + later

    def eta(self) -> float | None:
        """Seconds left, from the seconds per step so far; None before a second step came."""
        if self.first_step_at is None or not self.steps_done:
            return None
        per_step = (self.now() - self.first_step_at) / self.steps_done
        return per_step * self.remaining_steps()

    def fraction(self) -> float:
        if not self.total:
            return 0.0
        done = (min(self.passes, self.planned_passes) - 1) * self.total + self.step
        return max(0.0, min(1.0, done / (self.planned_passes * self.total)))

    def line(self) -> str:
        parts = [f"{self.unit} {self.step}/{self.total}"]
        if self.batch_count > 1:
            parts.append(f"batch {self.batch}/{self.batch_count}")
        eta = self.eta()
        if eta is not None:
            parts.append(f"ETA {clock(eta)}")
        return " · ".join(parts)


class PartProgress(StepProgress):
    """The progress of a job that runs several requests one after another: an img2img script's loops or tiles
    (lowvram_gen/img2img_scripts), an X/Y/Z grid's cells. `part(index, total, line, batch_count, passes_per_batch)`
    is told before each request (the script's `on_part`; `cell(i, n, ...)` for a grid): the line then says the part
    first ("tile 3/6 · Step 2/4 · ETA 0:40", "cell 2/6 · Step 7/20"), the fraction counts the parts done, and the
    ETA the steps of the parts still to come, each as long as this one."""

    def __init__(self, parts: int = 1, unit: str = "Step", now=time.monotonic):
        super().__init__(1, 1, unit, now)
        self.index, self.parts, self.part_line = 0, max(1, parts), ""

    def part(self, index: int, total: int, line: str, batch_count: int = 1, passes_per_batch: int = 1) -> None:
        self.index, self.parts, self.part_line = index, max(1, total), line
        self.batch_count, self.passes_per_batch = max(1, batch_count), max(1, passes_per_batch)
        self.passes, self.step, self.total = 0, 0, 0  # the part's first step starts its first pass
        # the seconds per step go on from the parts before: the ETA of a part's first step is already an estimate

    def cell(self, index: int, total: int, batch_count: int = 1, passes_per_batch: int = 1) -> None:
        """An X/Y/Z grid's cell `index` of `total` starts."""
        self.part(index, total, f"cell {index}/{total}", batch_count, passes_per_batch)

    def remaining_steps(self) -> int:
        return super().remaining_steps() + max(0, self.parts - self.index) * self.planned_passes * self.total

    def eta(self) -> float | None:
        return super().eta() if self.total else None  # before a part's first step its length is not known

    def fraction(self) -> float:
        if not self.index:
            return super().fraction()
        return max(0.0, min(1.0, (self.index - 1 + super().fraction()) / self.parts))

    def line(self) -> str:
        return f"{self.part_line} · {super().line()}" if self.part_line else super().line()
