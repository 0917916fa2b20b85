"""Test utility: tiny seeded editing-model pipelines built offline (issue 30, editing models), in the shapes diffusers'
own tests use (tests/pipelines/qwenimage/test_qwenimage_edit.py and test_qwenimage_edit_plus.py,
tests/pipelines/flux/test_pipeline_flux_kontext.py: get_dummy_components).

- Qwen-Image-Edit / Edit-Plus: tiny_qwen's transformer, VAE and Qwen2.5-VL, plus the processor the edit pipelines
  give the reference images to (Qwen2VLProcessor: the offline Qwen2 tokenizer and a Qwen2VLImageProcessor whose
  pixel bounds keep the vision tower's patches few). The text encoder's image tokens are the tokenizer's own
  <|image_pad|> / <|vision_start|> / <|vision_end|>.
- FLUX.1 Kontext: tiny_transformers' FLUX.1 components (CLIP + T5 tiny) in a FluxKontextPipeline.
Flux.2 Klein's (its `image` references) is tests/tiny_flux2.py's. Seeded random weights: the images are noise.
"""

from __future__ import annotations

from tiny_tokenizers import qwen2_tokenizer


def qwen_vl_processor():
    """Qwen2.5-VL's processor built offline: the tiny Qwen2 tokenizer and an image processor made for small images
    (at most 112x112 pixels reach the vision tower: 64 patches of 14, merged 2x2)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    bounds = dict(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, temporal_patch_size=2, merge_size=2)
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**bounds), tokenizer=qwen2_tokenizer(),
                            video_processor=Qwen2VLVideoProcessor(**bounds))  # required by the class, never used


def build_tiny_qwen_image_edit(plus: bool = False):
    """A QwenImageEditPipeline (`plus`: QwenImageEditPlusPipeline) with diffusers' test shapes (float32, CPU)."""
    import torch
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline,
                           QwenImageEditPlusPipeline, QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = qwen_vl_processor()
    tokenizer = processor.tokenizer
    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4))
    torch.manual_seed(0)
    z_dim = 4
    vae = AutoencoderKLQwenImage(base_dim=z_dim * 6, z_dim=z_dim, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * z_dim,
                                 latents_std=[1.0] * z_dim)
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
        base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")
    torch.manual_seed(0)
    vocab = len(tokenizer)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
                     "num_key_value_heads": 2, "vocab_size": vocab,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
                     "rope_theta": 1000000.0},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": 16, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "fullatt_block_indexes": [1], "window_size": 56},
        hidden_size=16, vocab_size=vocab, vision_token_id=ids["image_token_id"], **ids)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    cls = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    return cls(transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=text_encoder,
               tokenizer=tokenizer, processor=processor)


def build_tiny_kontext():
    """A FluxKontextPipeline over tiny_transformers' FLUX.1 components (diffusers' Kontext test shapes)."""
    from diffusers import FluxKontextPipeline
    from tiny_transformers import build_tiny_flux

    flux = build_tiny_flux()
    return FluxKontextPipeline(**flux.components)
