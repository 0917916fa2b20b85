"""The configs of transformer ControlNets (SD3's, Flux's, Qwen-Image's, Z-Image's, SANA's) from a single file's
tensor shapes, in diffusers' layout: the records' `ControlNetFacts.config_from_shapes` (models/transformer_controlnet.py
reads a file's header and calls it), and their completion from the base transformer's config (`from_base`).
Pure functions of {key: shape}, a missing key raising KeyError naming it; `zimage_from_values` alone reads one tensor.
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


def is_zimage(shapes: dict) -> bool:
    """A Z-Image ControlNet (alibaba-pai's Z-Image-Turbo-Fun-Controlnet-Union files, 1.x and 2.x, as diffusers'
    single-file loader recognises them): its control patch embedder beside its control layers."""
    return any(k.startswith("control_all_x_embedder.") for k in shapes) and \
        any(k.startswith("control_layers.") for k in shapes)


def zimage_config(shapes: dict) -> dict:
    """ZImageControlNetModel's config from a file's shapes. Its control layers' places among the transformer's layers
    and the norm epsilon are not in the file: `zimage_from_base` spreads them over the base's layers as the published
    configs do (6 of 30: every 5th; 15 of 30: every 2nd). Which refiner it has: blocks with their own projections
    (`before_proj`: Union 2.1's 'control_noise_refiner'), plain transformer blocks (1.0's), or none (2.0's: its control
    layers run over the noise refiner too, 'control_layers'); `zimage_from_values` corrects a 2.0 file that carries its
    unused refiner with zero projections, as diffusers' single-file loader does."""
    embedders = sorted(k for k in shapes if k.startswith("control_all_x_embedder.") and k.endswith(".weight"))
    sizes = [tuple(int(n) for n in k.split(".")[1].split("-")) for k in embedders]  # '2-1': patch 2, frame patch 1
    dim, inputs = shapes[embedders[0]]
    patch, frames = sizes[0]
    layers = _count(shapes, r"control_layers\.(\d+)\.")
    refiners = _count(shapes, r"control_noise_refiner\.(\d+)\.")
    norm = shapes.get("control_layers.0.attention.norm_q.weight")
    head = int(norm[0]) if norm else 128
    if "control_noise_refiner.0.before_proj.weight" in shapes:
        kind = "control_noise_refiner"
    else:
        kind = None if refiners else "control_layers"
    return {
        "_class_name": "ZImageControlNetModel", "control_layers_places": list(range(layers)),
        "control_refiner_layers_places": list(range(refiners or 2)), "control_in_dim": int(inputs // (patch ** 2 * frames)),
        "add_control_noise_refiner": kind, "all_patch_size": [p for p, _f in sizes],
        "all_f_patch_size": [f for _p, f in sizes], "dim": int(dim), "n_refiner_layers": refiners or 2,
        "n_heads": int(dim) // head, "n_kv_heads": int(shapes["control_layers.0.attention.to_k.weight"][0]) // head,
        "qk_norm": norm is not None,
    }


def zimage_from_values(config: dict, tensor) -> None:
    """A Union 2.0 file whose refiner projections are all zeros is 2.0 ('control_layers'), as diffusers'
    infer_diffusers_model_type reads it; `tensor(key)` reads one tensor of the file."""
    if config.get("add_control_noise_refiner") == "control_noise_refiner" and \
            not bool(tensor("control_noise_refiner.0.before_proj.weight").any()):
        config["add_control_noise_refiner"] = "control_layers"


def zimage_from_base(config: dict, base) -> None:
    """The control layers spread over the base transformer's layers (every n_layers // count-th, from 0), the refiner
    places over its refiner layers, and its norm epsilon."""
    count = len(config["control_layers_places"])
    step = max(1, int(base.get("n_layers", count)) // max(count, 1))
    config["control_layers_places"] = [i * step for i in range(count)]
    if config.get("add_control_noise_refiner") == "control_layers":
        refiners = int(base.get("n_refiner_layers", 2))
        config["control_refiner_layers_places"] = list(range(refiners))
        config["n_refiner_layers"] = refiners
    if "norm_eps" in base:
        config["norm_eps"] = base["norm_eps"]


def is_sana(shapes: dict) -> bool:
    """A SANA ControlNet in diffusers' layout (SanaControlNetModel's input block and caption projection)."""
    return "input_block.weight" in shapes and "caption_projection.linear_1.weight" in shapes


def sana_config(shapes: dict) -> dict:
    """SanaControlNetModel's config from a file's shapes; its head counts, output channels, sample size and norms are
    the base transformer's (`sana_from_base`)."""
    inner, in_channels, patch = shapes["patch_embed.proj.weight"][:3]
    inverted = shapes["transformer_blocks.0.ff.conv_inverted.weight"][0]
    cross = shapes["transformer_blocks.0.attn2.to_k.weight"]
    return {
        "_class_name": "SanaControlNetModel", "in_channels": int(in_channels), "patch_size": int(patch),
        "num_layers": _count(shapes, r"transformer_blocks\.(\d+)\."), "cross_attention_dim": int(cross[1]),
        "caption_channels": int(shapes["caption_projection.linear_1.weight"][1]),
        "mlp_ratio": inverted / (2 * inner),  # the GLU's inverted conv holds two halves of mlp_ratio x width
        "attention_bias": "transformer_blocks.0.attn1.to_q.bias" in shapes,
        # heads of 32 (SANA's) where they divide the widths: the counts the plan needs; the base's at load
        **_sana_heads(int(inner), int(cross[0]), 32, 32),
    }


def _sana_heads(inner: int, cross: int, head: int, cross_head: int) -> dict:
    head, cross_head = math.gcd(inner, head), math.gcd(cross, cross_head)
    return {"attention_head_dim": head, "num_attention_heads": inner // head, "cross_attention_head_dim": cross_head,
            "num_cross_attention_heads": cross // cross_head}


def sana_from_base(config: dict, base) -> None:
    """The base transformer's head widths (the file gives the widths alone), and what it shares with the base: output
    channels, sample size, norms, interpolation scale."""
    inner = config["attention_head_dim"] * config["num_attention_heads"]
    cross = config["cross_attention_head_dim"] * config["num_cross_attention_heads"]
    head = int(base.get("attention_head_dim", 32))
    config.update(_sana_heads(inner, cross, head, int(base.get("cross_attention_head_dim", head))))
    for key in ("out_channels", "sample_size", "norm_elementwise_affine", "norm_eps", "interpolation_scale"):
        if key in base:
            config[key] = base[key]


def qwen_image_other_layout(shapes: dict) -> str | None:
    """DiffSynth's Qwen-Image Blockwise ControlNets (ComfyUI's model_patches/): blocks of two norms and two projections
    beside the transformer's blocks, a model diffusers has no class for."""
    if any(re.match(r"controlnet_blocks\.\d+\.x_rms\.", k) for k in shapes):
        return ("this is DiffSynth's Qwen-Image Blockwise ControlNet (ComfyUI's model_patches/), which diffusers cannot "
                "run: give a diffusers Qwen-Image ControlNet instead (InstantX/Qwen-Image-ControlNet-Union, a folder or "
                "its .safetensors)")
    return None


def sana_other_layout(shapes: dict) -> str | None:
    """Efficient-Large-Model's original SANA ControlNet checkpoints (`controlnet.N.copied_block`), which diffusers
    converts with a script, not a loader."""
    if any(re.match(r"controlnet\.\d+\.copied_block\.", k) for k in shapes):
        return ("this is a SANA ControlNet in its original layout (Efficient-Large-Model's .pth), which diffusers' loaders "
                "do not read: give the diffusers' layout of it instead (the folder Efficient-Large-Model publishes with "
                "a name ending in _diffusers, or its diffusion_pytorch_model.safetensors)")
    return None
