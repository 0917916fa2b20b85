"""Reference samplers for issue 31's Restart, DPM fast and DPM adaptive, written from the published algorithms (not
from lowvram_gen's schedulers), run by ksampling_ref.txt2img around plain diffusers' UNet with A1111's noise.

* Restart: Xu et al. 2023, "Restart Sampling for Improving Generative Processes": Heun's method (Karras et al. 2022,
  Algorithm 1, churn 0; Euler into 0) with restarts from the level nearest 0.1 back to the one nearest 2, the
  interval run again on a Karras ramp; A1111's rule picks how many (none under 20 steps; one of 9 steps from 20;
  two of steps // 4 from 36) and re-spaces the main levels as a Karras ramp so the step count stays.
* DPM fast / DPM adaptive: Lu et al. 2022, "DPM-Solver", in lambda = -log(sigma) with the variance-exploding
  x (alpha = 1): DPM-Solver-1/2/3 updates, the "fast" order split of its
  section 3.4 and its adaptive step size with k-diffusion's defaults (rtol 0.05, atol 0.0078,
  h 0.05, an integral step controller with safety 0.81), ancestral with A1111's eta 1.
"""

from __future__ import annotations

import math

import numpy as np

from ksampling_ref import ancestral_step


def karras_ramp(n: int, low: float, high: float, rho: float = 7.0) -> list[float]:
    """Karras et al. 2022, eq. 5: n levels from `high` to `low`, then 0."""
    return [(high ** (1 / rho) + i / (n - 1) * (low ** (1 / rho) - high ** (1 / rho))) ** rho
            for i in range(n)] + [0.0]


def heun(denoiser, x, sigma, sigma_next):
    d = (x - denoiser(x, sigma)) / sigma
    if sigma_next == 0:
        return x + d * (sigma_next - sigma)
    x_euler = x + d * (sigma_next - sigma)
    d_next = (x_euler - denoiser(x_euler, sigma_next)) / sigma_next
    return x + (d + d_next) / 2 * (sigma_next - sigma)


def restart(denoiser, x, sigmas, rng):
    steps = len(sigmas) - 1
    if steps < 20:
        schedule, segment = list(sigmas), None
    else:
        per, repeats = (steps // 4, 2) if steps >= 36 else (9, 1)
        schedule = karras_ramp(steps - per * repeats, sigmas[-2], sigmas[0])
        distance = [abs(s - 0.1) for s in schedule]
        lo = distance.index(min(distance))
        distance = [abs(s - 2.0) for s in schedule]
        hi = distance.index(min(distance))
        segment = (lo, hi, per, repeats) if hi < lo else None
    pairs = []
    for i in range(len(schedule) - 1):
        pairs.append((schedule[i], schedule[i + 1]))
        if segment is not None and i + 1 == segment[0]:
            ramp = karras_ramp(segment[2] + 1, schedule[segment[0]], schedule[segment[1]])[:-1]
            for _ in range(segment[3]):
                pairs += [(ramp[k], ramp[k + 1]) for k in range(len(ramp) - 1)]
    reached = None
    for sigma, sigma_next in pairs:
        if reached is not None and sigma > reached:  # restart: forward-diffuse from `reached` up to `sigma`
            x = x + rng.next() * math.sqrt(sigma ** 2 - reached ** 2)
        x = heun(denoiser, x, sigma, sigma_next)
        reached = sigma_next
    return x


def dpm_solver_update(denoiser, x, lam, lam_to, order, r1=None, both=False):
    """One DPM-Solver step in lambda (x variance-exploding, eps = (x - D) / sigma): order 1, 2 (r1 = 1/2) or 3
    (r1 = 1/3, r2 = 2/3); `both`: also the order-2 estimate with r1 = 1/3 (DPM adaptive's error pair)."""
    sig = lambda lam_: math.exp(-lam_)  # noqa: E731
    eps = lambda y, lam_: (y - denoiser(y, sig(lam_))) / sig(lam_)  # noqa: E731
    h = lam_to - lam
    e0 = eps(x, lam)
    one = x - sig(lam_to) * math.expm1(h) * e0
    if order == 1:
        return one
    r1 = r1 or (0.5 if order == 2 else 1 / 3)
    u1 = x - sig(lam + r1 * h) * math.expm1(r1 * h) * e0
    e1 = eps(u1, lam + r1 * h)
    two = one - sig(lam_to) / (2 * r1) * math.expm1(h) * (e1 - e0)
    if order == 2:
        return two
    r2 = 2 / 3
    u2 = (x - sig(lam + r2 * h) * math.expm1(r2 * h) * e0
          - sig(lam + r2 * h) * (r2 / r1) * (math.expm1(r2 * h) / (r2 * h) - 1) * (e1 - e0))
    e2 = eps(u2, lam + r2 * h)
    three = one - sig(lam_to) / r2 * (math.expm1(h) / h - 1) * (e2 - e0)
    return (two, three) if both else three


def _ancestral(lam, lam_next, lam_end, eta):
    """(lambda to step to, noise to add back): k-diffusion's ancestral split, not past lambda_end."""
    down, up = ancestral_step(math.exp(-lam), math.exp(-lam_next), eta)
    lam_to = min(lam_end, -math.log(down)) if down > 0 else lam_end
    return lam_to, math.sqrt(max(math.exp(-2 * lam_next) - math.exp(-2 * lam_to), 0.0))


def dpm_fast(denoiser, x, sigmas, rng, sigma_min, sigma_max, eta=1.0):
    """`len(sigmas) - 1` model calls between sigma_max and sigma_min; ends at sigma_min."""
    n = len(sigmas) - 1
    k = n // 3 + 1
    orders = [3] * (k - 2) + [2, 1] if n % 3 == 0 else [3] * (k - 1) + [n % 3]
    lams = np.linspace(-math.log(sigma_max), -math.log(sigma_min), len(orders) + 1)
    for i, order in enumerate(orders):
        lam_to, up = _ancestral(float(lams[i]), float(lams[i + 1]), float(lams[-1]), eta)
        x = dpm_solver_update(denoiser, x, float(lams[i]), lam_to, order)
        x = x + rng.next() * up
    return x


def dpm_adaptive(denoiser, x, sigmas, rng, sigma_min, sigma_max, eta=1.0, rtol=0.05, atol=0.0078, h=0.05):
    import torch

    lam, lam_end = -math.log(sigma_max), -math.log(sigma_min)
    previous = x
    while lam < lam_end - 1e-5:
        lam_next = min(lam_end, lam + h)
        lam_to, up = _ancestral(lam, lam_next, lam_end, eta)
        low, high = dpm_solver_update(denoiser, x, lam, lam_to, 3, r1=1 / 3, both=True)
        scale = torch.maximum(torch.full_like(low, atol), rtol * torch.maximum(low.abs(), previous.abs()))
        error = float(torch.sqrt(torch.mean(((low - high) / scale) ** 2)))
        factor = 1 + math.atan((1 / (error + 1e-8)) ** (1 / (1.5 if eta else 3)) - 1)
        h *= factor
        if factor >= 0.81:
            previous, x, lam = low, high + rng.next() * up, lam_next
    return x
