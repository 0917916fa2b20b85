"""A1111's "DPM++ 2S a" as a diffusers scheduler: DPM-Solver++(2S) with an ancestral step (k-diffusion's
sample_dpmpp_2s_ancestral, eta 1), so it runs inside every diffusers pipeline the SD-family engine uses.

The algorithm (Lu et al. 2022, "DPM-Solver++", the single-step second-order solver in log-SNR time t = -log sigma,
with the ancestral split of Karras et al. 2022 / k-diffusion's get_ancestral_step): for each pair of levels
sigma -> sigma_next, sigma_down and sigma_up with sigma_down^2 + sigma_up^2 = sigma_next^2; the model is called at
sigma, then at the midpoint s of log-SNR time between sigma and sigma_down, and x moves to sigma_down; then
sigma_up times the image's next noise is added. Where sigma_down is 0 (the last step, sigma_next 0) it is one
Euler step to 0 with one call, no noise: 2 calls a step, 1 on the last one, as A1111 runs it.

As diffusers' Heun scheduler does, `timesteps` has one entry per model call (the UNet's continuous t of that call's
sigma, as k-diffusion's denoiser gives it), `order` is 2 (img2img's get_timesteps starts at call 2 * step), and
`sigmas[i]` is the level of the latents handed to call i (the midpoint for a second call). The step noise is
diffusers' `randn_tensor` with the pipeline's generators (one per image), imported here so that the NV RNG source
(engines/sd/rng_source.py) replaces it in this module too.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_euler_discrete import betas_for_alpha_bar
from diffusers.schedulers.scheduling_utils import KarrasDiffusionSchedulers, SchedulerMixin, SchedulerOutput
from diffusers.utils.torch_utils import randn_tensor

from lowvram_gen.a1111 import sigmas as a1111_sigmas


def ancestral_step(sigma: float, sigma_next: float) -> tuple[float, float]:
    """(sigma_down, sigma_up) at eta 1: sigma_up^2 = sigma_next^2 (sigma^2 - sigma_next^2) / sigma^2, capped at
    sigma_next."""
    up = min(sigma_next, math.sqrt(max(sigma_next ** 2 * (sigma ** 2 - sigma_next ** 2) / sigma ** 2, 0.0)))
    return math.sqrt(max(sigma_next ** 2 - up ** 2, 0.0)), up


class DPMPP2SAncestralScheduler(SchedulerMixin, ConfigMixin):
    """DPM-Solver++(2S) ancestral on a discrete noise-prediction model's levels (k-diffusion's sigmas: x = x0 +
    sigma * noise). Without `sigmas=`, set_timesteps steps through A1111's Karras levels (its Automatic here)."""

    _compatibles = [e.name for e in KarrasDiffusionSchedulers]
    order = 2

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                 beta_schedule: str = "scaled_linear", trained_betas: np.ndarray | list[float] | None = None,
                 prediction_type: str = "epsilon"):
        if trained_betas is not None:
            betas = torch.tensor(trained_betas, dtype=torch.float32)
        elif beta_schedule == "linear":
            betas = torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float32)
        elif beta_schedule == "scaled_linear":
            betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, num_train_timesteps, dtype=torch.float32) ** 2
        elif beta_schedule == "squaredcos_cap_v2":
            betas = betas_for_alpha_bar(num_train_timesteps)
        else:
            raise NotImplementedError(f"beta_schedule {beta_schedule!r} is not one of linear, scaled_linear, "
                                      "squaredcos_cap_v2")
        if prediction_type not in ("epsilon", "v_prediction"):
            raise ValueError(f"prediction_type {prediction_type!r}: DPM++ 2S a takes epsilon or v_prediction")
        self.betas = betas
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        self._model = a1111_sigmas.Discrete(self.alphas_cumprod.double().numpy())
        self.num_inference_steps = None
        self._begin_index = None
        self._step_index = None
        self.set_timesteps(10)

    # the schedule ------------------------------------------------------------------------------------------------
    def set_levels(self, levels, device=None):
        """Step through A1111's `levels` as they are (schedules.hand_over's door for lowvram_gen.ksamplers' classes;
        the class's own set_timesteps: hand_over binds a step-count-only one to the object)."""
        type(self).set_timesteps(self, device=device, sigmas=levels)

    def set_timesteps(self, num_inference_steps: int | None = None, device=None, sigmas=None):
        """Step through `sigmas` (A1111's levels, highest first, ending at 0 or at the model's lowest level), or
        A1111's Karras levels for `num_inference_steps`."""
        if sigmas is None:
            if num_inference_steps is None:
                raise ValueError("set_timesteps needs num_inference_steps or sigmas")
            sigmas = a1111_sigmas.a1111("karras", int(num_inference_steps), self.alphas_cumprod.double().numpy())
        levels = [float(s) for s in sigmas]
        if len(levels) < 2 or any(b > a for a, b in zip(levels, levels[1:])) or levels[-1] < 0:
            raise ValueError(f"sigmas must be at least 2 levels, highest first, none below 0: {levels}")
        calls, plan = [], []  # the sigma of each model call; per call (level index, second call of its step)
        for i, (sigma, sigma_next) in enumerate(zip(levels[:-1], levels[1:])):
            down, _ = ancestral_step(sigma, sigma_next)
            calls.append(sigma)
            plan.append((i, False))
            if down > 0:  # DPM-Solver++(2S): a second call at the midpoint of log-SNR time between sigma and down
                calls.append(math.sqrt(sigma * down))  # exp(-(t + h / 2)), t = -log sigma, h = log(sigma / down)
                plan.append((i, True))
        self.num_inference_steps = len(levels) - 1
        self.levels = torch.tensor(levels, dtype=torch.float64)
        self._plan = plan
        self.sigmas = torch.tensor(calls + [levels[-1]], dtype=torch.float32)
        self.timesteps = torch.from_numpy(self._model.sigma_to_t(np.asarray(calls))).to(device=device,
                                                                                        dtype=torch.float32)
        self._step_index = None
        self._begin_index = None
        self._held = None

    @property
    def init_noise_sigma(self):
        return float(self.levels[0])  # A1111: the first latents are the first level times the seed's noise

    @property
    def step_index(self):
        return self._step_index

    @property
    def begin_index(self):
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0) -> None:
        self._begin_index = begin_index

    def index_for_timestep(self, timestep, schedule_timesteps=None) -> int:
        schedule_timesteps = self.timesteps if schedule_timesteps is None else schedule_timesteps
        found = (schedule_timesteps == timestep).nonzero()
        if not len(found):
            raise ValueError(f"timestep {float(timestep)} is not one of this schedule's")
        return int(found[0].item())

    def _init_step_index(self, timestep) -> None:
        if self._begin_index is not None:
            self._step_index = self._begin_index
        else:
            timestep = timestep.to(self.timesteps.device) if isinstance(timestep, torch.Tensor) else timestep
            self._step_index = self.index_for_timestep(timestep)

    def scale_model_input(self, sample: torch.Tensor, timestep=None) -> torch.Tensor:
        """k-diffusion's denoiser input: x / sqrt(sigma^2 + 1) at this call's sigma."""
        if self._step_index is None:
            self._init_step_index(timestep)
        sigma = float(self.sigmas[self._step_index])
        return sample / (sigma ** 2 + 1) ** 0.5

    # one model call ----------------------------------------------------------------------------------------------
    def _denoised(self, model_output, sample, sigma: float):
        if self.config.prediction_type == "v_prediction":
            return model_output * (-sigma / (sigma ** 2 + 1) ** 0.5) + sample / (sigma ** 2 + 1)
        return sample - sigma * model_output

    def step(self, model_output: torch.Tensor, timestep, sample: torch.Tensor, generator=None,
             return_dict: bool = True):
        """One model call's update: the first call of a step returns the midpoint latents (or, on a last step to 0,
        the denoised image); the second returns the next level's latents with the ancestral noise added."""
        if self._step_index is None:
            self._init_step_index(timestep)
        level, second = self._plan[self._step_index]
        sigma, sigma_next = float(self.levels[level]), float(self.levels[level + 1])
        down, up = ancestral_step(sigma, sigma_next)
        here = float(self.sigmas[self._step_index])
        denoised = self._denoised(model_output.to(torch.float32), sample.to(torch.float32), here)
        h = math.log(sigma) - math.log(down) if down > 0 else None
        if h is None:  # Euler to sigma_down 0: the denoised image
            out = denoised
        elif not second:
            self._held = sample.to(torch.float32)
            out = math.exp(-0.5 * h) * self._held - math.expm1(-0.5 * h) * denoised
        else:
            out = (down / sigma) * self._held - math.expm1(-h) * denoised
            self._held = None
        if (h is None or second) and sigma_next > 0:
            noise = randn_tensor(model_output.shape, generator=generator, device=model_output.device,
                                 dtype=torch.float32)
            out = out + noise * up
        self._step_index += 1
        out = out.to(sample.dtype)
        if not return_dict:
            return (out, denoised)
        return SchedulerOutput(prev_sample=out)

    def add_noise(self, original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor):
        """x0 + sigma * noise at the call the pipeline is at (img2img: its begin index; inpaint, after a step: the
        next call's level)."""
        sigmas = self.sigmas.to(device=original_samples.device, dtype=original_samples.dtype)
        if self._begin_index is None:
            indices = [self.index_for_timestep(t, self.timesteps.to(timesteps.device)) for t in timesteps]
        elif self._step_index is not None:
            indices = [self._step_index] * timesteps.shape[0]
        else:
            indices = [self._begin_index] * timesteps.shape[0]
        sigma = sigmas[indices].flatten()
        while sigma.ndim < original_samples.ndim:
            sigma = sigma.unsqueeze(-1)
        return original_samples + noise * sigma

    def __len__(self) -> int:
        return self.config.num_train_timesteps
