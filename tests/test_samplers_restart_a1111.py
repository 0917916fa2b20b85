"""Issue 31, item 4: A1111's Restart, DPM fast and DPM adaptive (lowvram_gen/ksamplers/) make A1111's number of UNet
calls and the image the published algorithms make (tests/ksampling_ref_restart.py) with A1111's levels and noise,
on the tiny SD 1.x and SDXL models; img2img runs A1111's pass; a PNG naming them reruns with no note."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.session import Session

import ksampling_ref as ref
import ksampling_ref_restart as ref_restart


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


def pipeline(folder):
    from diffusers import AutoPipelineForText2Image

    return AutoPipelineForText2Image.from_pretrained(str(folder))


def model_range(pipe) -> dict:
    alphas = pipe.scheduler.alphas_cumprod.double().numpy()
    levels = np.sqrt((1 - alphas) / alphas)
    return {"sigma_min": float(levels[0]), "sigma_max": float(levels[-1])}


def made(session, tmp_path, folder, **fields):
    result = session.generate(GenerationRequest(prompt="a lighthouse", model=str(folder), outdir=str(tmp_path),
                                                width=64, height=64, cfg_scale=7.0, seed=5, batch_size=2, **fields))
    return result, [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images]


# (sampler, schedule type, steps, reference, A1111's schedule for it, its UNet calls or None: the reference's count)
CASES = [("Restart", "automatic", 20, ref_restart.restart, "karras", 39),  # one restart of 9 steps, noise per image
         ("Restart", "uniform", 4, ref_restart.restart, "uniform", 7),  # under 20 steps: Heun
         ("DPM fast", "automatic", 5, ref_restart.dpm_fast, "uniform", 5),
         ("DPM adaptive", "automatic", 4, ref_restart.dpm_adaptive, "uniform", None)]


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
@pytest.mark.parametrize("sampler, schedule, steps, algorithm, kind, a1111_calls", CASES)
def test_txt2img_equals_the_published_algorithm_with_a1111s_calls(session, tmp_path, request, unet_passes, model, sampler,
                                                                   schedule, steps, algorithm, kind, a1111_calls):
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    levels = a1111_sigmas.a1111(kind, steps, pipe.scheduler.alphas_cumprod.double().numpy())
    options = model_range(pipe) if sampler.startswith("DPM") else {}
    want, ref_calls = ref.txt2img(pipe, algorithm, levels, [5, 6], "a lighthouse", **options)
    result, got = made(session, tmp_path, folder, sampler=sampler, schedule_type=schedule, steps=steps)
    assert len(unet_passes[-1]) == ref_calls == (a1111_calls or ref_calls), (sampler, len(unet_passes[-1]), ref_calls)
    for ours, theirs in zip(got, want):
        assert np.abs(ours - theirs).max() <= 2, sampler
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images: the comparison can fail


def test_restart_without_its_restart_noise_is_another_image(session, tmp_path, tiny_path, unet_passes, monkeypatch):
    """The restart noise counts: the same job with it drawn as zeros differs (so the test above checks it)."""
    import torch

    from lowvram_gen.ksamplers import stepper

    _, with_noise = made(session, tmp_path, tiny_path, sampler="Restart", steps=20)
    monkeypatch.setattr(stepper, "randn_tensor", lambda shape, **kw: torch.zeros(shape, device=kw.get("device"),
                                                                                   dtype=kw.get("dtype")))
    _, without = made(session, tmp_path, tiny_path, sampler="Restart", steps=20)
    assert np.abs(with_noise[0] - without[0]).max() > 2


@pytest.mark.parametrize("sampler, steps, denoise, a1111_calls", [
    ("Restart", 10, 0.5, 11),  # int(10 x 0.5) + 1 = 6 steps of Heun: 11 calls
    ("Restart", 24, 0.9, 43),  # 22 steps with a restart
    ("DPM fast", 10, 0.5, 6)])
def test_img2img_runs_a1111s_pass(session, tmp_path, tiny_path, unet_passes, sampler, steps, denoise, a1111_calls):
    """A1111's img2img pass (int(steps x denoise) + 1 steps from sigmas[steps - t_enc - 1:]): its call count, the
    first call at that level."""
    init = tmp_path / "init.png"
    Image.new("RGB", (64, 64), (90, 140, 200)).save(init)
    made(session, tmp_path, tiny_path, sampler=sampler, steps=steps, init_image=str(init), strength=denoise)
    pipe = pipeline(tiny_path)
    kind = "karras" if sampler == "Restart" else "uniform"
    levels = a1111_sigmas.a1111(kind, steps, pipe.scheduler.alphas_cumprod.double().numpy())
    start = levels[steps - int(steps * denoise) - 1]
    t = float(a1111_sigmas.Discrete(pipe.scheduler.alphas_cumprod.double().numpy()).sigma_to_t(start))
    assert len(unet_passes[-1]) == a1111_calls
    assert unet_passes[-1][0] == pytest.approx(t, abs=1e-3)


def test_the_nv_source_draws_the_restart_noise():
    """`--rng nv`: rng_source replaces randn_tensor where the ksamplers draw their step noise."""
    from lowvram_gen.engines.sd import rng_source
    from lowvram_gen.ksamplers import stepper
    from lowvram_gen.ksamplers.restart import RestartScheduler

    with rng_source.drawing("nv", RestartScheduler()):
        assert stepper.randn_tensor is rng_source.randn_tensor
    assert stepper.randn_tensor is not rng_source.randn_tensor


@pytest.mark.parametrize("name", ["Restart", "DPM fast", "DPM adaptive"])
def test_a_png_naming_them_reruns_with_no_note(session, tmp_path, tiny_path, name):
    from lowvram_gen.a1111.infotext import from_png
    from lowvram_gen.samplers import SAMPLERS
    from lowvram_gen.api.listings import samplers

    png = tmp_path / "a1111.png"
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", f"a lighthouse\nSteps: 3, Sampler: {name}, Schedule type: Automatic, CFG scale: 7, "
                                "Seed: 5, Size: 64x64")
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    read = from_png(png)
    assert read.fields["sampler"] == name and not read.notes and not read.unusable, (read.notes, read.unusable)
    result, _ = made(session, tmp_path, tiny_path, sampler=name, steps=3)
    assert f"Sampler: {name}," in Image.open(result.images[0]).text["parameters"]
    assert name in SAMPLERS and name in [entry["name"] for entry in samplers()]


# ------------------------------------------------------------------------------------ the scheduler tables


SD15 = {"_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
        "num_train_timesteps": 1000, "skip_prk_steps": True, "set_alpha_to_one": False, "steps_offset": 1}


@pytest.mark.parametrize("name", ["Restart", "DPM fast", "DPM adaptive"])
def test_they_take_the_schedule_types_and_are_named_as_a1111_names_them(name):
    from diffusers import FlowMatchEulerDiscreteScheduler, PNDMScheduler

    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.samplers import a1111_name, build_scheduler, infotext_schedule, timestep_only
    from lowvram_gen.schedules import SCHEDULE_TYPES, handed

    base = PNDMScheduler.from_config(SD15)
    for schedule in SCHEDULE_TYPES:
        if name == "Restart" and schedule == "kl-optimal":  # its last level is not 0: refused, as for Heun
            with pytest.raises(InvalidRequest, match="KL Optimal"):
                build_scheduler(name, schedule, base)
            continue
        scheduler, warning = build_scheduler(name, schedule, base)
        assert warning is None and a1111_name(scheduler) == name
        scheduler.set_timesteps(6)
        assert scheduler.init_noise_sigma > 14
    restart = build_scheduler("Restart", "automatic", base)[0]
    assert handed(restart) == "karras" and infotext_schedule(restart, "Restart", "automatic", True) == "Karras"
    assert name not in timestep_only()  # the UI does not say they take Automatic only
    with pytest.raises(InvalidRequest, match="noise-prediction models"):
        build_scheduler(name, "automatic", FlowMatchEulerDiscreteScheduler())
