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


def lcm(denoiser, x, sigmas, rng):
    """LCM through the noise levels `sigmas` (k-diffusion's sample_lcm): x is the denoised prediction, plus the next
    level times the image's next noise where that level is above 0."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        x = denoiser(x, sigma)
        if sigma_next > 0:
            x = x + sigma_next * rng.next()
    return x


def img2img(pipe, sampler, sigmas, latents, seeds, prompt: str, cfg: float = 7.0, width: int = 64,
            height: int = 64) -> tuple[list[np.ndarray], int]:
    """A k-diffusion sampler's img2img: `latents` plus the first of the schedule's tail `sigmas` times each seed's
    first noise, then `sampler` on that tail with the noise after it."""
    levels = [float(s) for s in sigmas]
    return ref._sampled(pipe, lambda denoiser, rng: sampler(denoiser, latents + rng.first() * levels[0], levels, rng),
                        seeds, prompt, "", cfg, width, height)
