"""The issue-30 families for `bench_streamed_bytes.py --plans`: each family's real-size transformer (its shipped
config, every block and hook as in the real model) inside the family's tiny test pipeline (tests/tiny_*.py), called
with prompt embeddings of the real text width, so the budget hooks onload what they would on a GPU.

Like FLUX.1 there, each top-level block list stores its weights once (every block of a list shares the first one's
storage through its own Parameter objects): the hooks and the meter see every block at its real size, and RAM holds
one block per list (Qwen-Image's 60 blocks of 0.68 GB: 0.7 GB, not 41 GB). The job runs 64x64 px with 8 text tokens,
CFG off (one forward per step): the bytes a forward moves do not depend on the tokens or the batch.

Table-driven: FAMILIES maps a family key to its tiny builder, the pipeline call's embedding arguments and the text
width; a family without a row here is listed as not measured (Flux.2 dev's one block of each list and its 1.5 GiB
fixed part hold 4.3 GiB: measure it alone, `--only flux2-dev`).
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "lowvram_gen" / "configs"
TEXT_TOKENS = 8


def _embeds(width: int, masked: str, as_list: bool = False, tokens: int = TEXT_TOKENS):
    import torch

    g = torch.Generator().manual_seed(3)
    emb = torch.randn(1, tokens, width, generator=g).to(torch.bfloat16)
    if as_list:  # Z-Image: one (tokens, width) tensor per prompt
        return {"prompt_embeds": [emb[0]]}
    out = {"prompt_embeds": emb}
    if masked:  # Chroma hands its mask to SDPA as it is: bool there ("bool_mask")
        name = "prompt_attention_mask" if masked == "bool_mask" else masked
        out[name] = torch.ones(1, tokens, dtype=torch.bool if masked == "bool_mask" else torch.long)
    return out


def _extra(cfg: dict, shapes: dict, tokens: int) -> dict:
    """Further embeddings a pipeline call needs beside prompt_embeds: {argument: shape(cfg, tokens)}."""
    import torch

    g = torch.Generator().manual_seed(4)
    return {name: torch.randn(*shape(cfg, tokens), generator=g).to(torch.bfloat16) for name, shape in shapes.items()}


# HiDream: T5's embeddings and every Llama layer the transformer reads (its llama_layers index them), and the pooled
HIDREAM = {"prompt_embeds_t5": lambda c, t: (1, t, c["caption_channels"][1]),
           "prompt_embeds_llama3": lambda c, t: (max(c["llama_layers"]) + 1, 1, t, c["caption_channels"][0]),
           "pooled_prompt_embeds": lambda c, t: (1, c["text_emb_dim"])}

# family key -> (tests module, builder, config key of the text width ("" when the extras hold every embedding), mask
# argument or "", call extras, further embeddings as _extra takes them)
FAMILIES = {
    "qwen-image": ("tiny_qwen", "build_tiny_qwen_image", "joint_attention_dim", "prompt_embeds_mask",
                   {"true_cfg_scale": 1.0}),
    "z-image": ("tiny_zimage", "build_tiny_zimage", "cap_feat_dim", "", {"guidance_scale": 0.0}),
    "flux2-klein": ("tiny_flux2", "build_tiny_flux2_klein", "joint_attention_dim", "", {"guidance_scale": 1.0}),
    "sana": ("tiny_dit", "build_tiny_sana", "caption_channels", "prompt_attention_mask", {"guidance_scale": 1.0}),
    "chroma": ("tiny_dit", "build_tiny_chroma", "joint_attention_dim", "bool_mask",
               {"guidance_scale": 1.0}),
    "lumina2": ("tiny_dit", "build_tiny_lumina2", "cap_feat_dim", "prompt_attention_mask", {"guidance_scale": 1.0}),
    # Kontext resizes the job to max_area (1024 x 1024 by default) keeping its aspect: 64 x 64 asked for here
    "flux-kontext": ("tiny_edit", "build_tiny_kontext", "joint_attention_dim", "",
                     {"guidance_scale": 3.5, "max_area": 64 * 64},
                     {"pooled_prompt_embeds": lambda c, t: (1, c["pooled_projection_dim"])}),
    "flux2-klein-9b": ("tiny_flux2", "build_tiny_flux2_klein", "joint_attention_dim", "", {"guidance_scale": 1.0}),
    "cogview4": ("tiny_cogview4", "build_tiny_cogview4", "text_embed_dim", "", {"guidance_scale": 1.0}),
    "hidream": ("tiny_hidream", "build_tiny_hidream", "", "", {"guidance_scale": 1.0}, HIDREAM),
    # one block of each list and the 1.5 GiB fixed part hold 4.3 GiB: run it alone
    "flux2-dev": ("tiny_flux2_dev", "build_tiny_flux2_dev", "joint_attention_dim", "", {"guidance_scale": 4.0}),
}


def build_transformer(key: str, overrides: dict | None = None):
    """The family's transformer from its shipped config (with `overrides`: fewer blocks for calibrate_memory.py),
    random bfloat16 weights, each block list stored once."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    cfg = {**json.loads((CONFIGS / key / "transformer" / "config.json").read_text()), **(overrides or {})}
    with init_empty_weights(include_buffers=False):
        model = getattr(diffusers, cfg["_class_name"]).from_config(cfg)
    lists = {name for name, child in model.named_children() if isinstance(child, torch.nn.ModuleList)}
    gen = torch.Generator().manual_seed(0)
    shared = {}
    for full_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            parts = f"{full_name}.{name}".split(".")
            key_ = (parts[0], ".".join(parts[2:])) if parts[0] in lists else None
            data = shared.get(key_) if key_ is not None else None
            if data is None:
                data = torch.empty(param.shape, dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
                if key_ is not None:
                    shared[key_] = data
            module._parameters[name] = torch.nn.Parameter(data, requires_grad=False)
    return model.to(dtype=torch.bfloat16).eval(), cfg


def build_pipeline(key: str, transformer):
    """The family's tiny test pipeline with the real-size transformer in place of its own."""
    import importlib
    import sys

    import torch

    sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))
    module, builder = FAMILIES[key][:2]
    pipe = getattr(importlib.import_module(module), builder)()
    pipe.register_modules(transformer=transformer)
    bn = getattr(pipe.vae, "bn", None)
    if isinstance(bn, torch.nn.BatchNorm2d):  # Flux.2's latent normalization, applied even to latent output
        pipe.vae.bn = torch.nn.BatchNorm2d(int(transformer.config.in_channels), affine=False).eval()
    pipe.to(torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def job_kwargs(key: str, cfg: dict, steps: int, side: int = 64, tokens: int = TEXT_TOKENS,
               height: int | None = None, call: dict | None = None) -> dict:
    """The call of one job of `steps` steps at side x side px (side x `height`) with `tokens` text tokens, CFG off,
    latents out (the prompt embeddings made here: calibrate_memory.py makes them before it measures; `call`: further
    pipeline arguments, SANA's use_resolution_binning for calibrate_memory.py)."""
    import torch

    _, _, width_key, mask, extra, *shapes = FAMILIES[key]
    return dict(num_inference_steps=steps, width=side, height=height or side, generator=torch.Generator().manual_seed(1),
                output_type="latent", **extra, **_extra(cfg, shapes[0] if shapes else {}, tokens),
                **(_embeds(int(cfg[width_key]), mask, as_list=key == "z-image", tokens=tokens) if width_key else {}),
                **(call or {}))


def run_job(pipe, key: str, cfg: dict, steps: int, side: int = 64, tokens: int = TEXT_TOKENS,
            kwargs: dict | None = None, call: dict | None = None) -> None:
    """One job (`job_kwargs`, or the `kwargs` made before)."""
    import torch

    with torch.inference_mode():
        pipe(**(kwargs or job_kwargs(key, cfg, steps, side, tokens, call=call)))
