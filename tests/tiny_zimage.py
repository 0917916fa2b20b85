"""Test utility: a tiny Z-Image pipeline (ZImagePipeline) built offline with the shapes diffusers' own tests use
(tests/pipelines/z_image/test_z_image.py, `get_dummy_components`), with the offline Qwen2 tokenizer
(tests/tiny_tokenizers.py: Qwen's chat template with enable_thinking) and a Qwen3 text encoder whose vocabulary is
that tokenizer's. The transformer's pad tokens are fixed to ones as diffusers' test does (they are made with
torch.empty). Seeded random weights: the images are noise.
"""

from __future__ import annotations

import torch
from tiny_tokenizers import qwen2_tokenizer

DIM = 32  # the transformer's width (dim): what `plan` must read as transformer_hidden


def build_tiny_zimage():
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = qwen2_tokenizer()
    torch.manual_seed(0)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=DIM, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
        axes_dims=[8, 4, 4], axes_lens=[256, 32, 32])
    with torch.no_grad():
        transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token.data))
        transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token.data))
    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], block_out_channels=[32, 64], layers_per_block=1,
        latent_channels=16, norm_num_groups=32, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159)
    torch.manual_seed(0)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=len(tokenizer), max_position_embeddings=512))
    return ZImagePipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                          text_encoder=text_encoder, tokenizer=tokenizer)
