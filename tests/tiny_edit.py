"""Test utility: tiny seeded editing-model pipelines built offline (issue 30, editing models), in the shapes diffusers'
own tests use (tests/pipelines/qwenimage/test_qwenimage_edit.py and test_qwenimage_edit_plus.py,
tests/pipelines/flux/test_pipeline_flux_kontext.py: get_dummy_components).

- Qwen-Image-Edit / Edit-Plus: tiny_qwen's transformer, VAE and scheduler, a Qwen2.5-VL of its shapes whose image
  tokens are the tokenizer's own (<|image_pad|>, <|vision_start|>, <|vision_end|>), and the processor the edit
  pipelines give the reference images to (Qwen2VLProcessor: the offline Qwen2 tokenizer and a Qwen2VLImageProcessor
  whose pixel bounds keep the vision tower's patches few).
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
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
    from tiny_qwen import build_tiny_qwen_image
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = qwen_vl_processor()
    tokenizer = processor.tokenizer
    qwen = build_tiny_qwen_image()  # its transformer, VAE and scheduler: Qwen-Image's test shapes
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
    # the text encoder is its own: its image token ids are the tokenizer's (tiny_qwen's never sees an image)
    return cls(transformer=qwen.transformer, vae=qwen.vae, scheduler=qwen.scheduler, text_encoder=text_encoder,
               tokenizer=tokenizer, processor=processor)


def build_tiny_kontext():
    """A FluxKontextPipeline over tiny_transformers' FLUX.1 components (diffusers' Kontext test shapes)."""
    from diffusers import FluxKontextPipeline
    from tiny_transformers import build_tiny_flux

    flux = build_tiny_flux()
    return FluxKontextPipeline(**flux.components)
