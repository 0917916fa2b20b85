"""A1111's "LCM" sampler as a diffusers scheduler: k-diffusion's sample_lcm on A1111's LCM denoiser (Luo et al. 2023,
"Latent Consistency Models"), so it runs inside every diffusers pipeline the SD-family engine uses.

A1111 runs LCM as a k-diffusion sampler on a denoiser of its own: the model's noise levels are those of the 50
timesteps an LCM is distilled on (19, 39, ..., 999: every T // 50-th, LCM's "original steps"), so every schedule
type (Automatic is Uniform) spaces its levels on those 50; the UNet is given the timestep of the nearest of them;
and the prediction x - sigma * eps is taken through the consistency model's boundary condition at 10 * t
(c_skip = 0.25 / ((10t)^2 + 0.25), c_out = 10t / sqrt((10t)^2 + 0.25)). Each step takes that prediction as the image
and, where the next level is above 0, adds the next level times fresh noise: one model call a level.

diffusers' LCMScheduler (another schedule: its own skipping timesteps, no noise levels) stays askable by its class
name. The step noise is diffusers' `randn_tensor` with the pipeline's generators (stepper.py).
"""

from __future__ import annotations

import numpy as np

from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.ksamplers.stepper import KSamplerScheduler

ORIGINAL_STEPS = 50  # the timesteps an LCM is distilled on (A1111's fixed "LCM original timesteps")
SIGMA_DATA = 0.5
TIME_SCALE = 10.0  # the boundary condition's timestep scaling


class LCMTimes:
    """The UNet timestep of a noise level: the nearest (in log sigma) of the 50 LCM timesteps."""

    def __init__(self, alphas_cumprod, train: int):
        self.skip = train // ORIGINAL_STEPS
        self.log_sigmas = a1111_sigmas.Discrete(alphas_cumprod).log_sigmas

    def sigma_to_t(self, sigma) -> np.ndarray:
        log_sigma = np.log(np.asarray(sigma, dtype=np.float64))
        nearest = np.abs(log_sigma[..., None] - self.log_sigmas).argmin(axis=-1)
        return (nearest * self.skip + self.skip - 1).astype(np.float64)


class LCMKDiffusionScheduler(KSamplerScheduler):
    """A1111's "LCM": one model call a level, the next level's noise added after it (not after the last)."""

    @property
    def level_alphas(self):
        """alphas_cumprod of the 50 LCM timesteps (T // 50 - 1, 2 T // 50 - 1, ...): the levels' model (hand_over)."""
        skip = self.config.num_train_timesteps // ORIGINAL_STEPS
        return self.alphas_cumprod[skip - 1::skip]

    def set_timesteps(self, num_inference_steps: int, device=None, **kwargs):
        """A1111's Automatic for LCM: Uniform on the 50 LCM levels (hand_over replaces this with the job's type)."""
        if kwargs and any(v is not None for v in kwargs.values()):
            raise ValueError(f"{type(self).__name__} is set by a step count alone, not {kwargs}")
        self.set_levels(a1111_sigmas.a1111("uniform", int(num_inference_steps), self.level_alphas.double().numpy()),
                        device=device)

    def set_levels(self, levels, device=None):
        self.model = LCMTimes(self.level_alphas.double().numpy(), self.config.num_train_timesteps)
        super().set_levels(levels, device=device)

    def call_sigmas(self, levels, whole):
        return levels[:-1]

    def _denoised(self, model_output, x, sigma: float):
        denoised = super()._denoised(model_output, x, sigma)
        t = TIME_SCALE * float(self.model.sigma_to_t(sigma))
        c_skip = SIGMA_DATA ** 2 / (t ** 2 + SIGMA_DATA ** 2)
        c_out = t / (t ** 2 + SIGMA_DATA ** 2) ** 0.5
        return c_out * denoised + c_skip * x

    def algorithm(self, x, levels, whole, noise):
        for sigma, sigma_next in zip(levels[:-1], levels[1:]):
            denoised, x = yield sigma, x
            x = denoised
            if sigma_next > 0:
                x = x + sigma_next * noise(x)
        return x
