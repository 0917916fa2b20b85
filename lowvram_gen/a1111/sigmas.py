"""A1111's noise levels (sigmas) for each of its schedule types, from a model's own alphas_cumprod.

What A1111 1.9+ steps its k-diffusion samplers through, written from the published formulas (docs/a1111-schedules.md
says where each comes from): k-diffusion's discrete-model schedule (Uniform), `get_sigmas_karras`,
`get_sigmas_exponential`, `get_sigmas_polyexponential`, the model's `t_to_sigma`/`sigma_to_t` (interpolation in
log sigma between the model's 1000 training noise levels), ComfyUI's Simple, Normal, SGM Uniform, DDIM and KL
Optimal, the Beta schedule of arXiv:2407.12173 and NVIDIA's Align Your Steps tables, log-linearly interpolated.
sigma_min and sigma_max are the model's own (its first and last training noise level), as A1111 takes them.

Every schedule is a list of `steps + 1` floats, highest first, the last one the level the sampler ends at (0, except
KL Optimal, which ends at sigma_min as A1111's does). `discard_penultimate` is A1111's `discard_next_to_last_sigma`
(DPM2, DPM2 a, DPM++ 3M SDE): one more level is computed and the next-to-last one dropped.

numpy only (scipy for Beta's distribution, imported when Beta is asked for); no torch.
"""

from __future__ import annotations

import math

import numpy as np

# NVIDIA's Align Your Steps 10-step tables (research.nvidia.com/labs/toronto-ai/AlignYourSteps/howto.html), as A1111
# and ComfyUI hold them: 11 noise levels, resampled log-linearly for another step count
AYS = {"sd15": (14.615, 6.475, 3.861, 2.697, 1.886, 1.396, 0.963, 0.652, 0.399, 0.152, 0.029),
       "sdxl": (14.615, 6.315, 3.771, 2.181, 1.342, 0.862, 0.555, 0.380, 0.234, 0.113, 0.029)}
KARRAS_RHO = 7.0  # A1111's default rho for Karras (its "rho" setting at 0)
POLYEXPONENTIAL_RHO = 1.0  # and for Polyexponential
BETA_ALPHA = BETA_BETA = 0.6  # A1111's "Beta schedule alpha/beta" defaults


class Discrete:
    """A model's training noise levels: sigma_t = sqrt((1 - alphas_cumprod_t) / alphas_cumprod_t) for t = 0..T-1,
    with k-diffusion's conversions between a continuous t and a sigma (linear in log sigma)."""

    def __init__(self, alphas_cumprod):
        alphas = np.asarray(alphas_cumprod, dtype=np.float64)
        if alphas.ndim != 1 or len(alphas) < 2 or not np.all((alphas > 0) & (alphas < 1)):
            raise ValueError("alphas_cumprod must be a list of at least 2 values between 0 and 1")
        self.sigmas = np.sqrt((1 - alphas) / alphas)
        self.log_sigmas = np.log(self.sigmas)

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[-1])

    def t_to_sigma(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        low = np.floor(t).astype(int)
        high = np.ceil(t).astype(int)
        w = t - low
        return np.exp((1 - w) * self.log_sigmas[low] + w * self.log_sigmas[high])

    def sigma_to_t(self, sigma) -> np.ndarray:
        log_sigma = np.log(np.asarray(sigma, dtype=np.float64))
        # the last training level at or below sigma (clamped so that one above exists), then linear in log sigma
        low = np.clip(np.searchsorted(self.log_sigmas, log_sigma, side="right") - 1, 0, len(self.log_sigmas) - 2)
        lo, hi = self.log_sigmas[low], self.log_sigmas[low + 1]
        w = np.clip((lo - log_sigma) / (lo - hi), 0, 1)
        return (1 - w) * low + w * (low + 1)


def _append_zero(levels) -> list[float]:
    return [float(x) for x in levels] + [0.0]


def uniform(n: int, model: Discrete) -> list[float]:
    """k-diffusion's DiscreteSchedule.get_sigmas: n values of t evenly from T-1 to 0."""
    return _append_zero(model.t_to_sigma(np.linspace(len(model.sigmas) - 1, 0, n)))


def karras(n: int, model: Discrete, rho: float = KARRAS_RHO) -> list[float]:
    """Karras et al. 2022, eq. 5 (k-diffusion's get_sigmas_karras)."""
    ramp = np.linspace(0, 1, n)
    lo, hi = model.sigma_min ** (1 / rho), model.sigma_max ** (1 / rho)
    return _append_zero((hi + ramp * (lo - hi)) ** rho)


def exponential(n: int, model: Discrete) -> list[float]:
    """Evenly spaced in log sigma (k-diffusion's get_sigmas_exponential)."""
    return _append_zero(np.exp(np.linspace(math.log(model.sigma_max), math.log(model.sigma_min), n)))


def polyexponential(n: int, model: Discrete, rho: float = POLYEXPONENTIAL_RHO) -> list[float]:
    """k-diffusion's get_sigmas_polyexponential: log sigma from max to min along ramp**rho."""
    ramp = np.linspace(1, 0, n) ** rho
    lo, hi = math.log(model.sigma_min), math.log(model.sigma_max)
    return _append_zero(np.exp(ramp * (hi - lo) + lo))


def sgm_uniform(n: int, model: Discrete) -> list[float]:
    """n + 1 values of t evenly from sigma_max's to sigma_min's, the last dropped (Stability's SGM "trailing")."""
    start, end = model.sigma_to_t(model.sigma_max), model.sigma_to_t(model.sigma_min)
    return _append_zero(model.t_to_sigma(np.linspace(start, end, n + 1)[:-1]))


def normal(n: int, model: Discrete) -> list[float]:
    """n values of t evenly from sigma_max's to sigma_min's, both ends kept (ComfyUI's "normal")."""
    start, end = model.sigma_to_t(model.sigma_max), model.sigma_to_t(model.sigma_min)
    return _append_zero(model.t_to_sigma(np.linspace(start, end, n)))


def simple(n: int, model: Discrete) -> list[float]:
    """ComfyUI's "simple": every (T / n)-th training level counted down from the last, index truncated."""
    stride = len(model.sigmas) / n
    return _append_zero([model.sigmas[-(1 + int(x * stride))] for x in range(n)])


def ddim(n: int, model: Discrete) -> list[float]:
    """ComfyUI's "ddim_uniform": the training levels 1, 1 + T // n, 1 + 2 (T // n), ... below T, highest first
    (more than n of them where n does not divide T, as in A1111)."""
    stride = max(len(model.sigmas) // n, 1)
    return _append_zero(model.sigmas[1::stride][::-1])


def kl_optimal(n: int, model: Discrete) -> list[float]:
    """Sabour et al. 2024 ("Align Your Steps", KL-optimal): tan of arctan(sigma) evenly spaced; n + 1 values from
    sigma_max to sigma_min, no 0 after them (as A1111's)."""
    i = np.arange(n + 1) / n
    return [float(x) for x in np.tan(i * math.atan(model.sigma_min) + (1 - i) * math.atan(model.sigma_max))]


def beta(n: int, model: Discrete, alpha: float = BETA_ALPHA, b: float = BETA_BETA) -> list[float]:
    """Lee et al. 2024 (arXiv:2407.12173): sigma_min + ppf(1 - i / (n - 1)) (sigma_max - sigma_min), ppf the
    Beta(alpha, b) distribution's inverse cumulative distribution."""
    from scipy import stats

    points = 1 - np.linspace(0, 1, n)
    return _append_zero([model.sigma_min + stats.beta.ppf(p, alpha, b) * (model.sigma_max - model.sigma_min)
                         for p in points])


def align_your_steps(n: int, model: Discrete, table: str = "sd15") -> list[float]:
    """NVIDIA's table for the model (SD 1.5's or SDXL's), log-linearly resampled to n values where it has another
    count (the table's own values where n is 11, as A1111 does), then 0."""
    levels = AYS[table]
    if n == len(levels):
        return _append_zero(levels)
    ys = np.log(levels[::-1])
    resampled = np.exp(np.interp(np.linspace(0, 1, n), np.linspace(0, 1, len(levels)), ys))[::-1]
    return _append_zero(resampled)


FUNCTIONS = {"uniform": uniform, "karras": karras, "exponential": exponential, "polyexponential": polyexponential,
             "sgm-uniform": sgm_uniform, "kl-optimal": kl_optimal, "align-your-steps": align_your_steps,
             "simple": simple, "normal": normal, "ddim": ddim, "beta": beta}


def a1111(schedule_type: str, steps: int, alphas_cumprod, *, discard_penultimate: bool = False,
          table: str = "sd15") -> list[float]:
    """The noise levels A1111 steps through for `steps` steps of `schedule_type` (a key of FUNCTIONS) on a model with
    `alphas_cumprod`; `table`: which Align Your Steps table ('sd15' or 'sdxl', A1111's is_sdxl)."""
    if schedule_type not in FUNCTIONS:
        raise ValueError(f"schedule type {schedule_type!r}: use one of {', '.join(FUNCTIONS)}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps {steps!r}: use a whole number of at least 1")
    model = Discrete(alphas_cumprod)
    n = steps + 1 if discard_penultimate else steps
    extra = {"table": table} if schedule_type == "align-your-steps" else {}
    levels = FUNCTIONS[schedule_type](n, model, **extra)
    return levels[:-2] + levels[-1:] if discard_penultimate else levels
