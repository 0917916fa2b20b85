"""How many steps an img2img-like pass runs, and from where in its schedule: A1111's rule, for every pass that starts
from an image (img2img, inpaint, hires fix's second pass), whatever the model family.

A1111 (and Forge, for every model it runs, Flux included) takes a pass of `steps` at denoising strength d (capped at
0.999) as the end of a longer schedule:

* no explicit step count and its "With img2img, do exactly the amount of steps the slider specifies" setting
  (`img2img_fix_steps`) off: a schedule of `steps`, of which the last int(d * steps) + 1 run (10 steps at 0.5: 6);
* an explicit count n (hires fix's second pass: Hires steps, or Steps when 0), or that setting on (n = steps): a
  schedule of int(n / d) steps, of which the last n run: exactly n.

diffusers' img2img pipelines run the last int(N * strength) steps of an N-step schedule. Handing them N = the
schedule's length and a strength that gives exactly the count that runs (`strength_for`) starts them at A1111's
sigma, for any scheduler. Their two roundings (SD's int(N * strength); the flow-matching pipelines'
int(N - N * strength)) cannot both be met by one float for every count, so the engine asks the pipeline's own rule.

Denoising strength 0 runs nothing here (the init is kept as it is). A schedule longer than the model's training
timesteps (1000: a denoise below n / 1000 with an explicit n) is cut to them, as diffusers' discrete schedulers
cannot space more. Standard library only: the planner and the request count steps with it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

MAX_DENOISE = 0.999  # A1111's cap: at 1 the whole schedule would run, as at 0.999 of it
LONGEST = 1000  # the training timesteps of the SD family (and the flow-matching schedulers' num_train_timesteps)


@dataclass(frozen=True)
class PassSteps:
    """A pass's schedule of `schedule` steps, of which the last `run` run (from index `start` of its sigmas)."""

    schedule: int
    run: int

    @property
    def start(self) -> int:
        return self.schedule - self.run

    def strength(self, counts: Callable[[int, float], int] | None = None) -> float:
        """The strength that makes a diffusers img2img pipeline run exactly `run` steps of `schedule`."""
        return strength_for(self.run, self.schedule, counts or diffusers_count)


def pass_steps(steps: int, denoise: float, explicit: int | None = None, fix_steps: bool = False,
               longest: int = LONGEST) -> PassSteps:
    """The schedule and the steps that run of a pass of `steps` at `denoise`: `explicit` its own step count (hires
    fix's second pass), `fix_steps` A1111's img2img_fix_steps setting; `longest` the most steps a schedule may have."""
    if denoise <= 0:
        return PassSteps(explicit or steps, 0)
    d = min(denoise, MAX_DENOISE)
    if explicit or fix_steps:
        n = explicit or steps
        return PassSteps(max(n, min(int(n / d), longest)), n)
    return PassSteps(steps, int(d * steps) + 1)


def diffusers_count(schedule: int, strength: float) -> int:
    """The steps the SD/SDXL img2img pipelines of diffusers run of `schedule` at `strength` (their get_timesteps)."""
    return min(int(schedule * strength), schedule)


def strength_for(run: int, schedule: int, counts: Callable[[int, float], int] = diffusers_count) -> float:
    """A strength for which `counts(schedule, strength)` is `run`: run / schedule, or the float next to it where the
    product rounds the other way (22 * (15 / 22) is 14.999999999999998)."""
    if run <= 0:
        return 0.0
    if run >= schedule:
        return 1.0
    exact = run / schedule
    candidates = [exact]
    up = down = exact
    for _ in range(4):
        up, down = math.nextafter(up, 2.0), math.nextafter(down, 0.0)
        candidates += [up, down]
    for strength in candidates:
        if counts(schedule, strength) == run:
            return strength
    raise ValueError(f"no strength runs {run} of {schedule} steps")  # a pipeline whose rule is neither diffusers'


def job_steps(request: Any) -> int:
    """The denoising steps one batch of `request` runs (its steps set): its first pass (an init image's count for
    img2img and inpaint; an edit's reference images are not an init) and hires fix's second pass."""
    steps = request.steps
    fix = bool(getattr(request, "img2img_fix_steps", False))
    first = pass_steps(steps, request.strength, fix_steps=fix).run if request.init_image else steps
    if getattr(request, "hires", False):
        first += pass_steps(steps, request.hires_denoise, explicit=request.hires_steps or steps).run
    return first


def pipeline_counts(pipe: Any) -> Callable[[int, float], int] | None:
    """The count `pipe` (a diffusers img2img or inpaint pipeline) runs of a schedule at a strength, by its own
    get_timesteps run on a stand-in scheduler (nothing of the pipeline is touched); None: it takes no strength (a
    ControlNet inpaint pipeline that repaints from noise)."""
    rule = getattr(type(pipe), "get_timesteps", None)
    if rule is None:
        return None

    def counts(schedule: int, strength: float) -> int:
        scheduler = SimpleNamespace(timesteps=list(range(schedule)), order=1, set_begin_index=lambda index: None)
        try:
            return int(rule(SimpleNamespace(scheduler=scheduler), schedule, strength, "cpu")[1])
        except (AttributeError, TypeError):  # a get_timesteps that reads more of its pipeline: SD's rule
            return diffusers_count(schedule, strength)

    return counts
