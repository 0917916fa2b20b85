"""Issue 31: A1111's inpaint blend on SD 1.x and SDXL (engines/sd/a1111_blend.py). An inpaint job through the app
equals tests/ksampling_ref_inpaint.py, A1111's rule written around plain diffusers' UNet (each denoiser estimate
blended with the clean init latents; DDIM: the model's input; the final latents once more), within 2/255, for an
ordinary (4-channel) and an inpainting (9-channel) UNet, k-diffusion samplers (diffusers' schedulers given A1111's
levels, and one of ours in ksamplers/), DDIM, and a ControlNet inpaint; and differs from diffusers' own blend (the
latents blended after each step with the init noised to the next level), so the comparison can fail."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.session import Session

import controlnet_files as files_cn  # tests/controlnet_files.py
import inpaint_files as files  # tests/inpaint_files.py
import ksampling_ref as ref
import ksampling_ref_inpaint as inpaint_ref
import ksampling_ref_singlestep as singlestep

SEEDS, STEPS, STRENGTH, PROMPT = [5, 6], 4, 0.5, "a lighthouse"
BOX = (13, 18, 45, 43)  # a hard-edged mask not on the latent grid: its latent mask is rounded
# sampler -> (the reference, its A1111 schedule type)
SAMPLERS = {"Euler": (ref.euler, "uniform"), "Euler a": (ref.euler_ancestral, "uniform"),
            "DPM++ 2M": (ref.dpmpp_2m, "karras"), "DPM++ 2S a": (singlestep.dpmpp_2s_ancestral, "karras")}


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend")
    return {"init": files.init_image(root / "init.png"), "mask": files.mask_image(root / "mask.png", BOX),
            "root": root}


_PIPES = {}


def pipeline(folder, xl: bool):
    """The txt2img pipeline of the folder's components (an inpainting UNet's too): the reference's UNet and VAE."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    if str(folder) not in _PIPES:
        cls = StableDiffusionXLPipeline if xl else StableDiffusionPipeline
        _PIPES[str(folder)] = cls.from_pretrained(str(folder), **({} if xl else {"safety_checker": None}))
    return _PIPES[str(folder)]


def made(session, tmp_path, images, folder, **fields) -> list[np.ndarray]:
    result = session.generate(GenerationRequest(
        prompt=PROMPT, model=str(folder), outdir=str(tmp_path), width=64, height=64, cfg_scale=7.0, seed=SEEDS[0],
        batch_size=len(SEEDS), strength=STRENGTH, init_image=str(images["init"]), mask=str(images["mask"]),
        mask_blur=0, **{"steps": STEPS, **fields}))
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images]


def worst(got, want) -> int:
    return max(int(np.abs(a - b).max()) for a, b in zip(got, want, strict=True))


def open_images(images):
    return Image.open(images["init"]).convert("RGB"), Image.open(images["mask"]).convert("L")


def levels(pipe, kind: str, xl: bool):
    return a1111_sigmas.a1111(kind, STEPS, pipe.scheduler.alphas_cumprod.double().numpy(),
                              table="sdxl" if xl else "sd15")


def reference(pipe, sampler, images, xl):
    algorithm, kind = SAMPLERS[sampler]
    return inpaint_ref.inpaint(pipe, algorithm, levels(pipe, kind, xl), STRENGTH, *open_images(images), SEEDS,
                               PROMPT)


def assert_a1111s(got, want):
    assert worst(got, want) <= 2, f"max diff {worst(got, want)}/255"
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images


@pytest.mark.parametrize("model, sampler", [("tiny_path", "Euler"), ("tiny_path", "Euler a"), ("tiny_path", "DPM++ 2M"),
                                            ("tiny_path", "DPM++ 2S a"), ("tiny_sdxl_path", "Euler a"),
                                            ("tiny_sdxl_path", "DPM++ 2M")])
def test_inpaint_blends_each_estimate_as_a1111(session, tmp_path, images, request, model, sampler):
    """diffusers' Euler, Euler a and DPM++ 2M given A1111's levels, and our DPM++ 2S a (ksamplers/stepper.py)."""
    folder = request.getfixturevalue(model)
    xl = model == "tiny_sdxl_path"
    pipe = pipeline(folder, xl)
    got = made(session, tmp_path, images, folder, sampler=sampler)
    assert_a1111s(got, reference(pipe, sampler, images, xl))
    if sampler == "Euler a":  # diffusers' own blend makes another image: the comparison can fail
        theirs = inpaint_ref.euler_ancestral_diffusers_blend(pipe, levels(pipe, "uniform", xl), STRENGTH,
                                                             *open_images(images), SEEDS, PROMPT)
        assert worst(got, theirs) > 2


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
def test_an_inpainting_unet_blends_as_a1111(session, tmp_path, images, request, model):
    """A 9-channel UNet (tests/inpaint_files.py) is blended too, as A1111 blends it (diffusers does not blend it)."""
    xl = model == "tiny_sdxl_path"
    base = request.getfixturevalue(model)
    folder = images["root"] / f"inpainting-{model}"
    if not folder.exists():
        files.save_folder(files.build_xl(base) if xl else files.build(base), folder)
    pipe = pipeline(folder, xl)
    assert pipe.unet.config.in_channels == 9
    got = made(session, tmp_path, images, folder, sampler="Euler")
    assert_a1111s(got, reference(pipe, "Euler", images, xl))
    unblended = inpaint_ref.inpaint(pipe, ref.euler, levels(pipe, "uniform", xl), STRENGTH, *open_images(images),
                                    SEEDS, PROMPT, blend=False)
    assert worst(got, unblended) > 2


def test_ddim_blends_the_models_input_as_a1111(session, tmp_path, images, tiny_path):
    """A1111's timestep samplers blend the x each model call is given (its CFGDenoiserTimesteps' mask before
    denoising), not the estimate. 8 steps at 0.5: the init noised to A1111's timestep 4, then 3 DDIM calls."""
    pipe = pipeline(tiny_path, False)
    got = made(session, tmp_path, images, tiny_path, sampler="DDIM", steps=8)
    assert_a1111s(got, inpaint_ref.inpaint_ddim(pipe, 8, STRENGTH, *open_images(images), SEEDS, PROMPT))


def test_controlnet_inpaint_blends_as_a1111(session, tmp_path, images, tiny_path):
    """The ControlNet inpaint pipeline's pass (engines/sd/controlnet.py) is blended by the same hook: a unit at its
    defaults (full weight in every step) with the tiny SD model, against the reference with the ControlNet's
    residuals in each UNet call; without the unit the image differs."""
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel

    from lowvram_gen.control.units import ControlNetUnit

    net = files_cn.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=1)
    folder = files_cn.save_folder(net, images["root"] / "tiny-cn")
    control = images["root"] / "control.png"
    square = np.zeros((64, 64, 3), dtype=np.uint8)
    square[12:44, 20:52] = 255
    Image.fromarray(square).save(control)
    pipe = pipeline(tiny_path, False)
    got = made(session, tmp_path, images, tiny_path, sampler="Euler a",
               controlnets=(ControlNetUnit(str(folder), str(control)),))
    hint = torch.from_numpy(square.astype(np.float32) / 255).permute(2, 0, 1)[None]
    want = inpaint_ref.inpaint(pipe, ref.euler_ancestral, levels(pipe, "uniform", False), STRENGTH,
                               *open_images(images), SEEDS, PROMPT, control=(ControlNetModel.from_pretrained(folder),
                                                                             hint))
    assert_a1111s(got, want)
    assert worst(got, reference(pipe, "Euler a", images, False)) > 2
