"""Reference samplers for issue 31's DPM++ 2S a, DPM++ 2M and UniPC tests, written from the published algorithms
around plain diffusers' UNet (tests/ksampling_ref.py's Denoiser, ImageRNG and txt2img), apart from lowvram_gen's code.

- dpmpp_2s_ancestral: Lu et al. 2022 ("DPM-Solver++"), the single-step second-order solver (r = 1/2) in log-SNR time
  t = -log sigma, with k-diffusion's ancestral split (eta 1) and an Euler step where sigma_down is 0.
- dpmpp_2m: the multistep second-order DPM-Solver++, first order on its first step and where sigma_next is 0.
- unipc: Zhao et al. 2023 ("UniPC"), multistep UniP predictor + UniC corrector on the data prediction, B(h) = h
  (bh1) or e^h - 1 (bh2), on a variance-preserving schedule in continuous time t in [1/N, 1] with log alpha_t linear
  in t between the model's training steps, the UNet given (t - 1/N) * N; time-uniform steps; lower order on the last
  steps; the corrector's model call skipped after the last step. This is how A1111 (1.6+) runs its UniPC with its
  default options (bh1, order 3, time_uniform, lower_order_final).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ksampling_ref import ancestral_step, to_d


@functools.lru_cache(maxsize=2)
def pipeline(folder):
    """The plain diffusers pipeline of a tiny SD 1.x or SDXL folder that the references run (read only)."""
    from diffusers import AutoPipelineForText2Image

    return AutoPipelineForText2Image.from_pretrained(str(folder))


def dpmpp_2s_ancestral(denoiser, x, sigmas, rng):
    """DPM-Solver++(2S) to sigma_down, then sigma_up times the image's next noise; an Euler step where sigma_down
    is 0."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        denoised = denoiser(x, sigma)
        down, up = ancestral_step(sigma, sigma_next)
        if down == 0:
            x = x + to_d(x, sigma, denoised) * (down - sigma)
        else:
            t, t_next = -math.log(sigma), -math.log(down)
            h = t_next - t
            s = t + 0.5 * h
            x_2 = (math.exp(-s) / math.exp(-t)) * x - math.expm1(-0.5 * h) * denoised
            denoised_2 = denoiser(x_2, math.exp(-s))
            x = (math.exp(-t_next) / math.exp(-t)) * x - math.expm1(-h) * denoised_2
        if sigma_next > 0:
            x = x + rng.next() * up
    return x


def dpmpp_2m(denoiser, x, sigmas, rng=None):
    """DPM-Solver++(2M): one call a level, the previous denoised image making it second order."""
    old, h_last = None, None
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        denoised = denoiser(x, sigma)
        if sigma_next == 0:
            x = denoised  # sigma_fn(inf) = 0, expm1(-inf) = -1
        else:
            t, t_next = -math.log(sigma), -math.log(sigma_next)
            h = t_next - t
            if old is None:
                d = denoised
            else:
                r = h_last / h
                d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old
            x = (sigma_next / sigma) * x - math.expm1(-h) * d
            h_last = h
        old = denoised
    return x


class VPSchedule:
    """The model's discrete schedule as continuous VP time: t_k = (k + 1) / N for training step k, log alpha_t
    linear in t between them (so the UNet's input time is (t - 1/N) * N)."""

    def __init__(self, alphas_cumprod):
        self.log_alpha = 0.5 * np.log(np.asarray(alphas_cumprod, dtype=np.float64))
        self.n = len(self.log_alpha)

    def model_time(self, t: float) -> float:
        return (t - 1.0 / self.n) * self.n

    def alpha_sigma_lambda(self, t: float) -> tuple[float, float, float]:
        log_alpha = float(np.interp(self.model_time(t), np.arange(self.n), self.log_alpha))
        alpha = math.exp(log_alpha)
        sigma = math.sqrt(1 - alpha ** 2)
        return alpha, sigma, log_alpha - math.log(sigma)


def a1111_unipc_steps(steps: int) -> int:
    """The steps A1111's UniPC runs for `steps`: len(range(0, 1000, 1000 // steps)) (30: 31)."""
    return len(range(0, 1000, 1000 // steps))


def unipc(denoiser, noise, steps: int, variant: str = "bh1", order: int = 3, lower_order_final: bool = True):
    """UniPC (multistep, data prediction) from x_T = `noise` at t = 1 to t = 1/N in `steps` time-uniform steps;
    returns x at t = 1/N. `denoiser` is ksampling_ref.Denoiser (its UNet, prompts, CFG and call count)."""
    vp = VPSchedule(denoiser.pipe.scheduler.alphas_cumprod.double().numpy())
    times = np.linspace(1.0, 1.0 / vp.n, steps + 1)

    def data(x, t):  # x0 = (x - sigma_t * eps) / alpha_t, eps from the UNet at its input time, with CFG
        alpha, sigma, _ = vp.alpha_sigma_lambda(t)
        return (x - sigma * eps(denoiser, x, vp.model_time(t))) / alpha

    def update(x, models, ts, t, p, corrector):
        alpha_t, sigma_t, lam_t = vp.alpha_sigma_lambda(t)
        _, sigma_0, lam_0 = vp.alpha_sigma_lambda(ts[-1])
        m0 = models[-1]
        h = lam_t - lam_0
        rks, d1s = [], []
        for k in range(1, p):
            lam_k = vp.alpha_sigma_lambda(ts[-(k + 1)])[2]
            rk = (lam_k - lam_0) / h
            rks.append(rk)
            d1s.append((models[-(k + 1)] - m0) / rk)
        rks.append(1.0)
        hh = -h  # data prediction
        h_phi_1 = math.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        b_h = hh if variant == "bh1" else math.expm1(hh)
        rows, b, factorial = [], [], 1
        for i in range(1, p + 1):
            rows.append([rk ** (i - 1) for rk in rks])
            b.append(h_phi_k * factorial / b_h)
            factorial *= i + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        R, b = np.array(rows), np.array(b)
        x_base = (sigma_t / sigma_0) * x - alpha_t * h_phi_1 * m0
        if d1s:
            rhos_p = [0.5] if p == 2 else list(np.linalg.solve(R[:-1, :-1], b[:-1]))
            pred = sum(r * d for r, d in zip(rhos_p, d1s))
        else:
            pred = 0
        x_t = x_base - alpha_t * b_h * pred
        model_t = None
        if corrector:
            rhos_c = [0.5] if p == 1 else list(np.linalg.solve(R, b))
            model_t = data(x_t, t)
            corr = sum(r * d for r, d in zip(rhos_c[:-1], d1s)) if d1s else 0
            x_t = x_base - alpha_t * b_h * (corr + rhos_c[-1] * (model_t - m0))
        return x_t, model_t

    x = noise
    ts, models = [times[0]], [data(x, times[0])]
    for step in range(1, steps + 1):
        if step < order:  # warm-up: the orders the previous values allow
            p = min(step, steps + 1 - step) if lower_order_final else step
        else:
            p = min(order, steps + 1 - step) if lower_order_final else order
        last = step == steps
        x, model_x = update(x, models, ts, float(times[step]), p, corrector=not last)
        if not last:
            models.append(model_x if model_x is not None else data(x, float(times[step])))
            ts.append(float(times[step]))
            models, ts = models[-order:], ts[-order:]
    return x


def eps(denoiser, x, model_time: float):
    """The guided noise prediction uncond + cfg * (cond - uncond) at the UNet's input time `model_time` (A1111's
    timestep samplers give the UNet the continuous time as it is)."""
    import torch

    n = x.shape[0]
    added = None if denoiser.added is None else {k: v.repeat_interleave(n, 0) for k, v in denoiser.added.items()}
    with torch.no_grad():
        out = denoiser.pipe.unet(torch.cat([x, x]), torch.tensor(model_time, dtype=torch.float32),
                                 encoder_hidden_states=denoiser.context.repeat_interleave(n, 0),
                                 added_cond_kwargs=added).sample
    denoiser.calls += 1
    uncond, cond = out.chunk(2)
    return uncond + denoiser.cfg * (cond - uncond)


def img2img(pipe, sampler, sigmas, seeds, prompt: str, posterior, cfg: float = 7.0, width: int = 64,
            height: int = 64, ensd: int = 0, rng=None, old_order: bool = False) -> tuple[list[np.ndarray], int]:
    """k-diffusion's img2img as A1111 runs it: the init latents are the VAE posterior's mean (`posterior`, the init
    image's latent_dist) times the scaling factor (A1111 samples it with its unseeded global RNG, and the real VAEs'
    spread is ~0), plus the first level of the schedule's tail `sigmas` times each image's FIRST draw (`rng`'s
    `first`: ksampling_ref.ImageRNG's, ENSD re-seeding after it); then `sampler` on that tail, its step noise the
    draws after. `old_order`: diffusers' own order, which the app had before, for tests to see the difference: a
    posterior sample from each image's generator first (retrieve_latents), the noise its second draw.
    (pixels per image, UNet calls)."""
    import torch

    from ksampling_ref import Denoiser, ImageRNG

    mean, scale = posterior.mean, pipe.vae.config.scaling_factor
    draws = (rng or ImageRNG)(seeds, mean.shape[1:], ensd)
    if old_order:
        latents = (mean + posterior.std * draws.next()) * scale
    else:
        latents = mean * scale
    noise = draws.first()
    denoiser = Denoiser(pipe, prompt, "", cfg, width, height)
    levels = [float(s) for s in sigmas]
    x = sampler(denoiser, latents + noise * levels[0], levels, draws)
    with torch.no_grad():
        decoded = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    images = pipe.image_processor.postprocess(decoded, output_type="np")
    return [np.round(image * 255).astype(int) for image in images], denoiser.calls
