"""Hires fix as A1111 1.10 has it (issue 19, item 5): `Hires resize: WxH`, the second pass's own sampler, schedule
type, CFG scale and prompts, A1111's upscaler names and its latent upscale modes; all through the one request.

The second passes here run on the embedded tiny model on the CPU; where a test needs to see inside a pass it wraps
`pipeline.denoise` (what the runner calls for every pass) and looks at the pass it gets and the pipeline's scheduler
at that moment. Out-of-memory is simulated by that wrapper raising torch.OutOfMemoryError, as the ladder's tests do.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from a1111_png import rerun_with_no_unused_note  # tests/a1111_png.py
from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.engines.sd import pipeline as sd_pipeline
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.hires import HiresGeometry, geometry
from lowvram_gen.a1111.infotext import from_png, request_fields
from lowvram_gen.outputs import _PARAM, parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session
from lowvram_gen.a1111.upscaler_names import available, check_upscaler


@pytest.fixture(scope="module")
def session():
    return Session()


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def make(session, tmp_path, **kw) -> str:
    fields = dict(prompt="a lighthouse", negative_prompt="fog", width=64, height=64, steps=2, seed=11,
                  sampler="Euler", hires_scale=2, hires_steps=2, hires_denoise=0.6, outdir=str(tmp_path))
    return session.generate(GenerationRequest(**{**fields, **kw})).images[0]


def params_of(path) -> dict:
    return parse_a1111_parameters(read_png_metadata(path)[0])


@pytest.fixture()
def passes(monkeypatch):
    """Every denoise pass of the jobs run while it is active: (the Pass, the pipeline's scheduler class name then,
    the latents it returned or None)."""
    seen = []
    real = sd_pipeline.denoise

    def watch(pipe, step, *args, **kwargs):
        entry = [step, type(pipe.scheduler).__name__, None]
        seen.append(entry)
        out = real(pipe, step, *args, **kwargs)
        entry[2] = out.latents
        return out

    monkeypatch.setattr(sd_pipeline, "denoise", watch)
    return seen


# ----------------------------------------------------------------------------------------------------- sizes


def test_the_geometry_is_a1111s():
    """A1111's calculate_target_resolution: one side keeps the aspect; both cover the box and crop its middle in whole
    latents, the odd one at the bottom/right."""
    assert geometry((512, 512), 2.0, (0, 0)) == HiresGeometry((1024, 1024), (1024, 1024))
    assert geometry((512, 768), 1.0, (1024, 0)).size == (1024, 1536)
    assert geometry((512, 768), 1.0, (0, 1024)).size == (680, 1024)  # 1024*512//768 = 682, down to whole latents
    tall = geometry((512, 768), 1.0, (1024, 1024))
    assert (tall.upscale_to, tall.size, tall.offset) == ((1024, 1536), (1024, 1024), (0, 256))
    wide = geometry((768, 512), 1.0, (1024, 1024))
    assert (wide.upscale_to, wide.size, wide.offset) == ((1536, 1024), (1024, 1024), (256, 0))
    odd = geometry((512, 584), 1.0, (512, 512))  # 9 latent rows too many: 4 off the top, 5 off the bottom
    assert (odd.upscale_to, odd.size, odd.offset) == ((512, 584), (512, 512), (0, 32))
    assert geometry((64, 96), 1.5, (0, 0), multiple=16).size == (96, 144)
    shrunk = tall.scaled(512, 512, 8)  # a preset's cap: the same crop, smaller
    assert (shrunk.upscale_to, shrunk.size, shrunk.offset) == ((512, 768), (512, 512), (0, 128))


@pytest.mark.parametrize("resize, size, written", [((128, 0), (128, 192), "128x0"), ((0, 144), (96, 144), "0x144"),
                                                    ((128, 128), (128, 128), "128x128")])
def test_resize_to_a_size_gives_that_size(session, tmp_path, resize, size, written):
    """`--hires-resize WxH` is hires fix even at scale 1; the PNG says `Hires resize` where A1111 writes it (instead of
    `Hires upscale`)."""
    request = GenerationRequest(prompt="x", width=64, height=96, steps=2, seed=3, hires_resize_w=resize[0],
                                hires_resize_h=resize[1], hires_steps=1, outdir=str(tmp_path)).validated()
    assert request.hires and request.output_size() == size
    result = session.generate(request)
    assert (result.width, result.height) == size and Image.open(result.images[0]).size == size
    params = params_of(result.images[0])
    assert params["Hires resize"] == written and "Hires upscale" not in params and params["Size"] == "64x96"


def test_a_resize_to_another_aspect_keeps_the_middle_of_the_upscaled_latents(session, tmp_path, passes):
    """64x96 to 128x128: the first pass's latents upscaled to 128x192 (16x24 latents), rows 4 to 20 kept."""
    make(session, tmp_path, width=64, height=96, hires_scale=1, hires_resize_w=128, hires_resize_h=128,
         hires_upscaler="Latent (bicubic)")
    (first, _, latents), (second, _, _) = passes
    assert first.init is None and second.init.shape[-2:] == (16, 16)
    upscaled = torch.nn.functional.interpolate(latents, size=(24, 16), mode="bicubic")
    assert torch.equal(second.init, upscaled[:, :, 4:20, :])


def test_the_plan_sees_the_resize(session):
    """The planner estimates the second pass, the larger one: at the resize's size."""
    plan = session.plan(GenerationRequest(prompt="x", width=64, height=96, hires_resize_w=256).validated())
    chosen = next(e for e in plan.estimates if e.name == plan.preset.name)
    assert (chosen.width, chosen.height) == (256, 384)


# --------------------------------------------------------------------------------------- the second pass's own


def test_the_hires_sampler_runs_the_second_pass_and_the_first_pass_scheduler_comes_back(tmp_path, monkeypatch):
    """The hires sampler is the pipeline's scheduler for the second pass only, its retry after a (simulated)
    out-of-memory included; the first pass's is back after the job, and after a second pass that failed."""
    session = Session(preset="highvram")
    real = sd_pipeline.denoise
    seen = []
    failures = {"oom": 1}

    def watch(pipe, step, *args, **kwargs):
        seen.append(("hires" if step.init is not None else "first", type(pipe.scheduler).__name__))
        if step.init is not None and failures["oom"]:
            failures["oom"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        if step.init is not None and failures.get("error"):
            raise RuntimeError("a bug in the second pass (simulated)")
        return real(pipe, step, *args, **kwargs)

    monkeypatch.setattr(sd_pipeline, "denoise", watch)
    result = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, sampler="Euler",
                                                hires_scale=2, hires_steps=2, hires_sampler="DPM++ 2M",
                                                outdir=str(tmp_path)))
    assert seen == [("first", "EulerDiscreteScheduler"), ("hires", "DPMSolverMultistepScheduler"),
                    ("hires", "DPMSolverMultistepScheduler")]
    assert [(a["stage"], a["outcome"]) for a in result.attempts if a["stage"] == "hires"] == [("hires", "oom"),
                                                                                           ("hires", "ok")]
    assert type(session.model.pipe.scheduler).__name__ == "EulerDiscreteScheduler"
    assert params_of(result.images[0])["Hires sampler"] == "DPM++ 2M"
    failures["error"] = True
    with pytest.raises(RuntimeError, match="simulated"):
        session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, sampler="Euler", hires_scale=2,
                                           hires_steps=2, hires_sampler="DPM++ 2M", outdir=str(tmp_path)))
    assert type(session.model.pipe.scheduler).__name__ == "EulerDiscreteScheduler"


def test_a_hires_sampler_equal_to_the_first_pass_changes_nothing_and_another_changes_the_image(session, tmp_path):
    same = make(session, tmp_path)
    assert np.array_equal(pixels(make(session, tmp_path, hires_sampler="Euler")), pixels(same))
    assert np.array_equal(pixels(make(session, tmp_path, hires_schedule_type="automatic")), pixels(same))
    other = make(session, tmp_path, hires_sampler="DPM++ 2M", hires_schedule_type="karras")
    assert not np.array_equal(pixels(other), pixels(same))
    params = params_of(other)
    assert (params["Hires sampler"], params["Hires schedule type"]) == ("DPM++ 2M", "Karras")
    assert "Hires sampler" not in params_of(same) and "Hires schedule type" not in params_of(same)


def test_hires_cfg_and_prompts_change_the_second_pass_only(session, tmp_path, passes):
    """The first pass keeps the prompt and CFG scale; the second runs the hires ones. Equal to the first pass's
    (or left out) they make the same image."""
    base = pixels(make(session, tmp_path))
    passes.clear()
    changed = make(session, tmp_path, hires_cfg=3, hires_prompt="a lighthouse, red", hires_negative="rain")
    (first, _, _), (second, _, _) = passes
    assert (first.guidance, first.texts.prompt, first.texts.negative_prompt) == (7, "a lighthouse", "fog")
    assert (second.guidance, second.texts.prompt, second.texts.negative_prompt) == (3, "a lighthouse, red", "rain")
    assert not np.array_equal(pixels(changed), base)
    for same in (dict(hires_cfg=7), dict(hires_prompt="a lighthouse"), dict(hires_negative="fog")):
        assert np.array_equal(pixels(make(session, tmp_path, **same)), base), same
    for other in (dict(hires_cfg=3), dict(hires_prompt="a lighthouse, red"), dict(hires_negative="rain")):
        assert not np.array_equal(pixels(make(session, tmp_path, **other)), base), other
    params = params_of(changed)
    assert (params["Hires prompt"], params["Hires negative prompt"], params["Hires CFG Scale"]) == (
        "a lighthouse, red", "rain", "3")


def test_a_hires_prompt_with_other_loras_is_refused_and_the_same_ones_are_taken():
    with pytest.raises(InvalidRequest, match=r"its LoRAs \(ink:0.5\) differ from the prompt's \(none\)"):
        GenerationRequest(prompt="a cat", hires_scale=2, hires_prompt="a cat <lora:ink:0.5>").validated()
    with pytest.raises(InvalidRequest, match="A1111 switches LoRAs for the second pass"):
        GenerationRequest(prompt="a cat <lora:ink:1>", hires_scale=2, hires_prompt="a cat, red").validated()
    GenerationRequest(prompt="a cat <lora:ink:1>", hires_scale=2, hires_prompt="a red cat <lora:ink>").validated()
    GenerationRequest(prompt="a cat", loras=("ink:0.5",), hires_scale=2, hires_prompt="a red cat").validated()


def _presets_with(tmp_path, text_encoders: str):
    """The shipped cpu preset with `text_encoders` set, in a presets folder of its own."""
    import shutil

    from lowvram_gen.presets import presets_dir

    folder = tmp_path / f"presets-{text_encoders}"
    folder.mkdir()
    text = (presets_dir() / "cpu.toml").read_text().replace("[memory]", f'[memory]\ntext_encoders = "{text_encoders}"')
    (folder / "cpu.toml").write_text(text)
    shutil.copy(presets_dir() / "highvram.toml", folder / "highvram.toml")
    return folder


def test_the_hires_prompt_and_cfg_with_text_encoders_reloaded_per_job(tmp_path):
    """text_encoders = "reloaded": the hires prompt is encoded with the prompt, before the encoders leave, with the
    hires CFG scale's negative prompt (CFG 1 in the first pass has none): the same image as with them kept."""
    images = {}
    for setting in ("kept", "reloaded"):
        session = Session(device="cpu", preset="cpu", presets_dir=str(_presets_with(tmp_path, setting)))
        images[setting] = pixels(make(session, tmp_path / setting, cfg_scale=1, hires_cfg=5,
                                      hires_prompt="a lighthouse, red", hires_negative="rain"))
    assert np.array_equal(images["kept"], images["reloaded"])


# ------------------------------------------------------------------------------------------ upscalers by name


def test_every_latent_upscaler_runs_as_a1111s_mode(session, tmp_path, passes):
    """A1111's latent_upscale_modes: each variant upscales the latents with its own interpolation; upscaling x1.5,
    the bicubic and nearest ones differ from bilinear `Latent`; antialiasing shows when the resize makes it smaller."""
    up = {}
    for name in ("Latent", "Latent (bicubic)", "Latent (bicubic antialiased)", "Latent (nearest)",
                 "Latent (nearest-exact)", "Latent (antialiased)"):
        passes.clear()
        up[name] = pixels(make(session, tmp_path, hires_scale=1.5, hires_upscaler=name))
        (_, _, latents), (second, _, _) = passes
        mode, antialias = GenerationRequest(hires_upscaler=name).validated().latent_upscale
        expected = torch.nn.functional.interpolate(latents.float(), size=(12, 12), mode=mode, antialias=antialias)
        assert torch.equal(second.init, expected.to(latents.dtype))
    for name in ("Latent (bicubic)", "Latent (bicubic antialiased)", "Latent (nearest)", "Latent (nearest-exact)"):
        assert not np.array_equal(up[name], up["Latent"]), name
    assert not np.array_equal(up["Latent (nearest)"], up["Latent (nearest-exact)"])
    down = {name: pixels(make(session, tmp_path, width=128, height=128, hires_scale=1, hires_resize_w=96,
                              hires_resize_h=96, hires_upscaler=name)) for name in ("Latent", "Latent (antialiased)")}
    assert not np.array_equal(down["Latent"], down["Latent (antialiased)"])


@pytest.mark.parametrize("name", ["None", "Lanczos", "Nearest"])
def test_the_pixel_upscalers_of_a1111_run_in_a_hires_pass(session, tmp_path, name):
    image = make(session, tmp_path, hires_upscaler=name.lower())  # our old lower case: A1111's name in the PNG
    assert Image.open(image).size == (128, 128) and params_of(image)["Hires upscaler"] == name


def test_upscaler_names_are_a1111s_and_the_old_ones_still_work(tmp_path, monkeypatch, capsys):
    assert check_upscaler("latent", latent_ok=True) == "Latent"
    assert check_upscaler("  latent  (BICUBIC antialiased) ", latent_ok=True) == "Latent (bicubic antialiased)"
    assert (check_upscaler("lanczos"), check_upscaler("NEAREST"), check_upscaler("SD-X4")) == ("Lanczos", "Nearest",
                                                                                              "sd-x4")
    for name in ("Latent (nearest)", "none"):
        with pytest.raises(InvalidRequest, match="inside a hires pass"):
            check_upscaler(name)
    models = tmp_path / "models"
    (models / "ESRGAN").mkdir(parents=True)
    (models / "ESRGAN" / "4x-Thing.pth").write_bytes(b"")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    assert check_upscaler("4x-thing") == "4x-Thing.pth"  # A1111 writes a model's name without its extension
    assert available(hires=True)[:9] == ["Latent", "Latent (antialiased)", "Latent (bicubic)",
                                         "Latent (bicubic antialiased)", "Latent (nearest)", "Latent (nearest-exact)",
                                         "None", "Lanczos", "Nearest"]
    assert "Latent" not in available() and "4x-Thing.pth" in available()
    source = tmp_path / "in.png"
    Image.new("RGB", (20, 10)).save(source)
    assert main(["upscale", str(source), "--upscaler", "lanczos", "--outdir", str(tmp_path / "up"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "Lanczos"


# ----------------------------------------------------------------------------------------- the PNG's fields


EVERYTHING = dict(hires_scale=1, hires_resize_w=128, hires_resize_h=0, hires_upscaler="latent (nearest-exact)",
                  hires_sampler="DPM++ 2M", hires_schedule_type="karras", hires_cfg=3.5,
                  hires_prompt='a "red" lighthouse, at night: <b>', hires_negative="rain\nand fog", hires_steps=1)


def test_the_hires_fields_round_trip_and_a1111s_parser_reads_them(session, tmp_path):
    """Written in A1111 1.10's order and spelling (Forge's `Hires CFG Scale`), quoted where A1111 quotes; read back into
    the same request fields by us, and by A1111's parse_generation_parameters (its regex, its unquoting, its WxH
    split into `-1`/`-2`)."""
    request = GenerationRequest(prompt="a lighthouse", width=64, height=72, steps=2, seed=5, sampler="Euler",
                                outdir=str(tmp_path), **EVERYTHING).validated()
    image = session.generate(request).images[0]
    text = read_png_metadata(image)[0]
    line = text.splitlines()[-1]
    order = ["Denoising strength", "Hires sampler", "Hires prompt", "Hires negative prompt", "Hires CFG Scale",
             "Hires schedule type", "Hires resize", "Hires steps", "Hires upscaler"]
    assert [k for k, _ in _PARAM.findall(line) if k in order] == order
    assert 'Hires prompt: "a \\"red\\" lighthouse, at night: <b>", Hires negative prompt: "rain\\nand fog"' in line
    fields = from_png(image).fields
    for name in ("hires_resize_w", "hires_resize_h", "hires_sampler", "hires_schedule_type", "hires_cfg",
                 "hires_prompt", "hires_negative", "hires_steps", "hires_upscaler"):
        assert fields[name] == getattr(request, name), name
    a1111 = {}
    for key, value in _PARAM.findall(line):  # A1111's parse_generation_parameters, as its code does it
        value = json.loads(value) if value[:1] == '"' and value[-1:] == '"' else value
        size = __import__("re").match(r"^(\d+)x(\d+)$", value)
        a1111.update({f"{key}-1": size.group(1), f"{key}-2": size.group(2)} if size else {key: value})
    assert (a1111["Hires resize-1"], a1111["Hires resize-2"], a1111["Hires sampler"], a1111["Hires schedule type"],
            a1111["Hires CFG Scale"], a1111["Hires upscaler"]) == ("128", "0", "DPM++ 2M", "Karras", "3.5",
                                                                   "Latent (nearest-exact)")
    assert (a1111["Hires prompt"], a1111["Hires negative prompt"]) == (request.hires_prompt, request.hires_negative)


A1111_TEXT = ("a fox\nNegative prompt: fog\nSteps: 2, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, Seed: 5, "
              "Size: 64x64, Model hash: 6ce0161689, Model: tiny, Denoising strength: 0.5, Hires sampler: DPM++ 2M, "
              'Hires prompt: "a fox, detailed", Hires negative prompt: "fog, blur", Hires CFG Scale: 4, '
              "Hires schedule type: Karras, Hires resize: 128x96, Hires steps: 2, Hires upscaler: Latent (nearest-exact), "
              "Version: v1.10.1")


def test_from_png_of_an_a1111_image_with_every_hires_field_uses_them_all(tmp_path, capsys):
    out = rerun_with_no_unused_note(A1111_TEXT, (128, 96), tmp_path, capsys)
    assert (out["width"], out["height"]) == (128, 96) and Image.open(out["images"][0]).size == (128, 96)
    original, rerun = parse_a1111_parameters(A1111_TEXT), params_of(out["images"][0])
    for key in ("Hires sampler", "Hires prompt", "Hires negative prompt", "Hires CFG Scale", "Hires schedule type",
                "Hires resize", "Hires steps", "Hires upscaler", "Denoising strength"):
        assert rerun[key] == original[key], key
    read = request_fields(original)
    assert (read.fields["hires_sampler"], read.fields["hires_schedule_type"], read.fields["hires_cfg"]) == (
        "DPM++ 2M", "karras", 4.0)


def test_old_pngs_and_forges_spellings_read_back():
    old = request_fields({"Hires upscale": "2", "Hires upscaler": "latent", "Hires steps": "0"}).fields
    assert old["hires_upscaler"] == "Latent" and old["hires_scale"] == 2.0
    forge = request_fields({"Sampler": "Euler", "Hires CFG scale": "5", "Hires sampler": "DPM++ 2M Karras"}).fields
    assert (forge["hires_cfg"], forge["hires_sampler"], forge["hires_schedule_type"]) == (5.0, "DPM++ 2M", "karras")
    automatic = request_fields({"Sampler": "Euler", "Hires sampler": "DPM++ SDE", "Hires schedule type": "Automatic"})
    assert automatic.fields["hires_schedule_type"] == "karras"  # A1111's Automatic for DPM++ SDE
    with pytest.raises(InvalidRequest, match="'Hires resize' in the image's parameters"):
        request_fields({"Hires resize": "big"})


# --------------------------------------------------------------------------------------------- front ends


def test_the_cli_flags_reach_the_request(tmp_path, capsys):
    # the first pass's sampler named: the PNG writes a Hires sampler that differs from it (the default's is DPM++ 2M
    # Karras since issue 29, as A1111's)
    assert main(["generate", "x", "--width", "64", "--height", "64", "--steps", "1", "--hires-resize", "96x0",
                 "--sampler", "Euler", "--hires-sampler", "DPM++ 2M Karras", "--hires-cfg", "4", "--hires-prompt",
                 "x, more",
                 "--hires-negative", "blur", "--hires-upscaler", "latent (bicubic)", "--hires-steps", "1",
                 "--outdir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    params = params_of(out["images"][0])
    assert (out["width"], out["height"]) == (96, 96)
    assert (params["Hires resize"], params["Hires sampler"], params["Hires schedule type"], params["Hires CFG Scale"],
            params["Hires prompt"], params["Hires negative prompt"], params["Hires upscaler"]) == (
        "96x0", "DPM++ 2M", "Karras", "4", "x, more", "blur", "Latent (bicubic)")


@pytest.mark.parametrize("args, said", [
    (["--hires-resize", "100x0"], "hires resize width: 100"), (["--hires-resize", "big"], "WIDTHxHEIGHT"),
    (["--hires-resize", "8192x0"], "from 64 to 4096"), (["--hires-sampler", "Magic"], "hires sampler: 'Magic'"),
    (["--hires-schedule-type", "wobbly"], "hires schedule type: 'wobbly'"), (["--hires-cfg", "31"], "hires cfg: 31"),
    (["--hires-sampler", "DPM++ 2M Karras", "--hires-schedule-type", "exponential"], "says 'Karras'"),
    (["--width", "256", "--height", "2048", "--hires-resize", "1024x0"], "is 1024x8192"),
    (["--hires-upscaler", "Latent (wobbly)"], "Latent (nearest-exact)"),
])
def test_bad_hires_values_exit_2_naming_them(args, said, capsys):
    assert main(["generate", "x", *args]) == 2
    assert said in capsys.readouterr().err
