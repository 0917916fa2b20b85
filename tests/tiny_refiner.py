"""Test utility: a tiny seeded SDXL refiner (issue 32 item 5), in the shape diffusers' own refiner tests use
(tests/pipelines/stable_diffusion_xl/test_stable_diffusion_xl_img2img.py, get_dummy_components with
skip_first_text_encoder=True, requires_aesthetics_score=True): a StableDiffusionXLImg2ImgPipeline with no first text
encoder, the second one (OpenCLIP-G's place) and a UNet whose added conditioning is 5 time ids (original size, crop,
aesthetic score) and the pooled text embeds. Its encoder is tiny-sdxl's second (seed 2), as the real refiner shares
OpenCLIP-G with the base. Seeded random weights: the images are noise.
"""

from __future__ import annotations


def build_tiny_refiner():
    """The refiner pipeline, float32 on the CPU."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline, UNet2DConditionModel

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer, _vae

    torch.manual_seed(5)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=128,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=72,  # 5 * 8 (time ids with the aesthetic score) + 32 (pooled)
        cross_attention_dim=32,  # text_encoder_2's hidden states alone
        norm_num_groups=8,
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
        steps_offset=1, timestep_spacing="leading", interpolation_type="linear", prediction_type="epsilon",
    )
    return StableDiffusionXLImg2ImgPipeline(
        unet=unet, vae=_vae(), text_encoder=None, text_encoder_2=_text_encoder(True, seed=2), tokenizer=None,
        tokenizer_2=_tokenizer(), scheduler=scheduler, requires_aesthetics_score=True,
        force_zeros_for_empty_prompt=False,
    )


def save_tiny_refiner(folder) -> str:
    """The refiner saved as a diffusers folder at `folder`; returns its path as a string."""
    build_tiny_refiner().save_pretrained(str(folder))
    return str(folder)
