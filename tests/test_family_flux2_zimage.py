"""Flux.2 Klein (Flux2KleinPipeline) and Z-Image (ZImagePipeline) through the project's real code, on tiny seeded
folders built with diffusers' own test shapes (tests/tiny_flux2.py, tests/tiny_zimage.py), each compared with plain
diffusers; and both planned at real size from the configs the package ships (configs/flux2-klein, configs/z-image).
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from family_checks import inpaint_files, inpainted, mask_options_act
from tiny_flux2 import build_tiny_flux2_klein
from tiny_transformers import cli, pixels
from tiny_zimage import DIM, build_tiny_zimage

from lowvram_gen import GenerationRequest, families
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"


@pytest.fixture(scope="module")
def flux2(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-flux2-klein")
    build_tiny_flux2_klein().save_pretrained(folder, safe_serialization=True)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "Flux2KleinPipeline"
    return str(folder)


@pytest.fixture(scope="module")
def zimage(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-z-image")
    build_tiny_zimage().save_pretrained(folder, safe_serialization=True)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "ZImagePipeline"
    return str(folder)


def plain(folder: str, pipeline: str = "", **kw) -> np.ndarray:
    """One image of plain diffusers' pipeline (`pipeline`: its class; the folder's own when empty), as int RGB."""
    import diffusers

    cls = getattr(diffusers, pipeline) if pipeline else diffusers.DiffusionPipeline
    pipe = cls.from_pretrained(folder)
    seed = kw.pop("seed")
    image = pipe(**kw, generator=torch.Generator().manual_seed(seed)).images[0]
    return np.asarray(image.convert("RGB"), dtype=int)


def generate(capsys, folder, tmp_path, *args) -> tuple[dict, str]:
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", "64", "--height", "64",
                         "--steps", "2", "--seed", "7", "--preset", "cpu", "--outdir", str(tmp_path), "--json", *args)
    assert code == 0, err
    return json.loads(out), err


# ====================================================================================== Flux.2 Klein


def test_flux2_klein_is_its_own_family_not_flux1(flux2):
    record = families.by_pipeline("Flux2KleinPipeline")
    assert record.key == "flux2-klein" and record is not families.FLUX1
    assert not record.call.takes_negative_prompt and record.pipeline_for("img2img") is None
    assert record.pipeline_for("inpaint") == "Flux2KleinInpaintPipeline"
    assert families.by_name("flux2-klein") is record and families.by_name("black-forest-labs/FLUX.2-klein-4B") is record
    assert families.by_denoiser_class("Flux2Transformer2DModel") is record


def test_flux2_klein_txt2img_from_the_cli_equals_plain_diffusers(flux2, tmp_path, capsys):
    """The base model's CFG: guidance_scale > 1 runs two forwards against the pipeline's own empty negative prompt."""
    for cfg in ("4", "1"):
        result, _ = generate(capsys, flux2, tmp_path, "--cfg", cfg)
        assert result["warnings"] == [] and result["attempts"][-1]["outcome"] == "ok"
        ours = pixels(result["images"][0])
        theirs = plain(flux2, prompt="a castle", width=64, height=64, num_inference_steps=2,
                       guidance_scale=float(cfg), seed=7)
        assert np.abs(ours - theirs).max() <= MAX_DIFF, cfg
        assert ours.std() > 1


def test_flux2_klein_with_a_negative_prompt_warns_in_one_line_and_runs_as_without(flux2, tmp_path, capsys):
    with_negative, _ = generate(capsys, flux2, tmp_path, "--cfg", "4", "--negative", "fog")
    without, _ = generate(capsys, flux2, tmp_path, "--cfg", "4")
    assert with_negative["warnings"] == [
        "Flux2KleinPipeline does not use a negative prompt (Flux.2 Klein has none): it is ignored"]
    assert np.array_equal(pixels(with_negative["images"][0]), pixels(without["images"][0]))


@pytest.mark.parametrize("args, said", [
    (["img2img", "a castle", "--init", "{init}"],
     "invalid task: 'img2img'; Flux.2 Klein has no img2img pipeline in diffusers: use txt2img"),
    (["generate", "a castle", "--hires-scale", "2", "--hires-upscaler", "lanczos"],
     "invalid hires scale: 2.0; Flux.2 Klein has no img2img pipeline in diffusers for hires fix's second pass (an "
     "img2img pass): leave hires fix off and upscale after"),
])
def test_flux2_klein_refuses_what_diffusers_has_no_pipeline_for_in_one_sentence(flux2, tmp_path, capsys, args, said):
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    Image.new("RGB", (64, 64), (90, 120, 150)).save(init)
    Image.new("L", (64, 64), 255).save(mask)
    args = [a.format(init=init, mask=mask) for a in args]
    code, out, err = cli(capsys, *args, "--model", flux2, "--width", "64", "--height", "64", "--steps", "2",
                         "--preset", "cpu", "--outdir", str(tmp_path))
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["error: " + said.format(init=init, mask=mask)]


def test_flux2_klein_inpaint_equals_its_diffusers_pipeline_and_takes_our_mask_options(flux2, tmp_path, capsys):
    """Flux2KleinInpaintPipeline, which the auto-pipelines do not map, over the loaded components. A white mask
    repaints everything (no overlay of the original): equal to plain diffusers; a box repaints inside it."""
    init, white, boxed = inpaint_files(tmp_path)
    common = ["--init", str(init), "--model", flux2, "--width", "64", "--height", "64", "--steps", "4", "--seed", "4",
              "--cfg", "4", "--strength", "0.5", "--mask-blur", "0", "--preset", "cpu", "--outdir", str(tmp_path),
              "--json"]
    # --strength 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4 (lowvram_gen/img2img_steps.py): diffusers' 0.75
    theirs = plain(flux2, "Flux2KleinInpaintPipeline", prompt="a castle", image=Image.open(init).convert("RGB"),
                   mask_image=Image.open(white), strength=0.75, width=64, height=64, num_inference_steps=4,
                   guidance_scale=4.0, seed=4)
    assert np.abs(inpainted(capsys, white, common) - theirs).max() <= MAX_DIFF
    mask_options_act(capsys, init, boxed, (16, 16, 48, 48), common)


# ====================================================================================== Z-Image


def test_zimage_txt2img_from_the_cli_equals_plain_diffusers_with_and_without_cfg(zimage, tmp_path, capsys):
    """CFG runs whenever the scale is above 0 (a doubled batch with the negative prompt); Turbo's 0 turns it off."""
    images = {}
    for cfg in ("4", "0"):
        result, _ = generate(capsys, zimage, tmp_path, "--cfg", cfg, "--negative", "fog")
        assert result["warnings"] == []
        ours = images[cfg] = pixels(result["images"][0])
        theirs = plain(zimage, prompt="a castle", negative_prompt="fog", width=64, height=64,
                       num_inference_steps=2, guidance_scale=float(cfg), seed=7)
        assert np.abs(ours - theirs).max() <= MAX_DIFF, cfg
    assert not np.array_equal(images["4"], images["0"])


def test_zimage_img2img_equals_its_diffusers_pipeline_and_inpaint_runs(zimage, tmp_path, capsys, posterior_mode):
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(init)
    box = np.zeros((64, 64), np.uint8)
    box[16:48, 16:48] = 255
    Image.fromarray(box).save(mask)
    common = ["--model", zimage, "--width", "64", "--height", "64", "--steps", "4", "--seed", "2", "--cfg", "3",
              "--preset", "cpu", "--outdir", str(tmp_path), "--json"]
    code, out, err = cli(capsys, "img2img", "a harbour", "--init", str(init), "--strength", "0.5", *common)
    assert code == 0, err
    ours = pixels(json.loads(out)["images"][0])
    # --strength 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4 (lowvram_gen/img2img_steps.py): diffusers' 0.75
    theirs = plain(zimage, "ZImageImg2ImgPipeline", prompt="a harbour", image=Image.open(init).convert("RGB"),
                   strength=0.75, width=64, height=64, num_inference_steps=4, guidance_scale=3.0, seed=2)
    assert np.abs(ours - theirs).max() <= MAX_DIFF
    code, out, err = cli(capsys, "inpaint", "a harbour", "--init", str(init), "--mask", str(mask), *common)
    assert code == 0, err
    painted = pixels(json.loads(out)["images"][0])
    original = pixels(init)
    assert np.abs(painted[24:40, 24:40] - original[24:40, 24:40]).mean() > 10  # repainted inside the mask


@pytest.mark.parametrize("name", ["flux2", "zimage"])
def test_int8_and_out_of_memory_stepping_down_without_reloading(request, name, tmp_path):
    """int8 runs; a simulated out-of-memory at highvram finishes the same job at medvram on the same transformer, as
    plain diffusers makes it."""
    folder = request.getfixturevalue(name)
    job = dict(prompt="a castle", model=folder, width=64, height=64, steps=2, seed=3, cfg_scale=4.0,
               outdir=str(tmp_path))
    quantized = Session().generate(GenerationRequest(**job, preset="cpu", quantize="int8"))
    assert [a["outcome"] for a in quantized.attempts] == ["ok"] and pixels(quantized.images[0]).std() > 1
    session = Session(preset="highvram")  # the GPU ladder, run on this CPU
    session.generate(GenerationRequest(**{**job, "steps": 1}))
    transformer = session.model.pipe.transformer

    def oom(_module, _args, _kwargs):  # highvram (no offload) runs out of memory in every step
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = transformer.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        result = session.generate(GenerationRequest(**job))
    finally:
        handle.remove()
    assert [(a["preset"], a["outcome"]) for a in result.attempts] == [("highvram", "oom"), ("medvram", "ok")]
    assert session.model.pipe.transformer is transformer  # reconfigured, not reloaded
    theirs = plain(folder, prompt="a castle", width=64, height=64, num_inference_steps=2, guidance_scale=4.0, seed=3)
    assert np.abs(pixels(result.images[0]) - theirs).max() <= MAX_DIFF


def test_zimage_refuses_latent_masked_content_in_one_sentence(zimage, tmp_path, capsys):
    """Its inpaint pipeline encodes the init image inside prepare_latents, where A1111's latent noise cannot go."""
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    Image.new("RGB", (64, 64), (90, 120, 150)).save(init)
    Image.new("L", (64, 64), 255).save(mask)
    code, _, err = cli(capsys, "inpaint", "a castle", "--init", str(init), "--mask", str(mask), "--masked-content",
                       "latent-noise", "--model", zimage, "--width", "64", "--height", "64", "--steps", "2",
                       "--preset", "cpu", "--outdir", str(tmp_path))
    assert code == 2 and err.strip().splitlines() == [
        "error: invalid masked content: 'latent-noise'; Z-Image's inpaint pipeline encodes the init image inside its "
        "own latents step, where it cannot be replaced: use original or fill"]


# ====================================================================================== plan


def test_the_tiny_folders_are_read_at_their_own_shapes(flux2, zimage):
    from lowvram_gen.models.profile import profile_from_folder

    z = profile_from_folder(zimage)
    assert (z.transformer_hidden, z.transformer_patch, z.latent_channels) == (DIM, 2, 16)  # not PixArt's 1152
    assert z.text_tokens == (512,) and z.joint_text_tokens == 512 and z.cfg_batch
    f = profile_from_folder(flux2)
    # 1 latent channel packed 2x2 into the transformer's 4 inputs: one token covers 2x2 latent pixels
    assert (f.transformer_hidden, f.transformer_patch, f.text_tokens, f.joint_text_tokens) == (32, 2, (512,), 512)
    assert not f.cfg_batch


@pytest.mark.parametrize("name, hidden, text_hidden, vram, ram", [
    ("z-image", 3840, 2560, "6GiB", "16GiB"),  # the targets: Z-Image Turbo at 1024x1024 ...
    ("flux2-klein", 24 * 128, 2560, "4GiB", "12GiB"),  # ... and Flux.2 Klein 4B
])
def test_plan_at_real_shapes_from_the_shipped_configs_offline(capsys, name, hidden, text_hidden, vram, ram):
    from lowvram_gen.models.profile import profile_builtin

    profile = profile_builtin(name)
    assert profile.arch == name and profile.transformer_hidden == hidden and profile.transformer_patch == 2
    assert profile.text_hidden == (text_hidden,) and profile.text_tokens == (512,) and profile.vae_scale_factor == 8
    assert profile.params["transformer"] > 3.5e9 and profile.params["text_encoder"] > 3.5e9
    code, out, err = cli(capsys, "plan", "--model", name, "--vram", vram, "--ram", ram, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["width"], result["height"]) == (1024, 1024) and not result["refusal"]
    chosen = next(p for p in result["presets"] if p["name"] == result["preset"])
    assert chosen["fits"] and chosen["fits_host"] and (chosen["width"], chosen["height"]) == (1024, 1024)
    assert any("te-reload" in p["name"] for p in result["presets"])  # its prompts can be encoded apart


def test_no_te_reload_candidate_for_a_family_whose_prompts_cannot_be_encoded_apart(capsys):
    """A +te-reload candidate of such a family would fail when picked ("encoding its prompts apart from the call is
    not supported"): the planner offers none."""
    from dataclasses import replace

    cannot = replace(families.by_key("z-image"), key="z-image-no-apart", text_encode_apart=None)
    with families.registered(cannot):  # in front: the short name 'z-image' and the denoiser class are its
        code, out, err = cli(capsys, "plan", "--model", "z-image", "--vram", "6GiB", "--ram", "16GiB", "--json")
    assert code == 0, err
    assert not any("te-reload" in p["name"] for p in json.loads(out)["presets"])


@pytest.mark.parametrize("name", ["flux2", "zimage"])
def test_te_reload_makes_the_same_image_with_the_encoders_gone_while_the_denoiser_runs(request, name, tmp_path):
    from test_text_encoder_reload import _presets_with

    folder = request.getfixturevalue(name)
    images, seen = {}, []
    for text_encoders in ("kept", "reloaded"):
        session = Session(device="cpu", preset="cpu", presets_dir=str(_presets_with(tmp_path, text_encoders)),
                          outdir=str(tmp_path / text_encoders))

        def watch(*_):  # in a step callback: the text encoder the pipeline holds while the denoiser runs
            seen.append((text_encoders, session.model.pipe.text_encoder is not None))

        result = session.generate(GenerationRequest(prompt="a castle", negative_prompt="fog", model=folder, steps=2,
                                                    width=64, height=64, seed=7, cfg_scale=4.0, batch_size=2),
                                  on_step=watch)
        images[text_encoders] = [pixels(p) for p in result.images]
    assert all(np.array_equal(a, b) for a, b in zip(images["kept"], images["reloaded"]))
    assert ("kept", True) in seen and ("reloaded", True) not in seen and ("reloaded", False) in seen
