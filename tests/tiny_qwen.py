"""Test utility: a tiny seeded Qwen-Image pipeline built offline (issue 30), in the shapes diffusers' own tests use
(tests/pipelines/qwenimage/test_qwenimage.py, get_dummy_components).

Qwen-Image is a dual-stream MMDiT (QwenImageTransformer2DModel) over a Wan-style VAE's latents (AutoencoderKLQwenImage,
8x down, one latent frame) that the pipeline packs 2x2 into the transformer's input channels (16 = 4 x 2^2 here,
64 = 16 x 2^2 in the real one); its text encoder is Qwen2.5-VL's language model (Qwen2_5_VLForConditionalGeneration),
prompted through a chat template whose first 34 tokens the pipeline drops; CFG is "true" CFG (`true_cfg_scale` with a
negative prompt: two forwards, not a doubled batch); the scheduler is flow-matching with a resolution shift.

The tokenizer is tests/tiny_tokenizers.qwen2_tokenizer() (offline, tiny vocabulary); the text encoder's vocabulary is
its length. Seeded random weights: the images are noise.
"""

from __future__ import annotations

from tiny_tokenizers import qwen2_tokenizer


def build_tiny_qwen_image(num_layers: int = 2, wide: bool = False):
    """A QwenImagePipeline with diffusers' test shapes (float32, CPU). `wide`: a transformer 4 heads of 32 wide (128)
    instead of 3 of 16 (48), which sdnq's int8 skips as too narrow to quantize."""
    import torch
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen2_tokenizer()
    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=num_layers, attention_head_dim=32 if wide else 16,
        num_attention_heads=4 if wide else 3, joint_attention_dim=16, guidance_embeds=False,
        axes_dims_rope=(8, 12, 12) if wide else (8, 4, 4))  # the rope axes sum to the head width
    torch.manual_seed(0)
    z_dim = 4
    vae = AutoencoderKLQwenImage(base_dim=z_dim * 6, z_dim=z_dim, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * z_dim,
                                 latents_std=[1.0] * z_dim)
    # Qwen-Image's own scheduler config (the published scheduler_config.json): shift by image length
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
        base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")
    torch.manual_seed(0)
    vocab = len(tokenizer)
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,  # ids within the tiny vocabulary
                     "num_key_value_heads": 2, "vocab_size": vocab,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
                     "rope_theta": 1000000.0},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": 16},
        hidden_size=16, vocab_size=vocab, vision_end_token_id=vocab - 1, vision_start_token_id=vocab - 2,
        vision_token_id=vocab - 3)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    return QwenImagePipeline(transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=text_encoder,
                             tokenizer=tokenizer)
