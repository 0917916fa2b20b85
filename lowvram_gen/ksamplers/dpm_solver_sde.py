"""A1111's DPM++ 2M SDE, 2M SDE Heun and 3M SDE: k-diffusion's multistep SDE samplers with its Brownian-tree noise.

diffusers' DPMSolverMultistepScheduler (sde-dpmsolver++) draws fresh Gaussian noise at each step, so a seed gives
another image than A1111's, and its third order is another formula. A1111 runs k-diffusion's `sample_dpmpp_2m_sde`
(Lu et al. 2022, "DPM-Solver++", its SDE variant at eta 1, midpoint or Heun solver type) and `sample_dpmpp_3m_sde`
(k-diffusion's third-order multistep SDE) with a `BrownianTreeNoiseSampler`: one torchsde Brownian tree per image,
its entropy the image's seed, over [the lowest nonzero level, the highest] of the job's whole schedule (img2img's and
the hires pass's too, though they start lower); the noise from sigma to sigma_next is
(W(sigma_next) - W(sigma)) / sqrt(|sigma_next - sigma|), W drawn in float32 on the latents' device, whatever A1111's
"Random number generator source" (torchsde draws it, not A1111's RNG).

`DPMSolverMultistepSDEScheduler` is diffusers' DPMSolverMultistepScheduler (its config, timesteps, model-output
conversion, add_noise, begin index: every SD-family pipeline runs it as it runs diffusers' class, and
schedules.hand_over gives it A1111's levels) with k-diffusion's step. The images' seeds come in as DPM++ SDE's do:
the engine sets `noise_sampler_seed` to the batch's seeds (one tree per image: the same seed gives the same image
whatever the batch); unset, the trees are seeded at random as diffusers' DPMSolverSDEScheduler does.
"""

from __future__ import annotations

import math

from diffusers import DPMSolverMultistepScheduler
from diffusers.schedulers.scheduling_euler_discrete import EulerDiscreteSchedulerOutput


def brownian_noise(sample, sigmas, seeds):
    """k-diffusion's Brownian-tree noise sampler for `sample`'s batch over `sigmas`' nonzero range: one tree per image
    seeded by the list `seeds` (an int: one tree for the whole batch, as diffusers' `noise_sampler_seed`; None: at
    random), drawn in float32 on `sample`'s device (diffusers' copy of k-diffusion's BrownianTreeNoiseSampler, which
    wraps torchsde.BrownianTree). Called (sigma, sigma_next) -> float32 noise."""
    import torch
    from diffusers.schedulers.scheduling_dpmsolver_sde import BrownianTreeNoiseSampler

    levels = sigmas.to("cpu", torch.float32)
    shape = tuple(sample.shape)
    if seeds is not None and not isinstance(seeds, int):
        seeds = [int(s) for s in seeds]
        if len(seeds) != shape[0]:
            raise ValueError(f"noise_sampler_seed has {len(seeds)} seeds for a batch of {shape[0]} images")
    return BrownianTreeNoiseSampler(torch.zeros(shape, dtype=torch.float32, device=sample.device),
                                    levels[levels > 0].min(), levels.max(), seed=seeds)


class DPMSolverMultistepSDEScheduler(DPMSolverMultistepScheduler):
    """k-diffusion's DPM-Solver++(2M) SDE (`solver_type` midpoint or heun, `solver_order` 2) and DPM-Solver++(3M) SDE
    (`solver_order` 3) at eta 1, as diffusers' DPMSolverMultistepScheduler with `algorithm_type="sde-dpmsolver++"`
    is configured, stepping with the Brownian-tree noise of the images' seeds (`noise_sampler_seed`)."""

    noise_sampler_seed = None  # the images' seeds, set by the engine before a pass

    def set_timesteps(self, *args, **kwargs):
        super().set_timesteps(*args, **kwargs)
        self._tree = None  # built at the first step, over the levels set now
        # the last two steps' denoised estimates and their lengths in log sigma (k-diffusion's denoised_1, h_1, ...)
        self._d1 = self._d2 = self._h1 = self._h2 = None

    def step(self, model_output, timestep, sample, generator=None, variance_noise=None, return_dict: bool = True):
        """One k-diffusion step from this level to the next, on diffusers' scaled latents x / sqrt(1 + sigma^2), with
        the denoised estimate as `pred_original_sample`. `generator` and `variance_noise` are taken for the pipelines'
        sake and unused: the noise is the trees'."""
        import torch

        if self.num_inference_steps is None:
            raise ValueError("set_timesteps must run before step")
        if self.step_index is None:
            self._init_step_index(timestep)
        if self.config.algorithm_type != "sde-dpmsolver++" or self.config.solver_order not in (2, 3):
            raise ValueError(f"{type(self).__name__} runs sde-dpmsolver++ of order 2 or 3, not "
                             f"{self.config.algorithm_type} of order {self.config.solver_order}")
        sigma_t, sigma_next_t = self.sigmas[self.step_index], self.sigmas[self.step_index + 1]
        sigma, sigma_next = float(sigma_t), float(sigma_next_t)
        denoised = self.convert_model_output(model_output, sample=sample).to(torch.float32)
        x = sample.to(torch.float32) * math.sqrt(1 + sigma ** 2)  # k-diffusion's unscaled latents
        h = None
        if sigma_next == 0:
            x = denoised  # the last step: the model's estimate itself
        else:
            h = math.log(sigma) - math.log(sigma_next)
            x = self._update(x, denoised, h, sigma, sigma_next)
            if self._tree is None:
                self._tree = brownian_noise(sample, self.sigmas, self.noise_sampler_seed)
            # the trees are asked at A1111's float32 levels
            noise = self._tree(sigma_t.to(torch.float32), sigma_next_t.to(torch.float32)).to(x.device)
            x = x + noise * sigma_next * math.sqrt(-math.expm1(-2 * h))
        self._d1, self._d2, self._h1, self._h2 = denoised, self._d1, h, self._h1
        self._step_index += 1
        prev_sample = (x / math.sqrt(1 + sigma_next ** 2)).to(model_output.dtype)
        estimate = denoised.to(model_output.dtype)  # what a preview shows and an interrupted pass keeps, as A1111
        if not return_dict:
            return (prev_sample, estimate)
        return EulerDiscreteSchedulerOutput(prev_sample=prev_sample, pred_original_sample=estimate)

    def _update(self, x, denoised, h: float, sigma: float, sigma_next: float):
        """k-diffusion's deterministic part of the step (eta 1: the exponential integrator over 2h), with the
        multistep corrections from the previous estimates."""
        # the first-order part: sigma_next / sigma * e^-h * x + (1 - e^-2h) * denoised
        x = (sigma_next / sigma * math.exp(-h)) * x + (-math.expm1(-2 * h)) * denoised
        if self._h1 is None:
            return x
        if self.config.solver_order == 3 and self._h2 is not None:
            # 3M: the first and second differences of the last three estimates (k-diffusion's phi_2, phi_3)
            r0, r1 = self._h1 / h, self._h2 / h
            d1_0 = (denoised - self._d1) / r0
            d1_1 = (self._d1 - self._d2) / r1
            d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
            d2 = (d1_0 - d1_1) / (r0 + r1)
            phi_2 = math.expm1(-2 * h) / (2 * h) + 1
            phi_3 = phi_2 / (2 * h) - 0.5
            return x + phi_2 * d1 - phi_3 * d2
        d = (denoised - self._d1) / (self._h1 / h)
        if self.config.solver_order == 3:
            return x + (math.expm1(-2 * h) / (2 * h) + 1) * d
        if self.config.solver_type == "heun":
            return x + (-math.expm1(-2 * h) / (-2 * h) + 1) * d
        return x + 0.5 * (-math.expm1(-2 * h)) * d
