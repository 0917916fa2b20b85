"""ControlNet inpainting on Qwen-Image (QwenImageControlNetInpaintPipeline) and Z-Image
(ZImageControlNetInpaintPipeline): an inpaint job with one ControlNet unit runs the family's pipeline over the loaded
components, equal to plain diffusers inside the mask and the init image outside it; our mask options (blur, only
masked) act; what the pipelines have not (several units, masked content, a ControlNet that does not read the mask) is
refused in one sentence, and what they do not use (the denoising strength; Qwen-Image's, the unit's control image) is
one of the job's warnings; the plan counts the ControlNet; a simulated out-of-memory steps down without reloading it.

Both pipelines repaint the masked area from noise. Qwen-Image's reads the image to repaint and its mask through an
inpainting ControlNet (InstantX's: 4 more packed input channels, the mask beside the image's latents); Z-Image's takes
the control map beside them, read by a ControlNet of 16 + 1 + 16 input channels (alibaba-pai's Union 2.0). The tiny
ControlNets here are those shapes at the width of the tiny transformers (tests/tiny_controlnets.py), seeded random.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from controlnet_files import random_image, steps_down_once
from PIL import Image
from tiny_controlnets import _randomised
from tiny_qwen import build_tiny_qwen_image
from tiny_transformers import cli, pixels
from tiny_zimage import build_tiny_zimage

from lowvram_gen import GenerationRequest
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"
BOX = (16, 8, 48, 40)  # the mask's white part


def qwen_inpaint_controlnet(seed: int = 3):
    """tests/tiny_controlnets.tiny_qwen_controlnet's shape reading the mask too: 4 more packed input channels (the
    mask's one channel beside the image's 4 latent channels, packed 2x2), as InstantX's inpainting one does."""
    from diffusers import QwenImageControlNetModel

    return _randomised(QwenImageControlNetModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, axes_dims_rope=(8, 4, 4), extra_condition_channels=4), seed)


def zimage_inpaint_controlnet(seed: int = 3):
    """tests/tiny_controlnets.tiny_zimage_controlnet's shape reading 16 + 1 + 16 channels (the control latents, the
    mask, the masked image's latents), as Z-Image-Turbo-Fun-Controlnet-Union-2.0 does."""
    from diffusers import ZImageControlNetModel

    return _randomised(ZImageControlNetModel(
        control_layers_places=[0, 1], control_refiner_layers_places=[0], control_in_dim=33, all_patch_size=(2,),
        all_f_patch_size=(1,), dim=32, n_refiner_layers=1, n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True),
        seed, scale=0.2)


CASES = {  # family: (model builder, inpainting ControlNet builder, pipeline, ControlNet class, CFG argument)
    "qwen-image": (build_tiny_qwen_image, qwen_inpaint_controlnet, "QwenImageControlNetInpaintPipeline",
                   "QwenImageControlNetModel", {"true_cfg_scale": 4.0}),
    "z-image": (build_tiny_zimage, zimage_inpaint_controlnet, "ZImageControlNetInpaintPipeline",
                "ZImageControlNetModel", {"guidance_scale": 4.0}),
}


def inside() -> np.ndarray:
    m = np.zeros((64, 64), bool)
    m[BOX[1]:BOX[3], BOX[0]:BOX[2]] = True
    return m


@pytest.fixture(scope="module", params=list(CASES))
def made(request, tmp_path_factory):
    key = request.param
    build, cn, *_ = CASES[key]
    root = tmp_path_factory.mktemp(f"cn-inpaint-{key}")
    build().save_pretrained(root / "model", safe_serialization=True)
    cn().save_pretrained(root / "cn", safe_serialization=True)
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, BOX)
    mask.save(root / "mask.png")
    return dict(key=key, model=str(root / "model"), cn=str(root / "cn"), init=random_image(root / "init.png", 1),
                control=random_image(root / "control.png", 2), mask=str(root / "mask.png"), root=root)


def request(made, tmp_path, **fields) -> GenerationRequest:
    base = dict(prompt="a castle", negative_prompt="fog", model=made["model"], width=64, height=64, steps=2, seed=7,
                cfg_scale=4.0, outdir=str(tmp_path), init_image=made["init"], mask=made["mask"], mask_blur=0,
                strength=1.0, controlnets=(ControlNetUnit(made["cn"], made["control"], 0.8),))
    return GenerationRequest(**{**base, **fields})


def plain(made) -> np.ndarray:
    """Plain diffusers' ControlNet inpaint pipeline of the family, torch's global random state seeded as the engine
    seeds it (Qwen-Image's samples the image's latents from it)."""
    import diffusers

    _build, _cn, pipeline, model_class, call = CASES[made["key"]]
    net = getattr(diffusers, model_class).from_pretrained(made["cn"])
    pipe = getattr(diffusers, pipeline).from_pretrained(made["model"], controlnet=net)
    pipe.set_progress_bar_config(disable=True)
    init, mask = Image.open(made["init"]).convert("RGB"), Image.open(made["mask"]).convert("L")
    images = dict(control_image=init, control_mask=mask) if made["key"] == "qwen-image" else \
        dict(image=init, mask_image=mask, control_image=Image.open(made["control"]).convert("RGB"))
    torch.manual_seed(7)
    out = pipe(prompt="a castle", negative_prompt="fog", width=64, height=64, num_inference_steps=2, **call, **images,
               controlnet_conditioning_scale=0.8, generator=torch.Generator().manual_seed(7)).images[0]
    return np.asarray(out.convert("RGB"), dtype=int)


def test_controlnet_inpaint_from_the_cli_equals_plain_diffusers(made, tmp_path, capsys):
    """Inside the mask diffusers' image, outside it the init image; without the ControlNet the inside differs."""
    code, out, err = cli(capsys, "inpaint", "a castle", "--negative", "fog", "--model", made["model"], "--width",
                         "64", "--height", "64", "--steps", "2", "--seed", "7", "--cfg", "4", "--preset", "cpu",
                         "--outdir", str(tmp_path), "--json", "--init", made["init"], "--mask", made["mask"],
                         "--mask-blur", "0", "--strength", "1", "--controlnet", f"{made['cn']}:0.8",
                         "--control-image", made["control"])
    assert code == 0, err
    ours = pixels(json.loads(out)["images"][0])
    m = inside()
    assert np.abs(ours[m] - plain(made)[m]).max() <= MAX_DIFF
    assert np.array_equal(ours[~m], pixels(made["init"])[~m])
    without = Session(preset="cpu").generate(request(made, tmp_path / "plain", controlnets=()))
    assert np.abs(ours[m] - pixels(without.images[0])[m]).max() > 10


def test_mask_blur_and_only_masked_act(made, tmp_path):
    """A blurred mask keeps the init image where the blurred mask is black; only masked (inpaint_full_res) repaints
    the crop at the job's size and pastes it back: another image inside the mask, the init outside it."""
    from lowvram_gen.inpaint.masks import blurred, read

    session = Session(preset="cpu")
    init = pixels(made["init"])
    soft = np.asarray(blurred(read(made["mask"]), 4))
    out = pixels(session.generate(request(made, tmp_path / "blur", mask_blur=4)).images[0])
    assert np.array_equal(out[soft == 0], init[soft == 0])
    assert np.abs(out[inside()] - init[inside()]).mean() > 10
    whole = pixels(session.generate(request(made, tmp_path / "whole")).images[0])
    cropped = pixels(session.generate(request(made, tmp_path / "crop", inpaint_area="masked",
                                              mask_padding=4)).images[0])
    assert np.array_equal(cropped[~inside()], init[~inside()])
    assert np.abs(cropped[inside()] - whole[inside()]).max() > 10


def test_what_the_pipeline_does_not_use_is_one_of_the_jobs_warnings(made, tmp_path):
    """Both pipelines repaint the masked area from noise: a denoising strength below 1 is one warning. Qwen-Image's
    reads the init image through its inpainting ControlNet (diffusers' `control_image` is the image to repaint), so a
    unit's other control image is another warning; the init image given as the unit's image (a copy too) is none."""
    import shutil

    session, name = Session(preset="cpu"), CASES[made["key"]][2]
    result = session.generate(request(made, tmp_path, strength=0.6, steps=1))
    said = [f"{name} repaints the masked area from noise: denoising strength 0.6 is not used"]
    if made["key"] == "qwen-image":
        said.append(f"{name} reads the init image and the mask (its inpainting ControlNet's input), not a control "
                    "image: the unit's control image is not used")
    assert result.warnings == said
    if made["key"] == "qwen-image":
        copy = shutil.copy(made["init"], tmp_path / "init-copy.png")
        same = session.generate(request(made, tmp_path, steps=1, controlnets=(ControlNetUnit(made["cn"], copy, 0.8),)))
        assert same.warnings == []


def test_what_the_controlnet_inpaint_pipeline_has_not_is_refused_in_one_sentence(made, tmp_path):
    key, session = made["key"], Session(preset="cpu")
    label = "Qwen-Image" if key == "qwen-image" else "Z-Image"
    # a ControlNet that does not read the mask: the family's plain one (the txt2img tests' shape)
    from tiny_controlnets import BUILDERS

    plain_cn = made["root"] / "plain-cn"
    if not plain_cn.exists():
        BUILDERS[key]().save_pretrained(plain_cn, safe_serialization=True)
    unit = ControlNetUnit(made["cn"], made["control"], 0.8)
    # latent noise: Qwen-Image's refused here, Z-Image's already by its plain inpaint pipeline's check (inpaint.py)
    cases = [(dict(masked_content="latent-noise"), "masked content: 'latent-noise'|masked content 'latent-noise'"),
             (dict(controlnets=(ControlNetUnit(str(plain_cn), made["control"]),)),
              f"{label} ControlNet inpainting takes a ControlNet that reads the image and its mask"),
             (dict(controlnets=(unit, unit)), "runs one ControlNet unit, not 2"),
             (dict(mask=None), f"diffusers has no {label} ControlNet img2img pipeline")]
    if key == "qwen-image":  # its inpainting ControlNet reads the image to repaint: it has no txt2img use
        cases.append((dict(mask=None, init_image=None), "inpaint with it, an init image and a mask"))
    for fields, words in cases:
        with pytest.raises(InvalidRequest, match=words) as caught:
            session.generate(request(made, tmp_path, **fields))
        assert len(str(caught.value).splitlines()) == 1, caught.value


def test_the_plan_counts_the_inpainting_controlnet(made, capsys):
    args = ["plan", "--json", "--vram", "4GiB", "--model", made["model"], "--width", "512", "--height", "512"]
    code, out, err = cli(capsys, *args, "--controlnet", made["cn"])
    assert code == 0, err
    params = sum(p.numel() for p in CASES[made["key"]][1]().parameters())
    for row in json.loads(out)["presets"]:
        assert row["breakdown"]["controlnet_bytes"] in (2 * params, 4 * params), row["name"]


def test_out_of_memory_in_a_controlnet_inpaint_step_steps_down_without_reloading_it(made, tmp_path, monkeypatch):
    """Simulated: the ControlNet's forward raises torch.OutOfMemoryError once at highvram; the job finishes one rung
    down with the same ControlNet object, not loaded again, diffusers' image inside the mask."""
    _session, result = steps_down_once(monkeypatch, request(made, tmp_path, steps=1), request(made, tmp_path))
    m = inside()
    assert np.abs(pixels(result.images[0])[m] - plain(made)[m]).max() <= MAX_DIFF


def test_an_api_inpaint_body_with_a_unit_is_the_same_job(made, tmp_path):
    """A1111's img2img body with a mask and alwayson_scripts' unit, its masked content left at the API's default
    (inpainting_fill 0: fill, pixels the pipeline blanks anyway), maps onto the same job (a1111/api_body.map_body, as
    the REST API's img2img route runs it): diffusers' image inside the mask, the init image outside it."""
    from family_checks import b64, stored_images

    from lowvram_gen.a1111.api_body import map_body

    body = dict(prompt="a castle", negative_prompt="fog", seed=7, steps=2, width=64, height=64, cfg_scale=4,
                init_images=[b64(made["init"])], mask=b64(made["mask"]), mask_blur=0, denoising_strength=1.0,
                inpaint_full_res=False,  # A1111 defaults it to only masked (true)
                alwayson_scripts={"controlnet": {"args": [{"image": b64(made["control"]), "module": "none",
                                                           "model": made["cn"], "weight": 0.8}]}})
    mapped = map_body(body, "img2img", made["model"], 1, str(tmp_path), lambda title: None,
                      init_image=stored_images(tmp_path))
    assert mapped.request.masked_content == "fill" and len(mapped.request.controlnets) == 1
    ours = pixels(Session(preset="cpu").generate(mapped.request).images[0])
    m = inside()
    assert np.abs(ours[m] - plain(made)[m]).max() <= MAX_DIFF
    assert np.array_equal(ours[~m], pixels(made["init"])[~m])
