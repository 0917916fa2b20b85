"""ControlNet models: found, described by their config, loaded, and kept on the base pipeline between jobs.

Where (`resolve_controlnet`):
- `tiny-controlnet`, the embedded ControlNet for the embedded `tiny` model (models/tiny.py), built on first use
  and listed first, so the ControlNet accordion can be tried offline;
- by name in `models/ControlNet` (`$LOWVRAM_GEN_MODELS/ControlNet`, the folder A1111's extension reads;
  sub-folders too): a file's stem (`control_v11p_sd15_canny`) or a diffusers folder's name;
- a path: a diffusers folder (a `config.json` of a ControlNetModel) or a single file as people download them,
  `.safetensors` (read without unpickling) or `.pth`/`.ckpt`/`.pt`/`.bin` (unpickled weights-only), in
  diffusers' key layout (`diffusers_xl_canny_mid.safetensors`) or the original one (`control_v11p_sd15_canny.pth`:
  `input_blocks`, `zero_convs`, `input_hint_block`, with or without `control_model.`);
- a hub id, from the Hugging Face cache (downloaded once while online);
- a control-LoRA (models/control_lora.py): Stability AI's `control-lora-canny-rank128.safetensors` and its
  kind, a ControlNet stored as a LoRA over the base model's UNet, told apart by its `lora_controlnet` key.

Config (`config_of`): a folder's config.json; a single file's from its tensors' shapes (`shape_config`: block
widths, blocks with attention and their transformer depth, cross-attention width, SDXL's added embedding, the
conditioning embedding's widths), read from a safetensors header without its weights, so the plan and the
family check (planning/controlnet.py) need no weights. What shapes do not show (attention heads, norm groups,
time embedding settings) is the base model's UNet's, taken at load as diffusers' ControlNetModel.from_unet
takes it, so diffusers' `from_single_file` needs no config from the hub.

Transformer ControlNets (SD3's, Flux's, Qwen-Image's, Z-Image's, SANA's) are found the same ways; their configs and loading
are models/transformer_controlnet.py's (`transformer_config`), completed from the base transformer's config.

Loading (`load_controlnet`): at the dtype the pipeline's first preset loads it at, int8/int4 while loading
when that preset quantizes (sdnq, the UNet's lever); its weights checked finite. A control-LoRA (below) is
built from the base pipeline's UNet instead. Kept per base pipeline
(`kept`): a later job with the same model reuses it; a model switch drops the pipeline and them with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.models.attached import SLOT, attached  # noqa: F401 (the slots the job's ControlNets take)
from lowvram_gen.models import control_lora
from lowvram_gen.models import transformer_controlnet as transformer
from lowvram_gen.models.controlnet_config import from_unet_config, known_config
from lowvram_gen.models.profile import weight_file_bytes
from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only, safetensors_header
from lowvram_gen.models.tiny import TINY_CONTROLNET, ensure_tiny, tiny_path
from lowvram_gen.networks import files

log = logging.getLogger(__name__)

SUFFIXES = (".safetensors", ".pth", ".pt", ".ckpt", ".bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CACHE = "_lowvram_controlnet_cache"  # on the base pipeline: {source key: loaded ControlNetModel}
_LDM = "control_model."  # the original layout's prefix (A1111's extension also reads files without it)


@dataclass(frozen=True)
class ControlNetSource:
    spec: str  # what the user gave
    kind: str  # 'folder' | 'file' | 'control_lora' (a file) | 'builtin' (a known size, for `plan` only)
    path: Path | None
    label: str  # as A1111's extension lists it: `name [hash]` for a file, the folder's name, the hub id

    @property
    def key(self) -> str:
        if self.path is None:
            return f"builtin:{self.spec}"
        stat = self.path.stat() if self.path.is_file() else (self.path / "config.json").stat()
        return f"{self.path}:{stat.st_mtime_ns}:{stat.st_size}"


def controlnet_dirs() -> list[Path]:
    return files.kind_dirs("ControlNet")


def _is_controlnet_folder(folder: Path) -> bool:
    try:
        config = safe_json.load_file(folder / "config.json")
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "ControlNet" in str(config.get("_class_name", ""))


def available() -> dict[str, Path]:
    """{name: path} of the embedded ControlNet (its folder, which may not be built yet: `resolve_controlnet` builds
    it) and the ControlNet files (by stem) and diffusers folders (by name) in `controlnet_dirs()`."""
    found: dict[str, Path] = {TINY_CONTROLNET: tiny_path(TINY_CONTROLNET)}
    for root in controlnet_dirs():
        if not root.is_dir():
            continue
        folders = sorted(p.parent for p in root.rglob("config.json") if _is_controlnet_folder(p.parent))
        for folder in folders:
            found.setdefault(folder.name, folder)
        for stem, path in files.scan(root, SUFFIXES).items():
            if not any(folder in path.parents for folder in folders):  # a folder's own weight files
                found.setdefault(stem, path)
    return found


def short_hash(path: Path) -> str:
    """A1111's short model hash (sd_models.model_hash), which the extension shows as `name [hash]`: sha256 of the
    64 KiB at offset 1 MiB, first 8 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(0x100000)
        digest.update(f.read(0x10000))
    return digest.hexdigest()[:8]


def resolve_controlnet(spec: str, known_sizes: bool = False) -> ControlNetSource:
    """The ControlNet `spec` names (see the module doc); `known_sizes`: also `sd15`, `sdxl`... (for `plan`)."""
    text = str(spec).strip()
    if text.lower() == TINY_CONTROLNET:  # embedded, as `tiny` is: the name is taken before any file of that name
        return _folder(text, ensure_tiny(TINY_CONTROLNET), TINY_CONTROLNET)
    path = Path(text).expanduser()
    if path.is_dir():
        return _folder(text, path, path.name)
    if path.is_file():
        return _file(text, path)
    found = available()
    stem = path.stem if path.suffix.lower() in SUFFIXES else text
    folded = {k.lower(): v for k, v in found.items()}
    hit = found.get(stem) or folded.get(stem.lower())
    if hit is not None:
        return _folder(text, hit, hit.name) if hit.is_dir() else _file(text, hit)
    if known_sizes and known_config(text) is not None:
        return ControlNetSource(text, "builtin", None, text)
    if _HUB_ID.match(text) and not text.startswith((".", "/", "~")) and path.suffix.lower() not in SUFFIXES:
        return _hub(text)
    on_disk = {name: p for name, p in found.items() if name != TINY_CONTROLNET}  # what the folders hold
    why = files.not_found(stem, on_disk, controlnet_dirs(), SUFFIXES) + f" (and {TINY_CONTROLNET}, the embedded " \
        "one for the tiny model)"
    if known_config(text) is not None:
        why += f"; {text!r} is a known ControlNet size for `lowvram-gen plan`, not a model to generate with"
    if path.suffix.lower() in SUFFIXES or text.startswith((".", "/", "~")) or "\\" in text:
        raise InvalidRequest("ControlNet", spec, f"no such file or folder; {why}")
    raise InvalidRequest("ControlNet", spec, why + " (or give a diffusers folder, a .safetensors/.pth file or a "
                                                   "hub id in the Hugging Face cache)")


def _folder(spec: str, folder: Path, label: str) -> ControlNetSource:
    if not _is_controlnet_folder(folder):
        raise ModelLoadError(f"{spec} is a folder but not a ControlNet (no config.json of a ControlNetModel); give a "
                             "ControlNet folder, a .safetensors/.pth file or a hub id")
    return ControlNetSource(spec, "folder", folder.resolve(), label)


def _file(spec: str, path: Path) -> ControlNetSource:
    if path.suffix.lower() not in SUFFIXES:
        raise ModelLoadError(f"{spec}: a ControlNet file is one of {', '.join(SUFFIXES)}, not {path.suffix or 'this'}")
    kind = "control_lora" if control_lora.is_control_lora_file(path) else "file"
    return ControlNetSource(spec, kind, path.resolve(), f"{path.stem} [{short_hash(path)}]")


def _hub(repo: str) -> ControlNetSource:
    from huggingface_hub import snapshot_download

    from lowvram_gen.models.resolve import hub_problem

    try:
        folder = snapshot_download(repo)
    except Exception as exc:  # offline, not cached, gated, not found: one sentence for all
        raise ModelLoadError(f"could not get the ControlNet {repo!r}: {hub_problem(exc)}. Download it once while "
                             f"online with `hf download {repo}`, or put its file in models/ControlNet") from exc
    return _folder(repo, Path(folder), repo)


# ------------------------------------------------------------------------------------------------- config


def file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of a single file: a safetensors header (no weights read), or a pickle unpickled
    weights-only."""

    if path.suffix.lower() == ".safetensors":
        return {k: tuple(v["shape"]) for k, v in safetensors_header(path).items() if k != "__metadata__"}
    return {k: tuple(v.shape) for k, v in load_pickle_weights_only(path).items()}


def _count(shapes: dict, pattern: str) -> int:
    """How many distinct indices fill the `(\\d+)` of `pattern` among the keys."""
    rx = re.compile(pattern)
    return len({m.group(1) for k in shapes for m in [rx.match(k)] if m})


def shape_config(shapes: dict[str, tuple[int, ...]], where: str = "the file") -> dict:
    """The ControlNetModel config fields a ControlNet's tensor shapes give (see the module doc), in diffusers'
    layout or the original one."""
    if any(k.startswith(_LDM) for k in shapes):
        shapes = {k[len(_LDM):]: v for k, v in shapes.items() if k.startswith(_LDM)}
    if control_lora.CONTROL_LORA_KEY in shapes:  # read from its header as a .safetensors (`_file`); a pickle is not
        raise ModelLoadError(f"{where} is a control-LoRA in a pickle file: control-LoRAs are read as .safetensors, "
                             "as stabilityai/control-lora ships them")
    if "controlnet_cond_embedding.conv_in.weight" in shapes:
        blocks = _count(shapes, r"down_blocks\.(\d+)\.")
        lpb = _count(shapes, r"down_blocks\.0\.resnets\.(\d+)\.")
        out = [shapes[f"down_blocks.{i}.resnets.0.conv1.weight"][0] for i in range(blocks)]
        attn = [f"down_blocks.{i}.attentions.0.proj_in.weight" in shapes for i in range(blocks)]
        depth = [_count(shapes, rf"down_blocks\.{i}\.attentions\.0\.transformer_blocks\.(\d+)\.")
                 for i in range(blocks)]
        proj = next((shapes[f"down_blocks.{i}.attentions.0.proj_in.weight"] for i in range(blocks) if attn[i]), None)
        hint = ["controlnet_cond_embedding.conv_in.weight"] + [
            f"controlnet_cond_embedding.blocks.{j}.weight"
            for j in range(1, _count(shapes, r"controlnet_cond_embedding\.blocks\.(\d+)\."), 2)]
        mid = "mid_block.attentions.0.proj_in.weight" in shapes
        add, conv_in = "add_embedding.linear_1.weight", "conv_in.weight"
    elif "input_hint_block.0.weight" in shapes:
        n = _count(shapes, r"input_blocks\.(\d+)\.")
        downs = sorted(int(m.group(1)) for k in shapes
                       for m in [re.match(r"input_blocks\.(\d+)\.0\.op\.weight", k)] if m)
        lpb = (downs[0] - 1) if downs else n - 1
        blocks = (n - 1) // (lpb + 1) + (1 if (n - 1) % (lpb + 1) else 0)
        first = [1 + i * (lpb + 1) for i in range(blocks)]
        out = [shapes[f"input_blocks.{k}.0.in_layers.2.weight"][0] for k in first]
        attn = [f"input_blocks.{k}.1.proj_in.weight" in shapes for k in first]
        depth = [_count(shapes, rf"input_blocks\.{k}\.1\.transformer_blocks\.(\d+)\.") for k in first]
        proj = next((shapes[f"input_blocks.{k}.1.proj_in.weight"] for k, a in zip(first, attn) if a), None)
        hint = [f"input_hint_block.{j}.weight" for j in range(0, 15, 2) if f"input_hint_block.{j}.weight" in shapes]
        hint = [hint[0]] + hint[2::2][: max(0, (len(hint) - 2) // 2)] if len(hint) > 2 else hint
        mid = "middle_block.1.proj_in.weight" in shapes
        add, conv_in = "label_emb.0.0.weight", "input_blocks.0.0.weight"
    else:
        raise ModelLoadError(f"{where} is not a ControlNet: none of its tensors is a ControlNet's "
                             "(controlnet_cond_embedding, or input_hint_block in the original layout)")
    cross = next((v[1] for k, v in sorted(shapes.items()) if k.endswith("attn2.to_k.weight")), None)
    try:
        config = {
            "_class_name": "ControlNetModel",
            "in_channels": int(shapes[conv_in][1]),
            "conditioning_channels": int(shapes[hint[0]][1]),
            "conditioning_embedding_out_channels": [int(shapes[h][0]) for h in hint],
            "block_out_channels": [int(c) for c in out],
            "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn],
            "layers_per_block": int(lpb),
            "transformer_layers_per_block": [max(1, d) if a else 1 for d, a in zip(depth, attn)],
            "cross_attention_dim": int(cross) if cross is not None else 1280,
            "use_linear_projection": proj is not None and len(proj) == 2,
            "mid_block_type": "UNetMidBlock2DCrossAttn" if mid else "UNetMidBlock2D",
        }
    except (KeyError, IndexError) as exc:
        raise ModelLoadError(f"{where}: its ControlNet tensors are not laid out as SD/SDXL ControlNets are "
                             f"(no {exc})") from None
    if add in shapes:  # SDXL's "text_time" embedding of the pooled prompt and the size conditioning
        config.update(addition_embed_type="text_time", projection_class_embeddings_input_dim=int(shapes[add][1]))
    return config


def config_of(source: ControlNetSource) -> dict:
    """The ControlNetModel config of `source` as far as the plan needs it (parameter counts and shapes)."""
    if source.kind == "builtin":
        return known_config(source.spec)
    if source.kind == "folder":
        try:
            return safe_json.load_file(source.path / "config.json")
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not read the ControlNet config {source.path / 'config.json'}: {exc}") from exc
    shapes = file_shapes(source.path)
    if source.kind == "control_lora":
        shapes = control_lora.control_lora_shapes(shapes)
    family = transformer.family_of_shapes(shapes)  # SD3/Flux (models/transformer_controlnet.py)
    if family is not None:
        return transformer.shape_config(shapes, family, str(source.path))
    config = shape_config(shapes, str(source.path))
    # for counting on the meta device: heads and norm groups change no parameter count; any that fit will do
    return {**config, "attention_head_dim": 1, "norm_num_groups": 1,
            "addition_time_embed_dim": 8 if config.get("addition_embed_type") else None}


def file_bytes(source: ControlNetSource) -> int:
    """Bytes of its weights on disk (what loading reads); 0 for a known size."""
    if source.kind == "file":
        return source.path.stat().st_size
    if source.kind == "folder":
        return weight_file_bytes(source.path.parent, [source.path.name]).get(source.path.name, 0)
    return 0


# -------------------------------------------------------------------------------------------------- loading


def load_controlnet(source: ControlNetSource, base_unet_config: dict, dtype: str, quantize: str = "none",
                    quantize_on: str | None = None):
    """The ControlNetModel of `source` on the CPU at `dtype` (int8/int4 while loading with `quantize`)."""
    import tempfile

    import torch
    from diffusers import ControlNetModel

    from lowvram_gen.models.quantize import check_scales, from_single_file, sdnq_config
    from lowvram_gen.models.quiet import libraries_silenced, quiet_hub_bars

    quiet_hub_bars()
    torch_dtype = getattr(torch, dtype)
    try:
        config = transformer_config(source)
        if config is not None:  # SD3/Flux: `base_unet_config` is the base transformer's
            module = transformer.load(source, config, base_unet_config, dtype, quantize, quantize_on)
        elif source.kind == "folder":
            kwargs = {"quantization_config": sdnq_config(quantize, quantize_on)} if quantize != "none" else {}
            module = ControlNetModel.from_pretrained(str(source.path), torch_dtype=torch_dtype, **kwargs)
        elif source.kind == "file":
            path = source.path
            if path.suffix.lower() == ".safetensors":
                check_safetensors(path)
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = load_pickle_weights_only(path)
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            if transformer.family_of_shapes(shapes):  # an SD3/Flux ControlNet in a pickle (transformer_config)
                raise transformer.not_safetensors(source.spec, path)
            config = {**from_unet_config(base_unet_config), **shape_config(shapes, str(path))}
            with tempfile.TemporaryDirectory(prefix="lowvram-controlnet-") as folder, libraries_silenced():
                (Path(folder) / "config.json").write_text(json.dumps(config))
                if quantize != "none":
                    module = from_single_file(ControlNetModel, state, quantize, quantize_on, config=folder,
                                              torch_dtype=torch_dtype)
                else:
                    module = ControlNetModel.from_single_file(state, config=folder, torch_dtype=torch_dtype)
        else:
            raise ModelLoadError(f"{source.spec!r} is a known ControlNet size for planning, not a model to load")
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"could not load the ControlNet {source.spec}: {why}") from exc
    if quantize != "none":
        check_scales(module, quantize)
    _check_finite(module, source)
    module.eval()
    module._lowvram_source = source  # what `reload` reads again
    return module


def _check_finite(module, source: ControlNetSource) -> None:
    import torch

    for name, param in module.named_parameters():
        if param.is_floating_point() and not bool(torch.isfinite(param.detach()).all()):
            raise ModelLoadError(f"the ControlNet {source.spec} has NaN/Inf weights ({name}): the file is damaged; "
                                 "download it again")


def _from_control_lora(pipe, source: ControlNetSource, dtype: str, quantize: str, quantize_on: str | None):
    """The ControlNet a control-LoRA makes of `pipe`'s UNet (models/control_lora.py), its weights checked finite."""
    module = control_lora.make(pipe, source, dtype, quantize, quantize_on)
    _check_finite(module, source)
    return module


def kept(pipe, source: ControlNetSource, base_unet_config: dict, dtype: str, quantize: str = "none",
         quantize_on: str | None = None):
    """The ControlNet of `source` kept on `pipe` (the base pipeline), loaded on first use."""
    cache = pipe.__dict__.setdefault(_CACHE, {})
    key = source.key
    if key not in cache:
        log.info("loading the ControlNet %s", source.spec)
        if source.kind == "control_lora":
            cache[key] = _from_control_lora(pipe, source, dtype, quantize, quantize_on)
        else:
            cache[key] = load_controlnet(source, base_unet_config, dtype, quantize, quantize_on)
    return cache[key]


def reload(pipe, module, dtype: str, quantize: str = "none", quantize_on: str | None = None):
    """A fresh copy of the kept ControlNet `module` from its files (its precision lost to a cast or a
    quantization that the next settings want back), replacing it in the pipeline's keep."""
    source = module._lowvram_source
    if source.kind == "control_lora":  # from the UNet, which models/loading.reload_components restores first
        fresh = _from_control_lora(pipe, source, dtype, quantize, quantize_on)
    else:
        fresh = load_controlnet(source, base_config(pipe), dtype, quantize, quantize_on)
    cache = pipe.__dict__.setdefault(_CACHE, {})
    for key, value in list(cache.items()):
        if value is module:
            cache[key] = fresh
    log.info("reloading the ControlNet %s from disk to restore its precision", source.spec)
    return fresh


def base_config(pipe) -> dict:
    """The config of the pipeline's denoiser, what a single file's ControlNet config is completed from: the UNet's
    (SD/SDXL) or the transformer's (SD3/Flux)."""
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    return dict(denoiser.config) if denoiser is not None else {}


def transformer_config(source: ControlNetSource) -> dict | None:
    """The config of an SD3/Flux ControlNet `source` (a folder's config.json, or one a .safetensors' header gives), or
    None for an SD/SDXL one. A pickle is not unpickled here for it: the SD load reads it, and refuses one that holds
    an SD3/Flux ControlNet (those load from .safetensors only)."""
    if source.kind == "folder":
        config = config_of(source)
        return config if transformer.family_of_config(config) else None
    if source.kind == "file" and source.path.suffix.lower() == ".safetensors":
        shapes = file_shapes(source.path)
        family = transformer.family_of_shapes(shapes)
        return transformer.shape_config(shapes, family, str(source.path)) if family else None
    return None
