"""Test utility: the tiny SD model with an inpainting UNet (in_channels 9: latents, mask, masked image's latents),
as a diffusers folder and as one original-layout .safetensors (tests/ldm_layout.py), and test images and masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def build(tiny_folder, seed: int = 7):
    """StableDiffusionInpaintPipeline: the tiny model's VAE, text encoder and scheduler, and a UNet of the tiny's
    config with in_channels 9, seeded random weights."""
    import torch
    from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline, UNet2DConditionModel

    base = StableDiffusionPipeline.from_pretrained(str(tiny_folder))
    torch.manual_seed(seed)
    unet = UNet2DConditionModel.from_config({**dict(base.unet.config), "in_channels": 9})
    return StableDiffusionInpaintPipeline(vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
                                          unet=unet, scheduler=base.scheduler, safety_checker=None,
                                          feature_extractor=None, requires_safety_checker=False)


def save_folder(pipe, folder: Path) -> Path:
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder


def save_single_file(pipe, path: Path) -> Path:
    from safetensors.torch import save_file

    import ldm_layout  # tests/ldm_layout.py

    state = {k: v.contiguous() for k, v in ldm_layout.pipeline_to_ldm(pipe).items()}
    save_file(state, str(path))
    return path


def init_image(path: Path, side: int = 64) -> Path:
    """A gradient with a bright square: a picture whose every pixel differs from noise."""
    x = np.linspace(0, 255, side, dtype=np.float32)
    pixels = np.stack([np.tile(x, (side, 1)), np.tile(x[:, None], (1, side)), np.full((side, side), 90.0)], -1)
    pixels[side // 4:side // 2, side // 4:side // 2] = 230
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def mask_image(path: Path, box: tuple[int, int, int, int], size: tuple[int, int] = (64, 64)) -> Path:
    """White inside `box` (x0, y0, x1, y1), black elsewhere."""
    pixels = np.zeros((size[1], size[0]), dtype=np.uint8)
    x0, y0, x1, y1 = box
    pixels[y0:y1, x0:x1] = 255
    Image.fromarray(pixels).save(path)
    return path


def build_xl(tiny_xl_folder, seed: int = 8):
    """StableDiffusionXLInpaintPipeline: tiny-sdxl's components and a UNet of its config with in_channels 9."""
    import torch
    from diffusers import StableDiffusionXLInpaintPipeline, StableDiffusionXLPipeline, UNet2DConditionModel

    base = StableDiffusionXLPipeline.from_pretrained(str(tiny_xl_folder))
    torch.manual_seed(seed)
    unet = UNet2DConditionModel.from_config({**dict(base.unet.config), "in_channels": 9})
    parts = {k: v for k, v in base.components.items() if k != "unet"}
    return StableDiffusionXLInpaintPipeline(**parts, unet=unet)
