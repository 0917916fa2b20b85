"""Issue 31 item 4: A1111's SDE samplers (DPM++ SDE, DPM++ 2M SDE, 2M SDE Heun, 3M SDE) step with A1111's Brownian-tree
noise, one tree per image seeded by its seed, so the same seed gives A1111's image whatever the batch.

The references are tests/ksampling_ref_sde.py's samplers (the published algorithms, torchsde's BrownianTree used
directly). First the schedulers alone against them with a stand-in noise predictor (txt2img and an img2img start,
whose trees span the whole schedule as A1111's do), then jobs through the app on the tiny SD 1.x and SDXL models:
the UNet's calls are A1111's and the images the reference's (max diff <= 2/255)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.samplers import A1111_AUTOMATIC, DISCARD_PENULTIMATE, make_scheduler
from lowvram_gen.session import Session

import ksampling_ref as ref
import ksampling_ref_sde as ref_sde

SD15 = {"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
        "num_train_timesteps": 1000, "steps_offset": 1, "prediction_type": "epsilon", "timestep_spacing": "leading"}
ALGORITHMS = {"DPM++ SDE": ref_sde.dpmpp_sde, "DPM++ 2M SDE": ref_sde.dpmpp_2m_sde,
              "DPM++ 2M SDE Heun": ref_sde.dpmpp_2m_sde_heun, "DPM++ 3M SDE": ref_sde.dpmpp_3m_sde}
SEEDS = [5, 6]


def a1111_calls(sampler: str, steps: int) -> int:
    """A1111's model calls: DPM++ SDE two a step but one on the last (its Euler step to 0), the multistep ones one."""
    return 2 * steps - 1 if sampler == "DPM++ SDE" else steps


def levels(alphas, sampler: str, schedule: str, steps: int) -> list[float]:
    kind = A1111_AUTOMATIC[sampler] if schedule == "automatic" else schedule
    return a1111_sigmas.a1111(kind, steps, alphas, discard_penultimate=sampler in DISCARD_PENULTIMATE)


# --------------------------------------------------------------------------- the schedulers alone


def eps(scaled):
    """A stand-in noise prediction of the scaled input (as the UNet sees it): smooth, not linear."""
    import torch

    return 0.6 * torch.tanh(scaled) + 0.1 * torch.sin(3 * scaled)


def denoiser(x, sigma):
    return x - sigma * eps(x / (sigma ** 2 + 1) ** 0.5)


def through_scheduler(scheduler, noise, init, begin: int):
    """A diffusers pipeline's loop (txt2img from the first level, img2img from level `begin` via add_noise; a
    second-order class has two timesteps a level, as the img2img pipelines' get_timesteps counts them)."""
    begin *= scheduler.order
    if begin:
        scheduler.set_begin_index(begin)
        latents = scheduler.add_noise(init, noise, scheduler.timesteps[begin:begin + 1])
    else:
        latents = noise * scheduler.init_noise_sigma
    for t in scheduler.timesteps[begin:]:
        latents = scheduler.step(eps(scheduler.scale_model_input(latents, t)), t, latents).prev_sample
    return latents  # at the last level, 0, the scaled latents of the multistep class are the latents


@pytest.mark.parametrize("sampler", list(ALGORITHMS))
@pytest.mark.parametrize("begin", [0, 3])
def test_the_scheduler_steps_as_the_published_algorithm_with_the_seeds_trees(sampler, begin):
    """The schedulers the app runs, seeded with the images' seeds as the engine seeds them (`noise_sampler_seed`),
    give the reference's latents; from an img2img start (index 3 of 8) the trees still span the whole schedule."""
    import torch

    scheduler = make_scheduler(sampler, SD15, "karras")
    steps = 8
    scheduler.set_timesteps(steps)
    scheduler.noise_sampler_seed = list(SEEDS)
    noise = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(1))
    init = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(2))
    got = through_scheduler(scheduler, noise, init, begin)
    full = levels(scheduler.alphas_cumprod.double().numpy(), sampler, "karras", steps)
    start = full[begin]
    x = (init if begin else 0) + noise * float(np.float32(start))
    want = ALGORITHMS[sampler](denoiser, x, full[begin:], entropy=SEEDS, full=full)
    assert (got - want).abs().max() < 1e-4  # float32 rounding; a tree over another span moves it by units
    scheduler.set_timesteps(steps)
    scheduler.noise_sampler_seed = [SEEDS[0], 99]  # another seed for the second image: its result moves, not the first's
    other = through_scheduler(scheduler, noise, init, begin)
    assert (other[0] - got[0]).abs().max() < 1e-5 and (other[1] - got[1]).abs().max() > 1e-2


def test_a_seed_list_of_another_length_than_the_batch_is_refused():
    import torch

    scheduler = make_scheduler("DPM++ 2M SDE", SD15)
    scheduler.set_timesteps(3)
    scheduler.noise_sampler_seed = [1, 2, 3]
    with pytest.raises(ValueError, match="3 seeds for a batch of 2"):
        scheduler.step(torch.zeros(2, 4, 8, 8), scheduler.timesteps[0], torch.zeros(2, 4, 8, 8))


# ------------------------------------------------------------------------------- jobs through the app


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


def passes(calls) -> list[int]:
    return [len(p) for p in calls]


def made(session, tmp_path, folder, **fields) -> list[np.ndarray]:
    result = session.generate(GenerationRequest(prompt="a lighthouse", model=str(folder), outdir=str(tmp_path),
                                                width=64, height=64, cfg_scale=7.0, **fields))
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images]


@pytest.fixture(scope="module")
def plain():
    """Plain diffusers pipelines of the tiny models for the reference, loaded once per model."""
    from diffusers import AutoPipelineForText2Image

    loaded = {}

    def get(folder):
        if str(folder) not in loaded:
            loaded[str(folder)] = AutoPipelineForText2Image.from_pretrained(str(folder))
        return loaded[str(folder)]

    return get


# the model outermost, so that the session keeps one model loaded through the samplers; SDXL's training noise levels
# are SD 1.x's (the same Karras levels), so SDXL runs each sampler's Automatic only, the rest being its own UNet
@pytest.mark.parametrize("sampler", list(ALGORITHMS))
@pytest.mark.parametrize("model, schedule", [("tiny_path", "automatic"), ("tiny_path", "karras"),
                                             ("tiny_sdxl_path", "automatic")])
def test_txt2img_equals_a1111s_algorithm_with_its_brownian_noise(session, tmp_path, request, unet_passes, plain, model,
                                                                  schedule, sampler):
    folder = request.getfixturevalue(model)
    pipe = plain(folder)
    steps = 4
    sigmas = levels(pipe.scheduler.alphas_cumprod.double().numpy(), sampler, schedule, steps)
    want, ref_calls = ref.txt2img(pipe, ALGORITHMS[sampler], sigmas, SEEDS, "a lighthouse", entropy=SEEDS)
    got = made(session, tmp_path, folder, sampler=sampler, schedule_type=schedule, steps=steps, seed=SEEDS[0],
               batch_size=2)
    assert passes(unet_passes) == [a1111_calls(sampler, steps)] and ref_calls == a1111_calls(sampler, steps)
    for ours, theirs in zip(got, want):
        assert np.abs(ours - theirs).max() <= 2
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images: the comparison can fail


def test_the_same_seed_gives_the_same_image_at_batch_1_and_2(session, tmp_path, tiny_path):
    """A1111's batch determinism: image 2 of a batch of seeds 5, 6 is the image of seed 6 alone (DPM++ 2M SDE Heun;
    the schedulers' own test above moves one image's seed under all four)."""
    fields = dict(sampler="DPM++ 2M SDE Heun", steps=4)
    batch = made(session, tmp_path, tiny_path, seed=5, batch_size=2, **fields)
    alone = made(session, tmp_path, tiny_path, seed=6, **fields)
    assert np.abs(batch[1] - alone[0]).max() <= 1  # batched convolutions may round differently by one level
    assert np.abs(batch[0] - alone[0]).max() > 10


def test_the_hires_pass_steps_with_the_trees_of_the_same_seeds(session, tmp_path, tiny_path, unet_passes):
    """A1111 seeds the hires pass's trees with the images' seeds too: with DPM++ 2M SDE, 3 steps + Hires steps 2
    run 3 + 2 UNet calls, and image 2 of a batch is the image of its seed alone."""
    fields = dict(sampler="DPM++ 2M SDE", steps=3, hires_scale=1.5, hires_steps=2, hires_denoise=0.5)
    batch = made(session, tmp_path, tiny_path, seed=5, batch_size=2, **fields)
    alone = made(session, tmp_path, tiny_path, seed=6, **fields)
    assert passes(unet_passes) == [3, 2, 3, 2]
    assert np.abs(batch[1] - alone[0]).max() <= 1
    assert np.abs(batch[0] - alone[0]).max() > 3


def test_img2img_runs_a1111s_steps_with_the_trees_of_its_seeds(session, tmp_path, tiny_path, unet_passes):
    """img2img with DPM++ 3M SDE: int(6 x 0.5) + 1 = 4 UNet calls (A1111's count), and image 2 of a batch is the
    image of its seed alone."""
    init = tmp_path / "init.png"
    Image.new("RGB", (64, 64), (90, 140, 200)).save(init)
    fields = dict(sampler="DPM++ 3M SDE", steps=6, init_image=str(init), strength=0.5)
    batch = made(session, tmp_path, tiny_path, seed=5, batch_size=2, **fields)
    alone = made(session, tmp_path, tiny_path, seed=6, **fields)
    assert passes(unet_passes) == [4, 4]
    assert np.abs(batch[1] - alone[0]).max() <= 1
    assert np.abs(batch[0] - alone[0]).max() > 3
