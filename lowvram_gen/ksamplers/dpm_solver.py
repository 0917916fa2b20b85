"""A1111's "DPM fast" and "DPM adaptive": DPM-Solver (Lu et al. 2022, "DPM-Solver: A Fast ODE Solver for Diffusion
Probabilistic Model Sampling in Around 10 Steps", its fixed and adaptive step solvers as k-diffusion's DPMSolver
runs them) as diffusers schedulers.

Both step in t = -log(sigma) from sigma_max to sigma_min and end there, at sigma_min, not at 0 (the decoded image
keeps that little noise, as in A1111). A1111 gives them, in txt2img, the model's own sigma_min and sigma_max, and
in img2img the pass's first and next-to-last levels; with its ancestral eta (its "Eta for k-diffusion samplers"
setting, 1 by default): each step goes below the next level, and the image's next noise brings it back up (drawn
every step, scaled by 0 where nothing is to be added back).

* DPM fast: `steps` model calls in all, spread over floor(steps / 3) + 1 equal steps in t of order 3, the last ones
  of order 2 and 1 (or steps % 3) so the calls add up (DPM-Solver-fast, the paper's section 3.4).
* DPM adaptive: steps of order 3 with an order-2 estimate beside it; their difference against A1111's tolerances
  (rtol 0.05, atol 0.0078, first step h 0.05 in t) accepts or rejects each step, and a controller (integral, 0.81
  safety) picks the next step's size: three model calls a try, as many tries as the error control needs, whatever
  the step count. Its call points are written into `timesteps` as the tries go (stepper.py); the list is
  `steps + MAX_CALLS` long, and `finished` tells the caller (engines/sd/pipeline.py's step callback) to end the
  pipeline's loop through diffusers' `interrupt` when the solver is done, so that the remaining entries cost no
  model call. Its progress is how far in t the solver has come (`progress`).
"""

from __future__ import annotations

import math

import torch

from lowvram_gen.ksamplers.stepper import KSamplerScheduler

ETA = 1.0  # A1111's default "Eta for k-diffusion samplers" (eta_ancestral), which it hands both
# DPM adaptive's tolerances and step-size control: k-diffusion's defaults, which A1111 keeps
RTOL, ATOL, H_INIT, ACCEPT_SAFETY = 0.05, 0.0078, 0.05, 0.81
MAX_CALLS = 1500  # the most model calls DPM adaptive may take (each try is three); more is an error


def _sigma(t: float) -> float:
    return math.exp(-t)


def _t(sigma: float) -> float:
    return -math.log(sigma)


def ancestral(t: float, t_next: float, t_end: float, eta: float = ETA) -> tuple[float, float]:
    """(the t a step goes to, the noise to add back after it) of an ancestral step from t to t_next: k-diffusion's
    get_ancestral_step in sigma, the step not beyond t_end."""
    if not eta:
        return t_next, 0.0
    s, s_next = _sigma(t), _sigma(t_next)
    up = min(s_next, eta * (s_next ** 2 * (s ** 2 - s_next ** 2) / s ** 2) ** 0.5)
    down = (s_next ** 2 - up ** 2) ** 0.5
    t_to = min(t_end, _t(down)) if down > 0 else t_end
    return t_to, (s_next ** 2 - _sigma(t_to) ** 2) ** 0.5


def fast_orders(calls: int) -> list[int]:
    """DPM-Solver-fast's orders for `calls` model calls: 3s, then 2 and 1, or the remainder."""
    m = calls // 3 + 1
    return [3] * (m - 2) + [2, 1] if calls % 3 == 0 else [3] * (m - 1) + [calls % 3]


class _DPMSolver(KSamplerScheduler):
    def range(self, levels, whole: bool) -> tuple[float, float]:
        """(sigma_max, sigma_min) of a pass: the model's own in txt2img, the pass's first and next-to-last level in
        img2img (A1111's sample and sample_img2img)."""
        if whole:
            return self.model.sigma_max, self.model.sigma_min
        return levels[0], levels[-2]

    def _eps(self, denoised, x, t):
        return (x - denoised) / _sigma(t)


class DPMSolverFastScheduler(_DPMSolver):
    """A1111's "DPM fast": DPM-Solver-fast with `steps` model calls."""

    def _plan(self, levels, whole):
        high, low = self.range(levels, whole)
        calls = len(levels) - 1
        orders = fast_orders(calls)
        t_start, t_end = _t(high), _t(low)
        ts = [t_start + (t_end - t_start) * i / len(orders) for i in range(len(orders) + 1)]
        return orders, ts, t_end

    def call_sigmas(self, levels, whole):
        orders, ts, t_end = self._plan(levels, whole)
        points = []
        for i, order in enumerate(orders):
            t_to, _ = ancestral(ts[i], ts[i + 1], t_end)
            h = t_to - ts[i]
            points += [ts[i], ts[i] + h / 2] if order == 2 else [ts[i]] if order == 1 else [ts[i], ts[i] + h / 3,
                                                                                               ts[i] + 2 * h / 3]
        return [_sigma(t) for t in points]

    def algorithm(self, x, levels, whole, noise):
        orders, ts, t_end = self._plan(levels, whole)
        for i, order in enumerate(orders):
            t, (t_to, up) = ts[i], ancestral(ts[i], ts[i + 1], t_end)
            x = yield from _solve(self, x, t, t_to, order)
            x = x + noise(x) * up
        return x


def _solve(scheduler, x, t, t_to, order, low_order: bool = False):
    """One DPM-Solver step of `order` from t to t_to as model-call requests; the new x (and, `low_order`, also the
    order-2 estimate with r1 = 1/3 that DPM adaptive compares it with)."""
    h = t_to - t
    denoised, x = yield _sigma(t), x
    eps = [scheduler._eps(denoised, x, t)]
    s_to = _sigma(t_to)
    first = x - s_to * math.expm1(h) * eps[0]
    if order == 1:
        return first
    r1 = 1 / 3 if order == 3 else 1 / 2
    s1 = t + r1 * h
    denoised, u1 = yield _sigma(s1), x - _sigma(s1) * math.expm1(r1 * h) * eps[0]
    eps.append(scheduler._eps(denoised, u1, s1))
    if order == 2:
        return first - s_to / (2 * r1) * math.expm1(h) * (eps[1] - eps[0])
    r2 = 2 / 3
    s2 = t + r2 * h
    u2 = (x - _sigma(s2) * math.expm1(r2 * h) * eps[0]
          - _sigma(s2) * (r2 / r1) * (math.expm1(r2 * h) / (r2 * h) - 1) * (eps[1] - eps[0]))
    denoised, u2 = yield _sigma(s2), u2
    eps.append(scheduler._eps(denoised, u2, s2))
    high = first - s_to / r2 * (math.expm1(h) / h - 1) * (eps[2] - eps[0])
    if low_order:
        return first - s_to / (2 * r1) * math.expm1(h) * (eps[1] - eps[0]), high
    return high


class DPMSolverAdaptiveScheduler(_DPMSolver):
    """A1111's "DPM adaptive": DPM-Solver-3 with an order-2 error estimate and adaptive step size (the paper's
    adaptive step size as k-diffusion runs it: the controller's exponent 1 / 1.5 with eta, 1 / 3 without)."""

    progress = 0.0  # how far in t the solver has come, 0 to 1

    def length(self, steps: int) -> int:
        return steps + MAX_CALLS

    def call_sigmas(self, levels, whole):
        return [self.range(levels, whole)[0]]  # the rest are written as the tries go

    def algorithm(self, x, levels, whole, noise):
        high, low = self.range(levels, whole)
        t_start, t_end = _t(high), _t(low)
        s, x_prev, h = t_start, x, H_INIT
        exponent = 1 / (1.5 if ETA else 3)
        self.progress = 0.0
        while s < t_end - 1e-5:
            t = min(t_end, s + h)
            t_to, up = ancestral(s, t, t_end)
            x_low, x_high = yield from _solve(self, x, s, t_to, 3, low_order=True)
            delta = torch.clamp(RTOL * torch.maximum(x_low.abs(), x_prev.abs()), min=ATOL)
            error = float(torch.linalg.norm((x_low - x_high) / delta)) / x.numel() ** 0.5
            factor = 1 + math.atan((1 / (error + 1e-8)) ** exponent - 1)  # integral control, limited
            h *= factor
            if factor >= ACCEPT_SAFETY:
                x_prev, x, s = x_low, x_high + noise(x) * up, t
                self.progress = (s - t_start) / (t_end - t_start)
        return x
