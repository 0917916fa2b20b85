"""Test utility: a tiny seeded SDXL refiner (issue 32 item 5), in the shape diffusers' own refiner tests use
(tests/pipelines/stable_diffusion_xl/test_stable_diffusion_xl_img2img.py, get_dummy_components with
skip_first_text_encoder=True, requires_aesthetics_score=True): a StableDiffusionXLImg2ImgPipeline with no first text
encoder, the second one (OpenCLIP-G's place) and a UNet whose added conditioning is 5 time ids (original size, crop,
aesthetic score) and the pooled text embeds. Its encoder is tiny-sdxl's second (seed 2), as the real refiner shares
OpenCLIP-G with the base. Seeded random weights: the images are noise.
"""

from __future__ import annotations


def build_tiny_refiner():
    """The refiner pipeline, float32 on the CPU: tiny-sdxl's UNet shape with the refiner's cross-attention (the second
    encoder's 32 features alone) and added conditioning (5 time ids of 8 + the 32 pooled), its own seeded weights."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline, UNet2DConditionModel

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer, _vae, ensure_tiny

    base = ensure_tiny("tiny-sdxl")
    config = UNet2DConditionModel.load_config(str(base / "unet"))
    torch.manual_seed(5)
    unet = UNet2DConditionModel.from_config(dict(config, cross_attention_dim=32,
                                                 projection_class_embeddings_input_dim=5 * 8 + 32))
    return StableDiffusionXLImg2ImgPipeline(
        unet=unet, vae=_vae(), text_encoder=None, text_encoder_2=_text_encoder(True, seed=2), tokenizer=None,
        tokenizer_2=_tokenizer(), scheduler=EulerDiscreteScheduler.from_pretrained(str(base / "scheduler")),
        requires_aesthetics_score=True, force_zeros_for_empty_prompt=False,
    )


def save_tiny_refiner(folder) -> str:
    """The refiner saved as a diffusers folder at `folder`; returns its path as a string."""
    build_tiny_refiner().save_pretrained(str(folder))
    return str(folder)
