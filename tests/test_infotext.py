"""A PNG's parameters back into a request (a1111/infotext.py), and `generate --from-png`: the same image again."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from a1111_png import rerun_with_no_unused_note  # tests/a1111_png.py
from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.a1111.infotext import from_png, request_fields
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

ROUND_TRIP = ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale", "seed", "sampler", "schedule_type",
              "model")


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.fixture(scope="module")
def session():
    return Session()


@pytest.mark.parametrize("extra", [
    {},  # the default sampler (DPM++ 2M, written with the Karras it ran) comes back as "default" and Automatic
    {"sampler": "Euler a", "cfg_scale": 5.5, "negative_prompt": "blurry, (ugly:1.3)"},
    {"sampler": "DPM++ 2M Karras", "hires_scale": 1.5, "hires_steps": 1, "hires_denoise": 0.4,
     "hires_upscaler": "lanczos"},
    {"sampler": "DPM++ 2M"},  # Automatic: written "Schedule type: Karras" as A1111 does, read back as Automatic
    {"sampler": "DPM++ SDE", "schedule_type": "exponential"},
    {"clip_skip": 2, "sampler": "Euler"},
])
def test_request_to_png_to_request_gives_the_same_fields(session, tmp_path, extra):
    request = GenerationRequest(prompt="a lighthouse, at dusk: <b>", width=64, height=72, steps=2, seed=4321,
                                outdir=str(tmp_path), **extra).validated()
    image = session.generate(request).images[0]
    fields = {"schedule_type": "automatic", **from_png(image).fields}  # no Schedule type in the text: Automatic
    ran = session.with_sampling_defaults(request)  # the CFG scale left out: the family's (SD: 7), as the PNG says
    for name in ROUND_TRIP + tuple(k for k in extra):
        assert fields[name] == getattr(ran, name), name
    assert "strength" not in fields  # a hires image's "Denoising strength" is the hires pass's, not img2img's


def test_img2img_png_gives_its_strength(session, tmp_path):
    init = tmp_path / "init.png"
    Image.new("RGB", (64, 64), (10, 200, 30)).save(init)
    image = session.generate(GenerationRequest(prompt="x", init_image=str(init), strength=0.35, width=64, height=64,
                                               steps=2, seed=3, outdir=str(tmp_path))).images[0]
    fields = from_png(image).fields
    assert fields["strength"] == 0.35 and "hires_denoise" not in fields


def test_a1111s_own_text():
    text = ("masterpiece, <lora:film:0.6>\nNegative prompt: lowres\nSteps: 28, Sampler: DPM++ 2M, "
            "Schedule type: Karras, CFG scale: 6.5, Seed: 99, Size: 512x768, Model hash: 6ce0161689, "
            "Model: v1-5-pruned-emaonly, Clip skip: 2, Batch size: 4, Batch pos: 1, Denoising strength: 0.45, "
            "Hires upscale: 2, Hires upscaler: Latent (bicubic), Version: v1.10.1")
    read = request_fields(parse_a1111_parameters(text))
    assert read.fields == {"prompt": "masterpiece, <lora:film:0.6>", "negative_prompt": "lowres", "steps": 28,
                           "sampler": "DPM++ 2M", "schedule_type": "karras", "cfg_scale": 6.5, "seed": 99,
                           "width": 512, "height": 768, "model": "v1-5-pruned-emaonly", "clip_skip": 2,
                           "batch_size": 4, "hires_denoise": 0.45,
                           "hires_scale": 2.0, "hires_upscaler": "Latent (bicubic)"}
    assert read.ignored == [] and read.notes == []  # A1111's latent upscalers run as A1111 runs them
    # a scheduler class name (no A1111 name matched it) is the model's own scheduler
    assert request_fields({"Sampler": "FlowMatchEulerDiscreteScheduler"}).fields["sampler"] == "default"
    # Quantize as the request and the UI's Quantize box spell it
    assert request_fields({"Quantize": " INT4 "}).fields["quantize"] == "int4"


@pytest.mark.parametrize("key, value, said", [("Steps", "many", "whole number"), ("Size", "512 by 512", "WIDTHxHEIGHT"),
                                              ("Clip skip", "two", "whole number"),
                                              ("CFG scale", "x", "a number"), ("Sampler", "Magic", "use 'default'"),
                                              ("Quantize", "int3", "use one of none, int8, int4")])
def test_a_value_we_cannot_read_is_a_clear_error(key, value, said):
    with pytest.raises(InvalidRequest) as err:
        request_fields({"prompt": "x", key: value})
    assert key in str(err.value) and value in str(err.value) and said in str(err.value)


def test_from_png_reruns_the_same_image_and_flags_override(session, tmp_path, capsys):
    original = session.generate(GenerationRequest(prompt="a red fox",
                                                  negative_prompt="fog", width=64, height=64, steps=2, seed=777,
                                                  sampler="Euler", outdir=str(tmp_path / "a"))).images[0]
    code = main(["generate", "--from-png", original, "--outdir", str(tmp_path / "b"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["seeds"] == [777] and out["sampler"] == "Euler"
    assert np.array_equal(pixels(out["images"][0]), pixels(original))
    # flags given win, even one equal to the usual default (--seed -1: a new random seed)
    code = main(["generate", "a blue fox", "--from-png", original, "--seed", "-1", "--steps", "3",
                 "--outdir", str(tmp_path / "c"), "--json"])
    out = json.loads(capsys.readouterr().out)
    params = parse_a1111_parameters(Image.open(out["images"][0]).text["parameters"])
    assert code == 0 and params["prompt"] == "a blue fox" and params["Steps"] == "3"
    assert params["negative_prompt"] == "fog" and params["Sampler"] == "Euler"
    assert out["seeds"] != [777]  # random: 777 again has a chance of 1 in 2**32


def test_from_png_of_a_file_without_parameters_or_not_a_png_exits_2(tmp_path, capsys):
    plain = tmp_path / "plain.png"
    Image.new("RGB", (8, 8)).save(plain)
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    for bad, said in ((plain, "no generation parameters"), (text, "not a readable image"),
                      (tmp_path / "missing.png", "no such file")):
        code = main(["generate", "--from-png", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and str(bad) in err and said in err


def test_without_a_prompt_or_from_png_is_exit_2(capsys):
    assert main(["generate", "--steps", "1"]) == 2
    assert "--from-png" in capsys.readouterr().err


def test_a_pngs_model_that_is_not_here_falls_back_with_a_warning(session, tmp_path, capsys):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", "x\nSteps: 1, Sampler: Euler, CFG scale: 7, Seed: 5, Size: 64x64, "
                                "Model: no-such-checkpoint")
    png = tmp_path / "a1111.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    code = main(["generate", "--from-png", str(png), "--outdir", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["model"] == "tiny"
    assert "'no-such-checkpoint' is not here" in captured.err


@pytest.mark.parametrize("command", [["generate"], ["img2img", "--init", "{png}", "--strength", "0.5"]])
def test_from_png_notes_are_in_the_json_warnings_too(tmp_path, capsys, command):
    """Issue 18: the fields of an A1111 PNG that are not used were said on stderr only; a script reading --json
    never saw them."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", "a fox\nSteps: 1, Sampler: Euler, CFG scale: 7, Seed: 5, Size: 64x64, "
                                "Model hash: 6ce0161689, Model: no-such-checkpoint, Clip skip: 2, Eta: 0.67")
    png = tmp_path / "a1111.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    argv = [a.replace("{png}", str(png)) for a in command]
    code = main([*argv, "--from-png", str(png), "--outdir", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    warnings = json.loads(captured.out)["warnings"]
    not_used = f"not used from {png}: Eta"  # Clip skip (issue 19) and ENSD (issue 31) are used: the rerun has them
    assert warnings[0] == not_used and f"note: {not_used}" in captured.err
    assert any(w.startswith("the PNG's model 'no-such-checkpoint' is not here") for w in warnings)
    assert captured.err.count(not_used) == 1  # said once on stderr, before the job; not again at the end
    made = json.loads(captured.out)["images"][0]
    assert parse_a1111_parameters(Image.open(made).text["parameters"])["Clip skip"] == "2"


def test_clip_skip_is_written_as_a1111_writes_it_only_above_1():
    """A1111's order (after Denoising strength, before the hires fields) and only when it is on; our text reads back."""
    from lowvram_gen.a1111.infotext import a1111_fields

    def fields(**kw):
        request = GenerationRequest(prompt="x", seed=1, **kw).validated()
        return a1111_fields(request, "Euler", 1, "cpu", request.output_size())

    assert "Clip skip" not in fields() and "Clip skip" not in fields(clip_skip=1)
    hires = list(fields(clip_skip=2, hires_scale=2))
    assert hires.index("Denoising strength") < hires.index("Clip skip") < hires.index("Hires upscale")
    request = GenerationRequest(prompt="x", seed=1, clip_skip=3).validated()
    assert a1111_fields(request, "Euler", 1, "cpu", (512, 512), clip_skip=1).get("Clip skip") is None  # not used
    text = "x\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 512x512, Model: tiny, Clip skip: 2"
    assert request_fields(parse_a1111_parameters(text)).fields["clip_skip"] == 2


def test_clip_skip_changes_the_image_and_from_png_reruns_it(session, tmp_path, capsys):
    """An A1111 PNG with `Clip skip: 2` reruns with clip skip 2 and no note that it was not used; the rerun's PNG
    says it again, and a flag overrides it."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", "a red fox\nNegative prompt: fog\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 77, "
                                "Size: 64x64, Model: tiny, Clip skip: 2")
    png = tmp_path / "a1111.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    assert main(["generate", "--from-png", str(png), "--outdir", str(tmp_path / "a"), "--json"]) == 0
    captured = capsys.readouterr()
    rerun = json.loads(captured.out)
    assert "not used" not in captured.err and not any("not used" in w for w in rerun["warnings"])
    params = parse_a1111_parameters(Image.open(rerun["images"][0]).text["parameters"])
    assert params["Clip skip"] == "2" and request_fields(params).fields["clip_skip"] == 2
    same = session.generate(GenerationRequest(prompt="a red fox", negative_prompt="fog", width=64, height=64, steps=2,
                                              seed=77, sampler="Euler", clip_skip=2, outdir=str(tmp_path / "b")))
    off = session.generate(GenerationRequest(prompt="a red fox", negative_prompt="fog", width=64, height=64, steps=2,
                                             seed=77, sampler="Euler", outdir=str(tmp_path / "c")))
    assert np.array_equal(pixels(rerun["images"][0]), pixels(same.images[0]))
    assert not np.array_equal(pixels(same.images[0]), pixels(off.images[0]))
    assert "Clip skip" not in parse_a1111_parameters(Image.open(off.images[0]).text["parameters"])
    assert main(["generate", "--from-png", str(png), "--clip-skip", "1", "--outdir", str(tmp_path / "d"),
                 "--json"]) == 0
    flagged = json.loads(capsys.readouterr().out)["images"][0]
    assert np.array_equal(pixels(flagged), pixels(off.images[0]))


# A1111 1.9+'s reading of `Sampler` and `Schedule type` (its sd_samplers.get_sampler_and_scheduler): a schedule
# label after the sampler name is the schedule type; none is Automatic, which is the sampler's own default
# (sd_samplers_kdiffusion.py's `scheduler` option; Uniform for the others)
A1111_LABELS = ("Automatic", "Uniform", "Karras", "Exponential", "Polyexponential", "SGM Uniform", "KL Optimal",
                "Align Your Steps", "Simple", "Normal", "DDIM", "Beta")
A1111_DEFAULTS = {"DPM++ 2M": "Karras", "DPM++ SDE": "Karras", "DPM++ 2M SDE": "Exponential",
                  "DPM++ 2M SDE Heun": "Exponential", "DPM++ 2S a": "Karras", "DPM++ 3M SDE": "Exponential",
                  "DPM2": "Karras", "DPM2 a": "Karras", "Restart": "Karras"}


def a1111_reads(params: dict) -> tuple[str, str]:
    """(sampler, the schedule that runs) as A1111 1.9+ reads a `parameters` text's fields."""
    name, schedule = params["Sampler"], params.get("Schedule type", "Automatic")
    for label in A1111_LABELS:
        if name.endswith(" " + label):
            name, schedule = name[: -len(label) - 1], label
    if schedule == "Automatic":
        schedule = A1111_DEFAULTS.get(name, "Uniform")
    return name, schedule


@pytest.mark.parametrize("text, sampler, schedule", [
    ("Sampler: DPM++ SDE, Schedule type: Karras", "DPM++ SDE", "karras"),  # A1111 1.9+
    ("Sampler: DPM++ SDE Karras", "DPM++ SDE", "karras"),  # A1111 1.6: the old combined name
    ("Sampler: DPM++ 2M Karras", "DPM++ 2M", "karras"),
    ("Sampler: Euler, Schedule type: Exponential", "Euler", "exponential"),
    ("Sampler: Euler a, Schedule type: SGM Uniform", "Euler a", "sgm-uniform"),
    ("Sampler: DPM++ 3M SDE, Schedule type: Automatic", "DPM++ 3M SDE", "exponential"),  # A1111's Automatic
    ("Sampler: Euler, Schedule type: Automatic", "Euler", "automatic"),
    ("Sampler: DPM++ SDE Karras, Schedule type: Exponential", "DPM++ SDE", "karras"),  # the name's wins, as in A1111
    ("Sampler: DPM++ 2M, Schedule type: Align Your Steps", "DPM++ 2M", "align-your-steps"),  # runs with a warning
    ("Sampler: DDPM, Schedule type: beta", "DDPM", "beta"),
])
def test_a1111_schedule_types_are_read_not_dropped(text, sampler, schedule):
    """Issue 19: `Schedule type: Exponential` (and every type but Karras) was dropped without a word."""
    read = request_fields(parse_a1111_parameters(f"x\nSteps: 20, {text}, CFG scale: 7, Seed: 1"))
    assert (read.fields["sampler"], read.fields.get("schedule_type", "automatic")) == (sampler, schedule)
    assert read.ignored == [] and read.notes == []
    assert request_fields({"Schedule type": "Karras"}).fields == {"prompt": "", "negative_prompt": "",
                                                                  "schedule_type": "karras"}
    with pytest.raises(InvalidRequest) as err:
        request_fields({"Sampler": "Euler", "Schedule type": "Wobbly"})
    assert "'Schedule type' in the image's parameters: 'Wobbly'" in str(err.value)


@pytest.mark.parametrize("sampler, schedule, a1111, back", [
    ("DPM++ SDE", "karras", ("DPM++ SDE", "Karras"), "karras"),
    # issue 31: A1111's Automatic (Karras for DPM++ 2M) runs, and is written as A1111 writes it
    ("DPM++ 2M", "automatic", ("DPM++ 2M", "Karras"), "automatic"),
    ("Euler", "sgm-uniform", ("Euler", "SGM Uniform"), "sgm-uniform"),
    ("Euler a", "automatic", ("Euler a", "Uniform"), "automatic"),
    ("Euler a", "karras", ("Euler a", "Karras"), "karras"),  # A1111's Karras levels run on Euler a too
    ("DPM++ 3M SDE", "beta", ("DPM++ 3M SDE", "Beta"), "beta"),
])
def test_a1111_reads_our_png_as_what_ran(session, tmp_path, sampler, schedule, a1111, back):
    """Our PNG says, in A1111 1.9+'s own terms (`Sampler: DPM++ SDE, Schedule type: Karras`), the sampler and the
    schedule that ran; and it reads back to the same request fields."""
    request = GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=5, sampler=sampler,
                                schedule_type=schedule, outdir=str(tmp_path))
    result = session.generate(request)
    params = parse_a1111_parameters(Image.open(result.images[0]).text["parameters"])
    assert a1111_reads(params) == a1111
    assert list(params)[3:5] == ["Sampler", "Schedule type" if "Schedule type" in params else "CFG scale"]
    fields = from_png(result.images[0]).fields
    assert (fields["sampler"], fields.get("schedule_type", "automatic")) == (sampler, back)
    assert (result.sampler, result.schedule_type) == (sampler, schedule)


@pytest.mark.parametrize("text", ["Sampler: DPM++ SDE, Schedule type: Karras", "Sampler: DPM++ 2M Karras",
                                  "Sampler: DPM++ SDE Karras, Schedule type: Exponential",
                                  "Sampler: DPM++ 2S a, Schedule type: Karras"])
def test_from_png_of_an_a1111_schedule_type_uses_it(tmp_path, capsys, text):
    """The issue's "done when": an A1111 PNG's sampler and schedule type rerun with no "not used" note for them, and
    the new PNG says them as A1111 1.9+ does."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", f"a fox\nSteps: 2, {text}, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, "
                                "Version: v1.10.1")
    png = tmp_path / "a1111.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    code = main(["generate", "--from-png", str(png), "--outdir", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert "not used" not in captured.err and not any("not used" in w or "schedule" in w for w in out["warnings"])
    sampler = text.split(",")[0].removeprefix("Sampler: ").removesuffix(" Karras")
    assert (out["sampler"], out["schedule_type"]) == (sampler, "karras")
    written = parse_a1111_parameters(Image.open(out["images"][0]).text["parameters"])
    assert (written["Sampler"], written["Schedule type"]) == (sampler, "Karras")


def test_from_png_flags_override_the_schedule_type_as_a1111s_boxes_do(tmp_path, capsys):
    """A plain --sampler keeps the PNG's schedule type (as A1111's Schedule type box stays when the sampler changes);
    an old combined --sampler name brings its own; --schedule-type sets it."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", "a fox\nSteps: 1, Sampler: DPM++ 2M, Schedule type: Exponential, CFG scale: 7, "
                                "Seed: 5, Size: 64x64, Model: tiny")
    png = tmp_path / "a1111.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    for flags, expected in ((["--sampler", "Euler"], ("Euler", "exponential")),
                            (["--sampler", "DPM++ 2M Karras"], ("DPM++ 2M", "karras")),
                            (["--schedule-type", "beta"], ("DPM++ 2M", "beta"))):
        code = main(["generate", "--from-png", str(png), *flags, "--outdir", str(tmp_path / "out"), "--json"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        out = json.loads(captured.out)
        assert (out["sampler"], out["schedule_type"]) == expected, flags


# Issue 19's done-when: an A1111 1.10 image with every field this round added, as A1111 writes them. The combined
# "DPM++ SDE Karras" wins over "Schedule type: Exponential", as A1111's get_sampler_and_scheduler decides (the
# name's suffix overrides the field).
A1111_ROUND_TWO = (
    "masterpiece, a lighthouse at dusk\nNegative prompt: lowres, blurry\n"
    "Steps: 2, Sampler: DPM++ SDE Karras, Schedule type: Exponential, CFG scale: 6.5, Seed: 1234, Size: 512x512, "
    "Model hash: 6ce0161689, Model: tiny, Variation seed: 5, Variation seed strength: 0.3, Denoising strength: 0.5, "
    "Clip skip: 2, Hires resize: 1024x1024, Hires steps: 1, Hires upscaler: Latent, Version: v1.10.1")


def test_from_png_of_an_a1111_image_with_round_twos_fields_uses_them_all_and_writes_them_back(tmp_path, capsys):
    out = rerun_with_no_unused_note(A1111_ROUND_TWO, (1024, 1024), tmp_path, capsys)
    assert (out["sampler"], out["schedule_type"]) == ("DPM++ SDE", "karras")
    assert Image.open(out["images"][0]).size == (1024, 1024)
    ours = parse_a1111_parameters(read_png_metadata(out["images"][0])[0])
    assert {k: ours.get(k) for k in ("Sampler", "Schedule type", "Clip skip", "Variation seed", "Variation seed strength",
                                     "Hires resize", "Hires upscaler", "Seed", "Size")} == {
        "Sampler": "DPM++ SDE", "Schedule type": "Karras", "Clip skip": "2", "Variation seed": "5",
        "Variation seed strength": "0.3", "Hires resize": "1024x1024", "Hires upscaler": "Latent", "Seed": "1234",
        "Size": "512x512"}
