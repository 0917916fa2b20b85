"""Tiny LoRA and embedding files for the embedded tiny models, built here from seeded random numbers.

Layouts as found in the wild: kohya/A1111 (`lora_unet_<module_with_underscores>.lora_down.weight`,
`.lora_up.weight`, `.alpha`; `lora_te_text_model_...` / `lora_te1_` / `lora_te2_` for text encoders)
and diffusers/peft (`unet.<module>.lora_A.weight`, `lora_B`; `text_encoder.<module>...`).
"""

from __future__ import annotations

from pathlib import Path

import torch

RANK = 4


def _linears(module, only_attention: bool):
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear) and (not only_attention or ".attn" in name or "self_attn" in name):
            yield name, m


def _pair(m, g, scale):
    down = torch.randn(RANK, m.in_features, generator=g) * scale
    up = torch.randn(m.out_features, RANK, generator=g) * scale
    return down, up


def kohya_state(pipe, seed: int = 0, scale: float = 0.5, text: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, m in _linears(pipe.unet, True):
        key = "lora_unet_" + name.replace(".", "_")
        state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"] = _pair(m, g, scale)
        state[f"{key}.alpha"] = torch.tensor(float(RANK) / 2)
    encoders = [("text_encoder", "lora_te_" if getattr(pipe, "text_encoder_2", None) is None else "lora_te1_"),
                ("text_encoder_2", "lora_te2_")]
    for attr, prefix in encoders if text else []:
        encoder = getattr(pipe, attr, None)
        if encoder is None:
            continue
        for name, m in _linears(encoder, False):
            name = name.removeprefix("text_model.")  # transformers 5 flattens CLIPTextModel, not ...WithProjection
            key = prefix + "text_model_" + name.replace(".", "_")  # A1111 files name CLIP's text_model
            state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"] = _pair(m, g, scale)
            state[f"{key}.alpha"] = torch.tensor(float(RANK))
    return state


def peft_state(pipe, seed: int = 1, scale: float = 0.5) -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {}
    for attr in ("unet", "text_encoder", "text_encoder_2"):
        module = getattr(pipe, attr, None)
        if module is None:
            continue
        for name, m in _linears(module, attr == "unet"):
            down, up = _pair(m, g, scale)
            path = name if attr == "unet" else "text_model." + name.removeprefix("text_model.")  # as files saved with transformers 4 name it
            state[f"{attr}.{path}.lora_A.weight"], state[f"{attr}.{path}.lora_B.weight"] = down, up
    return state


def save(state: dict, path: Path, metadata: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
    else:
        torch.save(state, path)
    return path
