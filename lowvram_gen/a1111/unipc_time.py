"""A1111's UniPC time steps (its sd_samplers_timesteps, 1.6+, with the UniPC of Zhao et al. 2023 and its default
options: time-uniform steps), handed to diffusers' UniPCMultistepScheduler.

A1111 runs UniPC for as many steps as its timestep samplers' schedule has entries, len(range(0, 1000, 1000 // steps))
(30 steps: 31; 3: 4), time-uniformly in continuous VP time from t = 1 to t = 1/N (N = 1000 training steps), where
log alpha_t is linear in t between the training steps (t_k = (k + 1) / N) and the UNet is given (t - 1/N) * N as it
is (999, 749.25, ... for 4 steps). It starts from the seed's noise as it is and stops at t = 1/N, the model's lowest
level, without a model call there. diffusers' class steps through the same levels as k-diffusion sigmas
(sigma = sqrt(1 - alpha^2) / alpha) with those times as its timesteps.

numpy at import; torch where a scheduler is handed over.
"""

from __future__ import annotations

import types

import numpy as np

from lowvram_gen.schedules import AUTOMATIC, HANDED


def a1111_steps(steps: int) -> int:
    """The steps A1111's UniPC runs for a request's `steps` (its timestep samplers' schedule length)."""
    if steps < 1 or steps > 1000:
        raise ValueError(f"steps {steps}: UniPC takes 1 to 1000")
    return len(range(0, 1000, 1000 // steps))


def time_uniform(steps: int, alphas_cumprod) -> tuple[np.ndarray, np.ndarray]:
    """(the UNet's input times, the levels as sigmas) of A1111's UniPC for `steps`: a1111_steps(steps) + 1 of each,
    the last one the end (t = 1/N, not called)."""
    log_alpha = 0.5 * np.log(np.asarray(alphas_cumprod, dtype=np.float64))
    n = len(log_alpha)
    model_times = (np.linspace(1.0, 1.0 / n, a1111_steps(steps) + 1) - 1.0 / n) * n
    alpha = np.exp(np.interp(model_times, np.arange(n), log_alpha))
    return model_times, np.sqrt(1 - alpha ** 2) / alpha


def hand_over(scheduler):
    """Make a UniPCMultistepScheduler step through A1111's UniPC times for whatever step count it is set to."""
    import torch

    own = type(scheduler).set_timesteps
    alphas = scheduler.alphas_cumprod.double().cpu().numpy()

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        if num_inference_steps is None or any(v is not None for v in kwargs.values()):
            raise ValueError(f"A1111's UniPC schedule is set by a step count alone, not {kwargs}")
        times, levels = time_uniform(int(num_inference_steps), alphas)
        own(self, len(times) - 1, device=device)  # the class's state (orders, history) reset for that many steps
        self.sigmas = torch.tensor(levels, dtype=torch.float32)
        self.timesteps = torch.tensor(times[:-1], dtype=torch.float32, device=device)
        self.num_inference_steps = len(times) - 1

    scheduler.set_timesteps = types.MethodType(set_timesteps, scheduler)
    scheduler.init_noise_sigma = 1.0  # the seed's noise as it is, at t = 1
    setattr(scheduler, HANDED, AUTOMATIC)  # schedules.applied_label: A1111's Automatic, no schedule type to write
    return scheduler
