"""Test utility: tiny transformer pipelines built offline (Stable Diffusion 3 and FLUX.1-dev), an
offline T5 tokenizer, and the small helpers their tests share.

SD 1.x and SDXL take the split path (denoise, then our own VAE decode); every other pipeline takes
the generic one, where the pipeline decodes itself (engines/sd.py, `splits_decode`).

SD3 is a real such pipeline: a transformer denoiser with 2x2 patches (sides in multiples of 16), a
16-channel VAE with a shift factor, two CLIP encoders and no T5 (`text_encoder_3=None`, saved as null
in model_index.json), and a flow-matching scheduler.

Flux is the other transformer family the app claims (engines/sd.py `size_multiple`, memory.py's
"Flux" family): a transformer over 2x2-packed 16-channel latents (sides in multiples of 16), guidance
as an input of the transformer (FLUX.1-dev is guidance-distilled: no CFG batch, no negative prompt
unless true CFG), a CLIP encoder for a pooled vector and a T5 encoder for the token stream, and a
flow-matching scheduler with a resolution-dependent shift. No T5 tokenizer is available offline, so
one is built here from a small vocabulary.

Seeded random weights: the images are noise.
"""

from __future__ import annotations

import string

import numpy as np
import torch
from PIL import Image

from lowvram_gen.cli.main import main

T5_DIM = 32  # T5 d_model: the width of the text tokens the Flux transformer attends to


def vae_16_channels(scaling_factor: float, shift_factor: float):
    """SD3's and Flux's VAE layout: 16 latent channels, no quant convs, a shift factor (seeded)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(8, 16, 32, 32), in_channels=3, out_channels=3, latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=8, sample_size=128, use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=scaling_factor, shift_factor=shift_factor,
    )


def build_tiny_sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=2,
        caption_projection_dim=16,  # = heads x head dim: text and image tokens attend jointly
        joint_attention_dim=64,  # the two CLIP hidden states concatenated (32 + 32); the T5 slot is zeros
        pooled_projection_dim=64,  # the two CLIP projections concatenated (32 + 32)
        pos_embed_max_size=32,  # up to 512 px (32 patches a side)
    )
    vae = vae_16_channels(scaling_factor=1.5305, shift_factor=0.0609)  # SD3's
    return StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        text_encoder=_text_encoder(True, hidden=32, seed=1), tokenizer=_tokenizer(),
        text_encoder_2=_text_encoder(True, hidden=32, seed=2), tokenizer_2=_tokenizer(),
        text_encoder_3=None, tokenizer_3=None,
    )


def t5_tokenizer():
    """A T5 tokenizer built offline: T5's special tokens (<pad> 0, </s> 1, <unk> 2) and a Unigram
    (sentencepiece) vocabulary of single characters, word-initial ones marked with '▁' as T5's are."""
    from transformers import T5TokenizerFast

    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [("▁" + c, -3.0) for c in chars] + [(c, -4.0) for c in chars]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=512)


def build_tiny_flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer

    tokenizer_2 = t5_tokenizer()
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64,  # 16 latent channels packed 2x2 by the pipeline
        num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        axes_dims_rope=(4, 6, 6),  # sums to the head dim
        joint_attention_dim=T5_DIM,  # the T5 hidden states are the text tokens
        pooled_projection_dim=32,  # CLIP's pooled output (its hidden width)
        guidance_embeds=True,  # FLUX.1-dev: guidance is an input, not a doubled batch
    )
    vae = vae_16_channels(scaling_factor=0.3611, shift_factor=0.1159)  # Flux's
    torch.manual_seed(3)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer_2), d_model=T5_DIM, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",  # T5 v1.1, as FLUX's T5-XXL
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))
    scheduler = FlowMatchEulerDiscreteScheduler(  # FLUX.1-dev's scheduler config
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096,
    )
    return FluxPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler,
        text_encoder=_text_encoder(False, hidden=32, seed=1), tokenizer=_tokenizer(),
        text_encoder_2=t5, tokenizer_2=tokenizer_2,
    )


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err
