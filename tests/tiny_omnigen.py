"""Test utility: a tiny OmniGen pipeline (OmniGenPipeline) built offline with the shapes diffusers' own tests use
(tests/pipelines/omnigen/test_pipeline_omnigen.py, `get_dummy_components`): an OmniGenTransformer2DModel of one
layer, 16 wide (4 heads), over 4-channel latents in 2x2 patches, a four-block AutoencoderKL of 4 channels, and the
scheduler diffusers' test gives it. The tokenizer is tests/tiny_transformers.py's offline T5 one, not the downloaded
hf-internal-testing/llama-tokenizer (the transformer embeds whatever ids it is given). Seeded random weights: the
images are noise.
"""

from __future__ import annotations

import torch
from tiny_transformers import t5_tokenizer


def build_tiny_omnigen(wide: bool = False):
    """OmniGenPipeline over seeded tiny components. `wide`: a transformer 128 wide (4 heads of 32) instead of 16,
    which sdnq's int8 skips as too narrow to quantize."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, OmniGenPipeline, OmniGenTransformer2DModel

    torch.manual_seed(0)
    transformer = OmniGenTransformer2DModel(
        hidden_size=128 if wide else 16, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=256 if wide else 32, num_layers=1, in_channels=4, time_step_dim=4,
        rope_scaling={"long_factor": list(range(1, 17 if wide else 3)), "short_factor": list(range(1, 17 if wide else 3))})
    torch.manual_seed(0)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4, 4, 4, 4),
                        layers_per_block=1, latent_channels=4, norm_num_groups=1,
                        up_block_types=["UpDecoderBlock2D"] * 4)
    scheduler = FlowMatchEulerDiscreteScheduler(invert_sigmas=True, num_train_timesteps=1)
    return OmniGenPipeline(transformer=transformer, vae=vae, scheduler=scheduler, tokenizer=t5_tokenizer())
