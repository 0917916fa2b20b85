"""Inpainting with ControlNet (issue 20): an inpaint job with ControlNet units runs diffusers'
StableDiffusionControlNetInpaintPipeline / StableDiffusionXLControlNetInpaintPipeline over the loaded components, with
ordinary and 9-channel checkpoints, whole picture and only masked, from every front end.

The models are the tiny ones (tests/inpaint_files.py: a 9-channel UNet on the tiny SD model; tests/controlnet_files.py:
ControlNets made from the tiny UNets with random zero convolutions). Out-of-memory is simulated as the ladder tests do
it: a forward pre-hook on the ControlNet raises torch.OutOfMemoryError once.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.models import controlnet as models
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

import controlnet_files as cn_files  # tests/controlnet_files.py
from controlnet_reference import extension_forward  # tests/controlnet_reference.py
import inpaint_files as files  # tests/inpaint_files.py
from folder_sampler import own_sampler  # tests/folder_sampler.py

STEPS, SIDE, SEED, CFG = 3, 64, 5, 7.0
# the jobs' denoise 0.8 of 3 steps runs A1111's int(0.8 x 3) + 1 = 3 of 3 (lowvram_gen/img2img_steps.py): diffusers'
# strength for that count is 1.0 (its 0.8 runs int(2.4) = 2)
A1111_RUN = 1.0
BOX = (16, 16, 48, 40)  # the mask's white part: x0, y0, x1, y1


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_path, tiny_sdxl_path):
    """The 9-channel tiny inpainting model, ControlNets for tiny and tiny-sdxl, an init image, a mask and a control
    image (a noisy white square: canny finds its border)."""
    from diffusers import UNet2DConditionModel

    root = tmp_path_factory.mktemp("inpaint-cn")
    sd = cn_files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=1)
    xl = cn_files.build(UNet2DConditionModel.from_pretrained(tiny_sdxl_path, subfolder="unet"), seed=3)
    rng = np.random.RandomState(0)
    image = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    image[12:44, 20:52] = 255
    image = np.clip(image.astype(int) + rng.randint(-20, 20, image.shape), 0, 255).astype(np.uint8)
    Image.fromarray(image).save(root / "control.png")
    return {"inpainting": files.save_folder(files.build(tiny_path), root / "tiny-inpainting"),
            "cn": cn_files.save_folder(sd, root / "tiny-cn"),
            "cn_pth": cn_files.save_ldm_pth(sd, root / "control_tiny_canny.pth"),
            "xl_cn": cn_files.save_folder(xl, root / "tiny-xl-cn"),
            "init": files.init_image(root / "init.png"),
            "mask": files.mask_image(root / "mask.png", BOX),
            "control": root / "control.png", "root": root}


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def inside(box=BOX, side=SIDE):
    x0, y0, x1, y1 = box
    m = np.zeros((side, side), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def request(made, tmp_path, *units, **fields):
    base = dict(prompt="a boat", width=SIDE, height=SIDE, steps=STEPS, seed=SEED, cfg_scale=CFG, outdir=str(tmp_path),
                init_image=str(made["init"]), mask=str(made["mask"]), model="tiny", mask_blur=0, strength=0.8)
    units = units or (ControlNetUnit(str(made["cn"]), str(made["control"])),)
    return GenerationRequest(**{**base, **fields}, controlnets=tuple(units)).validated()


def reference(model_folder, cn_folder, made, xl=False, **call):
    """Plain diffusers: the ControlNet inpaint pipeline of the model folder with the ControlNet folder."""
    from diffusers import (ControlNetModel, StableDiffusionControlNetInpaintPipeline,
                           StableDiffusionXLControlNetInpaintPipeline)

    cls = StableDiffusionXLControlNetInpaintPipeline if xl else StableDiffusionControlNetInpaintPipeline
    pipe = cls.from_pretrained(str(model_folder), controlnet=ControlNetModel.from_pretrained(str(cn_folder)))
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a boat", image=Image.open(made["init"]).convert("RGB"),
               mask_image=Image.open(made["mask"]).convert("L"), control_image=Image.open(made["control"]),
               num_inference_steps=STEPS, guidance_scale=CFG, strength=A1111_RUN, width=SIDE, height=SIDE,
               controlnet_conditioning_scale=call.pop("scale", 1.0),
               generator=torch.Generator("cpu").manual_seed(SEED), **call).images[0]
    return np.asarray(out.convert("RGB")).astype(int)


# ------------------------------------------------------------------------------------- equal to diffusers


@pytest.mark.parametrize("model", ["inpainting", "tiny"])
def test_inpaint_with_controlnet_equals_plain_diffusers(model, made, session, tmp_path, tiny_path, posterior_mode):
    """Same seed: our inpaint job with a ControlNet unit (a 9-channel inpainting model, and an ordinary one) is
    diffusers' StableDiffusionControlNetInpaintPipeline's image inside the mask, pixel for pixel (CPU, float32, the same
    generator), the init image outside it; and the ControlNet did something (without it the image differs)."""
    folder = made["inpainting"] if model == "inpainting" else tiny_path
    spec = str(made["inpainting"]) if model == "inpainting" else "tiny"
    unit = ControlNetUnit(str(made["cn"]), str(made["control"]), 0.7, 0.0, 0.8)
    result = session.generate(request(made, tmp_path, unit, model=spec, control_mode="controlnet",
                                      sampler=own_sampler(folder)))
    ours = pixels(result.images[0])
    # "ControlNet is more important": the extension's factors (control/weights.py); guidance end 0.8 of the 2 steps
    # strength 0.8 runs here (PLMS: 3 calls, its first step two) acts in every call, diffusers' window in the first 2
    with extension_forward():
        plain = reference(folder, made["cn"], made, scale=0.7, guess_mode=True)
    m = inside()
    assert np.array_equal(ours[m], plain[m])
    assert np.array_equal(ours[~m], pixels(made["init"])[~m])
    without = pixels(session.generate(dataclasses.replace(request(made, tmp_path / "plain", model=spec,
                                                                  sampler=own_sampler(folder)),
                                                          controlnets=())).images[0])
    assert not np.array_equal(ours[m], without[m])
    text = read_png_metadata(result.images[0])[0]
    assert 'ControlNet 0: "Module: none, Model: tiny-cn, Weight: 0.7' in text and "Mask blur" not in text


def test_sdxl_inpaint_with_controlnet_equals_plain_diffusers(made, session, tmp_path, tiny_sdxl_path,
                                                            posterior_mode):
    """tiny-sdxl (an ordinary checkpoint) with an SDXL ControlNet: diffusers' StableDiffusionXLControlNetInpaintPipeline's
    image inside the mask, pixel for pixel; the init image outside it."""
    ours = pixels(session.generate(request(made, tmp_path, ControlNetUnit(str(made["xl_cn"]), str(made["control"])),
                                           model="tiny-sdxl", sampler=own_sampler(tiny_sdxl_path))).images[0])
    plain = reference(tiny_sdxl_path, made["xl_cn"], made, xl=True)
    m = inside()
    assert np.array_equal(ours[m], plain[m])
    assert np.array_equal(ours[~m], pixels(made["init"])[~m])


def test_the_controlnet_inpaint_pipeline_shares_the_loaded_weights(made, session, tmp_path, monkeypatch):
    """The pass's pipeline is diffusers' ControlNet inpaint one over the loaded pipeline's own UNet, VAE and
    ControlNet (from_pipe: nothing copied or loaded again)."""
    from lowvram_gen.engines.sd import controlnet

    seen = []
    real = controlnet.control_pipe

    def spy(*args, **kwargs):
        made_pipe = real(*args, **kwargs)
        seen.append(made_pipe)
        return made_pipe

    monkeypatch.setattr(controlnet, "control_pipe", spy)
    session.generate(request(made, tmp_path, model=str(made["inpainting"]), steps=1))
    base = session.model.pipe
    assert [type(p).__name__ for p in seen] == ["StableDiffusionControlNetInpaintPipeline"]
    assert seen[0].unet is base.unet and seen[0].vae is base.vae and seen[0].controlnet is base.controlnet0


# ---------------------------------------------------------------------------------------- the mask's geometry


def test_outside_the_blurred_mask_stays_the_init_image(made, session, tmp_path):
    from lowvram_gen.inpaint.masks import blurred, read

    out = pixels(session.generate(request(made, tmp_path, mask_blur=4, strength=1.0)).images[0])
    soft = np.asarray(blurred(read(str(made["mask"])), 4))
    init = pixels(made["init"])
    assert np.array_equal(out[soft == 0], init[soft == 0])
    assert np.abs(out[inside()] - init[inside()]).mean() > 10


def test_masked_content_changes_what_the_controlnet_inpaint_pipeline_starts_from(made, session, tmp_path):
    """Latent noise / latent nothing replace the init latents inside the mask in diffusers' ControlNet inpaint
    pipeline too (its prepare_latents encodes the init image as the plain inpaint pipeline's does): each makes another
    image inside the mask than original, the same outside it."""
    out = {c: pixels(session.generate(request(made, tmp_path / c, masked_content=c, strength=0.6)).images[0])
           for c in ("original", "latent-noise", "latent-nothing")}
    m = inside()
    for content in ("latent-noise", "latent-nothing"):
        assert not np.array_equal(out[content][m], out["original"][m])
        assert np.array_equal(out[content][~m], out["original"][~m])


def test_only_masked_cuts_the_control_image_with_the_init_images_crop(made, session, tmp_path, monkeypatch):
    """Only masked on a 128 px canvas, a 64 px job, a control image of another size (96 px): the ControlNet reads the
    control image resized to the canvas, cut with the init image's crop box and resized to the job's size (A1111's
    sd-webui-controlnet with inpaint_full_res), not the whole control image; the UNet sees the job's size; outside the
    mask the canvas stays."""
    from diffusers import ControlNetModel

    from lowvram_gen.inpaint.masks import crop_box, read, to_aspect

    canvas = files.init_image(tmp_path / "big.png", side=128)
    mask = files.mask_image(tmp_path / "bigmask.png", (40, 40, 72, 64), size=(128, 128))
    control = tmp_path / "control96.png"
    Image.open(made["control"]).resize((96, 96), Image.NEAREST).save(control)
    conds = []
    forward = ControlNetModel.forward

    def spy(self, sample, timestep, encoder_hidden_states, controlnet_cond, *args, **kwargs):
        conds.append((tuple(sample.shape[-2:]), controlnet_cond[0].permute(1, 2, 0).numpy().copy()))
        return forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, *args, **kwargs)

    monkeypatch.setattr(ControlNetModel, "forward", spy)
    result = session.generate(request(made, tmp_path, ControlNetUnit(str(made["cn"]), str(control)),
                                      init_image=str(canvas), mask=str(mask), inpaint_area="masked", mask_padding=8,
                                      strength=1.0))
    box = to_aspect(crop_box(read(str(mask)), 8), SIDE, SIDE, (128, 128))
    expected = Image.open(control).convert("RGB").resize((128, 128), Image.LANCZOS).crop(box).resize(
        (SIDE, SIDE), Image.LANCZOS)
    expected = np.asarray(expected, dtype=np.float32) / 255
    assert conds and {shape for shape, _ in conds} == {(SIDE // 8, SIDE // 8)}
    assert all(np.allclose(cond, expected, atol=1e-6) for _, cond in conds)
    whole = np.asarray(Image.open(control).convert("RGB").resize((SIDE, SIDE), Image.LANCZOS), dtype=np.float32) / 255
    assert not np.allclose(conds[0][1], whole, atol=0.05)  # the crop, not the whole image
    out = pixels(result.images[0])
    m = inside((40, 40, 72, 64), 128)
    assert out.shape[:2] == (128, 128) and np.array_equal(out[~m], pixels(canvas)[~m])


# ----------------------------------------------------------------------------------------------- the ladder


def test_out_of_memory_in_a_controlnet_inpaint_step_steps_down_without_reloading_it(made, tmp_path, monkeypatch):
    """Simulated out-of-memory: the ControlNet's forward raises torch.OutOfMemoryError once, in an inpaint step (at
    highvram, the GPU ladder run on this CPU); the job finishes one rung down with the same ControlNet module and
    weights, loaded once, and keeps the init image outside the mask."""
    calls = []
    real = models.load_controlnet
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = Session(preset="highvram")
    unit = ControlNetUnit(str(made["cn"]), str(made["control"]))
    session.generate(request(made, tmp_path, unit, model=str(made["inpainting"]), steps=1))
    net = session.model.pipe.controlnet0
    weight = net.conv_in.weight
    failed = cn_files.out_of_memory_once(net)
    result = session.generate(request(made, tmp_path, unit, model=str(made["inpainting"]), strength=1.0))
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert session.model.pipe.controlnet0 is net and net.conv_in.weight is weight and calls == [1]
    out = pixels(result.images[0])
    assert np.array_equal(out[~inside()], pixels(made["init"])[~inside()])
    assert "ControlNet 0" in read_png_metadata(result.images[0])[0]


def test_the_jobs_plan_counts_the_controlnet_and_the_nine_channel_input(made, session, tmp_path, tiny_path, capsys):
    """The plan of an inpaint + ControlNet job counts both: the inpainting UNet's 9 inputs and the ControlNet's weights
    (Session.plan, which the job runs with); `plan --model <inpainting> --controlnet` shows the same."""
    from lowvram_gen.models.resolve import resolve

    req = request(made, tmp_path, model=str(made["inpainting"]))
    profile = session.profile_for(resolve(req.model), None, req)
    assert profile.unet_in_channels == 9 and profile.controlnets
    with_cn = session.plan(req).estimates[0]  # the CPU's preset: what this session's job would run
    without = session.plan(dataclasses.replace(req, controlnets=())).estimates[0]
    assert with_cn.name == without.name and with_cn.breakdown["controlnet_bytes"] > 0
    assert with_cn.estimate_bytes > without.estimate_bytes

    def plan(model):
        assert main(["plan", "--json", "--vram", "4GiB", "--model", model, "--width", "512", "--height", "512",
                     "--preset", "highvram", "--controlnet", str(made["cn"])]) == 0
        out = json.loads(capsys.readouterr().out)
        return next(p for p in out["presets"] if p["name"] == "highvram")["breakdown"]

    nine, four = plan(str(made["inpainting"])), plan(str(tiny_path))
    assert nine["controlnet_bytes"] == four["controlnet_bytes"] > 0
    assert nine["unet_bytes"] > four["unet_bytes"]  # the mask and masked-image latents beside the ControlNet


# ------------------------------------------------------------------------------------------ the front ends


def test_cli_inpaints_with_controlnet_and_reruns_it_from_the_png(made, tmp_path, capsys, monkeypatch):
    """`lowvram-gen inpaint ... --controlnet ... --control-image ...` (a .pth ControlNet, canny), then `inpaint
    --from-png` with the mask and the control image given again (the ControlNet by the name the PNG gives, in
    models/ControlNet): the same settings and the same image."""
    import shutil
    out = tmp_path / "out"
    args = ["inpaint", "a boat", "--init", str(made["init"]), "--mask", str(made["mask"]), "--steps", str(STEPS),
            "--seed", str(SEED), "--width", str(SIDE), "--height", str(SIDE), "--strength", "0.7", "--mask-blur", "2",
            "--controlnet", f"{made['cn_pth']}:0.6", "--control-image", str(made["control"]), "--preprocessor",
            "canny", "--outdir", str(out), "--json", "--cpu"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    params = parse_a1111_parameters(read_png_metadata(first)[0])
    assert params["Mask blur"] == "2" and params["Denoising strength"] == "0.7"
    assert params["ControlNet 0"].startswith("Module: canny, Model: control_tiny_canny") and "Weight: 0.6" in \
        params["ControlNet 0"]
    (tmp_path / "models" / "ControlNet").mkdir(parents=True)
    shutil.copy(made["cn_pth"], tmp_path / "models" / "ControlNet")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    assert main(["inpaint", "--from-png", first, "--init", str(made["init"]), "--mask", str(made["mask"]),
                 "--control-image", str(made["control"]), "--outdir", str(out), "--json", "--cpu"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert parse_a1111_parameters(read_png_metadata(again)[0]) == params
    assert np.array_equal(pixels(again), pixels(first))


def test_batch_lines_and_the_python_api_inpaint_with_units(made, tmp_path, capsys):
    """A prompt file's line with a mask and a unit (the extension's keys), and lowvram_gen.generate with a request
    that has both: each inpaints with the ControlNet (its unit in the PNG, the init image outside the mask)."""
    import lowvram_gen

    line = {"prompt": "a boat", "init_image": str(made["init"]), "mask": str(made["mask"]), "mask_blur": 0,
            "controlnets": [{"enabled": True, "model": str(made["cn"]), "input_image": str(made["control"]),
                             "module": "none", "weight": 0.5}]}
    path = tmp_path / "jobs.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert main(["batch", str(path), "--steps", "2", "--width", str(SIDE), "--height", str(SIDE), "--outdir",
                 str(tmp_path / "o"), "--cpu", "--json"]) == 0
    capsys.readouterr()
    (png,) = sorted((tmp_path / "o").rglob("*.png"))
    result = lowvram_gen.generate(request(made, tmp_path / "api", strength=1.0))
    init = pixels(made["init"])
    for made_png, weight in ((png, "0.5"), (result.images[0], "1")):
        text = read_png_metadata(made_png)[0]
        assert f"Model: tiny-cn, Weight: {weight}" in text and "Denoising strength" in text
        assert np.array_equal(pixels(made_png)[~inside()], init[~inside()])
