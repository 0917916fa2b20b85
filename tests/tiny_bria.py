"""Test utility: a tiny Bria pipeline (BriaPipeline) built offline with the shapes diffusers' own tests use
(tests/pipelines/bria/test_pipeline_bria.py, `get_dummy_components`): a BriaTransformer2DModel at one double- and one
single-stream block over 4-channel latents packed 2x2, a one-block AutoencoderKL, and a T5 encoder. The T5 tokenizer
is tests/tiny_transformers.py's offline one and the T5 model a small config of width 32 (the transformer's
joint_attention_dim), not diffusers' downloaded tiny-random-t5. Seeded random weights: the images are noise.
"""

from __future__ import annotations

import torch
from tiny_transformers import t5_tokenizer


def build_tiny_bria(wide: bool = False):
    """BriaPipeline over seeded tiny components. `wide`: a transformer 4 heads of 32 (128 wide) instead of 2 of 8
    (16), which sdnq's int8 skips as too narrow to quantize."""
    from diffusers import AutoencoderKL, BriaPipeline, BriaTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = BriaTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=32 if wide else 8,
        num_attention_heads=4 if wide else 2, joint_attention_dim=32, pooled_projection_dim=None,
        axes_dims_rope=[0, 16, 16] if wide else [0, 4, 4])
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=[32], in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"],
                        up_block_types=["UpDecoderBlock2D"], latent_channels=4, sample_size=32)
    tokenizer = t5_tokenizer()
    torch.manual_seed(0)
    text_encoder = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    return BriaPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                        text_encoder=text_encoder, tokenizer=tokenizer)
