"""Test utility: a tiny HiDream-I1 pipeline (HiDreamImagePipeline) built offline with the shapes diffusers' own tests
use (tests/pipelines/hidream_image/test_pipeline_hidream.py, `get_dummy_components`): the sparse (mixture-of-experts)
transformer at one double- and one single-stream block, two CLIP encoders with projections, a T5 encoder and a
Llama causal LM, and an AutoencoderKL.

Changes from diffusers' dummies, so it builds offline: the tokenizers are built here (CLIP's from
lowvram_gen.models.tiny, T5's from tests/tiny_transformers.py, Llama's a byte-level BPE as Llama 3's is, with its
<|begin_of_text|> / <|eot_id|> tokens), and the T5 and Llama models are made from small configs of the widths the
dummy transformer's caption_channels name (T5 32, Llama 16), not downloaded. The CLIP encoders take 128 positions:
the pipeline pads CLIP prompts to 128 tokens. The transformer's max_resolution is (128, 128), as the real config's:
the pipeline scales every size to its native area (128x128 latent pixels here, the VAE's scale factor being 1), and a
non-square latent is padded to max_resolution's patches, which diffusers' dummy (32, 32) is too small for. Seeded random weights: the images are noise.
"""

from __future__ import annotations

import torch
from tiny_flux2_dev import byte_level_tokenizer
from tiny_transformers import t5_tokenizer

T5_WIDTH, LLAMA_WIDTH, CLIP_WIDTH = 32, 16, 32


def _clip(seed: int):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        bos_token_id=512, eos_token_id=513, pad_token_id=513,  # lowvram_gen.models.tiny._tokenizer's ids
        hidden_size=CLIP_WIDTH, intermediate_size=37, layer_norm_eps=1e-05, num_attention_heads=4,
        num_hidden_layers=5, vocab_size=1000, hidden_act="gelu", projection_dim=CLIP_WIDTH,
        max_position_embeddings=128)
    torch.manual_seed(seed)
    return CLIPTextModelWithProjection(config)


def build_tiny_hidream(wide: bool = False):
    """HiDreamImagePipeline over seeded tiny components. `wide`: a transformer 4 heads of 32 (128 wide) instead of 4
    of 8 (32), which sdnq's int8 skips as too narrow to quantize."""
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline,
                           HiDreamImageTransformer2DModel)
    from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5EncoderModel

    from lowvram_gen.models.tiny import _tokenizer

    torch.manual_seed(0)
    transformer = HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
        attention_head_dim=32 if wide else 8, num_attention_heads=4, caption_channels=[T5_WIDTH, LLAMA_WIDTH],
        text_emb_dim=2 * CLIP_WIDTH, num_routed_experts=4, num_activated_experts=2,
        axes_dims_rope=(16, 8, 8) if wide else (4, 2, 2), max_resolution=(128, 128), llama_layers=(0, 1)).eval()
    torch.manual_seed(0)
    vae = AutoencoderKL(scaling_factor=0.3611, shift_factor=0.1159)
    tokenizer_3 = t5_tokenizer()
    torch.manual_seed(0)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer_3), d_model=T5_WIDTH, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0))
    tokenizer_4 = byte_level_tokenizer(("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"),
                                       bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                       pad_token="<|end_of_text|>", unk_token=None)
    special = tokenizer_4.convert_tokens_to_ids
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer_4), hidden_size=LLAMA_WIDTH, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=special("<|begin_of_text|>"), eos_token_id=special("<|end_of_text|>"),
        pad_token_id=special("<|end_of_text|>")))
    return HiDreamImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer,
        text_encoder=_clip(1), tokenizer=_tokenizer(), text_encoder_2=_clip(2), tokenizer_2=_tokenizer(),
        text_encoder_3=t5, tokenizer_3=tokenizer_3, text_encoder_4=llama, tokenizer_4=tokenizer_4)
