"""The configs of transformer ControlNets (SD3's, Flux's, Qwen-Image's) from a single file's tensor shapes, in
diffusers' layout: the records' `ControlNetFacts.config_from_shapes` (models/transformer_controlnet.py reads a file's
header and calls it).
Pure functions of {key: shape}; a missing key raises KeyError naming it.
"""

from __future__ import annotations

import math
import re


def _count(shapes: dict, pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in shapes for m in [rx.match(k)] if m})


def _head_dim(shapes: dict, inner: int, default: int) -> tuple[int, int]:
    """(heads, head width): the q norm's width where there is one, else `default` (the base's, or 64)."""
    norm = next((v for k, v in sorted(shapes.items()) if k.endswith("attn.norm_q.weight")), None)
    head = int(norm[0]) if norm else int(default)
    if inner % head:
        head = math.gcd(inner, head)
    return inner // head, head


def sd3_config(shapes: dict) -> dict:
    inner, cond_in = shapes["pos_embed_input.proj.weight"][:2]
    patch = shapes["pos_embed_input.proj.weight"][2]
    has_pos = "pos_embed.proj.weight" in shapes
    in_channels = shapes["pos_embed.proj.weight"][1] if has_pos else 16
    layers = _count(shapes, r"transformer_blocks\.(\d+)\.")
    context = shapes.get("context_embedder.weight")
    heads, head = _head_dim(shapes, inner, 64)
    config = {
        "_class_name": "SD3ControlNetModel", "patch_size": int(patch), "in_channels": int(in_channels),
        "num_layers": layers, "attention_head_dim": head, "num_attention_heads": heads,
        "joint_attention_dim": int(context[1]) if context else None,
        "caption_projection_dim": int(context[0]) if context else int(inner),
        "pooled_projection_dim": int(shapes["time_text_embed.text_embedder.linear_1.weight"][1]),
        "extra_conditioning_channels": int(cond_in - in_channels),
        "dual_attention_layers": [i for i in range(layers) if f"transformer_blocks.{i}.attn2.to_q.weight" in shapes],
        "qk_norm": None, "use_pos_embed": has_pos, "force_zeros_for_pooled_projection": context is not None,
    }
    if any(k.endswith("attn.norm_q.weight") for k in shapes):
        config["qk_norm"] = "layer_norm" if any(k.endswith("attn.norm_q.bias") for k in shapes) else "rms_norm"
    if "pos_embed.pos_embed" in shapes:
        config["pos_embed_max_size"] = math.isqrt(int(shapes["pos_embed.pos_embed"][1]))
    return config


def flux_config(shapes: dict) -> dict:
    inner, in_channels = shapes["x_embedder.weight"]
    heads, head = _head_dim(shapes, inner, 128)
    hint = shapes.get("input_hint_block.conv_in.weight")
    mode = shapes.get("controlnet_mode_embedder.weight")
    return {
        "_class_name": "FluxControlNetModel", "patch_size": 1, "in_channels": int(in_channels),
        "num_layers": _count(shapes, r"transformer_blocks\.(\d+)\."),
        "num_single_layers": _count(shapes, r"single_transformer_blocks\.(\d+)\."),
        "attention_head_dim": head, "num_attention_heads": heads,
        "joint_attention_dim": int(shapes["context_embedder.weight"][1]),
        "pooled_projection_dim": int(shapes["time_text_embed.text_embedder.linear_1.weight"][1]),
        "guidance_embeds": any(k.startswith("time_text_embed.guidance_embedder.") for k in shapes),
        "num_mode": int(mode[0]) if mode else None,
        "conditioning_embedding_channels": int(hint[1]) if hint else None,
    }


def is_qwen_image(shapes: dict) -> bool:
    """A Qwen-Image ControlNet in diffusers' layout (InstantX's, DiffSynth's): the text norm and image input of
    Qwen-Image's transformer beside the ControlNet's own input (`controlnet_x_embedder`)."""
    return "controlnet_x_embedder.weight" in shapes and "txt_norm.weight" in shapes and "img_in.weight" in shapes


def qwen_image_config(shapes: dict) -> dict:
    inner, in_channels = shapes["img_in.weight"]
    heads, head = _head_dim(shapes, inner, 128)
    return {
        "_class_name": "QwenImageControlNetModel", "patch_size": 2, "in_channels": int(in_channels),
        "num_layers": _count(shapes, r"transformer_blocks\.(\d+)\."),
        "attention_head_dim": head, "num_attention_heads": heads,
        "joint_attention_dim": int(shapes["txt_in.weight"][1]),
        # the inpainting ControlNet reads the masked image's latents and the mask beside the control image's
        "extra_condition_channels": int(shapes["controlnet_x_embedder.weight"][1] - in_channels),
    }


def qwen_image_from_base(config: dict, base) -> None:
    """A Qwen-Image ControlNet's rope axes (where they fit its head width) and output channels are the base
    transformer's."""
    axes = base.get("axes_dims_rope")
    if axes and sum(axes) == config["attention_head_dim"]:
        config["axes_dims_rope"] = list(axes)
    if "out_channels" in base:
        config["out_channels"] = base["out_channels"]
