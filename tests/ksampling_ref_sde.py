"""Reference SDE samplers for issue 31's tests: A1111's DPM++ SDE, DPM++ 2M SDE (midpoint and Heun) and DPM++ 3M SDE,
written from the published algorithms around tests/ksampling_ref.py's denoiser, apart from lowvram_gen's code.

The step noise is A1111's Brownian-tree noise (k-diffusion's BrownianTreeNoiseSampler as A1111's
`create_noise_sampler` sets it up, option "no_dpmpp_sde_batch_determinism" off): one torchsde.BrownianTree per image,
entropy the image's seed, w0 zeros of one image's latent shape in float32, spanning [the lowest nonzero level, the
highest] of the whole schedule (img2img: of the full schedule, not the part that runs); the noise between levels a
and b is (W(b) - W(a)) / sqrt(|b - a|), asked at the levels as float32 (A1111 holds them as float32 tensors).

- DPM++ SDE: DPM-Solver++ (Lu et al. 2022) single-step, r = 1/2, as k-diffusion's `sample_dpmpp_sde` with eta 1:
  in t = -log(sigma), an ancestral exponential-integrator step to the midpoint s = t + h/2 with the tree's noise, a
  second model call there, then a step from t to t_next with the midpoint's estimate; an Euler step to 0 at the end.
- DPM++ 2M SDE: DPM-Solver++(2M) in its SDE form at eta 1, the first-order step
  x' = sigma_next / sigma * e^-h * x + (1 - e^-2h) * D plus the previous estimate's correction (midpoint:
  0.5 * (1 - e^-2h) * (D - D_prev) / r; Heun: ((1 - e^-2h) / (-2h) + 1) * (D - D_prev) / r, r = h_prev / h) and
  sigma_next * sqrt(1 - e^-2h) times the tree's noise; the last step (to 0) is the estimate itself.
- DPM++ 3M SDE: k-diffusion's third-order multistep SDE: the same first-order step over 2h, with
  phi_2 * d1 - phi_3 * d2 from the last three estimates (phi_2 = (e^-2h - 1) / 2h + 1, phi_3 = phi_2 / 2h - 1/2).
"""

from __future__ import annotations

import math

import numpy as np

from ksampling_ref import ancestral_step, to_d


class BrownianNoise:
    """A1111's tree noise for a batch, one tree per seed (`entropy`): `noise(a, b)` is each image's
    (W(b) - W(a)) / sqrt(|b - a|), stacked."""

    def __init__(self, seeds, shape, levels):
        import torch
        import torchsde

        nonzero = [s for s in levels if s > 0]
        lo, hi = min(nonzero), max(nonzero)
        self.trees = [torchsde.BrownianTree(lo, torch.zeros(shape, dtype=torch.float32), hi, entropy=int(seed))
                      for seed in seeds]

    def __call__(self, a, b):
        import torch

        a, b = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
        lo, hi = (a, b) if a < b else (b, a)
        sign = 1.0 if a < b else -1.0  # W(b) - W(a)
        return torch.stack([tree(lo, hi) for tree in self.trees]) * sign / (b - a).abs().sqrt()


def float32(levels, full=None):
    """The levels as A1111 holds them (float32), and the tree over `full` (the whole schedule) or them."""
    return [float(np.float32(s)) for s in levels], [float(np.float32(s)) for s in (full or levels)]


def dpmpp_sde(denoiser, x, sigmas, rng=None, *, entropy, full=None):
    import torch

    levels, span = float32(sigmas, full)
    noise = BrownianNoise(entropy, x.shape[1:], span)
    # t = -log(sigma) and back in float32 tensors, as k-diffusion computes them: the trees are asked at these points,
    # and a Brownian path moves by sqrt(dt) between two points one float32 rounding apart
    t_of = lambda sigma: torch.as_tensor(sigma, dtype=torch.float32).log().neg()  # noqa: E731
    sigma_of = lambda t: t.neg().exp()  # noqa: E731
    for sigma, sigma_next in zip(levels[:-1], levels[1:]):
        denoised = denoiser(x, sigma)
        if sigma_next == 0:
            x = x + to_d(x, sigma, denoised) * (sigma_next - sigma)
            continue
        t, t_next = t_of(sigma), t_of(sigma_next)
        s = t + (t_next - t) * 0.5
        down, up = ancestral_step(float(sigma_of(t)), float(sigma_of(s)))
        x_2 = (down / float(sigma_of(t))) * x - float((t - t_of(down)).expm1()) * denoised
        x_2 = x_2 + noise(sigma_of(t), sigma_of(s)) * up
        denoised_2 = denoiser(x_2, float(sigma_of(s)))
        down, up = ancestral_step(float(sigma_of(t)), float(sigma_of(t_next)))
        x = (down / float(sigma_of(t))) * x - float((t - t_of(down)).expm1()) * denoised_2
        x = x + noise(sigma_of(t), sigma_of(t_next)) * up
    return x


def dpmpp_2m_sde(denoiser, x, sigmas, rng=None, *, entropy, solver_type="midpoint", full=None):
    levels, span = float32(sigmas, full)
    noise = BrownianNoise(entropy, x.shape[1:], span)
    previous, h_previous = None, None
    for sigma, sigma_next in zip(levels[:-1], levels[1:]):
        denoised = denoiser(x, sigma)
        if sigma_next == 0:
            x = denoised
        else:
            h = math.log(sigma / sigma_next)
            decay = -math.expm1(-2 * h)
            x = sigma_next / sigma * math.exp(-h) * x + decay * denoised
            if previous is not None:
                r = h_previous / h
                weight = decay / (-2 * h) + 1 if solver_type == "heun" else 0.5 * decay
                x = x + weight * (denoised - previous) / r
            x = x + noise(sigma, sigma_next) * sigma_next * math.sqrt(decay)
            h_previous = h
        previous = denoised
    return x


def dpmpp_2m_sde_heun(denoiser, x, sigmas, rng=None, *, entropy, full=None):
    return dpmpp_2m_sde(denoiser, x, sigmas, rng, entropy=entropy, solver_type="heun", full=full)


def dpmpp_3m_sde(denoiser, x, sigmas, rng=None, *, entropy, full=None):
    levels, span = float32(sigmas, full)
    noise = BrownianNoise(entropy, x.shape[1:], span)
    d_1 = d_2 = h_1 = h_2 = None
    for sigma, sigma_next in zip(levels[:-1], levels[1:]):
        denoised = denoiser(x, sigma)
        h = None
        if sigma_next == 0:
            x = denoised
        else:
            h = math.log(sigma / sigma_next)
            x = math.exp(-2 * h) * x - math.expm1(-2 * h) * denoised
            phi_2 = math.expm1(-2 * h) / (2 * h) + 1
            if h_2 is not None:
                r0, r1 = h_1 / h, h_2 / h
                first_0, first_1 = (denoised - d_1) / r0, (d_1 - d_2) / r1
                d1 = first_0 + (first_0 - first_1) * r0 / (r0 + r1)
                d2 = (first_0 - first_1) / (r0 + r1)
                x = x + phi_2 * d1 - (phi_2 / (2 * h) - 0.5) * d2
            elif h_1 is not None:
                x = x + phi_2 * (denoised - d_1) / (h_1 / h)
            x = x + noise(sigma, sigma_next) * sigma_next * math.sqrt(-math.expm1(-2 * h))
        d_1, d_2, h_1, h_2 = denoised, d_1, h, h_1
    return x
