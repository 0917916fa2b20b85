"""Test utility: a tiny CogView4 pipeline (CogView4Pipeline) built offline with the shapes diffusers' own tests use
(tests/pipelines/cogview4/test_cogview4.py, `get_dummy_components`): a 2-block CogView4Transformer2DModel, a 4x
AutoencoderKL and a GLM text model of width 32.

Changes from diffusers' dummies, so it builds offline and loads as the published folder does: the tokenizer is a
byte-level BPE built here with GLM-4's <|endoftext|> as its pad token (diffusers' test downloads CogView4-6B's), the
text encoder is a GlmModel (the published folder's class; the test's GlmForCausalLM gives the same hidden states),
and its vocabulary is the tokenizer's. The tokenizer starts every prompt with "[gMASK]<sop>", as GLM-4's does: an empty
(negative) prompt is those two tokens, never none (the pipeline's CFG without a negative prompt encodes ""). Seeded
random weights: the images are noise.
"""

from __future__ import annotations

import torch
from tiny_flux2_dev import byte_level_tokenizer


def build_tiny_cogview4(wide: bool = False):
    """CogView4Pipeline over seeded tiny components. `wide`: a transformer 4 heads of 32 (128 wide) instead of 4 of
    4 (16), which sdnq's int8 skips as too narrow to quantize."""
    from diffusers import AutoencoderKL, CogView4Pipeline, CogView4Transformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import GlmConfig, GlmModel

    torch.manual_seed(0)
    transformer = CogView4Transformer2DModel(
        patch_size=2, in_channels=4, num_layers=2, attention_head_dim=32 if wide else 4, num_attention_heads=4,
        out_channels=4, text_embed_dim=32, time_embed_dim=8, condition_dim=4)
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4, sample_size=128)
    torch.manual_seed(0)
    scheduler = FlowMatchEulerDiscreteScheduler(base_shift=0.25, max_shift=0.75, base_image_seq_len=256,
                                                use_dynamic_shifting=True, time_shift_type="linear")
    tokenizer = byte_level_tokenizer(("<|endoftext|>", "[gMASK]", "<sop>"), eos_token="<|endoftext|>",
                                     pad_token="<|endoftext|>")
    from tokenizers.processors import TemplateProcessing

    ids = tokenizer.convert_tokens_to_ids
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="[gMASK] <sop> $A", special_tokens=[("[gMASK]", ids("[gMASK]")), ("<sop>", ids("<sop>"))])
    torch.manual_seed(0)
    text_encoder = GlmModel(GlmConfig(hidden_size=32, intermediate_size=8, num_hidden_layers=2,
                                      num_attention_heads=4, head_dim=8, vocab_size=len(tokenizer),
                                      pad_token_id=tokenizer.pad_token_id))
    return CogView4Pipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                            scheduler=scheduler)
