"""Reference for issue 31's UniPC img2img/hires rule and A1111's uni_pc_* settings, written from the rule and the
UniPC paper (Zhao et al. 2023) around plain diffusers' UNet (ksampling_ref's Denoiser and ImageRNG), apart from
lowvram_gen's code.

- times: A1111's UniPC steps in continuous VP time t in [1/N, 1] (log alpha_t linear between training steps
  t_k = (k + 1) / N; the UNet given (t - 1/N) * N), spaced by the skip type: uniform in t, in sqrt(t) (quadratic),
  or in lambda = log alpha - log sigma (logSNR).
- img2img (A1111's timestep samplers): a schedule of S steps (S = steps, t_enc = int(d * steps); an explicit count
  n or img2img_fix_steps: S = int(n / d), t_enc = n - 1) has the timesteps ts = range(0, 1000, 1000 // S) + 1; the
  init x0 is noised to the level ts[t_enc]: x = sqrt(a) x0 + sqrt(1 - a) noise, a = alphas_cumprod[ts[t_enc]], and
  UniPC runs t_enc steps from t = ts[t_enc - 1] / 1000 + 1/1000.
- the solver: multistep UniP predictor + UniC corrector on the data prediction, B(h) = h (bh1) or e^h - 1 (bh2);
  its first steps at orders 1, 2, ... (the values there are), later ones at `order`, or at the steps left with
  lower_order_final; no corrector call after the last step.
- vary_coeff (the paper's UniPC_v, A1111's third variant): the Taylor conditions' matrix C[i][k] = r_i^k / (k + 1)!
  (rows the past points' ratios r_i = h_i / h, the last r = 1), inverted; the predictor's correction is
  sum_k h phi_{k+2}(h) (inverse of C less its last row and column)[k] . D1 (h phi_1 = e^h - 1, h phi_{k+1} =
  h phi_k / h - 1 / k!), the corrector's the same rows of the full inverse plus h phi_{p+1}(h) times its entry
  [max(p - 2, 0)][last] times the new output's difference (the row the original UniPC code, and so A1111, uses).
"""

from __future__ import annotations

import math

import numpy as np


class VP:
    def __init__(self, alphas_cumprod):
        self.log_alpha = 0.5 * np.log(np.asarray(alphas_cumprod, dtype=np.float64))
        self.n = len(self.log_alpha)

    def log_alpha_t(self, t: float) -> float:
        return float(np.interp((t - 1.0 / self.n) * self.n, np.arange(self.n), self.log_alpha))

    def lam(self, t: float) -> float:
        la = self.log_alpha_t(t)
        return la - 0.5 * math.log(1 - math.exp(2 * la))

    def t_of_lam(self, lam: float) -> float:
        """The time whose lambda is `lam` (bisection: lambda falls as t grows)."""
        lo, hi = 1.0 / self.n, 1.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.lam(mid) > lam else (lo, mid)
        return 0.5 * (lo + hi)

    def times(self, skip_type: str, t_start: float, steps: int) -> list[float]:
        end = 1.0 / self.n
        k = np.arange(steps + 1) / steps
        if skip_type == "time_uniform":
            return list(t_start + (end - t_start) * k)
        if skip_type == "time_quadratic":
            return list((math.sqrt(t_start) + (math.sqrt(end) - math.sqrt(t_start)) * k) ** 2)
        lams = self.lam(t_start) + (self.lam(end) - self.lam(t_start)) * k
        return [t_start] + [self.t_of_lam(float(v)) for v in lams[1:-1]] + [end]


def img2img_rule(steps: int, denoise: float, explicit: int | None = None, fix: bool = False) -> tuple[int, int, float]:
    """(t_enc, the training step the init is noised to, t_start) of A1111's timestep img2img."""
    d, n = min(denoise, 0.999), explicit or steps
    schedule = int(n / d) if explicit or fix else steps  # A1111's setup_img2img_steps
    t_enc = n - 1 if explicit or fix else int(d * steps)
    ts = [min(i + 1, 999) for i in range(0, 1000, 1000 // schedule)]
    return t_enc, ts[t_enc], ts[t_enc - 1] / 1000 + 1 / 1000


def unipc(denoiser, x, vp: VP, times, variant="bh1", order=3, lower_order_final=True):
    """UniPC from x at times[0] to times[-1], len(times) - 1 steps, one UNet call each."""
    import torch

    from ksampling_ref_singlestep import eps

    def alpha_sigma(t):
        alpha = math.exp(vp.log_alpha_t(t))
        return alpha, math.sqrt(1 - alpha * alpha)

    def data(x, t):
        alpha, sigma = alpha_sigma(t)
        return (x - sigma * eps(denoiser, x, (t - 1.0 / vp.n) * vp.n)) / alpha

    steps = len(times) - 1
    hist_t, hist_m = [times[0]], [data(x, times[0])]
    for i in range(1, steps + 1):
        p = i if i < order else (min(order, steps + 1 - i) if lower_order_final else order)
        t = times[i]
        alpha_t, sigma_t = alpha_sigma(t)
        sigma_0 = alpha_sigma(hist_t[-1])[1]
        h = vp.lam(t) - vp.lam(hist_t[-1])
        rs = [(vp.lam(hist_t[-1 - k]) - vp.lam(hist_t[-1])) / h for k in range(1, p)]
        ds = [(hist_m[-1 - k] - hist_m[-1]) / r for k, r in zip(range(1, p), rs)]
        hh = -h
        bh = hh if variant == "bh1" else math.expm1(hh)
        # phi_k(hh) * k! / B(h), k = 1..p: the right-hand side of the paper's order conditions
        phis, phi = [], math.expm1(hh) / hh - 1  # phi_2 * 1! ... built up as the paper's recursion
        fact = 1
        for k in range(1, p + 1):
            phis.append(phi * fact / bh)
            fact *= k + 1
            phi = phi / hh - 1 / fact
        R = np.array([[r ** (k - 1) for r in rs + [1.0]] for k in range(1, p + 1)])
        base = (sigma_t / sigma_0) * x - alpha_t * math.expm1(hh) * hist_m[-1]
        if variant == "vary_coeff":
            x, m_t = _vary_step(lambda y: data(y, t), x, base, hh, rs, ds, hist_m[-1], alpha_t, p, i == steps)
            if i == steps:
                break
            hist_t, hist_m = (hist_t + [t])[-order:], (hist_m + [m_t])[-order:]
            continue
        if ds:
            a_p = [0.5] if p == 2 else np.linalg.solve(R[:-1, :-1], np.array(phis[:-1]))
            x_pred = base - alpha_t * bh * sum(float(a) * d for a, d in zip(a_p, ds))
        else:
            x_pred = base
        if i == steps:
            x = x_pred
            break
        m_t = data(x_pred, t)
        a_c = [0.5] if p == 1 else np.linalg.solve(R, np.array(phis))
        corr = sum(float(a) * d for a, d in zip(a_c[:-1], ds)) if ds else torch.zeros_like(x)
        x = base - alpha_t * bh * (corr + float(a_c[-1]) * (m_t - hist_m[-1]))
        hist_t, hist_m = (hist_t + [t])[-order:], (hist_m + [m_t])[-order:]
    return x


def _vary_step(data_at, x, base, hh, rs, ds, m0, alpha_t, p, last):
    """One vary_coeff step: (x at the new time, the data prediction there; None after the last step's predictor)."""
    hphi = [None, math.expm1(hh)]  # hphi[k] = h phi_k(h), k = 1 .. p + 1: h phi_{k+1} = h phi_k / h - 1 / k!
    for k in range(1, p + 1):
        hphi.append(hphi[-1] / hh - 1 / math.factorial(k))
    rows = rs + [1.0]
    C = np.array([[r ** k / math.factorial(k + 1) for k in range(p)] for r in rows])
    x_pred = base
    if ds:
        inv_p = np.linalg.inv(C[:-1, :-1])
        for k in range(p - 1):
            x_pred = x_pred - alpha_t * hphi[k + 2] * sum(float(a) * d for a, d in zip(inv_p[k], ds))
    if last:
        return x_pred, None
    m_t = data_at(x_pred)
    inv_c = np.linalg.inv(C)
    x_new = base
    for k in range(p - 1):
        x_new = x_new - alpha_t * hphi[k + 2] * sum(float(a) * d for a, d in zip(inv_c[k][:-1], ds))
    x_new = x_new - alpha_t * hphi[p + 1] * float(inv_c[max(p - 2, 0)][-1]) * (m_t - m0)
    return x_new, m_t


def img2img(pipe, init_path, seeds, prompt, steps, denoise, explicit=None, fix=False, cfg=7.0, size=64, **options):
    """(pixels per image, UNet calls) of A1111's UniPC img2img of the image at `init_path` (encoded to the VAE
    posterior's mode), the seed's first draw its noise; `options`: variant, order, lower_order_final, skip_type."""
    import torch
    from PIL import Image

    from ksampling_ref import Denoiser, ImageRNG

    vp = VP(pipe.scheduler.alphas_cumprod.double().numpy())
    skip = options.pop("skip_type", "time_uniform")
    t_enc, noised_at, t_start = img2img_rule(steps, denoise, explicit, fix)
    with torch.no_grad():
        image = pipe.image_processor.preprocess(Image.open(init_path).convert("RGB"))
        x0 = pipe.vae.encode(image).latent_dist.mode() * pipe.vae.config.scaling_factor
    rng = ImageRNG(seeds, x0.shape[1:])
    a = math.exp(2 * vp.log_alpha[noised_at])
    x = math.sqrt(a) * x0 + math.sqrt(1 - a) * rng.first()
    denoiser = Denoiser(pipe, prompt, "", cfg, size, size)
    x = unipc(denoiser, x, vp, vp.times(skip, t_start, t_enc), **options)
    with torch.no_grad():
        decoded = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    images = pipe.image_processor.postprocess(decoded, output_type="np")
    return [np.round(im * 255).astype(int) for im in images], denoiser.calls


def txt2img(pipe, seeds, prompt, steps, cfg=7.0, size=64, **options):
    """(pixels per image, UNet calls) of A1111's UniPC txt2img: len(range(0, 1000, 1000 // steps)) steps from the
    seed's noise as it is at t = 1."""
    import torch

    from ksampling_ref import Denoiser, ImageRNG

    vp = VP(pipe.scheduler.alphas_cumprod.double().numpy())
    skip = options.pop("skip_type", "time_uniform")
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    rng = ImageRNG(seeds, (pipe.unet.config.in_channels, size // factor, size // factor))
    denoiser = Denoiser(pipe, prompt, "", cfg, size, size)
    x = unipc(denoiser, rng.first(), vp, vp.times(skip, 1.0, len(range(0, 1000, 1000 // steps))), **options)
    with torch.no_grad():
        decoded = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    images = pipe.image_processor.postprocess(decoded, output_type="np")
    return [np.round(im * 255).astype(int) for im in images], denoiser.calls
