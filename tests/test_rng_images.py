"""Issue 31 item 5: the images `--rng cpu` and `--rng nv` make on the tiny SD model are the ones their noise predicts:
a plain diffusers pipeline given that noise as `latents=` (and, for an ancestral sampler, that generator's next draws
as its step noise, as A1111's sampler noise continues each image's generator) makes the same image. And the NV
replacement of diffusers' `randn_tensor` (engines/sd/rng_source.py): per image generator, continuing, this thread
only, undone after."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lowvram_gen import rng
from lowvram_gen.engines.sd import rng_source
from test_variation_seeds import make, pixels, session  # noqa: F401 (session: a fixture); the tiny model, 64x64


def nv(seed, shape=(1, 4, 8, 8)):
    import torch

    return torch.from_numpy(rng.randn(seed, shape))


def cpu(seed, shape=(1, 4, 8, 8)):
    import torch

    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))


@pytest.fixture(scope="module")
def plain(tiny_path):
    """A plain diffusers pipeline of the tiny model: (latents, scheduler maker or None) -> its image's pixels."""
    from diffusers import AutoPipelineForText2Image

    pipe = AutoPipelineForText2Image.from_pretrained(str(tiny_path))
    own = pipe.scheduler

    def image(latents, scheduler=None):
        pipe.scheduler = own if scheduler is None else scheduler(own)
        out = pipe("a lighthouse", width=64, height=64, num_inference_steps=2, guidance_scale=7.0,
                   latents=latents).images[0]
        return np.asarray(out.convert("RGB")).astype(int)

    return image


def test_cpu_and_nv_images_are_the_ones_their_noise_makes_each_image_its_own_seeds(session, tmp_path, plain):
    nv_made = make(session, tmp_path, seed=5, rng="nv", batch_size=2)
    cpu_made = make(session, tmp_path, seed=5, rng="cpu")
    assert np.abs(pixels(cpu_made.images[0]) - plain(cpu(5))).max() <= 1
    for image, seed in zip(nv_made.images, (5, 6)):
        assert np.abs(pixels(image) - plain(nv(seed))).max() <= 1
    assert not np.array_equal(pixels(nv_made.images[0]), pixels(cpu_made.images[0]))


def test_nv_variation_noise_is_the_slerp_of_the_two_seeds_nv_noise(session, tmp_path, plain):
    from lowvram_gen.engines.sd.pipeline import slerp  # A1111's, as test_variation_seeds checks it

    ours = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0.3, rng="nv")
    blended = slerp(0.3, nv(5)[0], nv(9)[0])
    assert np.abs(pixels(ours.images[0]) - plain(blended[None])).max() <= 1


def test_an_ancestral_samplers_step_noise_continues_the_images_nv_generator(session, tmp_path, plain, monkeypatch):
    """Euler a: the first draw is the initial noise, each step's noise the next draw of the same generator."""
    import torch
    from diffusers.schedulers import scheduling_euler_ancestral_discrete as euler_a

    from lowvram_gen.samplers import build_scheduler
    from lowvram_gen.schedules import AUTOMATIC

    ours = make(session, tmp_path, seed=5, rng="nv", sampler="Euler a")
    generator = rng.Philox(5)
    first = torch.from_numpy(generator.randn((1, 4, 8, 8)))

    def next_draw(shape, device=None, dtype=None, **_):  # the scheduler's step noise: the generator's next draw
        return torch.from_numpy(generator.randn(tuple(shape))).to(device=device, dtype=dtype)

    monkeypatch.setattr(euler_a, "randn_tensor", next_draw)
    reference = plain(first, lambda base: build_scheduler("Euler a", AUTOMATIC, base)[0])
    assert np.abs(pixels(ours.images[0]) - reference).max() <= 1
    assert generator.offset == 4 * 3  # the initial noise and two steps' noise were drawn


def test_drawing_answers_nv_noise_per_generator_in_this_thread_only_and_is_undone():
    import torch
    from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion as module
    from diffusers.utils import torch_utils

    class Pipe(module.StableDiffusionPipeline):
        def __init__(self):  # no components: only its class's module matters here
            pass

    before = module.randn_tensor
    gens = rng_source.generators([5, 6], "cuda", "nv")
    assert {g.device.type for g in gens} == {"cpu"}
    assert rng_source.generator_device("cuda", "cpu") == "cpu" and rng_source.generator_device("cuda", "gpu") == "cuda"
    assert rng_source.generator_device("mps", "gpu") == "cpu"
    seen = {}
    with rng_source.drawing("nv", Pipe()):
        first = module.randn_tensor((2, 4, 8, 8), generator=gens, device=torch.device("cpu"), dtype=torch.float16)
        second = torch_utils.randn_tensor((2, 4, 8, 8), generator=gens, device=torch.device("cpu"))
        other = threading.Thread(target=lambda: seen.update(noise=module.randn_tensor(
            (1, 4, 8, 8), generator=torch.Generator().manual_seed(5), device=torch.device("cpu"))))
        other.start()
        other.join()
    assert first.dtype == torch.float16
    assert torch.equal(first.float(), torch.cat([nv(5), nv(6)]).half().float())
    g5, g6 = rng.Philox(5), rng.Philox(6)
    g5.randn((1, 4, 8, 8)), g6.randn((1, 4, 8, 8))
    assert torch.equal(second, torch.from_numpy(np.concatenate([g5.randn((1, 4, 8, 8)), g6.randn((1, 4, 8, 8))])))
    assert torch.equal(seen["noise"], cpu(5))  # another thread: diffusers' own
    assert module.randn_tensor is before and torch_utils.randn_tensor is before
    with rng_source.drawing("cpu", Pipe()):
        assert module.randn_tensor is before  # cpu and gpu: the generators say where torch draws
