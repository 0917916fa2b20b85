"""A reference for A1111's timestep samplers (DDIM, PLMS) on img2img, and its LCM sampler: written from the published
algorithms and A1111's rule for them (not its code), around plain diffusers' UNet, apart from lowvram_gen's code.

img2img (A1111's rule for its timestep samplers): a pass of `steps` at strength d has t_enc = int(d * steps)
(an explicit count n, as hires fix's: steps = int(n / d), t_enc = n - 1); the init latents (the VAE posterior's
mean) are noised to the level of timestep t_enc of the txt2img list (lowest first) with the seed's first noise, and
the sampler steps through the first t_enc timesteps, from the highest of them down.

LCM (Luo et al. 2023, "Latent Consistency Models", as k-diffusion's sample_lcm runs it on a list of noise levels):
each step takes the denoised prediction as the image, and where the next level is above 0 adds that level times
fresh noise (the image's next draw).
"""

from __future__ import annotations

import numpy as np

import ksampling_ref as ref


def img2img_steps(steps: int, strength: float, explicit: int | None = None) -> tuple[int, int]:
    """(the schedule's steps, t_enc) of an img2img pass in A1111 (denoising strength capped at 0.999)."""
    d = min(strength, 0.999)
    if explicit:
        return int(explicit / d), explicit - 1
    return steps, int(d * steps)


def init_latents(pipe, image):
    """The init image's latents as A1111 takes them: the VAE posterior's mean, scaled."""
    import torch

    with torch.no_grad():
        posterior = pipe.vae.encode(pipe.image_processor.preprocess(image)).latent_dist
    return posterior.mean * pipe.vae.config.scaling_factor


def img2img_timesteps(pipe, sampler, steps: int, t_enc: int, latents, seeds, prompt: str, cfg: float = 7.0,
                      width: int = 64, height: int = 64) -> tuple[list[np.ndarray], int]:
    """DDIM/PLMS img2img: `latents` noised to timestep t_enc of A1111's list for `steps` with each seed's first
    noise, then `sampler` (ksampling_ref.ddim / plms) through the timesteps below it."""
    alphas = pipe.scheduler.alphas_cumprod.double().numpy()
    timesteps = ref.a1111_timesteps(steps)
    a = float(alphas[timesteps[t_enc]])

    def run(denoiser, rng):
        x = a ** 0.5 * latents + (1 - a) ** 0.5 * rng.first()
        return sampler(denoiser, x, timesteps[:t_enc], rng, alphas=alphas)

    return ref._sampled(pipe, run, seeds, prompt, "", cfg, width, height)


class LCMDenoiser:
    """A1111's LCM denoiser around ksampling_ref.Denoiser: the noise levels of the 50 timesteps an LCM is distilled on
    (every T // 50-th: 19, 39, ..., 999), the UNet given the timestep of the nearest of them (in log sigma), and
    the prediction x - sigma * eps taken through the consistency boundary condition at 10 t: c_skip = 0.25 / ((10t)^2 +
    0.25), c_out = 10t / sqrt((10t)^2 + 0.25) (sigma_data 0.5), c_skip times the input added."""

    def __init__(self, denoiser, alphas):
        self.denoiser = denoiser
        self.alphas = np.asarray(alphas, dtype=np.float64)[19::20]
        self.log_sigmas = np.log(np.sqrt((1 - self.alphas) / self.alphas))

    def levels(self, kind: str, steps: int) -> list[float]:
        """A1111's levels on the 50: Uniform (its Automatic for LCM) n values evenly over the 50 indices, log-linear
        between them; Karras (rho 7) between the lowest and highest of the 50; then 0."""
        if kind == "uniform":
            index = np.linspace(49, 0, steps)
            logs = np.interp(index, np.arange(50), self.log_sigmas)
            return [float(s) for s in np.exp(logs)] + [0.0]
        lo, hi = np.exp(self.log_sigmas[0]) ** (1 / 7), np.exp(self.log_sigmas[-1]) ** (1 / 7)
        return [float(s) for s in (hi + np.linspace(0, 1, steps) * (lo - hi)) ** 7] + [0.0]

    def __call__(self, x, sigma):
        sigma = float(sigma)
        t = int(np.abs(np.log(sigma) - self.log_sigmas).argmin()) * 20 + 19
        denoised = x - sigma * self.denoiser.eps(x / (sigma ** 2 + 1) ** 0.5, t)
        scaled = 10.0 * t
        return scaled / (scaled ** 2 + 0.25) ** 0.5 * denoised + 0.25 / (scaled ** 2 + 0.25) * x


def lcm(denoiser, x, sigmas, rng):
    """LCM through the noise levels `sigmas` (k-diffusion's sample_lcm): x is the denoised prediction, plus the next
    level times the image's next noise where that level is above 0."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        x = denoiser(x, sigma)
        if sigma_next > 0:
            x = x + sigma_next * rng.next()
    return x


def lcm_txt2img(pipe, kind: str, steps: int, seeds, prompt: str, cfg: float = 7.0, width: int = 64,
                height: int = 64) -> tuple[list[np.ndarray], int]:
    """A1111's LCM txt2img: the first of its levels times each seed's first noise, then `lcm`."""
    alphas = pipe.scheduler.alphas_cumprod.double().numpy()

    def run(denoiser, rng):
        lcm_denoiser = LCMDenoiser(denoiser, alphas)
        levels = lcm_denoiser.levels(kind, steps)
        return lcm(lcm_denoiser, rng.first() * levels[0], levels, rng)

    return ref._sampled(pipe, run, seeds, prompt, "", cfg, width, height)


def lcm_img2img(pipe, kind: str, steps: int, strength: float, latents, seeds, prompt: str, cfg: float = 7.0,
                width: int = 64, height: int = 64) -> tuple[list[np.ndarray], int]:
    """A1111's LCM img2img (a k-diffusion sampler's): of the `steps` levels, from index steps - t_enc - 1 on
    (t_enc = int(strength * steps)): `latents` plus the first of them times each seed's first noise, then `lcm`."""
    alphas = pipe.scheduler.alphas_cumprod.double().numpy()
    _, t_enc = img2img_steps(steps, strength)

    def run(denoiser, rng):
        lcm_denoiser = LCMDenoiser(denoiser, alphas)
        tail = lcm_denoiser.levels(kind, steps)[steps - t_enc - 1:]
        return lcm(lcm_denoiser, latents + rng.first() * tail[0], tail, rng)

    return ref._sampled(pipe, run, seeds, prompt, "", cfg, width, height)
