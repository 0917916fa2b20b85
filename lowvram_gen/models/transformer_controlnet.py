"""Transformer ControlNets (diffusers' SD3ControlNetModel, FluxControlNetModel, and the issue-30 families' Qwen-Image,
Z-Image and SANA ones, each by its record's ControlNetFacts): their family, a single file's config, and loading. models/controlnet.py finds them as it finds any ControlNet (by name in models/ControlNet, a folder, a
hub id, a file) and hands them here when their config or tensors say they are one of these.

Config of a single file (`shape_config`), in diffusers' key layout only (a `.safetensors` as diffusers saves it; the
original layouts, XLabs' `double_blocks` or Stability's, are refused saying so): from the tensors' shapes, read from
the header without the weights, as the SD/SDXL path does:
- SD3: the width (`pos_embed_input`), the input channels and any extra conditioning channels, the text and pooled
  widths (`context_embedder`, `time_text_embed`), the block count, dual-attention blocks (`attn2`), q/k norm
  (`norm_q`: its width is the head width), the position table (`pos_embed.pos_embed`: its side). Published ones in
  this layout are InstantX's (a context embedder: `force_zeros_for_pooled_projection` true, as their configs say)
  and Stability's SD3.5 ones (no context embedder, no pos_embed: they take the transformer's; false).
- Flux: the width, input channels, text and pooled widths, the double and single block counts, the guidance
  embedder, XLabs' conditioning embedding (`input_hint_block`) and a union ControlNet's mode embedder.
- Qwen-Image, Z-Image (alibaba-pai's Fun ControlNet Union files: their keys are diffusers'; a 2.0 file's zero
  refiner read from one tensor, as diffusers does), SANA: the records' `config_from_shapes` (families/controlnet_shapes.py).
What shapes do not show (the head count where no norm gives the head width, Flux's rotary axes, SD3's sample size,
Z-Image's control layer places) is the base transformer's, taken at load (`base` config), as the SD path takes the
UNet's. A family's ControlNet in a layout diffusers does not read (DiffSynth's Qwen-Image Blockwise, SANA's original
.pth) is refused in the record's one sentence (`other_layout`).

Loading (`load`): a folder with the class its config names, a single file through a temporary folder holding the
derived config.json and a link to the file, so both go through `from_pretrained`: the dtype, and int8/int4 while
loading (sdnq's config, the transformer's lever), as a folder is. No torch or diffusers at import.
"""

from __future__ import annotations

import json
from pathlib import Path

from lowvram_gen import families
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models.safe_files import check_safetensors


def _transformer_kinds() -> dict[str, families.ControlNetFacts]:
    """Transformer ControlNet kind ('sd3', 'flux') -> its family's ControlNet facts (the records')."""
    return {kind: f.controlnet for kind, f in families.controlnet_kinds().items() if f.denoiser == "transformer"}


def family_of_config(config: dict) -> str | None:
    """The kind ('sd3' | 'flux') of a transformer ControlNet's config, None for an SD/SDXL one."""
    name = str(config.get("_class_name", ""))
    return next((kind for kind, facts in _transformer_kinds().items() if facts.model_class == name), None)


def family_of_shapes(shapes: dict) -> str | None:
    """The kind ('sd3' | 'flux') when a single file's tensors are a transformer ControlNet's in diffusers' layout (the
    records' `file_match`); None for an SD/SDXL ControlNet. Another layout of a transformer ControlNet is refused
    here, naming it."""
    for kind, facts in _transformer_kinds().items():
        if facts.file_match is not None and facts.file_match(shapes):
            return kind
    for facts in _transformer_kinds().values():  # a family's ControlNet in a layout diffusers does not read
        why = facts.other_layout(shapes) if facts.other_layout is not None else None
        if why:
            raise ModelLoadError(why)
    if any(k.startswith(("double_blocks.", "single_blocks.", "controlnet_blocks.")) for k in shapes) \
            and "controlnet_cond_embedding.conv_in.weight" not in shapes:
        raise ModelLoadError("this looks like an SD3/Flux ControlNet in another key layout than diffusers' (XLabs' "
                             "double_blocks or Stability's original one): only diffusers' layout is read; give the "
                             "diffusers version of it (a folder with config.json, or its .safetensors)")
    return None


def shape_config(shapes: dict, family: str, where: str = "the file") -> dict:
    """The config fields a transformer ControlNet's tensors give (see the module doc); where `where` is the file and
    the family's record reads a value its shapes cannot tell (`config_from_values`), that one tensor is read."""
    facts = _transformer_kinds()[family]
    try:
        config = facts.config_from_shapes(shapes)
        if facts.config_from_values is not None and Path(where).is_file():
            facts.config_from_values(config, lambda key: _tensor(Path(where), key))
        return config
    except KeyError as exc:
        raise ModelLoadError(f"{where}: its tensors are not laid out as diffusers' {facts.label} ControlNets are "
                             f"(no {exc})") from None


def _tensor(path: Path, key: str):
    """One tensor of a .safetensors file (KeyError when it has none of that name)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        if key not in f.keys():
            raise KeyError(key)
        return f.get_tensor(key)


def with_base(config: dict, base: dict) -> dict:
    """A derived config completed from the base transformer's (`base`: its config), where the shapes did not say."""
    out = dict(config)
    record = families.by_controlnet_class(out["_class_name"])
    complete = record.controlnet.from_base if record is not None else None
    if complete is not None:
        complete(out, base)
    else:
        for key in ("sample_size", "pos_embed_max_size", "out_channels"):
            if key in base and key not in out:
                out[key] = base[key]
    return out


def not_safetensors(spec: str, path: Path) -> ModelLoadError:
    return ModelLoadError(f"{spec}: an SD3/Flux ControlNet is read from a .safetensors file (or a diffusers folder), "
                          f"not a {path.suffix} one")


def load(source, config: dict, base: dict, dtype: str, quantize: str = "none", quantize_on: str | None = None):
    """The SD3/Flux ControlNet of `source` (models/controlnet.ControlNetSource) on the CPU at `dtype`, int8/int4 while
    loading with `quantize`. `config`: its config (a folder's, or a file's derived one); `base`: the base
    transformer's config."""
    import tempfile

    import diffusers
    import torch

    from lowvram_gen.models.quantize import sdnq_config
    from lowvram_gen.models.quiet import libraries_silenced

    cls = getattr(diffusers, config["_class_name"])
    kwargs = {"torch_dtype": getattr(torch, dtype)}
    if quantize != "none":
        kwargs["quantization_config"] = sdnq_config(quantize, quantize_on)
    if source.kind == "folder":
        return cls.from_pretrained(str(source.path), **kwargs)
    path = Path(source.path)
    if path.suffix.lower() != ".safetensors":
        raise not_safetensors(source.spec, path)
    check_safetensors(path)
    with tempfile.TemporaryDirectory(prefix="lowvram-controlnet-") as folder, libraries_silenced():
        (Path(folder) / "config.json").write_text(json.dumps(with_base(config, base)))
        (Path(folder) / "diffusion_pytorch_model.safetensors").symlink_to(path)
        return cls.from_pretrained(folder, **kwargs)
