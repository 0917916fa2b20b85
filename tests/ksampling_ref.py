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
    it (A1111's order of draws; its "CPU" source, and "GPU" on a CPU machine). With `ensd` (A1111's eta noise seed
    delta) each generator is made again from seed + ensd once the first noise is drawn."""

    def __init__(self, seeds, shape, ensd: int = 0):
        import torch

        self.shape, self.seeds, self.ensd = tuple(shape), [int(seed) for seed in seeds], int(ensd)
        self.generators = [torch.Generator("cpu").manual_seed(seed) for seed in self.seeds]

    def first(self):
        import torch

        noise = self.next()
        if self.ensd:
            self.generators = [torch.Generator("cpu").manual_seed(seed + self.ensd) for seed in self.seeds]
        return noise

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

    def eps(self, x, t: float):
        """The guided noise prediction of the UNet at timestep t for x as the UNet takes it (A1111's
        CompVisTimestepsDenoiser for DDIM and PLMS, with its CFG)."""
        import torch

        n = x.shape[0]
        added = None if self.added is None else {k: v.repeat_interleave(n, 0) for k, v in self.added.items()}
        with torch.no_grad():
            eps = self.pipe.unet(torch.cat([x, x]), torch.tensor(float(t), dtype=torch.float32),
                                 encoder_hidden_states=self.context.repeat_interleave(n, 0),
                                 added_cond_kwargs=added).sample
        self.calls += 1
        uncond, cond = eps.chunk(2)
        return uncond + self.cfg * (cond - uncond)

    def __call__(self, x, sigma):
        sigma = float(sigma)
        return x - sigma * self.eps(x / (sigma ** 2 + 1) ** 0.5, self.t(sigma))


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


def lms_coefficient(sigmas, order: int, i: int, j: int) -> float:
    """The weight of the j-th last derivative in a linear multistep step from sigmas[i] to sigmas[i + 1]: the
    integral over that interval of the Lagrange polynomial through the last `order` levels that is 1 at
    sigmas[i - j] (k-diffusion's linear_multistep_coeff, integrated as it does with scipy's quad)."""
    from scipy import integrate

    def basis(tau):
        product = 1.0
        for k in range(order):
            if k != j:
                product *= (tau - sigmas[i - k]) / (sigmas[i - j] - sigmas[i - k])
        return product

    return integrate.quad(basis, sigmas[i], sigmas[i + 1], epsrel=1e-4)[0]


def lms(denoiser, x, sigmas, rng=None, order: int = 4):
    """Linear multistep on the derivatives of the last `order` levels (fewer at the start): A1111's LMS."""
    derivatives = []
    for i in range(len(sigmas) - 1):
        derivatives = (derivatives + [to_d(x, sigmas[i], denoiser(x, sigmas[i]))])[-order:]
        now = min(i + 1, order)
        x = x + sum(lms_coefficient(sigmas, now, i, j) * d for j, d in enumerate(reversed(derivatives)))
    return x


def heun(denoiser, x, sigmas, rng=None):
    """Karras et al. 2022, Algorithm 1 without churn: an Euler step, then the mean of the two ends' derivatives;
    Euler alone where the next level is 0 (two calls a step, one for the last)."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        d = to_d(x, sigma, denoiser(x, sigma))
        if sigma_next == 0:
            x = x + d * (sigma_next - sigma)
            continue
        x_2 = x + d * (sigma_next - sigma)
        d_2 = to_d(x_2, sigma_next, denoiser(x_2, sigma_next))
        x = x + (d + d_2) / 2 * (sigma_next - sigma)
    return x


def _midpoint(sigma: float, sigma_to: float) -> float:
    """The level halfway between two in log sigma (DPM-Solver-2's midpoint, k-diffusion's sample_dpm_2)."""
    return float(np.exp((np.log(sigma) + np.log(sigma_to)) / 2))


def _dpm_solver_2(denoiser, x, sigma, sigma_to, d):
    """From sigma to sigma_to with the derivative at their log midpoint (Lu et al. 2022, DPM-Solver-2 in sigma)."""
    mid = _midpoint(sigma, sigma_to)
    x_2 = x + d * (mid - sigma)
    return x + to_d(x_2, mid, denoiser(x_2, mid)) * (sigma_to - sigma)


def dpm_2(denoiser, x, sigmas, rng=None):
    """k-diffusion's DPM2: DPM-Solver-2 from each level to the next (Euler where it is 0). A1111 runs it on a
    schedule of one more level with the next-to-last dropped (`discard_penultimate` of sigmas.py)."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        d = to_d(x, sigma, denoiser(x, sigma))
        x = x + d * (sigma_next - sigma) if sigma_next == 0 else _dpm_solver_2(denoiser, x, sigma, sigma_next, d)
    return x


def dpm_2_ancestral(denoiser, x, sigmas, rng):
    """DPM2 a: DPM-Solver-2 to sigma_down, then sigma_up times the image's next noise (Euler where sigma_down is 0)."""
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        down, up = ancestral_step(sigma, sigma_next)
        d = to_d(x, sigma, denoiser(x, sigma))
        if down == 0:
            x = x + d * (down - sigma)
            continue
        x = _dpm_solver_2(denoiser, x, sigma, down, d) + rng.next() * up
    return x


def dpmpp_2m(denoiser, x, sigmas, rng=None):
    """Lu et al. 2022, "DPM-Solver++" (arXiv:2211.01095) Algorithm 2, multistep second order in the data prediction,
    t = -log sigma, stepped as k-diffusion steps it: first order on the first step and where the next level is 0,
    then the last two predictions weighted by the ratio r of the last step size to this one's."""
    old = None
    for i, (sigma, sigma_next) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = denoiser(x, sigma)
        if sigma_next == 0:
            x = denoised  # sigma_next / sigma = 0 and -expm1(-h) = 1 at t_next = infinity
        else:
            h = np.log(sigma) - np.log(sigma_next)
            used = denoised
            if old is not None:
                r = (np.log(sigmas[i - 1]) - np.log(sigma)) / h
                used = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old
            x = (sigma_next / sigma) * x - float(np.expm1(-h)) * used
        old = denoised
    return x


def a1111_timesteps(steps: int, train_steps: int = 1000) -> list[int]:
    """The timesteps A1111 1.6+ steps DDIM and PLMS through, lowest first: 1 + k * (T // steps) below T + 1,
    clipped to T - 1 (more than steps + 1 of them where steps does not divide T); the samplers step from each to
    the one below it, so the lowest one is where they end and there is one UNet call fewer than timesteps."""
    stride = train_steps // steps
    return [min(1 + k, train_steps - 1) for k in range(0, train_steps, stride)]


def _ddim_move(x, eps, a_t: float, a_prev: float, sigma_t: float = 0.0, noise=None):
    """Song et al. 2021 ("DDIM", eq. 12) from alphas_cumprod a_t to a_prev: the predicted x0 taken to a_prev along
    eps, sigma_t times fresh noise on top (eta > 0)."""
    x0 = (x - (1 - a_t) ** 0.5 * eps) / a_t ** 0.5
    x = a_prev ** 0.5 * x0 + (1 - a_prev - sigma_t ** 2) ** 0.5 * eps
    return x if noise is None else x + sigma_t * noise


def ddim(denoiser, x, timesteps, rng=None, alphas=None, eta: float = 0.0):
    """DDIM (Song et al. 2021) through `timesteps` (lowest first) from the highest down to the lowest; eta 0 is
    A1111's default (deterministic), else the step noise is the image's next noise."""
    for index in range(len(timesteps) - 1, 0, -1):
        a_t, a_prev = float(alphas[timesteps[index]]), float(alphas[timesteps[index - 1]])
        eps = denoiser.eps(x, timesteps[index])
        sigma_t = eta * ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)) ** 0.5
        x = _ddim_move(x, eps, a_t, a_prev, sigma_t, rng.next() if sigma_t else None)
    return x


def plms(denoiser, x, timesteps, rng=None, alphas=None):
    """PLMS (Liu et al. 2022, "Pseudo Numerical Methods for Diffusion Models", as latent diffusion runs it):
    Adams-Bashforth on the noise predictions of the last 1-4 steps; the first step warms up with an improved-Euler
    step (the prediction at the next timestep averaged in: one more UNet call)."""
    old = []
    for index in range(len(timesteps) - 1, 0, -1):
        a_t, a_prev = float(alphas[timesteps[index]]), float(alphas[timesteps[index - 1]])
        eps = denoiser.eps(x, timesteps[index])
        if not old:
            ahead = _ddim_move(x, eps, a_t, a_prev)
            used = (eps + denoiser.eps(ahead, timesteps[index - 1])) / 2
        elif len(old) == 1:
            used = (3 * eps - old[-1]) / 2
        elif len(old) == 2:
            used = (23 * eps - 16 * old[-1] + 5 * old[-2]) / 12
        else:
            used = (55 * eps - 59 * old[-1] + 37 * old[-2] - 9 * old[-3]) / 24
        x = _ddim_move(x, used, a_t, a_prev)
        old = (old + [eps])[-3:]
    return x


def txt2img_timesteps(pipe, sampler, timesteps, seeds, prompt: str, negative: str = "", cfg: float = 7.0,
                      width: int = 64, height: int = 64, **options) -> tuple[list[np.ndarray], int]:
    """`txt2img` for a sampler that steps through timesteps (DDIM, PLMS): it starts from each seed's noise as it
    is and is given the model's alphas_cumprod."""
    alphas = pipe.scheduler.alphas_cumprod.double().numpy()
    return _sampled(pipe, lambda denoiser, rng: sampler(denoiser, rng.first(), list(timesteps), rng, alphas=alphas,
                                                        **options), seeds, prompt, negative, cfg, width, height)


def _sampled(pipe, run, seeds, prompt, negative, cfg, width, height, ensd=0):
    import torch

    channels = pipe.unet.config.in_channels
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    rng = ImageRNG(seeds, (channels, height // factor, width // factor), ensd)
    denoiser = Denoiser(pipe, prompt, negative, cfg, width, height)
    x = run(denoiser, rng)
    with torch.no_grad():
        decoded = pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample
    images = pipe.image_processor.postprocess(decoded, output_type="np")
    return [np.round(image * 255).astype(int) for image in images], denoiser.calls


def txt2img(pipe, sampler, sigmas, seeds, prompt: str, negative: str = "", cfg: float = 7.0, width: int = 64,
            height: int = 64, ensd: int = 0, **options) -> tuple[list[np.ndarray], int]:
    """(each image's RGB pixels as ints, the number of UNet calls) of `sampler(denoiser, x, sigmas, rng, **options)`
    started from the first level times each seed's noise (`ensd`: ImageRNG's), decoded by the pipeline's VAE."""
    levels = [float(s) for s in sigmas]
    return _sampled(pipe, lambda denoiser, rng: sampler(denoiser, rng.first() * levels[0], levels, rng, **options),
                    seeds, prompt, negative, cfg, width, height, ensd)
