"""A reference for issue 31's inpaint tests: A1111 1.10's inpaint of an img2img with a mask, written from its rule
around plain diffusers' UNet and VAE (tests/ksampling_ref.py's Denoiser, ImageRNG and samplers), apart from
lowvram_gen.

The rule (A1111's modules/processing.py StableDiffusionProcessingImg2Img, sd_samplers_cfg_denoiser.py,
sd_samplers_timesteps.py), read to learn it, written here from it:

* the init latents are the VAE posterior's mean of the init image (A1111 samples the posterior with its unseeded
  global generator: its mean to within float16) times the VAE's scaling factor; the image's first draw is its noise;
* the latent mask is the mask resized to the latent size (Pillow's default filter, bicubic), over 255, rounded
  (mask_round); nmask is it, mask is 1 - it;
* k-diffusion samplers: the pass runs the last int(strength * steps) + 1 steps of the `steps` levels from
  init + noise * their first level; each denoiser call's estimate, after CFG, becomes denoised * nmask + init * mask;
* DDIM (a timesteps sampler): from init noised to the timestep where the pass starts; the x each model call is
  given becomes x * nmask + init * mask (mask_before_denoising), the sampler's own x is not blended;
* after sampling, samples * nmask + init * mask; decoded, the init image is put back outside the mask (its overlay).

An inpainting UNet (9 input channels) is given, after the scaled x, the mask (the pixel mask rounded and sampled to
the latent size) and the latents of the init image with the masked part black (A1111's inpainting conditioning).
"""

from __future__ import annotations

import numpy as np

import ksampling_ref as ref


def init_latents(pipe, image, keep=None):
    """The VAE posterior's mean of `image` (PIL; `keep`: 1 where its pixels stay, 0 where they are made 0 in the
    VAE's -1..1 space) in model space (B = 1)."""
    import torch

    pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    pixels = pixels * 2 - 1
    with torch.no_grad():
        mean = pipe.vae.encode(pixels if keep is None else pixels * keep).latent_dist.mean
    return mean * pipe.vae.config.scaling_factor


def latent_mask(mask, width: int, height: int):
    """A1111's nmask (1, 1, h, w): the mask resized to the latent size with Pillow's default filter, rounded."""
    import torch

    small = mask.convert("RGB").resize((width, height))
    return torch.from_numpy(np.around(np.asarray(small, dtype=np.float32)[..., 0] / 255.0))[None, None]


class Blended(ref.Denoiser):
    """D(x, sigma) with A1111's blend of its estimate (or, `before`, of the model's input: DDIM, PLMS); an inpainting
    UNet's conditioning where the UNet takes 9 channels; a ControlNet's residuals where one is given (`control`:
    (the ControlNetModel, its image as a 1 x 3 x H x W tensor in 0..1), applied at full weight in every call)."""

    def __init__(self, pipe, prompt, init, nmask, conditioning=None, before: bool = False, control=None, **options):
        super().__init__(pipe, prompt, **options)
        self.init, self.nmask, self.conditioning, self.before, self.control = init, nmask, conditioning, before, control

    def blend(self, x):
        return x * self.nmask + self.init * (1 - self.nmask)

    def eps(self, x, t: float):
        if self.before:
            x = self.blend(x)
        unet = self.pipe.unet
        self.pipe.unet = _Wrapped(unet, self.conditioning, self.control)
        try:
            return super().eps(x, t)
        finally:
            self.pipe.unet = unet

    def __call__(self, x, sigma):
        denoised = super().__call__(x, sigma)
        return denoised if self.before else self.blend(denoised)


class _Wrapped:
    """The UNet given a ControlNet's residuals for its (4-channel) input, and the inpainting conditioning joined to
    its input's channels."""

    def __init__(self, unet, conditioning, control):
        self.unet, self.conditioning, self.control = unet, conditioning, control

    def __call__(self, x, t, encoder_hidden_states=None, added_cond_kwargs=None):
        import torch

        extra = {}
        if self.control is not None:
            net, image = self.control
            down, mid = net(x, t, encoder_hidden_states=encoder_hidden_states,
                            controlnet_cond=image.repeat(x.shape[0], 1, 1, 1), conditioning_scale=1.0,
                            added_cond_kwargs=added_cond_kwargs, return_dict=False)
            extra = {"down_block_additional_residuals": down, "mid_block_additional_residual": mid}
        if self.conditioning is not None:
            x = torch.cat([x, self.conditioning.repeat(x.shape[0], 1, 1, 1).to(x.dtype)], dim=1)
        return self.unet(x, t, encoder_hidden_states=encoder_hidden_states, added_cond_kwargs=added_cond_kwargs,
                         **extra)


def conditioning(pipe, image, mask, width: int, height: int):
    """An inpainting UNet's extra input (1, 5, h, w): the rounded pixel mask sampled nearest to the latent size, and
    the latents of the init image with the masked part 0 (grey) in the VAE's -1..1 space."""
    import torch

    pixel_mask = torch.round(torch.from_numpy(np.asarray(mask.convert("L"), dtype=np.float32) / 255.0))[None, None]
    masked = init_latents(pipe, image, keep=1 - pixel_mask)
    small = torch.nn.functional.interpolate(pixel_mask, size=(height, width))
    return torch.cat([small, masked], dim=1)


def _decode(pipe, x, image, mask):
    import torch

    with torch.no_grad():
        decoded = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    images = pipe.image_processor.postprocess(decoded, output_type="np")
    alpha = np.asarray(mask.convert("L"), dtype=np.float64)[..., None] / 255.0
    init = np.asarray(image.convert("RGB"), dtype=np.float64)
    return [np.round(init * (1 - alpha) + np.round(im * 255) * alpha).astype(int) for im in images]


def _setup(pipe, image, mask, seeds, prompt, width, height, before, cfg, control=None):
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    h, w = height // factor, width // factor
    init = init_latents(pipe, image).repeat(len(seeds), 1, 1, 1)
    nmask = latent_mask(mask, w, h)
    extra = conditioning(pipe, image, mask, w, h) if pipe.unet.config.in_channels == 9 else None
    denoiser = Blended(pipe, prompt, init, nmask, extra, before, control, cfg=cfg, width=width, height=height)
    return ref.ImageRNG(seeds, (init.shape[1], h, w)), denoiser, init, nmask


def inpaint(pipe, sampler, levels, strength: float, image, mask, seeds, prompt: str, cfg: float = 7.0,
            width: int = 64, height: int = 64, blend: bool = True, control=None) -> list[np.ndarray]:
    """Each image's RGB pixels (ints) of A1111's inpaint with a k-diffusion `sampler` over `levels` (A1111's levels
    for the job's steps, highest first, then 0); `blend` False: with no blend at all (diffusers' inpaint pipeline
    with an inpainting UNet); `control`: a ControlNet (Blended)."""
    steps = len(levels) - 1
    t_enc = int(min(strength, 0.999) * steps)
    run = [float(s) for s in levels[steps - t_enc - 1:]]
    rng, denoiser, init, nmask = _setup(pipe, image, mask, seeds, prompt, width, height, False, cfg, control)
    if not blend:
        denoiser.nmask = nmask = 1
    x = sampler(denoiser, init + rng.first() * run[0], run, rng)
    return _decode(pipe, x * nmask + init * (1 - nmask), image, mask)


def inpaint_ddim(pipe, steps: int, strength: float, image, mask, seeds, prompt: str, cfg: float = 7.0,
                 width: int = 64, height: int = 64) -> list[np.ndarray]:
    """A1111's inpaint with DDIM (eta 0): the init noised to A1111's timestep t_enc = int(strength * steps) (lowest
    first), then DDIM through the t_enc timesteps below it (A1111's timesteps[:t_enc]: t_enc - 1 calls), the model's
    input blended before each call."""
    timesteps = ref.a1111_timesteps(steps)
    t_enc = int(min(strength, 0.999) * steps)
    alphas = pipe.scheduler.alphas_cumprod.double().numpy()
    rng, denoiser, init, nmask = _setup(pipe, image, mask, seeds, prompt, width, height, True, cfg)
    a = float(alphas[timesteps[t_enc]])
    x = ref.ddim(denoiser, init * a ** 0.5 + rng.first() * (1 - a) ** 0.5, timesteps[:t_enc], rng, alphas=alphas)
    return _decode(pipe, x * nmask + init * (1 - nmask), image, mask)


def euler_ancestral_diffusers_blend(pipe, levels, strength: float, image, mask, seeds, prompt: str,
                                    cfg: float = 7.0, width: int = 64, height: int = 64) -> list[np.ndarray]:
    """What diffusers' inpaint pipeline does with a 4-channel UNet and Euler a over the same levels: no blend of the
    estimates; after each step the latents blended with the init noised to the next level with the FIRST noise.
    (For Euler and DPM++ 2M, which carry no step noise, that keeps the area outside the mask where A1111's blend of
    the estimates does, at init + noise * level: the two make one image; an ancestral step's noise tells them apart.)"""
    steps = len(levels) - 1
    t_enc = int(min(strength, 0.999) * steps)
    run = [float(s) for s in levels[steps - t_enc - 1:]]
    rng, denoiser, init, nmask = _setup(pipe, image, mask, seeds, prompt, width, height, True, cfg)
    denoiser.nmask = 1  # no blend in the denoiser
    noise = rng.first()
    x = init + noise * run[0]
    for sigma, sigma_next in zip(run[:-1], run[1:]):
        down, up = ref.ancestral_step(sigma, sigma_next)
        x = x + ref.to_d(x, sigma, denoiser(x, sigma)) * (down - sigma)
        if sigma_next > 0:
            x = x + rng.next() * up
        x = x * nmask + (init + noise * sigma_next) * (1 - nmask)
    return _decode(pipe, x, image, mask)
