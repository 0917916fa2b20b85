"""A1111's Restart sampler (Xu et al. 2023, "Restart Sampling for Improving Generative Processes") as a diffusers
scheduler.

Heun steps (Karras et al. 2022, Algorithm 1 without churn: an Euler step where the next level is 0) down a list of
levels; at the level nearest 0.1 the sampler jumps back up to the level nearest 2 by adding fresh noise (the
image's own noise generator), then runs Heun steps down again on a Karras ramp between the two. A1111's rule for the
restarts, keyed on the pass's step count n:

* n < 20: no restart, plain Heun over the pass's levels;
* 20 <= n < 36: one restart of 9 steps; n >= 36: two restarts of n // 4 steps each;
* with restarts the main levels become a Karras ramp of n - (restart steps x restarts) levels between the pass's
  first and next-to-last levels, so that the pass still makes n steps: 2n - 1 model calls in all, as Heun's.

A1111's Automatic schedule type for Restart is Karras (samplers.A1111_AUTOMATIC).
"""

from __future__ import annotations

import numpy as np

from lowvram_gen.ksamplers.stepper import KSamplerScheduler, karras

RESTART_AT, RESTART_TO = 0.1, 2.0  # the levels a restart leaves from and goes back up to (nearest in the list)


def restarts(steps: int) -> tuple[int, int]:
    """(steps of one restart, how many restarts) of A1111's rule for a pass of `steps` steps."""
    if steps < 20:
        return 0, 0
    return (steps // 4, 2) if steps >= 36 else (9, 1)


def step_pairs(levels: list[float]) -> list[tuple[float, float]]:
    """The (from, to) levels of each Heun step of a pass over `levels`, restarts included."""
    steps = len(levels) - 1
    length, times = restarts(steps)
    if not times:
        return list(zip(levels[:-1], levels[1:]))
    main = np.array(karras(steps - length * times, levels[-2], levels[0]))
    low = int(np.argmin(np.abs(main - RESTART_AT)))  # the first of equally near ones, as torch.argmin
    high = int(np.argmin(np.abs(main - RESTART_TO)))
    pairs = []
    for i in range(len(main) - 1):
        pairs.append((float(main[i]), float(main[i + 1])))
        if i + 1 == low and high < low:
            ramp = karras(length + 1, float(main[low]), float(main[high]))[:-1]
            pairs += list(zip(ramp[:-1], ramp[1:])) * times
    return pairs


class RestartScheduler(KSamplerScheduler):
    """A1111's "Restart": two model calls a step (one for the last, to 0), like diffusers' Heun."""

    order = 2
    default_schedule = "karras"

    def length(self, steps: int) -> int:
        return 2 * steps - 1

    def call_sigmas(self, levels, whole):
        sigmas = []
        for old, new in step_pairs(levels):
            sigmas += [old] if new == 0 else [old, new]
        return sigmas

    def algorithm(self, x, levels, whole, noise):
        last = None
        for old, new in step_pairs(levels):
            if last is not None and old > last:  # a restart: back up to `old` with fresh noise
                x = x + noise(x) * (old ** 2 - last ** 2) ** 0.5
            denoised, x = yield old, x
            d = (x - denoised) / old
            if new == 0:
                x = x + d * (new - old)
            else:
                denoised_2, x_2 = yield new, x + d * (new - old)
                d_2 = (x_2 - denoised_2) / new
                x = x + (d + d_2) / 2 * (new - old)
            last = new
        return x
