"""The ControlNet config diffusers makes of a base model's denoiser config (`ControlNetModel.from_unet`, an SD3 or
Flux ControlNet's `from_transformer`), and of a built-in base model (`known_config`: `sd15`, `sdxl`, ...): the
config a single file's shapes are completed from, and the known sizes `plan` counts. Plain JSON, no torch.
"""

from __future__ import annotations

import json

from lowvram_gen import families
from lowvram_gen.models.profile import CONFIGS

# ControlNetModel's config keys that diffusers' from_unet copies from the UNet's config
FROM_UNET = ("in_channels", "flip_sin_to_cos", "freq_shift", "down_block_types", "only_cross_attention",
             "block_out_channels", "layers_per_block", "downsample_padding", "mid_block_scale_factor", "act_fn",
             "norm_num_groups", "norm_eps", "cross_attention_dim", "attention_head_dim", "num_attention_heads",
             "use_linear_projection", "class_embed_type", "num_class_embeds", "upcast_attention",
             "resnet_time_scale_shift", "projection_class_embeddings_input_dim", "mid_block_type",
             "transformer_layers_per_block", "encoder_hid_dim", "encoder_hid_dim_type", "addition_embed_type",
             "addition_time_embed_dim")


def known_config(name: str) -> dict | None:
    """The ControlNet config diffusers' from_unet makes of a built-in base model's UNet (`sd15`, `sdxl`, ... and
    their aliases), or None for another name."""
    family = families.by_name(name)
    key = family.builtin if family is not None else None
    if key is not None and (CONFIGS / key / "transformer" / "config.json").is_file():
        return from_transformer_config(json.loads((CONFIGS / key / "transformer" / "config.json").read_text()))
    if key is None or not (CONFIGS / key / "unet" / "config.json").is_file():
        return None
    unet = json.loads((CONFIGS / key / "unet" / "config.json").read_text())
    return from_unet_config(unet)


def from_transformer_config(transformer: dict) -> dict | None:
    """The SD3/Flux ControlNet config diffusers' from_transformer makes of a transformer config with its defaults:
    what the family of that transformer class says from_transformer sets (SD3: 12 blocks; Flux: 4 double and 10
    single blocks at 24 heads of 128), the plain ControlNet (SD3's default adds the inpainting one's extra input
    channel). None for a transformer no family has a ControlNet for."""
    family = families.by_denoiser_class(str(transformer.get("_class_name")))
    if family is None or family.controlnet is None or not family.controlnet.from_transformer:
        return None
    config = {k: v for k, v in transformer.items() if not k.startswith("_")}
    return {**config, **family.controlnet.from_transformer, "_class_name": family.controlnet.model_class}


def from_unet_config(unet: dict) -> dict:
    """ControlNetModel's config for a UNet config, as ControlNetModel.from_unet builds it."""
    config = {k: unet[k] for k in FROM_UNET if k in unet}
    config.update(_class_name="ControlNetModel", conditioning_embedding_out_channels=[16, 32, 96, 256],
                  conditioning_channels=3, controlnet_conditioning_channel_order="rgb")
    return config
