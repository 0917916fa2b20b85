"""Test utility: tiny SANA, Chroma and Lumina 2 pipelines built offline (issue 30), with the shapes diffusers'
own tests use (tests/pipelines/sana/test_sana.py, chroma/test_pipeline_chroma.py, lumina2/test_pipeline_lumina2.py,
`get_dummy_components`), widened only where our CLI needs it:

- SANA: a linear-attention transformer over a DC-AE VAE. Its VAE here has six stages, as the real DC-AE's, so one
  latent pixel is 32x32 image pixels (sides in multiples of 32); a Gemma 2 text encoder; `sample_size` 16, so the
  pipeline's resolution binning (on by default) works at the 512 bins, not 1024 ones.
- Chroma: FLUX.1's layout without CLIP or guidance embedding, a T5 encoder, real CFG (two forwards).
- Lumina 2: a Gemma 2 text encoder, real CFG with its normalisation (two forwards).

Chroma's and Lumina 2's VAEs have four stages (8x, as the real ones); diffusers' tests use one (1x). Seeded random
weights: the images are noise. Tokenizers: tests/tiny_tokenizers.gemma_tokenizer, tiny_transformers.t5_tokenizer.
"""

from __future__ import annotations

import torch
from tiny_tokenizers import gemma_tokenizer
from tiny_transformers import t5_tokenizer


def _gemma2(hidden: int, vocab: int):
    """A one-layer Gemma 2 encoder (diffusers' tests' config; the vocabulary is the tokenizer's)."""
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(0)
    return Gemma2Model(Gemma2Config(
        head_dim=16, hidden_size=hidden, initializer_range=0.02, intermediate_size=64, max_position_embeddings=8192,
        num_attention_heads=2, num_hidden_layers=1, num_key_value_heads=2, vocab_size=vocab,
        attn_implementation="eager")).eval()


def _vae_8x(latent_channels: int):
    """A four-stage AutoencoderKL (8x, FLUX.1's shift and scale as diffusers' Chroma and Lumina 2 tests use)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8, 8, 8, 8),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, latent_channels=latent_channels, norm_num_groups=4, use_quant_conv=False,
        use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035).eval()


def build_tiny_sana():
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel

    tokenizer = gemma_tokenizer(model_max_length=8192)
    torch.manual_seed(0)
    transformer = SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2, attention_head_dim=4,
        num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=16)
    torch.manual_seed(0)
    vae = AutoencoderDC(  # six stages as the real DC-AE (32x); diffusers' test has two
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
        decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
        encoder_block_out_channels=(8,) * 6, decoder_block_out_channels=(8,) * 6,
        encoder_qkv_multiscales=((),) * 3 + ((5,),) * 3, decoder_qkv_multiscales=((),) * 3 + ((5,),) * 3,
        encoder_layers_per_block=(1,) * 6, decoder_layers_per_block=(1,) * 6,
        downsample_block_type="conv", upsample_block_type="interpolate", decoder_norm_types="rms_norm",
        decoder_act_fns="silu", scaling_factor=0.41407).eval()
    return SanaPipeline(transformer=transformer.eval(), vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                        text_encoder=_gemma2(8, len(tokenizer)), tokenizer=tokenizer)


def build_tiny_chroma():
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import T5Config, T5EncoderModel

    tokenizer = t5_tokenizer()
    torch.manual_seed(0)
    transformer = ChromaTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, axes_dims_rope=[4, 4, 8], approximator_hidden_dim=32, approximator_layers=1,
        approximator_num_channels=16)
    torch.manual_seed(3)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0)).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(  # Chroma1-HD's (FLUX.1's dynamic shift)
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096)
    return ChromaPipeline(transformer=transformer.eval(), vae=_vae_8x(1), scheduler=scheduler, text_encoder=t5,
                          tokenizer=tokenizer, image_encoder=None, feature_extractor=None)


def build_tiny_lumina2():
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel

    tokenizer = gemma_tokenizer(model_max_length=8192)
    torch.manual_seed(0)
    transformer = Lumina2Transformer2DModel(
        sample_size=4, patch_size=2, in_channels=4, hidden_size=8, num_layers=2, num_attention_heads=1,
        num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5, scaling_factor=1.0,
        axes_dim_rope=[4, 2, 2], cap_feat_dim=8)
    return Lumina2Pipeline(transformer=transformer.eval(), vae=_vae_8x(4), scheduler=FlowMatchEulerDiscreteScheduler(),
                           text_encoder=_gemma2(8, len(tokenizer)), tokenizer=tokenizer)


BUILDERS = {"sana": build_tiny_sana, "chroma": build_tiny_chroma, "lumina2": build_tiny_lumina2}
