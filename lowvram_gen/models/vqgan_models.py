"""VQGAN-CLIP models: the embedded tiny pair, what --vqgan/--clip accept, and taming checkpoints.

* ``tiny`` (``tiny-vqgan-clip``): a VQModel shaped like vqgan_imagenet_f16 (five levels, down factor
  16, attention at the lowest resolution) with tiny channels, and a tiny CLIPModel (vision and text
  towers) with an offline tokenizer; seeded random weights, saved as ordinary ``save_pretrained``
  folders in ``$LOWVRAM_GEN_HOME/models/`` on first use, so they load through the same code as real
  models. Their images are noise.
* ``--vqgan``: a diffusers VQModel folder or hub id (``org/name`` or ``org/name:subfolder``), or a
  taming-transformers checkpoint as users download it (``vqgan_imagenet_f16_16384.ckpt`` with its
  ``.yaml``). The YAML is parsed as data (``yaml.safe_load``) and every ``target`` in it must be a
  known class: nothing it names is imported (docs/FAULTS.md 5). The checkpoint is unpickled weights-only
  (docs/FAULTS.md 1), its keys are mapped to diffusers' VQModel and checked against it (missing and
  unexpected keys are named, docs/FAULTS.md 4), and the result is cached as safetensors with its config so
  the next load skips the conversion.
* ``--clip``: ``tiny``, a CLIP hub id or local folder, or an OpenAI name (``ViT-B/32`` ...). Only
  safetensors weights are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowvram_gen import safe_json
from lowvram_gen.errors import ModelLoadError, UnsafeCheckpoint
from lowvram_gen.models.checkpoint import check_finite
from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only
from lowvram_gen.models.quiet import quiet_hub_bars
from lowvram_gen.models.resolve import hub_problem
from lowvram_gen.models.tiny import _tokenizer
from lowvram_gen.paths import models_dir

VERSION = 1  # bump when a tiny builder changes: old caches are rebuilt, not reused
CONVERTER_VERSION = 1  # bump when the key mapping changes: cached conversions are redone
TINY_NAME = "tiny-vqgan-clip"
TINY_SPECS = ("tiny", TINY_NAME)
OPENAI_CLIP = {
    "ViT-B/32": "openai/clip-vit-base-patch32",
    "ViT-B/16": "openai/clip-vit-base-patch16",
    "ViT-L/14": "openai/clip-vit-large-patch14",
    "ViT-L/14@336px": "openai/clip-vit-large-patch14-336",
}
# taming classes: the one we convert, the ones we know but do not convert, and loss classes that
# appear in the YAML (lossconfig) and are never built (their `loss.*` weights are dropped).
MODEL_TARGETS = ("taming.models.vqgan.VQModel",)
UNSUPPORTED_TARGETS = {
    "taming.models.vqgan.GumbelVQ": "Gumbel-softmax VQGANs (vqgan_gumbel_f8) are not supported yet",
    "taming.models.vqgan.EMAVQ": "EMA VQGANs are not supported yet",
    "taming.models.cond_transformer.Net2NetTransformer": "a transformer checkpoint (sflckr) holds more than a VQGAN; "
                                                         "not supported yet",
}
AUX_TARGETS = (
    "taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator",
    "taming.modules.losses.vqperceptual.DummyLoss",
    "taming.modules.losses.DummyLoss",
)
CKPT_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".safetensors")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w./-]+)?$")
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


# ------------------------------------------------------------------------------------ tiny models


def tiny_path() -> Path:
    return models_dir() / f"{TINY_NAME}-v{VERSION}"


def build_tiny_vqgan(seed: int = 0):
    """vqgan_imagenet_f16's shape (ch_mult 1,1,2,2,4; attention at the lowest level) at 1/8 width."""
    import torch
    from diffusers import VQModel

    torch.manual_seed(seed)
    return VQModel(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4 + ("AttnDownEncoderBlock2D",),
        up_block_types=("AttnUpDecoderBlock2D",) + ("UpDecoderBlock2D",) * 4,
        block_out_channels=(16, 16, 32, 32, 64), layers_per_block=1, latent_channels=16, vq_embed_dim=16,
        num_vq_embeddings=512, norm_num_groups=8, sample_size=256, scaling_factor=1.0,
    )


def build_tiny_clip(seed: int = 0):
    """Vision and text towers of width 32, two layers each; 32 px cutouts in 8 px patches."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    text = dict(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=77, bos_token_id=512, eos_token_id=513, pad_token_id=513)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    torch.manual_seed(seed)
    return CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))


def ensure_tiny_vqgan_clip() -> Path:
    """The embedded pair's folder (``vqgan/`` and ``clip/``), built atomically on first use."""
    target = tiny_path()
    if (target / "vqgan" / "config.json").is_file() and (target / "clip" / "config.json").is_file():
        return target
    quiet_hub_bars()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{TINY_NAME}-", dir=target.parent))
    try:
        build_tiny_vqgan().save_pretrained(tmp / "vqgan", safe_serialization=True)
        build_tiny_clip().save_pretrained(tmp / "clip", safe_serialization=True)
        _tokenizer().save_pretrained(tmp / "clip")
        (tmp / "clip" / "preprocessor_config.json").write_text(json.dumps({
            "image_processor_type": "CLIPImageProcessor", "image_mean": list(OPENAI_MEAN),
            "image_std": list(OPENAI_STD), "crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 32}}))
        (tmp / "LOWVRAM_GEN_TINY.json").write_text(
            json.dumps({"name": TINY_NAME, "version": VERSION, "note": "random weights: output is noise"}))
        try:
            os.rename(tmp, target)  # atomic; another process may have won the race, which is fine
        except OSError:
            if not (target / "vqgan" / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class VqganSource:
    spec: str
    kind: str  # 'tiny' | 'folder' | 'taming' | 'hub'
    path: Path  # the VQModel folder, or the taming checkpoint
    config: Path | None = None  # the taming .yaml
    subfolder: str | None = None

    @property
    def is_tiny(self) -> bool:
        return self.kind == "tiny"


@dataclass(frozen=True)
class ClipSource:
    spec: str
    kind: str  # 'tiny' | 'folder' | 'hub'
    path: Path

    @property
    def is_tiny(self) -> bool:
        return self.kind == "tiny"


def resolve_vqgan(spec: str, config: str | None = None) -> VqganSource:
    if spec in TINY_SPECS:
        return VqganSource(spec, "tiny", ensure_tiny_vqgan_clip() / "vqgan")
    path = Path(spec).expanduser()
    if path.is_dir():
        if _is_vqmodel_folder(path):
            return VqganSource(spec, "folder", path.resolve())
        for sub in ("vqvae", "vqgan", "vqmodel"):  # a pipeline folder holding a VQModel
            if _is_vqmodel_folder(path / sub):
                return VqganSource(spec, "folder", (path / sub).resolve())
        raise ModelLoadError(f"{spec} is a folder but not a diffusers VQModel (no config.json with _class_name "
                             "VQModel); give a VQModel folder, a taming .ckpt with its .yaml, a hub id or tiny")
    if path.is_file() and path.suffix.lower() in (".yaml", ".yml"):
        config, path = str(path), next((path.with_suffix(s) for s in CKPT_SUFFIXES if path.with_suffix(s).is_file()),
                                       path.with_suffix(".ckpt"))
        if not path.is_file():
            raise ModelLoadError(f"{spec} is a taming config; its checkpoint {path.name} is not beside it: "
                                 "pass the .ckpt to --vqgan (and the .yaml to --vqgan-config)")
    if path.is_file():
        if path.suffix.lower() not in CKPT_SUFFIXES:
            raise ModelLoadError(f"{spec}: unknown VQGAN checkpoint type {path.suffix!r}; use a .ckpt with its .yaml "
                                 "(taming-transformers) or a diffusers VQModel folder")
        yaml_path = Path(config).expanduser() if config else next(
            (path.with_suffix(s) for s in (".yaml", ".yml") if path.with_suffix(s).is_file()), None)
        if yaml_path is None or not yaml_path.is_file():
            raise ModelLoadError(f"{spec}: a taming checkpoint needs its config; put {path.with_suffix('.yaml').name} "
                                 "beside it or pass --vqgan-config PATH.yaml")
        return VqganSource(spec, "taming", path.resolve(), yaml_path.resolve())
    if spec.startswith((".", "/", "~")) or "\\" in spec or path.suffix.lower() in CKPT_SUFFIXES:
        raise ModelLoadError(f"VQGAN file or folder not found: {spec}")
    if not _HUB_ID.match(spec):
        raise ModelLoadError(f"VQGAN not found: {spec!r} is not tiny, an existing folder or .ckpt, or a hub id like "
                             "'org/name' (or 'org/name:subfolder')")
    repo, _, sub = spec.partition(":")
    patterns = [f"{sub}/*.json", f"{sub}/*.safetensors"] if sub else ["*.json", "*.safetensors"]
    folder = _snapshot(repo, patterns, "--vqgan")
    return VqganSource(spec, "hub", folder / sub if sub else folder, subfolder=sub or None)


def resolve_clip(spec: str) -> ClipSource:
    if spec in TINY_SPECS:
        return ClipSource(spec, "tiny", ensure_tiny_vqgan_clip() / "clip")
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{spec} is a folder but not a CLIP model (no config.json); give a CLIP folder, "
                                 f"a hub id, one of {', '.join(OPENAI_CLIP)} or tiny")
        return ClipSource(spec, "folder", path.resolve())
    repo = OPENAI_CLIP.get(spec, spec)
    if spec.startswith((".", "/", "~")) or "\\" in spec or not _HUB_ID.match(repo) or ":" in repo:
        raise ModelLoadError(f"CLIP model not found: {spec!r} is not tiny, an existing folder, an OpenAI name "
                             f"({', '.join(OPENAI_CLIP)}) or a hub id like 'openai/clip-vit-base-patch32'")
    return ClipSource(spec, "hub", _snapshot(repo, ["*.json", "*.txt", "*.safetensors"], "--clip"))


def _is_vqmodel_folder(path: Path) -> bool:
    try:
        return safe_json.load_file(path / "config.json").get("_class_name") == "VQModel"
    except (OSError, ValueError, AttributeError):
        return False


def _snapshot(repo: str, patterns: list[str], flag: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as exc:  # offline, not cached, gated, not found: all end the same way for the user
        raise ModelLoadError(f"could not get the model {repo!r}: {hub_problem(exc)}. Download it once while online "
                             f"with `hf download {repo}`, or pass a local folder to {flag}.") from exc


# ----------------------------------------------------------------------------- taming conversion


def read_taming_config(path: Path) -> dict:
    """The model params of a taming YAML, parsed as data; every `target` must be a known class."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not a valid YAML file ({str(exc).splitlines()[0][:160]})") from None
    for target in _targets(data):
        if target in UNSUPPORTED_TARGETS:
            raise ModelLoadError(f"{path}: target {target!r}: {UNSUPPORTED_TARGETS[target]}; use a VQModel checkpoint "
                                 "such as vqgan_imagenet_f16_16384")
        if target not in MODEL_TARGETS + AUX_TARGETS:
            raise UnsafeCheckpoint(f"{path} was refused: its target {target!r} is not a known VQGAN class (allowed: "
                                   f"{', '.join(MODEL_TARGETS + AUX_TARGETS)}); nothing it names was imported")
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("target") not in MODEL_TARGETS:
        raise ModelLoadError(f"{path}: no model.target {MODEL_TARGETS[0]!r}; is this a taming-transformers "
                             "VQGAN config?")
    params = model.get("params")
    try:
        dd = params["ddconfig"]
        checked = {
            "embed_dim": int(params["embed_dim"]), "n_embed": int(params["n_embed"]),
            "ch": int(dd["ch"]), "ch_mult": [int(m) for m in dd["ch_mult"]],
            "num_res_blocks": int(dd["num_res_blocks"]),
            "attn_resolutions": [int(r) for r in dd.get("attn_resolutions", [])], "resolution": int(dd["resolution"]),
            "z_channels": int(dd["z_channels"]), "in_channels": int(dd.get("in_channels", 3)),
            "out_ch": int(dd.get("out_ch", 3)), "double_z": bool(dd.get("double_z", False)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: model.params is missing or has a bad value for {exc}; expected embed_dim, "
                             "n_embed and ddconfig (ch, ch_mult, num_res_blocks, resolution, z_channels)") from None
    if checked["double_z"] or not checked["ch_mult"] or checked["ch_mult"][0] != 1:
        raise ModelLoadError(f"{path}: ddconfig with double_z or ch_mult not starting at 1 is not a VQGAN this "
                             "converter knows")
    return checked


def _targets(node: Any):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "target":
                yield str(value)
            else:
                yield from _targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _targets(value)


def diffusers_config(params: dict) -> dict:
    """diffusers VQModel arguments for a taming VQModel's params (from `read_taming_config`)."""
    n, res = len(params["ch_mult"]), params["resolution"]
    attn = [res // 2**i in params["attn_resolutions"] for i in range(n)]
    return {
        "in_channels": params["in_channels"], "out_channels": params["out_ch"],
        "down_block_types": ["AttnDownEncoderBlock2D" if a else "DownEncoderBlock2D" for a in attn],
        "up_block_types": ["AttnUpDecoderBlock2D" if a else "UpDecoderBlock2D" for a in reversed(attn)],
        "block_out_channels": [params["ch"] * m for m in params["ch_mult"]],
        "layers_per_block": params["num_res_blocks"], "act_fn": "silu", "latent_channels": params["z_channels"],
        "sample_size": res, "num_vq_embeddings": params["n_embed"], "vq_embed_dim": params["embed_dim"],
        "norm_num_groups": 32, "scaling_factor": 1.0, "norm_type": "group", "mid_block_add_attention": True,
    }


_RESNET = {"nin_shortcut": "conv_shortcut"}
_ATTN = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}
_TOP = ("quant_conv.", "post_quant_conv.", "quantize.embedding.")


def taming_key(key: str, levels: int) -> str | None:
    """The diffusers VQModel name of a taming VQModel weight; None for weights we drop (the loss's)."""
    if key.startswith("loss."):
        return None
    if key.startswith(_TOP):
        return key
    m = re.match(r"^(encoder|decoder)\.(.+)$", key)
    if not m:
        return key  # unknown: reported as unexpected by the caller
    side, rest = m.groups()
    simple = {"conv_in.": "conv_in.", "norm_out.": "conv_norm_out.", "conv_out.": "conv_out."}
    for old, new in simple.items():
        if rest.startswith(old):
            return f"{side}.{new}{rest[len(old):]}"
    m = re.match(r"^mid\.(block_1|block_2|attn_1)\.(\w+)\.(.+)$", rest)
    if m:
        part, layer, tail = m.groups()
        if part == "attn_1":
            return f"{side}.mid_block.attentions.0.{_ATTN.get(layer, layer)}.{tail}"
        return f"{side}.mid_block.resnets.{0 if part == 'block_1' else 1}.{_RESNET.get(layer, layer)}.{tail}"
    m = re.match(r"^(down|up)\.(\d+)\.(block|attn)\.(\d+)\.(\w+)\.(.+)$", rest)
    if m:
        way, level, kind, j, layer, tail = m.groups()
        block = f"down_blocks.{level}" if way == "down" else f"up_blocks.{levels - 1 - int(level)}"
        if kind == "attn":
            return f"{side}.{block}.attentions.{j}.{_ATTN.get(layer, layer)}.{tail}"
        return f"{side}.{block}.resnets.{j}.{_RESNET.get(layer, layer)}.{tail}"
    m = re.match(r"^(down|up)\.(\d+)\.(downsample|upsample)\.conv\.(.+)$", rest)
    if m:
        way, level, _, tail = m.groups()
        if way == "down":
            block = f"down_blocks.{level}.downsamplers"
        else:
            block = f"up_blocks.{levels - 1 - int(level)}.upsamplers"
        return f"{side}.{block}.0.conv.{tail}"
    return key


def convert_taming_state_dict(state: dict, params: dict, where: str = "checkpoint") -> dict:
    """Map a taming VQModel state dict to diffusers' VQModel and check it against the architecture."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import VQModel

    with init_empty_weights(include_buffers=True):
        expected = {k: tuple(v.shape) for k, v in VQModel(**diffusers_config(params)).state_dict().items()}
    levels = len(params["ch_mult"])
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        new = taming_key(key, levels)
        if new is None:
            continue
        if ".attentions." in new and tensor.ndim == 4 and new.endswith(".weight") and "group_norm" not in new:
            tensor = tensor[:, :, 0, 0]  # taming's 1x1 attention convs are diffusers' linear layers
        out[new] = tensor
    missing = sorted(set(expected) - set(out))
    unexpected = sorted(k for k in state if taming_key(k, levels) not in (None, *expected))
    if missing or unexpected:
        raise ModelLoadError(
            f"{where} does not match its config (a checkpoint of another architecture?): "
            + "; ".join(part for part in (
                f"{len(missing)} missing weight(s): {', '.join(missing[:4])}" if missing else "",
                f"{len(unexpected)} unexpected weight(s): {', '.join(unexpected[:4])}" if unexpected else "") if part))
    wrong = [f"{k} {tuple(v.shape)} != {expected[k]}" for k, v in out.items() if tuple(v.shape) != expected[k]]
    if wrong:
        raise ModelLoadError(f"{where} does not match its config: {len(wrong)} weight(s) of the wrong shape: "
                             + ", ".join(wrong[:3]))
    return {k: v.to(torch.float32).contiguous() for k, v in out.items()}


def converted_path(ckpt: Path, yaml_path: Path) -> Path:
    """Cache folder of a conversion: keyed on the checkpoint's path, size and time and the YAML's text."""
    st = ckpt.stat()
    digest = hashlib.sha256(json.dumps([str(ckpt), st.st_size, st.st_mtime_ns, CONVERTER_VERSION]).encode()
                            + Path(yaml_path).read_bytes()).hexdigest()[:16]
    stem = re.sub(r"[^\w.-]", "_", ckpt.stem)[:60]
    return models_dir() / "vqgan-converted" / f"{stem}-{digest}"


def convert_taming(ckpt: Path, yaml_path: Path) -> Path:
    """A diffusers VQModel folder for a taming checkpoint: cached, else converted now (atomically)."""
    target = converted_path(ckpt, yaml_path)
    if (target / "config.json").is_file():
        return target
    params = read_taming_config(yaml_path)  # before the checkpoint: a refused YAML loads nothing
    if ckpt.suffix.lower() == ".safetensors":
        from safetensors.torch import load_file

        check_safetensors(ckpt)
        state = load_file(str(ckpt))
    else:
        state = load_pickle_weights_only(ckpt)
    converted = convert_taming_state_dict(state, params, ckpt.name)
    del state
    import diffusers
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        save_file(converted, str(tmp / "diffusion_pytorch_model.safetensors"))
        config = {"_class_name": "VQModel", "_diffusers_version": diffusers.__version__, **diffusers_config(params)}
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        (tmp / "SOURCE.json").write_text(json.dumps({"checkpoint": str(ckpt), "config": str(yaml_path),
                                                     "converter": CONVERTER_VERSION}))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# -------------------------------------------------------------------------------------- loading


@dataclass
class LoadedClip:
    source: ClipSource
    model: Any  # transformers CLIPModel, float32, eval, no grad
    tokenizer: Any
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def image_size(self) -> int:
        return int(self.model.config.vision_config.image_size)


def load_vqgan(source: VqganSource):
    """A diffusers VQModel in float32 on the CPU (placement is the engine's job)."""
    import torch
    from diffusers import VQModel

    quiet_hub_bars()
    folder = convert_taming(source.path, source.config) if source.kind == "taming" else source.path
    try:
        vq = VQModel.from_pretrained(str(folder), torch_dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load {source.spec} as a VQModel: {str(exc).splitlines()[0][:200]}") from exc
    _check_finite(vq, "VQGAN")
    return vq.eval().requires_grad_(False)


def load_clip(source: ClipSource) -> LoadedClip:
    import torch
    from transformers import CLIPModel, CLIPTokenizer

    quiet_hub_bars()
    if not any(source.path.glob("*.safetensors")):
        raise ModelLoadError(f"{source.spec}: no .safetensors weights in {source.path}; only safetensors CLIP "
                             "weights are loaded (a pickle can run code)")
    try:
        model = CLIPModel.from_pretrained(str(source.path), dtype=torch.float32, use_safetensors=True)
        tokenizer = CLIPTokenizer.from_pretrained(str(source.path))
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"could not load {source.spec} as a CLIP model: {str(exc).splitlines()[0][:200]}") from exc
    _check_finite(model, "CLIP")
    mean, std = OPENAI_MEAN, OPENAI_STD
    try:
        pre = safe_json.load_file(source.path / "preprocessor_config.json")
        mean, std = tuple(float(x) for x in pre["image_mean"]), tuple(float(x) for x in pre["image_std"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # OpenAI's normalisation, which every CLIP on the hub was trained with
    return LoadedClip(source, model.eval().requires_grad_(False), tokenizer, mean, std)


def _check_finite(module, name: str) -> None:
    from types import SimpleNamespace

    check_finite(SimpleNamespace(components={name: module}))
