"""A1111's UniPC time steps (its sd_samplers_timesteps, 1.6+, with the UniPC of Zhao et al. 2023), handed to
diffusers' UniPCMultistepScheduler, with A1111's uni_pc_* settings (a1111/unipc_options.py).

txt2img: A1111 runs UniPC for as many steps as its timestep samplers' schedule has entries,
len(range(0, 1000, 1000 // steps)) (30 steps: 31; 3: 4), in continuous VP time from t = 1 to t = 1/N (N = 1000
training steps), where log alpha_t is linear in t between the training steps (t_k = (k + 1) / N) and the UNet is
given (t - 1/N) * N as it is (999, 749.25, ... for 4 steps). The times between are the skip type's:
time_uniform (linear in t), time_quadratic (linear in sqrt t), logSNR (linear in lambda = log alpha - log sigma).
It starts from the seed's noise as it is and stops at t = 1/N without a model call there.

img2img, inpaint, hires fix's second pass: A1111's timestep img2img rule. A schedule of `steps` (an explicit count n,
or img2img_fix_steps: int(n / d) with t_enc = n - 1; else t_enc = int(d * steps)) gives the timesteps
ts = range(0, 1000, 1000 // steps) + 1. The init is noised to the discrete level ts[t_enc] (x sqrt(a) + noise
sqrt(1 - a)), and UniPC runs t_enc steps (t_enc UNet calls) from t = ts[t_enc - 1] / 1000 + 1/1000 down to 1/N:
one training step below the level it was noised to (A1111's own note calls it likely off by a bit; kept, it is
A1111's image). A1111 fails where t_enc is below the order (its assert) or 0; here the first steps run at the
orders they can (diffusers' warm-up) and t_enc is at least 1.

diffusers' class steps through the same levels as k-diffusion sigmas (sigma = sqrt(1 - alpha^2) / alpha) with those
times as its timesteps; the variant vary_coeff runs the paper's varying-coefficient predictor and corrector
(a1111/unipc_vary.py) in the class's place for the call. numpy at import; torch where a scheduler is handed over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types

import numpy as np

from lowvram_gen.a1111 import unipc_vary
from lowvram_gen.a1111.unipc_options import DEFAULTS
from lowvram_gen.schedules import AUTOMATIC, HANDED

LONGEST = 1000  # A1111's timestep samplers: 1000 // steps must be at least 1
_STATE = "_a1111_unipc"  # a handed scheduler's settings for the call running: skip type, the img2img pass


def a1111_steps(steps: int) -> int:
    """The steps A1111's UniPC runs for a request's `steps` (its timestep samplers' schedule length)."""
    if steps < 1 or steps > LONGEST:
        raise ValueError(f"steps {steps}: UniPC takes 1 to {LONGEST}")
    return len(range(0, LONGEST, LONGEST // steps))


class _VP:
    """The model's variance-preserving schedule in continuous time: log alpha linear between training steps."""

    def __init__(self, alphas_cumprod):
        self.log_alpha = 0.5 * np.log(np.asarray(alphas_cumprod, dtype=np.float64))
        self.n = len(self.log_alpha)

    def log_alpha_at(self, t):
        return np.interp((np.asarray(t, dtype=np.float64) - 1.0 / self.n) * self.n, np.arange(self.n), self.log_alpha)

    def lam(self, t):
        log_alpha = self.log_alpha_at(t)
        return log_alpha - 0.5 * np.log(1 - np.exp(2 * log_alpha))

    def time_of_lambda(self, lam):
        log_alpha = -0.5 * np.logaddexp(0.0, -2.0 * np.asarray(lam))
        return np.interp(log_alpha, self.log_alpha[::-1], (np.arange(self.n)[::-1] + 1.0) / self.n)

    def grid(self, skip_type: str, t_start: float, steps: int) -> np.ndarray:
        """`steps` + 1 times from `t_start` to 1/N, spaced as A1111's skip type spaces them."""
        end = 1.0 / self.n
        if skip_type == "time_quadratic":
            return np.linspace(t_start ** 0.5, end ** 0.5, steps + 1) ** 2
        if skip_type == "logSNR":
            return self.time_of_lambda(np.linspace(float(self.lam(t_start)), float(self.lam(end)), steps + 1))
        return np.linspace(t_start, end, steps + 1)

    def levels(self, grid) -> tuple[np.ndarray, np.ndarray]:
        """(the UNet's input times, the levels as sigmas) of the times `grid`."""
        alpha = np.exp(self.log_alpha_at(grid))
        return (np.asarray(grid) - 1.0 / self.n) * self.n, np.sqrt(1 - alpha ** 2) / alpha


def time_uniform(steps: int, alphas_cumprod, skip_type: str = "time_uniform") -> tuple[np.ndarray, np.ndarray]:
    """(the UNet's input times, the levels as sigmas) of A1111's txt2img UniPC for `steps`: a1111_steps(steps) + 1
    of each, the last one the end (t = 1/N, not called)."""
    vp = _VP(alphas_cumprod)
    return vp.levels(vp.grid(skip_type, 1.0, a1111_steps(steps)))


def t_enc_of(plan) -> int:
    """A1111's t_enc (the UniPC steps that run) of an img2img pass (img2img_steps.PassSteps: A1111's schedule, and
    the t_enc + 1 steps a k-diffusion sampler runs of it), at least 1 and below the schedule's timesteps (A1111 asserts
    or crashes there; here the pass runs)."""
    return max(1, min(plan.run - 1, a1111_steps(plan.schedule) - 1))


def img2img_times(schedule: int, run: int, alphas_cumprod,
                  skip_type: str = "time_uniform") -> tuple[np.ndarray, np.ndarray, float]:
    """(the UNet's input times, the levels as sigmas, the level the init is noised to) of A1111's UniPC pass of
    t_enc = `run` steps of a `schedule`-step list: t_enc calls from ts[t_enc - 1] / 1000 + 1/1000, the init noised at
    the discrete level ts[t_enc]."""
    timesteps = np.clip(np.arange(0, LONGEST, LONGEST // schedule) + 1, 0, LONGEST - 1)
    vp = _VP(alphas_cumprod)
    alpha_bar = float(np.exp(2 * vp.log_alpha[timesteps[run]]))
    times, levels = vp.levels(vp.grid(skip_type, timesteps[run - 1] / LONGEST + 1.0 / LONGEST, run))
    return times, levels, float(np.sqrt((1 - alpha_bar) / alpha_bar))


def hand_over(scheduler):
    """Make a UniPCMultistepScheduler step through A1111's UniPC times for whatever step count it is set to (an
    img2img pass: its own times, set by its `a1111_pass`, schedules.pass_of's door), with the settings `options`
    gives a call."""
    import torch

    own, own_noise = type(scheduler).set_timesteps, type(scheduler).add_noise
    alphas = scheduler.alphas_cumprod.double().cpu().numpy()
    setattr(scheduler, _STATE, {"skip_type": DEFAULTS["unipc_skip_type"], "pass": None})

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        if num_inference_steps is None or any(v is not None for v in kwargs.values()):
            raise ValueError(f"A1111's UniPC schedule is set by a step count alone, not {kwargs}")
        state = getattr(self, _STATE)
        if state["pass"] is not None:  # an img2img pass: a stand-in first entry (never run), then its own times
            times, levels, noised = state["pass"]
            times, levels = np.concatenate([times[:1], times]), np.concatenate([[noised], levels])
        else:
            times, levels = time_uniform(int(num_inference_steps), alphas, state["skip_type"])
        own(self, len(times) - 1, device=device)  # the class's state (orders, history) reset for that many steps
        self.timestep_list = [None] * self.config.solver_order  # which the class sizes at its init alone (order 4+)
        self.sigmas = torch.tensor(levels, dtype=torch.float32)
        self.timesteps = torch.tensor(times[:-1], dtype=torch.float32, device=device)
        self.num_inference_steps = len(times) - 1

    def add_noise(self, original, noise, timesteps):
        state = getattr(self, _STATE)
        if state["pass"] is None or timesteps.reshape(-1)[0] != self.timesteps[1]:
            return own_noise(self, original, noise, timesteps)  # inpaint's later blends: the class's own levels
        sigma = state["pass"][2]  # the init: A1111's level ts[t_enc], in the class's VP units
        alpha = 1.0 / (1.0 + sigma ** 2) ** 0.5
        return alpha * original + (sigma * alpha) * noise.to(original.dtype)

    def a1111_pass(self, plan, request):
        """The pass as A1111's UniPC runs it: its own times kept for the call's set_timesteps, handed to the pipeline
        as a schedule of one stand-in entry more than the steps that run."""
        state = getattr(self, _STATE)
        state["pass"] = img2img_times(plan.schedule, t_enc_of(plan), alphas, request.unipc_skip_type)
        run = len(state["pass"][0]) - 1
        return dataclasses.replace(plan, schedule=run + 1, run=run)  # the pipeline runs all but the stand-in

    scheduler.set_timesteps = types.MethodType(set_timesteps, scheduler)
    scheduler.add_noise = types.MethodType(add_noise, scheduler)
    scheduler.a1111_pass = types.MethodType(a1111_pass, scheduler)
    scheduler.init_noise_sigma = 1.0  # the seed's noise as it is, at t = 1
    setattr(scheduler, HANDED, AUTOMATIC)  # schedules.applied_label: A1111's Automatic, no schedule type to write
    return scheduler


@contextlib.contextmanager
def options(scheduler, request, img2img: bool = False):
    """`request`'s UniPC settings on `scheduler` for one pipeline call where it is handed over (else nothing); after
    it, the scheduler's own settings again and no img2img pass (set by `a1111_pass` just before an img2img call)."""
    state = getattr(scheduler, _STATE, None)
    if state is None:
        yield
        return
    if not img2img:
        state["pass"] = None
    before = {key: scheduler.config[key] for key in ("solver_type", "solver_order", "lower_order_final")}
    before_skip = state["skip_type"]
    # vary_coeff is no solver_type of diffusers' (its __init__ refuses one): the class's keeps, its updates are bound
    solver = {} if request.unipc_variant == unipc_vary.VARIANT else {"solver_type": request.unipc_variant}
    scheduler.register_to_config(**solver, solver_order=request.unipc_order,
                                 lower_order_final=request.unipc_lower_order_final)
    state["skip_type"] = request.unipc_skip_type
    try:
        with unipc_vary.updates(scheduler, request.unipc_variant):
            yield
    finally:
        scheduler.register_to_config(**before)
        state.update(skip_type=before_skip, **{"pass": None})
