"""Issue 31: A1111's timestep samplers (DDIM, PLMS) and its LCM make A1111's image. txt2img where A1111's timesteps
clip at 999 (3 and 9 steps), img2img with A1111's count and noise level (tests/ksampling_ref_timesteps.py), LCM on
A1111's noise levels: UNet calls and pixels (max diff <= 2/255) equal the reference on the tiny SD 1.x and SDXL
models, batch 2 with seeds 5 and 6."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest

import ksampling_ref as ref
import ksampling_ref_timesteps as ref_t
from test_samplers_a1111_images import SEEDS, assert_equal, made, pipeline, session  # noqa: F401 (a fixture)

PROMPT = "a lighthouse"  # the prompt and seeds of test_samplers_a1111_images' helpers
ALGORITHMS = {"DDIM": ref.ddim, "PLMS": ref.plms}


def init_image(tmp_path):
    path = tmp_path / "init.png"
    gradient = np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3).astype(np.uint8)
    Image.fromarray(gradient).save(path)
    return path


@pytest.mark.parametrize("model, sampler, steps", [("tiny_path", "DDIM", 3), ("tiny_sdxl_path", "PLMS", 3),
                                                   ("tiny_sdxl_path", "DDIM", 9)])
def test_clipped_timesteps_run_a1111s_steps(session, tmp_path, monkeypatch, request, model, sampler, steps):
    """3 steps: timesteps 1, 334, 667 and 1000 clipped to 999, so the first step is 999 -> 667 (332, not 333): 3
    DDIM calls, PLMS one more (its warm-up)."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    timesteps = ref.a1111_timesteps(steps)
    assert timesteps[-1] == 999 and len(timesteps) == steps + 1
    want, ref_calls = ref.txt2img_timesteps(pipe, ALGORITHMS[sampler], timesteps, SEEDS, PROMPT)
    got, calls = made(session, tmp_path, monkeypatch, folder, sampler=sampler, steps=steps)
    assert ref_calls == calls == steps + (sampler == "PLMS")
    assert_equal(got, want)


@pytest.mark.parametrize("model, sampler, steps, strength, calls", [
    ("tiny_path", "DDIM", 6, 0.6, 2), ("tiny_sdxl_path", "PLMS", 3, 0.75, 2)])
def test_img2img_runs_a1111s_count_from_a1111s_level(session, tmp_path, monkeypatch, request, posterior_mode, model,
                                                     sampler, steps, strength, calls):
    """t_enc = int(strength * steps) (6 at 0.6: 3): the init noised to timestep t_enc, then t_enc - 1 DDIM calls
    (PLMS t_enc, its warm-up) through the timesteps below it."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    init = init_image(tmp_path)
    schedule, t_enc = ref_t.img2img_steps(steps, strength)
    want, ref_calls = ref_t.img2img_timesteps(pipe, ALGORITHMS[sampler], schedule, t_enc,
                                              ref_t.init_latents(pipe, Image.open(init).convert("RGB")), SEEDS, PROMPT)
    got, app_calls = made(session, tmp_path, monkeypatch, folder, sampler=sampler, steps=steps, init_image=str(init),
                          strength=strength)
    assert ref_calls == app_calls == calls
    assert_equal(got, want)


def test_img2img_fix_steps_runs_the_explicit_count_rule(session, tmp_path, monkeypatch, posterior_mode, tiny_path):
    """A1111's img2img_fix_steps (as hires fix's explicit steps): 4 steps at 0.5 is a schedule of int(4 / 0.5) = 8
    with t_enc = 4 - 1 = 3: DDIM runs 2 calls."""
    pipe = pipeline(tiny_path)
    init = init_image(tmp_path)
    schedule, t_enc = ref_t.img2img_steps(4, 0.5, explicit=4)
    assert (schedule, t_enc) == (8, 3)
    want, ref_calls = ref_t.img2img_timesteps(pipe, ref.ddim, schedule, t_enc,
                                              ref_t.init_latents(pipe, Image.open(init).convert("RGB")), SEEDS, PROMPT)
    got, app_calls = made(session, tmp_path, monkeypatch, tiny_path, sampler="DDIM", steps=4, init_image=str(init),
                          strength=0.5, img2img_fix_steps=True)
    assert ref_calls == app_calls == 2
    assert_equal(got, want)


def test_hires_second_pass_runs_a1111s_count(session, tmp_path, monkeypatch, tiny_path):
    """Hires fix's explicit steps: 4 at 0.5 is a schedule of 8 with t_enc 3, so DDIM's second pass makes 2 calls (its
    first pass of 4 steps 3), PLMS's 3 (and 4)."""
    from diffusers import UNet2DConditionModel

    for sampler, want in (("DDIM", [8] * 3 + [16] * 2), ("PLMS", [8] * 4 + [16] * 3)):
        calls = []
        forward = UNet2DConditionModel.forward
        monkeypatch.setattr(UNet2DConditionModel, "forward",
                            lambda self, *a, **k: calls.append(a[0].shape[-1]) or forward(self, *a, **k))
        session.generate(GenerationRequest(prompt=PROMPT, model=str(tiny_path), outdir=str(tmp_path), width=64,
                                           height=64, steps=4, sampler=sampler, hires_scale=2, hires_steps=4,
                                           hires_denoise=0.5))
        monkeypatch.undo()
        assert calls == want, sampler


def test_img2img_with_no_a1111_step_gives_the_noised_init(session, tmp_path, monkeypatch, posterior_mode, tiny_path):
    """4 steps at 0.3: t_enc = 1, so A1111's DDIM steps nowhere and returns the init noised to timestep 251; the
    pipeline needs a call, which steps in place."""
    pipe = pipeline(tiny_path)
    init = init_image(tmp_path)
    want, ref_calls = ref_t.img2img_timesteps(pipe, ref.ddim, 4, 1,
                                              ref_t.init_latents(pipe, Image.open(init).convert("RGB")), SEEDS, PROMPT)
    got, app_calls = made(session, tmp_path, monkeypatch, tiny_path, sampler="DDIM", steps=4, init_image=str(init),
                          strength=0.3)
    assert (ref_calls, app_calls) == (0, 1)
    assert_equal(got, want)


@pytest.mark.parametrize("steps, sampler, calls", [(3, "DDIM", [999, 667, 334]), (3, "PLMS", [999, 667, 667, 334]),
                                                   (9, "DDIM", [999] + list(range(889, 1, -111))),
                                                   (4, "PLMS", [751, 501, 501, 251])])
def test_the_scheduler_calls_the_unet_at_a1111s_timesteps(steps, sampler, calls):
    from diffusers import DDIMScheduler

    from lowvram_gen.samplers import make_scheduler

    config = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear").config
    scheduler = make_scheduler(sampler, config)
    scheduler.set_timesteps(steps)
    assert scheduler.timesteps.tolist() == calls


@pytest.mark.parametrize("model, schedule, steps", [("tiny_path", "automatic", 4), ("tiny_sdxl_path", "karras", 3)])
def test_lcm_is_a1111s_on_its_50_levels(session, tmp_path, monkeypatch, request, model, schedule, steps):
    """A1111's LCM: k-diffusion's sample_lcm on the LCM denoiser's 50 levels (Automatic: Uniform on them), one
    call a level, the next level's noise from each image's generator."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    want, ref_calls = ref_t.lcm_txt2img(pipe, "uniform" if schedule == "automatic" else schedule, steps, SEEDS,
                                        PROMPT)
    got, calls = made(session, tmp_path, monkeypatch, folder, sampler="LCM", schedule_type=schedule, steps=steps)
    assert ref_calls == calls == steps
    assert_equal(got, want)


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
def test_lcm_img2img_runs_a1111s_tail(session, tmp_path, monkeypatch, request, posterior_mode, model):
    """6 steps at 0.5: the last int(0.5 * 6) + 1 = 4 of the levels, from the init plus the first of them times the
    seed's noise."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    init = init_image(tmp_path)
    want, ref_calls = ref_t.lcm_img2img(pipe, "uniform", 6, 0.5,
                                        ref_t.init_latents(pipe, Image.open(init).convert("RGB")), SEEDS, PROMPT)
    got, calls = made(session, tmp_path, monkeypatch, folder, sampler="LCM", steps=6, init_image=str(init),
                      strength=0.5)
    assert ref_calls == calls == 4
    assert_equal(got, want)


def test_lcm_step_noise_is_each_images_own_and_the_nv_sources():
    """The step noise is diffusers' randn_tensor with the pipeline's per-image generators, drawn through the
    stepper's module, so `--rng nv` replaces it: with a zero model from 0 latents, the first step's result is the
    next level times each image's own first draw."""
    import torch

    from lowvram_gen.engines.sd import rng_source
    from lowvram_gen.ksamplers import lcm, stepper
    from lowvram_gen.rng import NV, Philox

    def stepped(seeds, source=None):
        scheduler = lcm.LCMKDiffusionScheduler()
        scheduler.set_timesteps(3)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        x = torch.zeros(len(seeds), 4, 8, 8)
        with rng_source.drawing(source, scheduler):
            assert (stepper.randn_tensor is rng_source.randn_tensor) == (source == NV)
            x = scheduler.step(torch.zeros_like(x), scheduler.timesteps[0], x, generator=generators).prev_sample
        return x / scheduler.levels[1]

    nv = stepped([5, 6], NV)
    for image, seed in zip(nv, (5, 6)):
        assert torch.allclose(image, torch.from_numpy(Philox(seed).randn((1, 4, 8, 8)))[0], atol=1e-5)
    cpu = stepped([5, 6], "cpu")
    assert torch.allclose(cpu[0], torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(5))[0], atol=1e-5)
    assert not torch.equal(stepped([5, 7], "cpu")[1], cpu[1])


def test_diffusers_lcm_stays_askable_by_its_class_name():
    from diffusers import DDIMScheduler, LCMScheduler

    from lowvram_gen.samplers import build_scheduler, split_sampler

    config = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear").config
    assert split_sampler("LCMScheduler") == ("LCMScheduler", None)
    assert type(build_scheduler("LCMScheduler", "automatic", DDIMScheduler.from_config(config))[0]) is LCMScheduler


def test_an_a1111_lcm_png_reruns_with_no_unused_note(tmp_path, capsys):
    from a1111_png import rerun_with_no_unused_note

    out = rerun_with_no_unused_note("a fox\nSteps: 3, Sampler: LCM, Schedule type: Karras, CFG scale: 2, Seed: 5, "
                                    "Size: 64x64, Model: tiny, Version: v1.10.1", (64, 64), tmp_path, capsys)
    assert (out["sampler"], out["schedule_type"]) == ("LCM", "karras")


def test_ddpm_is_listed_as_diffusers_own_not_a1111s():
    """A1111 has no DDPM: the API's sampler list says which names are A1111's, DDPM runs diffusers' DDPMScheduler."""
    from lowvram_gen.api.listings import samplers

    listed = {entry["name"]: entry["options"] for entry in samplers()}
    assert listed["DDPM"] == {"diffusers_scheduler": "DDPMScheduler", "a1111": False}
    assert listed["LCM"]["a1111"] and listed["DDIM"]["a1111"] and listed["default"]["a1111"]
