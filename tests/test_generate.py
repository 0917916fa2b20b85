"""End-to-end txt2img on the embedded tiny models, through the CLI and the Python API."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.errors import Cancelled
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.schedules import handed
from lowvram_gen.session import Session

from folder_sampler import own_sampler  # tests/folder_sampler.py


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.mark.parametrize("model", ["tiny", "tiny-sdxl"])
def test_cli_generate_json(model, tmp_path, capsys):
    code = main(["generate", "a lighthouse at dusk", "--model", model, "--width", "128", "--height", "96",
                 "--steps", "3", "--seed", "7", "--batch", "2", "--outdir", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert code == 0
    result = json.loads(captured.out)  # stdout is exactly one JSON object
    assert result["seeds"] == [7, 8]
    assert (result["width"], result["height"], result["steps"]) == (128, 96, 3)
    assert result["model"] == model and result["model_path"].endswith(f"{model}-v1")
    assert result["preset"] == "cpu" and result["attempts"][-1]["outcome"] == "ok"
    assert "noise" in captured.err  # the CLI says plainly that the tiny model makes noise
    assert len(result["images"]) == 2
    for path, seed in zip(result["images"], result["seeds"]):
        assert Image.open(path).size == (128, 96)
        assert f"-{seed}-a-lighthouse-at-dusk.png" in path


def test_same_seed_twice_gives_identical_pixels_and_two_files(tmp_path):
    session = Session()
    req = GenerationRequest(prompt="a red fox", width=64, height=64, steps=2, seed=1234, outdir=str(tmp_path))
    first = session.generate(req)
    second = session.generate(req)
    assert first.images != second.images
    assert len(list(tmp_path.glob("*.png"))) == 2
    assert np.array_equal(pixels(first.images[0]), pixels(second.images[0]))
    third = session.generate(GenerationRequest(prompt="a red fox", width=64, height=64, steps=2, seed=1235,
                                               outdir=str(tmp_path)))
    assert not np.array_equal(pixels(first.images[0]), pixels(third.images[0]))


def test_batch_seed_i_equals_single_image_with_that_seed(tmp_path):
    """Batch seeds are seed+i, and image i does not depend on how the batch is split."""
    session = Session()
    batch = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=10, batch_size=3,
                                               outdir=str(tmp_path)))
    single = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=12,
                                                outdir=str(tmp_path)))
    assert batch.seeds == [10, 11, 12]
    diff = np.abs(pixels(batch.images[2]).astype(int) - pixels(single.images[0]).astype(int)).max()
    assert diff <= 1  # batched convolutions may round differently by one level


@pytest.mark.parametrize("model,fixture", [("tiny", "tiny_path"), ("tiny-sdxl", "tiny_sdxl_path")])
def test_the_folders_own_sampler_by_name_equals_plain_diffusers(model, fixture, tmp_path, request):
    import torch
    from diffusers import AutoPipelineForText2Image

    folder = request.getfixturevalue(fixture)
    ours = Session().generate(GenerationRequest(prompt="a castle", negative_prompt="fog", width=128, height=128,
                                                steps=3, cfg_scale=6.5, seed=99, model=model, outdir=str(tmp_path),
                                                sampler=own_sampler(model)))  # what plain diffusers runs
    pipe = AutoPipelineForText2Image.from_pretrained(str(folder))
    plain = pipe("a castle", negative_prompt="fog", width=128, height=128, num_inference_steps=3, guidance_scale=6.5,
                 generator=torch.Generator().manual_seed(99)).images[0]
    assert np.array_equal(pixels(ours.images[0]), np.asarray(plain.convert("RGB")))


@pytest.mark.parametrize("model,fixture", [("tiny", "tiny_path"), ("tiny-sdxl", "tiny_sdxl_path")])
def test_the_default_sampler_of_sd_models_is_a1111s_dpm_2m_with_its_automatic_schedule(model, fixture, tmp_path,
                                                                                        request):
    """Issue 29 item 13: A1111's default sampler is DPM++ 2M with the Automatic schedule type, which for DPM++ 2M
    is Karras (A1111 1.9+ writes `Schedule type: Karras`); "default" was the folder's scheduler (PLMS for SD 1.x).
    The PNG and the result say what ran, never "default"."""
    import torch
    from diffusers import AutoPipelineForText2Image, DPMSolverMultistepScheduler

    folder = request.getfixturevalue(fixture)
    session = Session()
    ours = session.generate(GenerationRequest(prompt="a castle", negative_prompt="fog", width=64, height=64, steps=3,
                                              cfg_scale=6.5, seed=99, model=model, outdir=str(tmp_path)))
    ran = session.model.pipe.scheduler
    assert type(ran) is DPMSolverMultistepScheduler and handed(ran) == "karras"
    assert ran.config.algorithm_type == "dpmsolver++" and ran.config.solver_order == 2
    # issue 31: A1111's Karras levels, which diffusers' own Karras flag gives too; the UNet is given the continuous
    # timestep (diffusers rounds it) and the first noise is sigma_max's, so the image is A1111's, not diffusers'
    pipe = AutoPipelineForText2Image.from_pretrained(str(folder))
    plain = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True)
    plain.set_timesteps(3)
    assert np.allclose(ran.sigmas.numpy(), plain.sigmas.numpy(), rtol=1e-5)
    assert not np.array_equal(ran.timesteps.numpy(), plain.timesteps.numpy())
    params = parse_a1111_parameters(read_png_metadata(ours.images[0])[0])
    assert (params["Sampler"], params["Schedule type"]) == ("DPM++ 2M", "Karras")
    assert ours.sampler == "DPM++ 2M"  # the result (generate --json) too
    # an explicit schedule type goes with the default sampler, as A1111's Schedule type box does
    other = session.generate(GenerationRequest(prompt="a castle", width=64, height=64, steps=3, seed=99, model=model,
                                               schedule_type="exponential", outdir=str(tmp_path)))
    assert handed(session.model.pipe.scheduler) == "exponential"
    assert parse_a1111_parameters(read_png_metadata(other.images[0])[0])["Schedule type"] == "Exponential"


def test_metadata_round_trip(tmp_path):
    result = Session().generate(GenerationRequest(prompt="a lighthouse, at dusk: 'golden'", negative_prompt="blur",
                                                  width=64, height=64, steps=2, seed=5, sampler="Euler a",
                                                  outdir=str(tmp_path)))
    text, meta = read_png_metadata(result.images[0])
    params = parse_a1111_parameters(text)
    assert params["prompt"] == "a lighthouse, at dusk: 'golden'"
    assert params["negative_prompt"] == "blur"
    assert (params["Steps"], params["Sampler"], params["Seed"], params["Size"], params["Model"]) == (
        "2", "Euler a", "5", "64x64", "tiny")
    assert params["CFG scale"] == "7"
    assert meta["seed"] == 5 and meta["preset"] == "cpu"
    assert meta["request"]["sampler"] == "Euler a"
    assert meta["attempts"][0]["stage"] == "denoise"


def test_samplers_change_the_image(tmp_path):
    session = Session()
    base = dict(prompt="x", width=64, height=64, steps=3, seed=3, outdir=str(tmp_path))
    default = session.generate(GenerationRequest(**base))
    euler_a = session.generate(GenerationRequest(**base, sampler="Euler a"))
    again = session.generate(GenerationRequest(**base))  # 'default' restores the folder's own scheduler
    assert not np.array_equal(pixels(default.images[0]), pixels(euler_a.images[0]))
    assert np.array_equal(pixels(default.images[0]), pixels(again.images[0]))


def test_every_a1111_sampler_runs(tmp_path):
    from lowvram_gen.samplers import SAMPLERS

    session = Session()
    seen = {}
    for name in SAMPLERS:
        result = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=3, sampler=name,
                                                    outdir=str(tmp_path)))
        image = pixels(result.images[0])
        assert image.std() > 0, name  # not a flat (NaN-cleared or black) image
        assert f"Sampler: {name}," in read_png_metadata(result.images[0])[0]
        seen[name] = image
    assert not np.array_equal(seen["Euler a"], seen["DDIM"])


@pytest.mark.parametrize("name", ["DPM++ SDE", "DPM++ 2M SDE Heun", "DPM++ 3M SDE", "DDPM"])
def test_the_samplers_issue_19_found_missing_run(tmp_path, name):
    """Issue 19: these A1111 samplers were refused; diffusers has them. Each makes a finite image, and its PNG names it
    as A1111 does and reads back to it."""
    from lowvram_gen.a1111.infotext import from_png

    result = Session().generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=3, sampler=name,
                                                  outdir=str(tmp_path)))
    image = pixels(result.images[0])
    assert image.std() > 0, name  # not a flat (NaN-cleared or black) image
    assert parse_a1111_parameters(read_png_metadata(result.images[0])[0])["Sampler"] == name
    assert from_png(result.images[0]).fields["sampler"] == name


def test_dpm_sde_noise_follows_the_seed(tmp_path):
    """DPM++ SDE's Brownian-tree noise is seeded by each image's seed (diffusers seeds it at random when not told):
    the same seed gives the same image, and image i of a batch is the image of its seed alone."""
    session = Session()
    request = dict(prompt="x", width=64, height=64, steps=3, sampler="DPM++ SDE", outdir=str(tmp_path))
    batch = session.generate(GenerationRequest(**request, seed=10, batch_size=2))
    again = session.generate(GenerationRequest(**request, seed=11))
    other = session.generate(GenerationRequest(**request, seed=12))
    diff = np.abs(pixels(batch.images[1]).astype(int) - pixels(again.images[0]).astype(int)).max()
    assert diff <= 1  # batched convolutions may round differently by one level
    assert not np.array_equal(pixels(again.images[0]), pixels(other.images[0]))


def test_every_schedule_type_runs_on_a_sigma_sampler_and_a_timestep_sampler_refuses_one(tmp_path, capsys):
    """Issue 31 (was issue 19's warning): every schedule type runs on the samplers that step through noise levels,
    Euler a with Karras and Euler with Polyexponential too (A1111's levels), with no warning, and the PNG says it;
    DDIM, which steps through timesteps of its own, refuses one in one line (exit 2)."""
    def run(*flags, code=0):
        got = main(["generate", "x", "--width", "64", "--height", "64", "--steps", "3", "--seed", "3",
                    "--outdir", str(tmp_path), "--json", *flags])
        captured = capsys.readouterr()
        assert got == code, captured.err
        return (json.loads(captured.out) if code == 0 else None), captured.err

    out, err = run("--sampler", "Euler a", "--schedule-type", "karras")
    assert not any("schedule" in w for w in out["warnings"])
    assert not any("schedule" in line for line in err.splitlines() if line.startswith("warning"))
    assert "Sampler: Euler a, Schedule type: Karras," in read_png_metadata(out["images"][0])[0]
    plain, _ = run("--sampler", "Euler a")
    assert not np.array_equal(pixels(out["images"][0]), pixels(plain["images"][0]))
    out, _ = run("--sampler", "Euler", "--schedule-type", "polyexponential")
    assert not any("schedule" in w for w in out["warnings"])
    assert "Sampler: Euler, Schedule type: Polyexponential," in read_png_metadata(out["images"][0])[0]
    _, err = run("--sampler", "DDIM", "--schedule-type", "karras", code=2)
    assert "sampler 'DDIM' steps through timesteps of its own" in err and len(err.strip().splitlines()) == 1


def test_progress_per_step_and_cancel_keeps_finished_images_and_the_interrupted_one(tmp_path):
    """A1111's Interrupt: the pass running when the cancel comes stops at that step and is decoded and saved as it
    is (A1111 keeps the interrupted image), beside the images finished before it; then the job ends Cancelled."""
    session = Session()
    cancel = threading.Event()
    seen = []

    def on_step(step, total):
        seen.append((step, total))
        if len(seen) == 5:  # first step of the second image (PLMS's warm-up step is not counted)
            cancel.set()

    # preset cpu has max_batch 4; a custom batch of 1 per pass makes two chunks
    req = GenerationRequest(prompt="x", width=64, height=64, steps=4, seed=1, batch_size=2, outdir=str(tmp_path),
                            sampler="PLMS")  # its warm-up step is what this counts around
    session.presets_dir = None
    from lowvram_gen import presets as presets_mod

    one_per_pass = presets_mod.find_preset("cpu")
    monkey = pytest.MonkeyPatch()
    monkey.setattr(Session, "forced_preset", lambda self, spec=None, quantize=None: presets_mod.Preset(
        **{**one_per_pass.__dict__, "max_batch": 1}))
    try:
        with pytest.raises(Cancelled) as err:
            session.generate(req, on_step=on_step, cancel=cancel)
    finally:
        monkey.undo()
    assert len(err.value.images) == 2 and "cancelled at step 1 of 4; 2 image(s) kept" in str(err.value)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(i.split("/")[-1] for i in err.value.images)
    interrupted = parse_a1111_parameters(read_png_metadata(err.value.images[1])[0])
    assert interrupted["Seed"] == "2" and interrupted["Steps"] == "4"  # its normal infotext: it reruns to the full image
    # the steps the user asked for, not PLMS's 4 + 1 (a rough edge: it showed 5 of 5); stopped at once
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4), (1, 4)]
    # the session is healthy: the next job runs normally
    assert len(session.generate(GenerationRequest(prompt="y", width=64, height=64, steps=2, outdir=str(tmp_path))).images) == 1


def test_a_long_prompt_is_encoded_whole_in_75_token_chunks_not_truncated(tmp_path):
    """A1111 encodes a prompt past 77 tokens in 75-token chunks; so do we for SD/SDXL: no truncation
    warning, and a change past the 77th token changes the image (docs/FAULTS.md 11)."""
    base = "lighthouse " * 30  # the tiny tokenizer: about a token per character, ~330 tokens
    request = dict(width=64, height=64, steps=2, seed=3, outdir=str(tmp_path))
    first = Session().generate(GenerationRequest(prompt=base + "at dusk", **request))
    second = Session().generate(GenerationRequest(prompt=base + "at noon", **request))
    assert not any("ignored" in w for w in first.warnings)
    assert not np.array_equal(np.asarray(Image.open(first.images[0])), np.asarray(Image.open(second.images[0])))


def test_a1111_weights_change_the_image_and_prompt_editing_is_not_warned(tmp_path):
    request = dict(width=64, height=64, steps=2, seed=3, outdir=str(tmp_path))
    plain = Session().generate(GenerationRequest(prompt="a red fox", **request))
    weighted = Session().generate(GenerationRequest(prompt="a (red:1.6) fox", **request))
    unit = Session().generate(GenerationRequest(prompt="a (red:1) fox", **request))
    pixels = [np.asarray(Image.open(r.images[0]), dtype=int) for r in (plain, weighted, unit)]
    assert not np.array_equal(pixels[0], pixels[1]) and np.array_equal(pixels[0], pixels[2])
    params, _ = read_png_metadata(weighted.images[0])
    assert params.startswith("a (red:1.6) fox")  # the PNG keeps the prompt as typed
    # prompt editing is implemented since issue 32 (tests/test_prompt_editing.py): no warning any more
    edited = Session().generate(GenerationRequest(prompt="a [cat:dog:5] fox", **request))
    assert not any("prompt editing" in w.lower() or "[cat:dog:5]" in w for w in edited.warnings)


def test_a_malformed_weight_is_a_clear_error_before_any_model_work(capsys):
    code = main(["generate", "a (red:1.2.3) fox", "--steps", "1"])
    assert code == 2 and "invalid prompt" in capsys.readouterr().err


def test_the_folders_scheduler_is_written_with_its_a1111_name(tmp_path):
    """The tiny model ships SD 1.5's PNDMScheduler with skip_prk_steps: that is A1111's PLMS, and the PNG
    says so (it used to say `Sampler: PNDMScheduler`, which A1111 and Civitai do not know). (Asked for by name:
    "default" is DPM++ 2M for SD models since issue 29.)"""
    from lowvram_gen.samplers import a1111_name, make_scheduler

    result = Session().generate(GenerationRequest(prompt="x", width=64, height=64, steps=1, sampler="PLMS",
                                                  outdir=str(tmp_path)))
    params, _ = read_png_metadata(result.images[0])
    assert parse_a1111_parameters(params)["Sampler"] == "PLMS"
    config = {"num_train_timesteps": 1000}
    for name in ("DPM++ 2M SDE", "DPM++ 2M", "Euler a", "LMS", "UniPC", "DPM++ 2M SDE Heun", "DPM++ 3M SDE", "DDPM",
                 "DPM++ SDE"):
        assert a1111_name(make_scheduler(name, config)) == name
        if name not in ("DDPM", "UniPC"):  # timestep samplers: they refuse a schedule type (test_schedules_a1111.py)
            assert a1111_name(make_scheduler(name, config, "karras")) == name  # the schedule type is not the sampler
    from diffusers import PNDMScheduler

    assert a1111_name(PNDMScheduler(skip_prk_steps=False)) == "PNDMScheduler"  # with Runge-Kutta steps: not PLMS
