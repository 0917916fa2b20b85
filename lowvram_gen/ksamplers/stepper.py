"""What lowvram_gen.ksamplers' schedulers share: a k-diffusion sampler written as a Python generator, run by a
diffusers pipeline's denoising loop one model call at a time.

A diffusers pipeline calls `scale_model_input(latents, t)`, the UNet at `t`, then `step(eps, t, latents)` once per
entry of `scheduler.timesteps`. A k-diffusion sampler (Restart, DPM-Solver) instead asks its denoiser D(x, sigma) at
points of its own choosing. Here each sampler is a generator, `algorithm(x, noise)`, that yields (sigma, x) for every
denoiser call it needs and is sent back D(x, sigma) as k-diffusion's CompVisDenoiser makes it from the UNet's
guided output (x - sigma * eps; the v-prediction form for SD 2.x's v models); its return value is the final latents.
`step` runs the generator to its next request and hands the pipeline the x to evaluate next.

`timesteps` holds the continuous timestep of each call's sigma (k-diffusion's sigma_to_t, as A1111 gives the UNet).
The pipeline iterates over that tensor (or a slice of it: img2img), and iterating a tensor reads each element from
its storage when it is reached, so a scheduler may write later calls' timesteps in place: where the call points
depend on where the pass starts (img2img's `set_begin_index`) or on the solver's own error control (DPM adaptive).

Levels come from schedules.hand_over through `set_levels` (A1111's levels of the job's schedule type); the pass's
first noise is the first level times the seed's noise, as A1111 draws it. Step noise is diffusers' `randn_tensor`
with the pipeline's per-image generators, drawn through this module's name so that rng_source's NV source covers it.
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_euler_discrete import EulerDiscreteSchedulerOutput
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils.torch_utils import randn_tensor

from lowvram_gen.a1111 import sigmas as a1111_sigmas


def karras(n: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> list[float]:
    """Karras et al. 2022, eq. 5 between any two levels: n levels, highest first, then 0."""
    ramp = np.linspace(0, 1, n)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return [float(s) for s in (hi + ramp * (lo - hi)) ** rho] + [0.0]


def _betas(config) -> torch.Tensor:
    if config.trained_betas is not None:
        return torch.tensor(config.trained_betas, dtype=torch.float32)
    n = config.num_train_timesteps
    if config.beta_schedule == "linear":
        return torch.linspace(config.beta_start, config.beta_end, n, dtype=torch.float32)
    if config.beta_schedule == "scaled_linear":
        return torch.linspace(config.beta_start ** 0.5, config.beta_end ** 0.5, n, dtype=torch.float32) ** 2
    if config.beta_schedule == "squaredcos_cap_v2":
        from diffusers.schedulers.scheduling_euler_discrete import betas_for_alpha_bar

        return betas_for_alpha_bar(n)
    raise ValueError(f"beta_schedule {config.beta_schedule!r}: use linear, scaled_linear or squaredcos_cap_v2")


class KSamplerScheduler(SchedulerMixin, ConfigMixin):
    """The diffusers side of a k-diffusion sampler (subclasses give `algorithm` and `call_sigmas`)."""

    order = 1
    _compatibles: list = []
    default_schedule = "uniform"  # the levels without hand_over: A1111's Automatic for the sampler

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                 beta_schedule: str = "scaled_linear", trained_betas=None, prediction_type: str = "epsilon"):
        if prediction_type not in ("epsilon", "v_prediction"):
            raise ValueError(f"prediction_type {prediction_type!r}: {type(self).__name__} takes epsilon or "
                             "v_prediction (k-diffusion's CompVisDenoiser and CompVisVDenoiser)")
        self.betas = _betas(self.config)
        self.alphas_cumprod = torch.cumprod(1.0 - self.betas, dim=0)
        self.model = a1111_sigmas.Discrete(self.alphas_cumprod.double().numpy())
        self.levels: list[float] | None = None
        self.timesteps = None
        self.sigmas = None
        self.num_inference_steps = None
        self.init_noise_sigma = 1.0
        self.finished = False
        self._begin_index = None
        self._step_index = None
        self._reset()

    # --- the levels and the calls -------------------------------------------------------------------------------
    def set_timesteps(self, num_inference_steps: int, device=None, **kwargs):
        """A1111's levels of the sampler's own Automatic schedule (hand_over replaces this with the job's type)."""
        if kwargs and any(v is not None for v in kwargs.values()):
            raise ValueError(f"{type(self).__name__} is set by a step count alone, not {kwargs}")
        self.set_levels(a1111_sigmas.a1111(self.default_schedule, int(num_inference_steps),
                                           self.alphas_cumprod.double().numpy()), device=device)

    def set_levels(self, levels, device=None):
        """Step through `levels` (A1111's, highest first, the last one where the sampler ends: 0)."""
        self.levels = [float(s) for s in levels]
        self.num_inference_steps = len(self.levels) - 1
        self.sigmas = torch.tensor(self.levels, dtype=torch.float32)
        self.init_noise_sigma = self.levels[0]
        self._begin_index = None
        self._step_index = None
        self._reset()
        calls = self.call_sigmas(self.levels, whole=True)
        self.timesteps = torch.zeros(self.length(self.num_inference_steps), dtype=torch.float32)
        self._write(0, calls)
        self.timesteps = self.timesteps.to(device)

    def length(self, steps: int) -> int:
        """How many entries `timesteps` has for `steps` levels (the pipeline loops over them)."""
        return steps

    def call_sigmas(self, levels: list[float], whole: bool) -> list[float]:
        """The sigmas the sampler calls the model at for a pass over `levels` (`whole`: from the first level, a
        txt2img pass), as far as they are known before it runs (at least the first)."""
        raise NotImplementedError

    def algorithm(self, x, levels: list[float], whole: bool, noise):
        """The sampler as a generator (see the module's docstring)."""
        raise NotImplementedError

    def _write(self, index: int, sigmas: list[float]) -> None:
        ts = torch.from_numpy(self.model.sigma_to_t(np.asarray(sigmas, dtype=np.float64))).float()
        end = min(index + len(ts), len(self.timesteps))
        self.timesteps[index:end] = ts[: end - index].to(self.timesteps.device)
        self._calls.update(zip(range(index, index + len(sigmas)), sigmas))

    def _reset(self):
        self._run = None
        self._next_sigma = None
        self._calls: dict[int, float] = {}  # index in timesteps -> the sigma of that model call
        self.finished = False

    # --- diffusers' scheduler interface -------------------------------------------------------------------------
    @property
    def begin_index(self):
        return self._begin_index

    @property
    def step_index(self):
        return self._step_index

    def set_begin_index(self, begin_index: int = 0):
        """img2img starts at `begin_index` of `timesteps` (its level times `order`): the calls of a pass over the
        levels from there, as A1111 runs its img2img (sigmas[steps - t_enc - 1:]), written from there on."""
        self._begin_index = begin_index
        self._reset()
        self._write(begin_index, self.call_sigmas(self.levels[begin_index // self.order:], whole=False))

    def index_for_timestep(self, timestep, schedule_timesteps=None):
        schedule = self.timesteps if schedule_timesteps is None else schedule_timesteps
        found = (schedule == timestep).nonzero()
        return int(found[0]) if len(found) else 0

    def _current_sigma(self) -> float:
        if self._next_sigma is not None:
            return self._next_sigma
        return self._calls[self._begin_index or 0]

    def scale_model_input(self, sample, timestep=None):
        """k-diffusion's CompVisDenoiser input scaling: x / sqrt(sigma^2 + 1) at the sigma of this call."""
        return sample / (self._current_sigma() ** 2 + 1) ** 0.5

    def _denoised(self, model_output, x, sigma: float):
        if self.config.prediction_type == "v_prediction":
            return x / (sigma ** 2 + 1) - model_output * (sigma / (sigma ** 2 + 1) ** 0.5)
        return x - sigma * model_output

    def step(self, model_output, timestep, sample, generator=None, return_dict: bool = True):
        """Give the sampler the model's output for the call it asked for; the latents to evaluate next come back
        (the final latents after its last call)."""
        dtype = sample.dtype
        if self.finished:  # DPM adaptive done before the list's end, in a loop nobody interrupted: nothing changes
            return (sample, sample) if not return_dict else EulerDiscreteSchedulerOutput(prev_sample=sample,
                                                                                           pred_original_sample=sample)
        x = sample.float()
        if self._run is None:
            self._step_index = self._begin_index or 0
            levels = self.levels[(self._begin_index or 0) // self.order:]

            def noise(like):
                return randn_tensor(like.shape, generator=generator, device=like.device, dtype=like.dtype)

            self._run = self.algorithm(x, levels, self._begin_index is None, noise)
            self._next_sigma = next(self._run)[0]
        sigma = self._next_sigma
        denoised = self._denoised(model_output.float(), x, sigma)
        self._step_index += 1
        try:
            self._next_sigma, out = self._run.send((denoised, x))
            if self._step_index >= len(self.timesteps):
                raise RuntimeError(f"{type(self).__name__} needed more than {len(self.timesteps)} model calls")
            self._write(self._step_index, [self._next_sigma])
        except StopIteration as done:
            out, self._run, self.finished = done.value, None, True
        prev = out.to(dtype)
        if not return_dict:
            return (prev, denoised.to(dtype))
        # diffusers' output with the sampler's estimate of the final latents (what a preview shows)
        return EulerDiscreteSchedulerOutput(prev_sample=prev, pred_original_sample=denoised.to(dtype))

    def add_noise(self, original_samples, noise, timesteps):
        """img2img's start: the image plus the noise times the sigma of the call at hand (the first of the pass)."""
        sigma = self._current_sigma() if self._step_index is not None else self._calls[self._begin_index or 0]
        return original_samples + noise * sigma

    def __getstate__(self):  # a copy of the scheduler (deepcopy) leaves a running sampler behind
        state = dict(self.__dict__)
        state["_run"] = None
        return state

    def __len__(self):
        return self.config.num_train_timesteps

