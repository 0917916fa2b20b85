"""A reference for issue 31's sampler tests: A1111's way of sampling, written from the published algorithms around a
plain diffusers UNet, apart from lowvram_gen's schedulers.

A1111 samples SD 1.x/2.x and SDXL with k-diffusion (Karras et al. 2022, "Elucidating the Design Space of
Diffusion-Based Generative Models"): a denoiser D(x, sigma) built from the noise-predicting UNet (k-diffusion's
`CompVisDenoiser`: the input scaled by 1/sqrt(sigma^2 + 1), the UNet given the continuous timestep of sigma, the
prediction taken back as x - sigma * eps), classifier-free guidance uncond + cfg * (cond - uncond), and a sampler
that steps x through a list of noise levels (lowvram_gen/a1111/sigmas.py computes A1111's levels; the tests also
hold them as numbers). The first latents are the first level times the seed's noise; each image's generator goes on
to give the samplers' step noise (A1111's modules/rng.py `ImageRNG.first`, then `next`).

Samplers here are written from the papers named beside each, not copied: a test runs a job through the app and
compares its image with `txt2img` here given the same levels and noise.
"""

from __future__ import annotations

import numpy as np


class ImageRNG:
    """One CPU generator per image seeded with its seed: `first()` the initial noise, `next()` the step noise after
    it (A1111's order of draws; its "CPU" source, and "GPU" on a CPU machine)."""

    def __init__(self, seeds, shape):
        import torch

        self.shape = tuple(shape)
        self.generators = [torch.Generator("cpu").manual_seed(int(seed)) for seed in seeds]

    def first(self):
        return self.next()

    def next(self):
        import torch

        return torch.stack([torch.randn(self.shape, generator=g) for g in self.generators])


class Denoiser:
    """D(x, sigma) of a diffusers SD or SDXL pipeline's UNet with classifier-free guidance (k-diffusion's
    CompVisDenoiser around it). `calls` counts the UNet's batched calls."""

    def __init__(self, pipe, prompt: str, negative: str = "", cfg: float = 7.0, width: int = 64, height: int = 64):
        import torch

        from lowvram_gen.a1111.sigmas import Discrete

        self.pipe, self.cfg, self.calls = pipe, float(cfg), 0
        self.model = Discrete(pipe.scheduler.alphas_cumprod.double().numpy())
        self.added = None
        with torch.no_grad():
            if getattr(pipe, "text_encoder_2", None) is not None:  # SDXL: two encoders, pooled text and size ids
                # an empty negative prompt is zeros on SDXL, in A1111 (its sd_models_xl.py) as in diffusers
                cond, uncond, pooled, neg_pooled = pipe.encode_prompt(
                    prompt=prompt, negative_prompt=negative or None, device="cpu", num_images_per_prompt=1,
                    do_classifier_free_guidance=True)
                ids = pipe._get_add_time_ids((height, width), (0, 0), (height, width), dtype=cond.dtype,
                                             text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim)
                self.added = {"text_embeds": torch.cat([neg_pooled, pooled]), "time_ids": torch.cat([ids, ids])}
            else:
                cond, uncond = pipe.encode_prompt(prompt, "cpu", 1, True, negative_prompt=negative)
        self.context = torch.cat([uncond, cond])

    def t(self, sigma: float) -> float:
        return float(self.model.sigma_to_t(float(sigma)))

    def __call__(self, x, sigma):
        import torch

        sigma = float(sigma)
        scaled = x / (sigma ** 2 + 1) ** 0.5
        n = x.shape[0]
        added = None if self.added is None else {k: v.repeat_interleave(n, 0) for k, v in self.added.items()}
        with torch.no_grad():
            eps = self.pipe.unet(torch.cat([scaled, scaled]), torch.tensor(self.t(sigma), dtype=torch.float32),
                                 encoder_hidden_states=self.context.repeat_interleave(n, 0),
                                 added_cond_kwargs=added).sample
        self.calls += 1
        uncond, cond = eps.chunk(2)
        return x - sigma * (uncond + self.cfg * (cond - uncond))


def to_d(x, sigma, denoised):
    """The ODE's derivative dx/dsigma = (x - D(x, sigma)) / sigma (Karras et al. 2022, eq. 1/4)."""
    return (x - denoised) / sigma


def ancestral_step(sigma_from: float, sigma_to: float, eta: float = 1.0) -> tuple[float, float]:
    """(sigma_down, sigma_up) of an ancestral step: a deterministic step to sigma_down, then fresh noise of scale
    sigma_up, so that sigma_down^2 + sigma_up^2 = sigma_to^2 (k-diffusion's get_ancestral_step)."""
    if not eta:
        return sigma_to, 0.0
    up = min(sigma_to, eta * (sigma_to ** 2 * (sigma_from ** 2 - sigma_to ** 2) / sigma_from ** 2) ** 0.5)
    return (sigma_to ** 2 - up ** 2) ** 0.5, up


def euler(denoiser, x, sigmas, rng=None):
    """Karras et al. 2022, Algorithm 2 without churn (A1111's Euler): one call per level."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        x = x + to_d(x, sigma, denoiser(x, sigma)) * (sigma_next - sigma)
    return x


def euler_ancestral(denoiser, x, sigmas, rng):
    """Euler to sigma_down, then sigma_up times the image's next noise (A1111's Euler a)."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        down, up = ancestral_step(sigma, sigma_next)
        x = x + to_d(x, sigma, denoiser(x, sigma)) * (down - sigma)
        if sigma_next > 0:
            x = x + rng.next() * up
    return x


def txt2img(pipe, sampler, sigmas, seeds, prompt: str, negative: str = "", cfg: float = 7.0, width: int = 64,
            height: int = 64, **options) -> tuple[list[np.ndarray], int]:
    """(each image's RGB pixels as ints, the number of UNet calls) of `sampler(denoiser, x, sigmas, rng, **options)`
    started from the first level times each seed's noise, decoded by the pipeline's VAE."""
    import torch

    channels = pipe.unet.config.in_channels
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    rng = ImageRNG(seeds, (channels, height // factor, width // factor))
    denoiser = Denoiser(pipe, prompt, negative, cfg, width, height)
    levels = [float(s) for s in sigmas]
    x = sampler(denoiser, rng.first() * levels[0], levels, rng, **options)
    with torch.no_grad():
        decoded = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    images = pipe.image_processor.postprocess(decoded, output_type="np")
    return [np.round(image * 255).astype(int) for image in images], denoiser.calls
