"""Test utility: LoRA files for the transformer families' tiny folders (issue 30), in the key layouts their users
download, built from seeded random numbers on the tiny transformer's real module names.

- 'diffusers': diffusers/peft keys, `transformer.<module>.lora_A.weight` / `lora_B.weight` (what diffusers' trainers
  save; SANA and Lumina 2 LoRAs on the hub are of this kind).
- 'kohya': sd-scripts' flattened names, `lora_unet_<module_with_underscores>.lora_down.weight` / `lora_up.weight` /
  `alpha` on diffusers' module names (Qwen-Image and Z-Image trainers; diffusers' converters read them).
- 'comfy': ComfyUI / ai-toolkit's `diffusion_model.<module>.lora_A.weight` on diffusers' module names (Qwen-Image,
  Z-Image).
- 'kohya-bfl': sd-scripts' flattened names on BFL's original layout (`lora_unet_double_blocks_0_img_attn_qkv`, fused
  q/k/v), as Flux.2 and Chroma LoRAs trained with sd-scripts / ComfyUI come.
- 'ai-toolkit-bfl': ai-toolkit's Flux.2 files, BFL's original layout under `diffusion_model.`
  (`diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight`), no alphas.
"""

from __future__ import annotations

import re

import torch

RANK = 4
# the attention projections every family's transformer has under one of these names
_ATTENTION = re.compile(r"(attn|attention)\d?\.(to_q|to_k|to_v|to_out\.0|to_out|add_q_proj|add_k_proj|add_v_proj|"
                        r"to_add_out)$")


def _linears(transformer):
    for name, module in transformer.named_modules():
        if isinstance(module, torch.nn.Linear) and _ATTENTION.search(name):
            yield name, module


def _pair(g, rows: int, cols: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(RANK, cols, generator=g) * scale, torch.randn(rows, RANK, generator=g) * scale


def lora_state(transformer, layout: str, seed: int = 0, scale: float = 0.5) -> dict:
    """A LoRA on `transformer`'s attention projections in `layout` (see the module doc). 'kohya-bfl-double': the
    double blocks only (diffusers' FLUX.1 converter, which Chroma's loader uses, splits a single block's linear1 at
    the real model's widths, so a tiny model's cannot be read)."""
    g = torch.Generator().manual_seed(seed)
    if layout.startswith("kohya-bfl"):
        return _bfl_state(transformer, g, scale, singles=layout == "kohya-bfl")
    if layout == "ai-toolkit-bfl":
        return _bfl_state(transformer, g, scale, singles=True, kohya=False)
    state = {}
    for name, m in _linears(transformer):
        down, up = _pair(g, m.out_features, m.in_features, scale)
        if layout == "diffusers":
            state[f"transformer.{name}.lora_A.weight"], state[f"transformer.{name}.lora_B.weight"] = down, up
        elif layout == "comfy":
            state[f"diffusion_model.{name}.lora_A.weight"], state[f"diffusion_model.{name}.lora_B.weight"] = down, up
        elif layout == "kohya":
            key = "lora_unet_" + name.replace(".", "_")
            state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"] = down, up
            state[f"{key}.alpha"] = torch.tensor(float(RANK) / 2)
        else:
            raise ValueError(f"unknown LoRA layout {layout!r}")
    return state


def _bfl_state(transformer, g, scale: float, singles: bool, kohya: bool = True) -> dict:
    """BFL's layout: per double block the image stream's fused qkv and its out projection, per single block
    linear1 (fused qkv + MLP in) and linear2, each kohya-flattened with an alpha (`kohya`), else ai-toolkit's
    dotted names under `diffusion_model.` with lora_A / lora_B."""
    state = {}

    def put(key: str, rows: int, cols: int):
        down, up = _pair(g, rows, cols, scale)
        if not kohya:
            dotted = re.sub(r"_(\d+)_", r".\1.", key).replace("_attn_", "_attn.")  # double_blocks.0.img_attn.qkv
            state[f"diffusion_model.{dotted}.lora_A.weight"], state[f"diffusion_model.{dotted}.lora_B.weight"] = down, up
            return
        state[f"lora_unet_{key}.lora_down.weight"], state[f"lora_unet_{key}.lora_up.weight"] = down, up
        state[f"lora_unet_{key}.alpha"] = torch.tensor(float(RANK) / 2)

    for i, block in enumerate(transformer.transformer_blocks):
        q = block.attn.to_q
        put(f"double_blocks_{i}_img_attn_qkv", 3 * q.out_features, q.in_features)
        out = block.attn.to_out[0]
        put(f"double_blocks_{i}_img_attn_proj", out.out_features, out.in_features)
    for i, block in enumerate(transformer.single_transformer_blocks if singles else ()):
        first = getattr(block.attn, "to_qkv_mlp_proj", None)  # Flux.2's fused linear1
        if first is None:  # FLUX.1's / Chroma's: q, k, v and the MLP's input side by side
            rows = 3 * block.attn.to_q.out_features + block.proj_mlp.out_features
            first_in = block.attn.to_q.in_features
        else:
            rows, first_in = first.out_features, first.in_features
        put(f"single_blocks_{i}_linear1", rows, first_in)
        second = getattr(block.attn, "to_out", None)  # Flux.2's linear2; FLUX.1's / Chroma's is the block's proj_out
        second = second if isinstance(second, torch.nn.Linear) else block.proj_out
        put(f"single_blocks_{i}_linear2", second.out_features, second.in_features)
    return state
