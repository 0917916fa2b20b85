"""Issue 31: img2img's first noise is A1111's. A1111 takes the init image's latents as the VAE posterior's mean (it
samples the posterior with its unseeded global RNG; the real VAEs' spread is ~0) and each image's FIRST draw from its
seed as the noise; diffusers' img2img pipelines sample the posterior with the image's generator first, making the
noise its second draw. The app encodes to the posterior's mode (lowvram_gen/engines/sd/posterior.py), so on the tiny
SD 1.x and SDXL models (64 px, batch 2, seeds 5 and 6):

- an Euler and an Euler a img2img job equal tests/ksampling_ref_singlestep.img2img in A1111's order (<= 2/255) and
  differ clearly from the same reference in diffusers' old order (so the comparison can fail);
- the hires pass with a pixel upscaler (its second pass encodes the upscaled images) likewise, with A1111's number
  of UNet calls;
- `--rng cpu` and `--rng nv` still give that first draw, and ENSD re-seeds each image's generator after it;
- a VAE without a Gaussian posterior (SANA's DC-AE, the Tiny AutoEncoder) encodes as it did.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.engines.sd import pipeline as sd_pipeline
from lowvram_gen.session import Session

import ksampling_ref as ref
import ksampling_ref_singlestep as ref2
from ksampling_ref_singlestep import pipeline  # unet_calls: a conftest fixture

PROMPT = "a lighthouse"
SEEDS = [5, 6]
SAMPLERS = {"Euler": ref.euler, "Euler a": ref.euler_ancestral}  # Automatic is Uniform for both


@pytest.fixture(scope="module")
def session():
    return Session()


def levels(pipe, steps: int) -> list[float]:
    return a1111_sigmas.a1111("uniform", steps, pipe.scheduler.alphas_cumprod.double().numpy())


def posterior(pipe, images):
    """The VAE posterior of `images` (PIL, one batch), as the img2img pipelines preprocess them."""
    import torch

    with torch.no_grad():
        return pipe.vae.encode(pipe.image_processor.preprocess(images)).latent_dist


def init_image(tmp_path):
    path = tmp_path / "init.png"
    Image.fromarray(np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3).astype(np.uint8)).save(path)
    return path


def made(session, tmp_path, folder, calls, **fields) -> tuple[list[np.ndarray], int]:
    calls.clear()
    result = session.generate(GenerationRequest(prompt=PROMPT, model=str(folder), outdir=str(tmp_path), width=64,
                                                height=64, cfg_scale=7.0, seed=SEEDS[0], batch_size=2, **fields))
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images], len(calls)


def worst(got, want) -> int:
    return max(int(np.abs(ours - theirs).max()) for ours, theirs in zip(got, want, strict=True))


def assert_a1111s(got, want, old):
    """`got` equals A1111's order's reference `want` and not diffusers' old order's `old`; two seeds, two images."""
    assert worst(got, want) <= 2, f"max diff {worst(got, want)}/255 from A1111's order"
    assert worst(got, old) > 10  # the old order's image is another one: the comparison can fail
    assert np.abs(got[0] - got[1]).max() > 10


class NvImageRNG(ref.ImageRNG):
    """ref.ImageRNG with A1111's NV source: each image's draws from its seed's Philox (lowvram_gen.rng, tested
    against torch's CUDA values in tests/test_rng_nv.py), made again from seed + ENSD after the first noise."""

    def __init__(self, seeds, shape, ensd: int = 0):
        from lowvram_gen.rng import Philox

        super().__init__(seeds, shape, ensd)
        self.generators = [Philox(seed) for seed in self.seeds]

    def first(self):
        from lowvram_gen.rng import Philox

        noise = self.next()
        if self.ensd:
            self.generators = [Philox(seed + self.ensd) for seed in self.seeds]
        return noise

    def next(self):
        import torch

        return torch.stack([torch.from_numpy(g.randn((1, *self.shape)))[0] for g in self.generators])


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_img2img_noise_is_each_seeds_first_draw(session, tmp_path, request, unet_calls, model, sampler):
    """6 steps at 0.5: the last int(6 * 0.5) + 1 = 4 levels of the 6-step schedule, one UNet call each, from the
    posterior's mean plus the first of them times each seed's first draw."""
    folder = request.getfixturevalue(model)
    pipe, init = pipeline(folder), init_image(tmp_path)
    dist, tail = posterior(pipe, Image.open(init).convert("RGB")), levels(pipeline(folder), 6)[2:]
    want, calls = ref2.img2img(pipe, SAMPLERS[sampler], tail, SEEDS, PROMPT, dist)
    old, _ = ref2.img2img(pipe, SAMPLERS[sampler], tail, SEEDS, PROMPT, dist, old_order=True)
    got, app_calls = made(session, tmp_path, folder, unet_calls, sampler=sampler, steps=6, init_image=str(init),
                          strength=0.5)
    assert calls == app_calls == 4
    assert_a1111s(got, want, old)


@pytest.mark.parametrize("model, sampler", [("tiny_path", "Euler a"), ("tiny_sdxl_path", "Euler")])
def test_the_hires_pass_encodes_the_upscaled_images_and_takes_the_first_draw(session, tmp_path, request, monkeypatch,
                                                                             unet_calls, model, sampler):
    """4 steps, then Lanczos to 128 px and Hires steps 3 at denoise 0.6: A1111 runs exactly 3 steps, the last of a
    schedule of int(3 / 0.6) = 5, from the upscaled images' posterior mean plus that level times each seed's first
    draw (A1111 makes the seeds' generators again for the pass): 4 + 3 UNet calls. The reference starts from the
    images the app's second pass was given (the first pass is the txt2img tests' matter)."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    inits, real = [], sd_pipeline.denoise

    def watch(pipe, step, *args, **kwargs):
        inits.append(step.init)
        return real(pipe, step, *args, **kwargs)

    monkeypatch.setattr(sd_pipeline, "denoise", watch)
    got, app_calls = made(session, tmp_path, folder, unet_calls, sampler=sampler, steps=4, hires_scale=2,
                          hires_steps=3, hires_denoise=0.6, hires_upscaler="Lanczos")
    assert app_calls == 4 + 3
    assert inits[0] is None and [im.size for im in inits[1]] == [(128, 128)] * 2
    dist, tail = posterior(pipe, inits[1]), levels(pipe, 5)[2:]
    want, calls = ref2.img2img(pipe, SAMPLERS[sampler], tail, SEEDS, PROMPT, dist, width=128, height=128)
    old, _ = ref2.img2img(pipe, SAMPLERS[sampler], tail, SEEDS, PROMPT, dist, width=128, height=128, old_order=True)
    assert calls == 3
    assert_a1111s(got, want, old)


@pytest.mark.parametrize("source, draws", [("cpu", ref.ImageRNG), ("nv", NvImageRNG)])
def test_the_rng_source_gives_the_first_draw_and_ensd_reseeds_after_it(session, tmp_path, tiny_path, unet_calls,
                                                                       source, draws):
    """Euler a img2img with ENSD 31337: the noise is the source's first draw from each seed, the step noise the
    draws of seed + 31337 (A1111's ImageRNG.first)."""
    pipe, init = pipeline(tiny_path), init_image(tmp_path)
    dist, tail = posterior(pipe, Image.open(init).convert("RGB")), levels(pipe, 6)[2:]
    want, _ = ref2.img2img(pipe, ref.euler_ancestral, tail, SEEDS, PROMPT, dist, ensd=31337, rng=draws)
    old, _ = ref2.img2img(pipe, ref.euler_ancestral, tail, SEEDS, PROMPT, dist, ensd=31337, rng=draws,
                          old_order=True)
    got, _ = made(session, tmp_path, tiny_path, unet_calls, sampler="Euler a", steps=6, init_image=str(init),
                  strength=0.5, rng=source, ensd=31337)
    assert_a1111s(got, want, old)
    without, _ = ref2.img2img(pipe, ref.euler_ancestral, tail, SEEDS, PROMPT, dist, rng=draws)
    assert worst(got, without) > 10  # ENSD changed the step noise


@pytest.mark.parametrize("vae", ["dc-ae", "tiny-autoencoder"])
def test_a_vae_without_a_gaussian_posterior_encodes_as_it_did(vae):
    """SANA's deep-compression autoencoder and the Tiny AutoEncoder give latents, not a posterior: inside
    `posterior.mode_only` their encoding is the same object type with the same values (nothing to take the mode of),
    while an AutoencoderKL's posterior becomes its mode and leaves the generator as it was."""
    import types

    import torch
    from diffusers import AutoencoderKL, AutoencoderTiny

    from lowvram_gen.engines.sd import posterior as posterior_mode
    from tiny_dit import build_tiny_sana

    if vae == "dc-ae":
        model = build_tiny_sana().vae
    else:
        torch.manual_seed(0)
        model = AutoencoderTiny(encoder_block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
                                num_encoder_blocks=(1, 1, 1, 1), num_decoder_blocks=(1, 1, 1, 1)).eval()
    pipe = types.SimpleNamespace(vae=model)
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        plain = model.encode(x)
        with posterior_mode.mode_only(pipe):
            moded = model.encode(x)
    assert type(moded) is type(plain) and not hasattr(moded, "latent_dist")
    latents = "latent" if vae == "dc-ae" else "latents"
    assert torch.equal(getattr(moded, latents), getattr(plain, latents))

    torch.manual_seed(0)
    kl = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=4).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad(), posterior_mode.mode_only(types.SimpleNamespace(vae=kl)):
        dist = kl.encode(x).latent_dist
        assert torch.equal(dist.sample(generator), dist.mode())
    assert torch.equal(torch.randn(3, generator=generator), torch.randn(3, generator=torch.Generator().manual_seed(5)))
    assert "encode" not in vars(kl) and "encode" not in vars(model)  # as it was after the block


def test_a_mode_copied_without_init_raises_attribute_error_not_recursion():
    """copy.copy / pickle build a `posterior.Mode` without calling __init__: asking it for an attribute must be an
    AttributeError (what copy and pickle expect), not a RecursionError through `__getattr__`'s `self.dist`."""
    import copy

    from lowvram_gen.engines.sd.posterior import Mode

    bare = Mode.__new__(Mode)
    with pytest.raises(AttributeError):
        bare.mean
    dist = types.SimpleNamespace(mean=3.0, mode=lambda: 3.0)
    assert copy.copy(Mode(dist)).mean == 3.0
