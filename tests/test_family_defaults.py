"""The model family's steps and CFG scale when the user gives none (families/record.py `sampling`, resolved once by
the Session: families/sampling.py): Z-Image Turbo runs its model card's 9 steps at CFG 0 equal to plain diffusers
called with those, an explicit --steps/--cfg wins, SD keeps A1111's 20 / 7, the variants a folder says (Z-Image base,
Flux.2 Klein base, FLUX.1-schnell), the REST API's and the batch script's paths, --from-png, `plan`, and the web UI's
sliders following the Model box. Tiny seeded folders (tests/tiny_zimage.py, tests/tiny_flux2.py): the images are
noise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_flux2 import build_tiny_flux2_klein
from tiny_transformers import cli, pixels
from tiny_zimage import build_tiny_zimage

from lowvram_gen import GenerationRequest, families
from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.api import answers
from lowvram_gen.batch.files import request_hash
from lowvram_gen.families import sampling
from lowvram_gen.families.record import A1111_SAMPLING, FolderFacts
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session
from lowvram_gen.ui import family_defaults

MAX_DIFF = 2  # of 255: "equal to plain diffusers"


@pytest.fixture(scope="module")
def zimage(tmp_path_factory) -> str:
    """Named as a user names a Turbo download (the name is what tells Turbo from the base model)."""
    folder = tmp_path_factory.mktemp("zimage") / "Z-Image-Turbo"
    build_tiny_zimage().save_pretrained(folder, safe_serialization=True)
    return str(folder)


def params_of(path) -> dict:
    return parse_a1111_parameters(read_png_metadata(path)[0])


def counting(monkeypatch, cls) -> list:
    """Count the forwards of `cls` (the denoiser class) in this process, ours and plain diffusers' alike."""
    calls: list = []
    real = cls.forward

    def forward(self, *args, **kw):
        calls.append(1)
        return real(self, *args, **kw)

    monkeypatch.setattr(cls, "forward", forward)
    return calls


def run_cli(capsys, folder, tmp_path, *args) -> dict:
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", "64", "--height", "64",
                         "--seed", "7", "--preset", "cpu", "--outdir", str(tmp_path), "--json", *args)
    assert code == 0, err
    return json.loads(out)


# ===================================================================================== Z-Image Turbo, end to end


def test_zimage_turbo_without_steps_or_cfg_runs_its_model_cards_9_steps_at_cfg_0_equal_to_diffusers(
        zimage, tmp_path, capsys, monkeypatch):
    from diffusers import ZImagePipeline, ZImageTransformer2DModel

    calls = counting(monkeypatch, ZImageTransformer2DModel)
    result = run_cli(capsys, zimage, tmp_path)
    ours_calls = len(calls)
    params = params_of(result["images"][0])
    assert (params["Steps"], params["CFG scale"]) == ("9", "0") and result["steps"] == 9
    calls.clear()
    pipe = ZImagePipeline.from_pretrained(zimage)
    theirs = pipe("a castle", width=64, height=64, num_inference_steps=9, guidance_scale=0.0,
                  generator=torch.Generator().manual_seed(7)).images[0]
    assert ours_calls == len(calls) >= 8  # the transformer ran as often as in diffusers' own 9-step call
    assert np.abs(pixels(result["images"][0]) - np.asarray(theirs.convert("RGB"), dtype=int)).max() <= MAX_DIFF


def test_an_explicit_steps_and_cfg_win_over_the_familys(zimage, tmp_path, capsys, monkeypatch):
    from diffusers import ZImageTransformer2DModel

    calls = counting(monkeypatch, ZImageTransformer2DModel)
    result = run_cli(capsys, zimage, tmp_path, "--steps", "2", "--cfg", "3")
    params = params_of(result["images"][0])
    assert (params["Steps"], params["CFG scale"]) == ("2", "3") and len(calls) == 2
    only_steps = params_of(run_cli(capsys, zimage, tmp_path, "--steps", "2")["images"][0])
    assert (only_steps["Steps"], only_steps["CFG scale"]) == ("2", "0")  # the one not given is the family's


def test_from_png_keeps_what_the_png_says(zimage, tmp_path, capsys):
    first = run_cli(capsys, zimage, tmp_path, "--steps", "2", "--cfg", "3")["images"][0]
    code, out, err = cli(capsys, "generate", "--from-png", first, "--model", zimage, "--preset", "cpu",
                         "--outdir", str(tmp_path / "again"), "--json")
    assert code == 0, err
    again = params_of(json.loads(out)["images"][0])
    assert (again["Steps"], again["CFG scale"]) == ("2", "3")


# ===================================================================================== SD keeps A1111's


def test_sd_without_steps_or_cfg_keeps_a1111s_20_and_7(tiny_path, tmp_path, capsys):
    result = run_cli(capsys, "tiny", tmp_path, "--sampler", "Euler")
    params = params_of(result["images"][0])
    assert (params["Steps"], params["CFG scale"]) == ("20", "7") and result["steps"] == 20
    assert families.SD15.default_sampling() == families.SDXL.default_sampling() == A1111_SAMPLING


# ===================================================================================== variants the folder says


def test_the_variant_is_read_from_the_folder(zimage, tmp_path):
    session = Session(device="cpu")
    resolved = session.with_sampling_defaults(GenerationRequest(model=zimage).validated())
    assert (resolved.steps, resolved.cfg_scale) == (9, 0.0)
    base = tmp_path / "Z-Image-Base"
    shutil.copytree(zimage, base)
    resolved = session.with_sampling_defaults(GenerationRequest(model=str(base)).validated())
    assert (resolved.steps, resolved.cfg_scale) == (50, 4.0)
    given = session.with_sampling_defaults(GenerationRequest(model=str(base), steps=3).validated())
    assert (given.steps, given.cfg_scale) == (3, 4.0)
    # the base model's hub id, and the short names (which load Turbo)
    record = families.by_pipeline("ZImagePipeline")
    assert record.default_sampling(FolderFacts(name="tongyi-mai/z-image")).steps == 50
    assert record.default_sampling(FolderFacts(name=sampling.model_name("Tongyi-MAI/Z-Image-Turbo"))).steps == 9
    assert record.default_sampling(FolderFacts(name=sampling.model_name("z-image"))).steps == 9


@pytest.mark.parametrize("distilled, expected", [(True, (4, 1.0)), (False, (50, 4.0))])
def test_flux2_klein_distilled_or_base_as_model_index_says(tmp_path, distilled, expected):
    folder = tmp_path / "klein"
    build_tiny_flux2_klein(distilled=distilled).save_pretrained(folder, safe_serialization=True)
    assert json.loads((folder / "model_index.json").read_text())["is_distilled"] is distilled
    resolved = Session(device="cpu").with_sampling_defaults(GenerationRequest(model=str(folder)).validated())
    assert (resolved.steps, resolved.cfg_scale) == expected


def test_each_record_says_its_defaults():
    by = {r.key: r.default_sampling() for r in families.all_families()}
    assert (by["qwen-image"].steps, by["qwen-image"].cfg) == (50, 4.0)  # true_cfg_scale 4, its card's
    assert (by["sana"].steps, by["sana"].cfg) == (20, 4.5)
    assert (by["chroma"].steps, by["chroma"].cfg) == (40, 3.0)
    assert (by["lumina2"].steps, by["lumina2"].cfg) == (50, 4.0)
    assert (by["flux"].steps, by["flux"].cfg) == (20, 3.5)  # FLUX.1-dev's distilled guidance, as Forge
    schnell = families.FLUX1.default_sampling(FolderFacts(transformer={"guidance_embeds": False}))
    assert (schnell.steps, schnell.cfg) == (4, 0.0)
    for key in ("sd15", "sd21", "sdxl", "sd3"):  # unchanged: A1111's
        assert by[key] == A1111_SAMPLING


def test_plan_takes_the_familys_steps_and_cfg(capsys):
    """`plan --model z-image` plans Turbo's 9 steps without CFG (no doubled batch), from the shipped configs."""
    session = Session(device="cpu")
    profile = session.model_profile("z-image")
    resolved = session.with_sampling_defaults(GenerationRequest(model="z-image", width=1024, height=1024).validated(),
                                              profile=profile[0])
    assert (resolved.steps, resolved.cfg_scale) == (9, 0.0)
    code, out, err = cli(capsys, "plan", "--model", "z-image", "--vram", "6GB", "--ram", "16GB", "--json")
    assert code == 0, err
    assert json.loads(out)["preset"]


# ===================================================================================== the REST API and batch


def test_api_body_without_steps_or_cfg_runs_the_familys_and_info_says_them(zimage, tmp_path):
    def mapped(body):
        return map_body(body, "txt2img", zimage, 1, str(tmp_path), lambda name: None)

    given = mapped({"prompt": "a castle", "steps": 2, "cfg_scale": 3, "width": 64, "height": 64, "seed": 7})
    assert (given.request.steps, given.request.cfg_scale) == (2, 3.0) and given.parameters["steps"] == 2
    # (sampler_name: A1111's API default, Euler, is refused for a flow-matching family; "default" is its own)
    absent = mapped({"prompt": "a castle", "width": 64, "height": 64, "seed": 7, "cfg_scale": None,
                     "sampler_name": "default"})
    assert (absent.request.steps, absent.request.cfg_scale) == (None, None)
    assert absent.parameters["steps"] is None and absent.parameters["cfg_scale"] is None
    result = Session(device="cpu", outdir=str(tmp_path)).generate(absent.request)
    info = json.loads(answers.info(absent.request, result.images, "txt2img", "z-image", [], result.summary, "test"))
    assert (info["steps"], info["cfg_scale"]) == (9, 0.0)


def test_batch_lines_without_steps_run_the_familys_and_sd_lines_keep_their_hash(zimage, tmp_path, capsys):
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(json.dumps({"prompt": "a castle", "model": zimage, "width": 64, "height": 64, "seed": 7}) + "\n"
                     + json.dumps({"prompt": "a castle", "model": zimage, "width": 64, "height": 64, "seed": 7,
                                   "steps": 2}) + "\n")
    code, out, err = cli(capsys, "batch", str(lines), "--outdir", str(tmp_path / "out"), "--preset", "cpu")
    assert code == 0, err
    made = sorted((tmp_path / "out").rglob("*.png"))
    assert sorted(params_of(p)["Steps"] for p in made) == ["2", "9"]
    # a line without steps hashes as it did when it ran 20 / 7 (its resume is kept)
    old = GenerationRequest(prompt="x", steps=20, cfg_scale=7.0).validated()
    assert request_hash("sd", GenerationRequest(prompt="x").validated()) == request_hash("sd", old)


# ===================================================================================== the web UI's sliders


def test_the_sliders_follow_the_model_boxs_family(zimage, tiny_path):
    assert family_defaults.sampling_of("tiny") == A1111_SAMPLING
    assert (family_defaults.sampling_of(zimage).steps, family_defaults.sampling_of(zimage).cfg) == (9, 0.0)
    assert family_defaults.sampling_of("z-image").steps == 9  # a short name, offline
    assert family_defaults.sampling_of(str(Path(zimage) / "missing.safetensors")) is None
    # tiny -> Z-Image Turbo: the sliders take its defaults
    assert family_defaults.on_pick(zimage, 20, 7.0, (20, 7.0)) == (9, 0.0, (9, 0.0))
    # another model of the same family: what the user set stays
    assert family_defaults.on_pick(zimage, 12, 1.5, (9, 0.0)) == (12, 1.5, (9, 0.0))
    # back to SD: A1111's
    assert family_defaults.on_pick("tiny", 12, 1.5, (9, 0.0)) == (20, 7.0, (20, 7.0))
    # what cannot be told offline leaves them
    assert family_defaults.on_pick("", 12, 1.5, (9, 0.0)) == (12, 1.5, (9, 0.0))


def test_the_ui_starts_the_sliders_at_its_models_family_and_wires_the_model_boxs_input(zimage, tmp_path):
    """Built with a Z-Image Turbo folder as its model, each tab's sliders start at 9 / 0; the Model box's input (the
    user's pick, not a programmatic change) sets them (`on_pick`, above)."""
    from lowvram_gen.ui.app import UiOptions, build_app

    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model=zimage))
    by_id = {getattr(b, "elem_id", None): b for b in app.blocks.values()}
    for prefix in ("", "i2i-"):  # (img2img's CFG slider has no elem_id: found as the pick's output)
        model, steps = by_id[f"{prefix}model"], by_id[f"{prefix}steps"]
        picks = [fn for fn in app.fns.values() if fn.fn is family_defaults.on_pick
                 and (model._id, "input") in [(getattr(t, "_id", t), e) for t, e in fn.targets]]
        assert len(picks) == 1 and picks[0].outputs[0] is steps, prefix
        cfg = picks[0].outputs[1]
        assert cfg.label == "CFG scale" and (steps.value, cfg.value) == (9, 0.0), prefix
