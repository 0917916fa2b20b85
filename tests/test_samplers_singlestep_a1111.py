"""Issue 31, item 4: DPM++ 2S a, UniPC and DPM++ 2M as A1111 runs them equal the published algorithms
(tests/ksampling_ref_singlestep.py, around plain diffusers' UNet with A1111's levels and noise) on the tiny SD 1.x and
SDXL models, with A1111's number of UNet calls:

- DPM++ 2S a: DPM-Solver++(2S) ancestral (lowvram_gen/ksamplers/), 2 calls a step and 1 on the last (to 0), its
  step noise from each image's own generator (batch 2, seeds 5 and 6), on txt2img and img2img;
- UniPC: bh1, order 3, time-uniform continuous times, lower order final (A1111's defaults), as many steps as A1111's
  timestep schedule has (3 steps: 4);
- DPM++ 2M: first order only on its first step and where the next level is 0, also below 15 steps.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.session import Session

import ksampling_ref as ref
import ksampling_ref_singlestep as ref2
from ksampling_ref_singlestep import pipeline  # unet_calls: a conftest fixture

PROMPT = "a lighthouse"


@pytest.fixture(scope="module")
def session():
    return Session()


def levels(pipe, kind: str, steps: int) -> list[float]:
    return a1111_sigmas.a1111(kind, steps, pipe.scheduler.alphas_cumprod.double().numpy())


def made(session, tmp_path, folder, calls, **fields) -> tuple[list[np.ndarray], int]:
    calls.clear()
    result = session.generate(GenerationRequest(prompt=PROMPT, model=str(folder), outdir=str(tmp_path), width=64,
                                                height=64, cfg_scale=7.0, seed=5, batch_size=2, **fields))
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images], len(calls)


def assert_equal(got, want):
    for ours, theirs in zip(got, want):
        assert np.abs(ours - theirs).max() <= 2
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images: the comparison can fail


@pytest.mark.parametrize("model, schedule", [("tiny_path", "automatic"), ("tiny_path", "kl-optimal"),
                                             ("tiny_sdxl_path", "automatic")])
def test_dpmpp_2s_a_is_the_ancestral_single_step_solver(session, tmp_path, request, unet_calls, model, schedule):
    """A1111's Automatic for DPM++ 2S a is Karras; KL Optimal ends at the lowest level, not 0: two calls on its last
    step too, and noise after it."""
    folder = request.getfixturevalue(model)
    pipe, steps = pipeline(folder), 4
    sigmas = levels(pipe, "karras" if schedule == "automatic" else schedule, steps)
    want, calls = ref.txt2img(pipe, ref2.dpmpp_2s_ancestral, sigmas, [5, 6], PROMPT)
    got, app_calls = made(session, tmp_path, folder, unet_calls, sampler="DPM++ 2S a", schedule_type=schedule,
                          steps=steps)
    assert calls == app_calls == 2 * steps - (sigmas[-1] == 0)
    assert_equal(got, want)


def test_dpmpp_2s_a_img2img_runs_a1111s_steps_from_a1111s_level(session, tmp_path, tiny_path, unet_calls):
    """img2img at 0.5 of 6 steps: A1111 runs the last int(6 * 0.5) + 1 = 4 levels of the 6-step Karras schedule,
    from the init latents plus the first of them times the seed's noise: 2 * 4 - 1 calls. (The init latents are the
    posterior's mean and the noise is each image's first draw, as in A1111: ksampling_ref_singlestep.img2img.)"""
    import torch

    pipe = pipeline(tiny_path)
    init = tmp_path / "init.png"
    gradient = np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3).astype(np.uint8)
    Image.fromarray(gradient).save(init)
    with torch.no_grad():
        posterior = pipe.vae.encode(pipe.image_processor.preprocess(Image.open(init).convert("RGB"))).latent_dist
    steps, run = 6, 4
    tail = levels(pipe, "karras", steps)[steps - run:]
    want, calls = ref2.img2img(pipe, ref2.dpmpp_2s_ancestral, tail, [5, 6], PROMPT, posterior)
    got, app_calls = made(session, tmp_path, tiny_path, unet_calls, sampler="DPM++ 2S a", steps=steps,
                          init_image=str(init), strength=0.5)
    assert calls == app_calls == 2 * run - 1
    assert_equal(got, want)


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
def test_unipc_is_a1111s_bh1_order_3_on_time_uniform_steps(session, tmp_path, request, unet_calls, model):
    """3 steps: A1111's timestep schedule range(0, 1000, 333) has 4 entries, so its UniPC runs 4 steps, one UNet
    call each (none at the end). diffusers' default UniPC (bh2, order 2) would give another image."""
    folder = request.getfixturevalue(model)
    pipe, steps = pipeline(folder), 3
    n = ref2.a1111_unipc_steps(steps)

    def unipc(variant, order):
        return lambda denoiser, x, sigmas, rng: ref2.unipc(denoiser, x, n, variant=variant, order=order)

    want, calls = ref.txt2img(pipe, unipc("bh1", 3), [1.0, 0.0], [5, 6], PROMPT)  # x_T: the seed's noise as it is
    got, app_calls = made(session, tmp_path, folder, unet_calls, sampler="UniPC", steps=steps)
    assert n == 4 and calls == app_calls == n
    assert_equal(got, want)
    if model == "tiny_path":
        other, _ = ref.txt2img(pipe, unipc("bh2", 2), [1.0, 0.0], [5, 6], PROMPT)
        assert max(np.abs(a - b).max() for a, b in zip(got, other)) > 2


@pytest.mark.parametrize("schedule, steps", [("karras", 4)])
def test_dpmpp_2m_is_second_order_to_the_end_below_15_steps(session, tmp_path, tiny_path, unet_calls, schedule,
                                                            steps):
    """diffusers' lower_order_final makes the last step first order below 15 steps; k-diffusion's 2M is first order
    only where the next level is 0, which is the last step here: equal (the latents' test below has KL Optimal)."""
    pipe = pipeline(tiny_path)
    want, calls = ref.txt2img(pipe, ref2.dpmpp_2m, levels(pipe, schedule, steps), [5, 6], PROMPT)
    got, app_calls = made(session, tmp_path, tiny_path, unet_calls, sampler="DPM++ 2M", schedule_type=schedule,
                          steps=steps)
    assert calls == app_calls == steps
    assert_equal(got, want)


def test_dpmpp_2s_a_step_noise_is_each_images_own_and_the_nv_sources():
    """The step noise is diffusers' randn_tensor with the pipeline's per-image generators, called from the
    scheduler's module, so `--rng nv` (rng_source.drawing) replaces it there: from 2 to 1 with a zero model, the
    step's result is sigma_up times each image's own first NV draw."""
    import torch

    from lowvram_gen.engines.sd import rng_source
    from lowvram_gen.ksamplers import dpmpp_2s_ancestral as module
    from lowvram_gen.rng import NV, Philox

    def stepped(seeds, source=None):
        scheduler = module.DPMPP2SAncestralScheduler()
        scheduler.set_timesteps(sigmas=[2.0, 1.0, 0.0])
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        x = torch.zeros(len(seeds), 4, 8, 8)
        with rng_source.drawing(source, scheduler):
            assert (module.randn_tensor is rng_source.randn_tensor) == (source == NV)
            for t in scheduler.timesteps[:2]:  # the first step: two calls, then the noise
                x = scheduler.step(torch.zeros_like(x), t, x, generator=generators).prev_sample
        return x / 0.75 ** 0.5  # sigma_up from 2 to 1: sqrt(1 * (4 - 1) / 4)

    nv = stepped([5, 6], NV)
    for image, seed in zip(nv, (5, 6)):
        want = torch.from_numpy(Philox(seed).randn((1, 4, 8, 8)))[0]
        assert torch.allclose(image, want, atol=1e-5)
    cpu = stepped([5, 6], "cpu")
    assert torch.allclose(cpu[0], torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(5))[0], atol=1e-5)
    assert torch.equal(stepped([5, 7], "cpu")[0], cpu[0]) and not torch.equal(stepped([5, 7], "cpu")[1], cpu[1])


@pytest.mark.parametrize("schedule, steps", [("karras", 4), ("kl-optimal", 4), ("kl-optimal", 10)])
def test_dpmpp_2m_latents_equal_k_diffusions_to_the_last_step(schedule, steps):
    """KL Optimal ends at the model's lowest level, not 0: k-diffusion's 2M steps there at second order, diffusers'
    class (lower_order_final below 15 steps, final_sigmas_type "zero") at first. On a made-up noise prediction the
    final latents equal the reference's to float32 precision; with diffusers' own settings KL Optimal's do not
    (about 1e-2 of latents of size 30 here; on the tiny UNet that is within 1/255, so it is measured here)."""
    import math

    import torch

    from lowvram_gen.samplers import make_scheduler

    config = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "num_train_timesteps": 1000}

    def eps(x, sigma):
        return torch.tanh(x) * 0.7 + 0.05 * math.log(sigma) * torch.cos(x)

    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def final(**settings):
        scheduler = make_scheduler("DPM++ 2M", config, schedule)
        scheduler.register_to_config(**settings)
        scheduler.set_timesteps(steps)
        x = noise.float() * scheduler.init_noise_sigma  # DPM-Solver's x / sqrt(1 + sigma^2)
        for i, t in enumerate(scheduler.timesteps):
            x = scheduler.step(eps(x.double(), float(scheduler.sigmas[i])).float(), t, x).prev_sample
        return x.double() * math.sqrt(1 + float(scheduler.sigmas[-1]) ** 2)

    sigmas = levels_of(config, schedule, steps)
    want = ref2.dpmpp_2m(lambda x, s: x - s * eps(x / math.sqrt(s * s + 1), s), noise * sigmas[0], sigmas)
    assert (final() - want).abs().max() < 1e-4
    diffusers_own = (final(lower_order_final=True, final_sigmas_type="zero") - want).abs().max()
    assert (diffusers_own > 1e-3) == (schedule == "kl-optimal")


def levels_of(config, schedule, steps):
    from diffusers import DDPMScheduler

    alphas = DDPMScheduler.from_config(config).alphas_cumprod.double().numpy()
    return a1111_sigmas.a1111(schedule, steps, alphas)


@pytest.mark.parametrize("steps, times", [(4, [999.0, 749.25, 499.5, 249.75]), (3, [999.0, 749.25, 499.5, 249.75]),
                                          (20, None), (30, None)])
def test_unipc_steps_through_a1111s_times(steps, times):
    """A1111's UniPC: len(range(0, 1000, 1000 // steps)) steps (20: 20, 30: 31), the UNet given the continuous
    times from 999 down, evenly, to 0 (not called there), the levels from the model's highest, 14.6146, to its
    lowest, 0.029168 (sqrt((1 - a) / a) of SD's first and last alphas_cumprod); the first latents the noise as it
    is; bh1, order 3 (a schedule type is refused, as A1111's UniPC ignores one: test_schedules_a1111.py)."""
    from diffusers import PNDMScheduler

    from lowvram_gen.samplers import build_scheduler
    from lowvram_gen.schedules import AUTOMATIC

    config = {"_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012, "num_train_timesteps": 1000,
              "beta_schedule": "scaled_linear", "skip_prk_steps": True, "set_alpha_to_one": False, "steps_offset": 1}

    scheduler = build_scheduler("UniPC", AUTOMATIC, PNDMScheduler.from_config(config))[0]
    assert (scheduler.config.solver_type, scheduler.config.solver_order, scheduler.config.lower_order_final) == (
        "bh1", 3, True)
    scheduler.set_timesteps(steps)
    n = {4: 4, 3: 4, 20: 20, 30: 31}[steps]
    assert len(scheduler.timesteps) == n and scheduler.init_noise_sigma == 1.0
    got = [float(t) for t in scheduler.timesteps]
    assert got == pytest.approx(times or list(np.linspace(999, 0, n + 1)[:-1]), abs=1e-3)
    assert float(scheduler.sigmas[0]) == pytest.approx(14.6146, rel=1e-4)
    assert float(scheduler.sigmas[-1]) == pytest.approx(0.029168, rel=1e-4) and len(scheduler.sigmas) == n + 1


def test_an_a1111_unipc_png_reruns_with_no_unused_note(tmp_path, capsys):
    """A1111 writes no schedule type for UniPC (a timestep sampler): its PNG reruns as UniPC, and ours says the same."""
    from a1111_png import rerun_with_no_unused_note

    from lowvram_gen.outputs import parse_a1111_parameters

    out = rerun_with_no_unused_note("a fox\nSteps: 3, Sampler: UniPC, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, "
                                    "Version: v1.10.1", (64, 64), tmp_path, capsys)
    assert (out["sampler"], out["schedule_type"]) == ("UniPC", "automatic")
    written = parse_a1111_parameters(Image.open(out["images"][0]).text["parameters"])
    assert written["Sampler"] == "UniPC" and "Schedule type" not in written
