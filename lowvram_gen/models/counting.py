"""Parameter counts of a model built on the meta device from its config (no weights read, nothing allocated):
what sdnq leaves unquantized (`sdnq_kept`, `text_quant_kept`), what a text encoder keeps in float32
(`text_fp32_kept`), and `instantiate_meta` that builds the model. The memory profile (models/profile.py) and the
ControlNet profiles (planning/controlnet.py) count with them.
"""

from __future__ import annotations

import warnings


def instantiate_meta(library: str, class_name: str, cfg: dict):
    """Build a model from its config with every tensor on the meta device (nothing allocated)."""
    from accelerate import init_empty_weights

    if library == "diffusers":
        import diffusers

        cls = getattr(diffusers, class_name, None)
        if cls is None or not hasattr(cls, "from_config"):
            return None
        # diffusers' own deprecations inside its classes (FluxControlNetModel imports FluxPosEmbed from where it
        # warns) are not the user's to read on every `plan`
        with init_empty_weights(include_buffers=True), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return cls.from_config(cfg)
    if library == "transformers":
        import transformers

        cls = getattr(transformers, class_name, None)
        if cls is None or not hasattr(cls, "config_class"):
            return None
        config = cls.config_class.from_dict(cfg)
        with init_empty_weights(include_buffers=True):
            return cls(config)
    return None


def sdnq_kept(model) -> int:
    """Parameters sdnq leaves unquantized: all but the weights of Linear and Conv2d layers, the embedders'
    (x_embedder, time_text_embed ...), and layers under 16384 weights or 32 output channels (its defaults).
    Checked against sdnq's own result: SD 1.5's UNet at int8 0.815 GiB counted vs 0.811 measured, a FLUX.1
    transformer cut to 2+4 blocks at int4 0.803 GiB vs 0.810 (layerwise casting's fp8_kept, which keeps
    every norm's linear, counted 1.21 GiB there)."""
    import torch

    kept = 0
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            quantized = (isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)) and pname == "weight"
                         and "embed" not in name and p.numel() >= 16384 and p.shape[0] >= 32)
            kept += 0 if quantized else p.numel()
    return kept


def text_quant_kept(model) -> int:
    """A text encoder's parameters sdnq leaves unquantized: `sdnq_kept`'s, plus the layers the transformers
    model names in `_keep_in_fp32_modules`, which sdnq's quantizer honours (use_keep_in_fp32_modules). T5's
    are its feed-forward output projections `wo` (24 x 10240 x 4096 = 1.0 B of T5-XXL's 4.76 B): measured on
    the real-size T5-XXL loaded at bfloat16 with int8: 3.38 GiB of int8 and 2.37 GiB of bfloat16 weights (that
    build's embeddings were untied, two copies: 2.12 GiB counted here for the tied model), where counting the
    embedding alone as unquantized said 4.3 and 0.25 (docs/benchmarks.md, "FLUX.1"). A tied weight counts once."""
    import torch

    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    kept, seen = 0, set()
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:  # a tied weight (T5's encoder.embed_tokens is its `shared`): one tensor
                continue
            seen.add(id(p))
            # sdnq's common_skip_keys leave `lm_head` alone too (measured: the scaled Qwen-Image at int8 in float32
            # held 2 GiB more than planned after the load, its 545M-weight untied lm_head at 4 bytes, not 1)
            quantized = (isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)) and pname == "weight"
                         and "embed" not in name and p.numel() >= 16384 and p.shape[0] >= 32
                         and "lm_head" not in name.split(".")
                         and not any(k in name.split(".") for k in keep))
            kept += 0 if quantized else p.numel()
    return kept


def text_fp32_kept(model) -> int:
    """Parameters of the layers a transformers text encoder names in `_keep_in_fp32_modules` (T5's `wo`, 1.0 B of
    T5-XXL's 4.76 B): transformers loads them in float32 when the model is loaded in float16 (T5 overflows in
    float16 there), quantized or not; in bfloat16 they follow the dtype (checked on a tiny T5)."""
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    if not keep:
        return 0
    return sum(p.numel() for name, mod in model.named_modules() if any(k in name.split(".") for k in keep)
               for p in mod.parameters(recurse=False))
