"""Issue 31: the samplers we offer make A1111's image. For each k-diffusion sampler (Euler, Euler a, LMS, Heun,
DPM2, DPM2 a, DPM++ 2M) on a representative set of the schedule types it takes, and for A1111's timestep samplers
(DDIM, PLMS), a txt2img job through the app equals tests/ksampling_ref.py's published algorithm run around plain
diffusers' UNet with A1111's levels and noise (max diff <= 2/255), with A1111's number of UNet calls, on the tiny
SD 1.x and SDXL models; and ENSD (A1111's eta noise seed delta) re-seeds the step noise, not the first noise."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.session import Session

import ksampling_ref as ref

# sampler -> (the reference, A1111's discard_next_to_last_sigma, UNet calls a step (2: one for the last))
K_SAMPLERS = {"Euler": (ref.euler, False, 1), "Euler a": (ref.euler_ancestral, False, 1), "LMS": (ref.lms, False, 1),
              "Heun": (ref.heun, False, 2), "DPM2": (ref.dpm_2, True, 2), "DPM2 a": (ref.dpm_2_ancestral, True, 2),
              "DPM++ 2M": (ref.dpmpp_2m, False, 1)}
# the schedule types, A1111's Automatic (as a sigmas.py key) of each sampler where it is not Uniform
AUTOMATIC = {"DPM2": "karras", "DPM2 a": "karras", "DPM++ 2M": "karras"}
# a representative set: each sampler on its Automatic and on others, each schedule type on one sampler or more
# (Euler and Euler a on Automatic and Karras: tests/test_ksampling_ref.py); KL Optimal ends at sigma_min, not 0
# (Automatic is Karras for DPM2, DPM2 a and DPM++ 2M)
CASES = [("Euler", "sgm-uniform"), ("Euler a", "exponential"), ("LMS", "automatic"), ("LMS", "beta"),
         ("Heun", "automatic"), ("DPM2", "automatic"), ("DPM2", "align-your-steps"), ("DPM2 a", "automatic"),
         ("DPM++ 2M", "automatic"), ("DPM++ 2M", "kl-optimal")]
STEPS = 4
SEEDS = [5, 6]


@pytest.fixture(scope="module")
def session():
    return Session()


_PIPES = {}


def pipeline(folder):
    from diffusers import AutoPipelineForText2Image

    if str(folder) not in _PIPES:
        _PIPES[str(folder)] = AutoPipelineForText2Image.from_pretrained(str(folder))
    return _PIPES[str(folder)]


def made(session, tmp_path, monkeypatch, folder, **fields) -> tuple[list[np.ndarray], int]:
    """The job's images and the number of UNet calls it made (the UNet's forward counted on its class)."""
    from diffusers import UNet2DConditionModel

    calls = []
    forward = UNet2DConditionModel.forward
    monkeypatch.setattr(UNet2DConditionModel, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    result = session.generate(GenerationRequest(prompt="a lighthouse", model=str(folder), outdir=str(tmp_path),
                                                width=64, height=64, cfg_scale=7.0, seed=SEEDS[0],
                                                batch_size=len(SEEDS), **fields))
    monkeypatch.undo()
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images], len(calls)


def assert_equal(got, want):
    for ours, theirs in zip(got, want, strict=True):
        worst = int(np.abs(ours - theirs).max())
        assert worst <= 2, f"max diff {worst}/255"
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images: the comparison can fail


def check(session, tmp_path, monkeypatch, request, model, sampler, schedule, steps=STEPS):
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    algorithm, discard, per_step = K_SAMPLERS[sampler]
    kind = AUTOMATIC.get(sampler, "uniform") if schedule == "automatic" else schedule
    table = "sdxl" if model == "tiny_sdxl_path" else "sd15"
    levels = a1111_sigmas.a1111(kind, steps, pipe.scheduler.alphas_cumprod.double().numpy(),
                                discard_penultimate=discard, table=table)
    want, ref_calls = ref.txt2img(pipe, algorithm, levels, SEEDS, "a lighthouse")
    got, calls = made(session, tmp_path, monkeypatch, folder, sampler=sampler, schedule_type=schedule, steps=steps)
    a1111_calls = len(levels) - 1 if per_step == 1 else 2 * (len(levels) - 1) - (levels[-1] == 0)
    assert ref_calls == calls == a1111_calls
    assert_equal(got, want)


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
@pytest.mark.parametrize("sampler, schedule", CASES)
def test_each_sampler_and_schedule_type_makes_a1111s_image(session, tmp_path, monkeypatch, request, model, sampler,
                                                           schedule):
    check(session, tmp_path, monkeypatch, request, model, sampler, schedule)


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
def test_dpmpp_2m_at_15_steps_makes_a1111s_image(session, tmp_path, monkeypatch, request, model):
    """From 15 steps diffusers' DPM-Solver++ steps its next-to-last step at second order as k-diffusion does (below
    15 its `lower_order_final` makes it first order there: within 2/255 on the tiny models at 4 steps, above)."""
    check(session, tmp_path, monkeypatch, request, model, "DPM++ 2M", "automatic", steps=15)

@pytest.mark.parametrize("model, sampler, steps", [("tiny_path", "DDIM", 4), ("tiny_sdxl_path", "DDIM", 6),
                                                   ("tiny_path", "PLMS", 6), ("tiny_sdxl_path", "PLMS", 4),
                                                   ("tiny_path", "PLMS", 2)])
def test_ddim_and_plms_step_through_a1111s_timesteps(session, tmp_path, monkeypatch, request, model, sampler, steps):
    """A1111 1.6+: timesteps 1 + k * (1000 // steps) (4 steps: 4 of them, 6: 7), one UNet call fewer than them
    (PLMS: one more, its warm-up; for 2 steps at the lowest timestep), from the seed's noise as it is; DDIM at
    A1111's default eta 0, its predicted x0 not clipped."""
    algorithm = ref.ddim if sampler == "DDIM" else ref.plms
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    timesteps = ref.a1111_timesteps(steps)
    assert timesteps == [1 + k * (1000 // steps) for k in range(len(timesteps))] and timesteps[-1] < 1000
    want, ref_calls = ref.txt2img_timesteps(pipe, algorithm, timesteps, SEEDS, "a lighthouse")
    got, calls = made(session, tmp_path, monkeypatch, folder, sampler=sampler, steps=steps)
    assert ref_calls == calls == len(timesteps) - (sampler == "DDIM")
    assert_equal(got, want)


def test_a1111s_timesteps_for_30_steps_are_31_with_30_calls():
    from lowvram_gen.schedules import a1111_timesteps

    assert ref.a1111_timesteps(30) == list(range(1, 1000, 33)) and len(ref.a1111_timesteps(30)) == 31
    assert a1111_timesteps(30) == ref.a1111_timesteps(30)[::-1]
    assert a1111_timesteps(20)[0] == 951 and a1111_timesteps(20)[-1] == 1 and len(a1111_timesteps(20)) == 20


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
def test_ensd_reseeds_the_step_noise_and_not_the_first_noise(session, tmp_path, monkeypatch, request, model):
    """A1111's eta noise seed delta: each image's generator made again from seed + ENSD once its first noise is
    drawn (modules/rng.py ImageRNG.first). Euler a takes step noise: it changes, and equals the reference's; Euler
    takes none: the same image with and without it."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    levels = a1111_sigmas.a1111("uniform", STEPS, pipe.scheduler.alphas_cumprod.double().numpy())
    want, _ = ref.txt2img(pipe, ref.euler_ancestral, levels, SEEDS, "a lighthouse", ensd=31337)
    got, _ = made(session, tmp_path, monkeypatch, folder, sampler="Euler a", steps=STEPS, ensd=31337)
    assert_equal(got, want)
    without, _ = made(session, tmp_path, monkeypatch, folder, sampler="Euler a", steps=STEPS)
    assert np.abs(got[0] - without[0]).max() > 10
    plain, _ = made(session, tmp_path, monkeypatch, folder, sampler="Euler", steps=STEPS)
    assert all(np.array_equal(a, b) for a, b in zip(
        plain, made(session, tmp_path, monkeypatch, folder, sampler="Euler", steps=STEPS, ensd=31337)[0]))


@pytest.mark.parametrize("source", ["gpu", "cpu", "nv"])
def test_seed_delta_reseeds_each_images_generator_at_the_first_step_for_every_rng_source(source):
    """engines/sd/rng_source.seed_delta: the draws before the scheduler's first step are each seed's, those after it
    seed + delta's (NV: its Philox started again from the new seed), image by image; the step is restored after."""
    from types import SimpleNamespace

    import torch

    from lowvram_gen.engines.sd import rng_source
    from lowvram_gen.rng import Philox

    shape = (2, 4, 8, 8)
    gens = rng_source.generators(SEEDS, "cpu", source)
    scheduler = SimpleNamespace(step=lambda: rng_source.randn_tensor(shape, generator=gens))
    own = scheduler.step
    with rng_source.drawing(source, scheduler), rng_source.seed_delta(scheduler, gens, SEEDS, 31337):
        first = rng_source.randn_tensor(shape, generator=gens)
        step = scheduler.step()
    assert scheduler.step is own

    def drawn(seed):
        if source == "nv":
            return torch.from_numpy(Philox(seed).randn((1, *shape[1:])))
        return torch.randn((1, *shape[1:]), generator=torch.Generator("cpu").manual_seed(seed))

    assert torch.equal(first, torch.cat([drawn(s) for s in SEEDS]))
    assert torch.equal(step, torch.cat([drawn(s + 31337) for s in SEEDS]))
