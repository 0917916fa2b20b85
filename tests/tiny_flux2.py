"""Test utility: a tiny Flux.2 Klein pipeline (Flux2KleinPipeline) built offline with the shapes diffusers' own
tests use (tests/pipelines/flux2/test_pipeline_flux2_klein.py, `get_dummy_components`).

Two changes from diffusers' dummies, both so the pipeline runs as its users call it (no test-only arguments): the
tokenizer is the offline Qwen2 one (tests/tiny_tokenizers.py, Qwen's chat template with enable_thinking), and the
Qwen3 text encoder has 28 layers (of width 16) because the call reads hidden states 9, 18 and 27 by default
(`text_encoder_out_layers`), which diffusers' test overrides to (1,). The transformer's joint_attention_dim is
those three layers side by side (3 x 16). Seeded random weights: the images are noise.
"""

from __future__ import annotations

import torch
from tiny_tokenizers import qwen2_tokenizer

QWEN_WIDTH = 16
QWEN_LAYERS = 28  # hidden_states[27] exists: the embeddings and 27 layers, and one more
OUT_LAYERS = 3  # (9, 18, 27): the call's default text_encoder_out_layers


def build_tiny_flux2_klein(distilled: bool = False):
    """Flux2KleinPipeline over seeded tiny components; `distilled`: the pipeline's is_distilled (Klein 4B/9B:
    guidance ignored, no CFG) instead of the base models' CFG with an empty negative prompt."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, \
        Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = qwen2_tokenizer()
    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=QWEN_WIDTH * OUT_LAYERS, timestep_guidance_channels=256,
        axes_dims_rope=[4, 4, 4, 4], guidance_embeds=False)
    torch.manual_seed(0)
    text_encoder = Qwen3ForCausalLM(Qwen3Config(
        intermediate_size=16, hidden_size=QWEN_WIDTH, num_hidden_layers=QWEN_LAYERS, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=512))
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(
        sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",), block_out_channels=(4,), layers_per_block=1, latent_channels=1,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False)
    return Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                              tokenizer=tokenizer, transformer=transformer, is_distilled=distilled)
