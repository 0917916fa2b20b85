"""Single-file checkpoints (A1111 / Civitai / original LDM layout): validate, load safely, convert.

Why this module exists instead of a bare `from_single_file` call:

* Safety (docs/FAULTS.md 1, 2). A `.ckpt` is a pickle and a pickle can run code. Pickles are only ever opened
  with torch's weights-only unpickler, and a file named `.safetensors` is never unpickled at all: its
  header is checked by hand first, so a renamed pickle is refused before any loader sees it.
* Clear errors (docs/FAULTS.md 3, 4, 6, 7). diffusers fills missing weights with nothing (they stay on the
  `meta` device), only logs unexpected ones, and with `local_files_only=True` it still goes online when
  the base configs are not cached. Here the checkpoint's keys and shapes are checked against the target
  architecture on the meta device before anything is loaded, and the configs are found in the local
  cache only, with an error that says how to get them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from lowvram_gen.errors import ModelLoadError, UnsafeCheckpoint
from lowvram_gen.models import gguf_file
from lowvram_gen.models.checkpoint_keys import FLUX, SD, SD3, SDXL, _diffusers_markers, _layout_hint

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"

UNET, VAE_PREFIXES = "model.diffusion_model.", ("first_stage_model.", "vae.")
CLIP_SD, OPENCLIP_SD2 = "cond_stage_model.transformer.", "cond_stage_model.model."
CLIP_XL, OPENCLIP_XL = "conditioner.embedders.0.transformer.", "conditioner.embedders.1.model."
# What diffusers' own config download fetches (loaders/single_file.py): configs, vocabularies, spm models.
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model")

_DTYPE_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_MAX_HEADER = 100_000_000  # the safetensors format's own limit


# ----------------------------------------------------------------------------------------- reading


def _safetensors_header(path) -> dict:
    """The JSON header of a safetensors file, checked against the file size; never unpickles."""
    p = Path(path)
    head = b""

    def bad(reason: str) -> ModelLoadError:
        # Magic bytes only explain a failure: a valid header length may start with the same bytes.
        if head.startswith(b"PK\x03\x04") or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")):
            reason = "it looks like a PyTorch/pickle checkpoint renamed to .safetensors; it was not unpickled"
        return ModelLoadError(f"{p} is not a safetensors file ({reason})")

    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if size == 0:
                raise bad("the file is empty: 0 bytes")
            if size < 8:
                raise bad(f"only {size} bytes: truncated")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, _MAX_HEADER):
                raise bad(f"header length {n} is larger than the {size}-byte file: truncated or another format")
            raw = f.read(n)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    head = b""  # a JSON header: from here on it is a (damaged) safetensors file, not a renamed pickle
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {key!r} has no valid dtype/shape/data_offsets") from None
        count = 1
        for d in shape:
            count *= d
        if dtype in _DTYPE_SIZES and stop - start != count * _DTYPE_SIZES[dtype]:
            raise bad(f"entry {key!r} has {stop - start} bytes for shape {shape} of {dtype}")
        end = max(end, stop)
    data = size - 8 - n
    if end > data:
        raise bad(f"truncated: the header promises {end} bytes of tensor data, the file holds {data}")
    if end < data:
        raise bad(f"{data - end} unexpected bytes after the tensor data")
    return header


def check_safetensors(path) -> list[str]:
    """Validate a safetensors header (8-byte little-endian length, JSON) without unpickling; its tensor keys."""
    return [k for k in _safetensors_header(path) if k != "__metadata__"]


def _pickle_globals(path) -> list[str]:
    """Globals a pickle names (module.name), found by reading opcodes only: nothing is imported or run."""
    import pickletools
    import zipfile

    p, found = Path(path), []
    try:
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as z:
                blobs = [z.read(n) for n in z.namelist() if n.endswith(".pkl")]
        else:
            blobs = [p.read_bytes()[:50_000_000]]
    except (OSError, zipfile.BadZipFile, RuntimeError):
        return found
    for blob in blobs:
        strings: list[str] = []
        names: list[str] = []
        try:
            for op, arg, _ in pickletools.genops(blob):
                if isinstance(arg, str):
                    strings.append(arg)
                if op.name in ("GLOBAL", "INST"):
                    names.append(arg.replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
        except Exception:  # noqa: BLE001 - not a well-formed pickle: random bytes would yield random "globals"
            continue
        found += names
    return found


class _LightningCallbackStandIn:
    """Inert stand-in for the one non-tensor global in the official SD 1.x `.ckpt` files.

    Their pickles name `pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint` (the class, as a
    dict key of training bookkeeping), so plain weights-only loading refuses them (diffusers #8874).
    A1111's safe unpickler allows that name too; here it resolves to this empty class, nothing is imported.
    """


def _weights_only_allowlist():
    import torch

    name = "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint"
    return torch.serialization.safe_globals([(_LightningCallbackStandIn, name)])


def _is_weights_global(name: str) -> bool:
    return name.startswith("torch.") or name in ("collections.OrderedDict", "_codecs.encode")


def load_pickle_weights_only(path) -> dict:
    """A `.ckpt`/`.pt`/`.pth`/`.bin` state dict, unpickled with torch's weights-only allowlist only.

    A pickle that would import or call anything else is refused with UnsafeCheckpoint naming the global;
    torch's weights-only unpickler refuses it before any of it runs. A1111's {"state_dict": ...} is unwrapped.
    """
    import torch

    p = Path(path)
    obj = unpickle_weights_only(p)
    for _ in range(4):  # A1111 / Lightning checkpoints: {"state_dict": {...}, "global_step": ...}
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{p} holds a {type(obj).__name__}, not a state dict of tensors")
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise ModelLoadError(f"{p} holds no tensors (keys: {', '.join(map(str, list(obj)[:5]))})")
    return tensors


def unpickle_weights_only(path):
    """The object a pickle file holds (nested dicts of tensors, strings, numbers), with the same
    weights-only safety and errors as `load_pickle_weights_only`. For files whose tensors are not
    top-level entries, e.g. A1111 textual-inversion embeddings (`{"string_to_param": {"*": tensor}}`)."""
    import pickle
    import warnings
    import zipfile

    import torch

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if size == 0:
        raise ModelLoadError(f"{p} is empty (0 bytes): a failed or unfinished download?")
    zipped = zipfile.is_zipfile(p)
    try:
        # mmap: tensors stay in the page cache instead of being copied (zip format only)
        with warnings.catch_warnings(), _weights_only_allowlist():  # torch warns about pickle protocols
            warnings.simplefilter("ignore", UserWarning)
            obj = torch.load(p, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        named = re.findall(r"GLOBAL ([\w.]+)", text)
        suspicious = named or [g for g in _pickle_globals(p) if not _is_weights_global(g)]
        if suspicious:
            raise UnsafeCheckpoint(
                f"{p} was refused: its pickle would load {suspicious[0]}, which is not a tensor type "
                "(a pickle can run code; nothing from this file was run). Use a .safetensors version "
                "of this model, or convert the file only if you trust where it came from."
            ) from None
        raise ModelLoadError(f"{p} cannot be read as a weights-only PyTorch checkpoint: truncated or corrupt "
                             f"({_last_line(text)})") from None
    except Exception as exc:  # noqa: BLE001 - on garbage bytes the unpickler raises anything (KeyError, IndexError...)
        hint = ""
        try:
            check_safetensors(p)
            hint = "; it is a safetensors file: rename it to .safetensors"
        except ModelLoadError:
            pass
        raise ModelLoadError(f"{p} is truncated or not a PyTorch checkpoint ({_last_line(str(exc))}){hint}") from None
    return obj


def _last_line(text: str) -> str:
    """The informative part of a torch / diffusers error, without torch's advice to load unsafely."""
    for marker in ("WeightsUnpickler error:", "Unsupported operand"):
        if marker in text:
            text = text[text.index(marker):].removeprefix("WeightsUnpickler error:")
            break
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else text.strip()
    return first.split(". ")[0][:160]


def _kind(path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix == SAFETENSORS_SUFFIX:
        return "safetensors"
    if suffix in PICKLE_SUFFIXES:
        return "pickle"
    if suffix == gguf_file.GGUF_SUFFIX:
        return "gguf"
    raise ModelLoadError(f"{path}: unknown checkpoint type {suffix!r}; use .safetensors, .gguf or "
                         f"{', '.join(PICKLE_SUFFIXES)}")


def checkpoint_keys(path) -> list[str]:
    """Tensor keys of a checkpoint: safetensors and GGUF from the header, pickles by weights-only loading."""
    if _kind(path) == "safetensors":
        return check_safetensors(path)
    if _kind(path) == "gguf":
        return list(gguf_file.read_header(path).shapes)
    return list(load_pickle_weights_only(path))


# --------------------------------------------------------------------------------------- detection


def detect_pipeline_class(keys) -> str:
    """The diffusers pipeline class for an original-layout (LDM / A1111 / Civitai) checkpoint's keys.

    SD 1.x/2.x and SDXL need all three parts (UNet, VAE, text encoders): `from_single_file` takes every
    weight from the file. Anything else is refused with a few of its keys and the keys expected.
    """
    keys = list(keys)
    key_set = set(keys)
    markers = _diffusers_markers()
    if any(k in key_set for k in markers["sd3"]):
        return SD3
    if any(k in key_set for k in markers["flux"]) and not any(k in key_set for k in markers["not_flux1"]):
        return FLUX

    def has(*prefixes):
        return any(k.startswith(prefixes) for k in keys)

    unet, vae = has(UNET + "input_blocks.") and has(UNET + "output_blocks."), has(*VAE_PREFIXES)
    if unet and vae and has(CLIP_XL) and has(OPENCLIP_XL):
        return SDXL
    if unet and vae and has(CLIP_SD, OPENCLIP_SD2):
        return SD

    known = (UNET, *VAE_PREFIXES, "cond_stage_model.", "conditioner.embedders.")
    unexpected = [k for k in keys if not k.startswith(known)]
    missing = [what for ok, what in ((unet, f"{UNET}input_blocks.* (UNet)"), (vae, "first_stage_model.* (VAE)"),
               (has("cond_stage_model.", "conditioner.embedders."),
                f"{CLIP_SD}* (SD 1.x), {OPENCLIP_SD2}* (SD 2.x) or conditioner.embedders.* (SDXL) text encoders"))
               if not ok]
    if has("conditioner.embedders.0.model.") and not has("conditioner.embedders.1."):
        missing = ["a base model: this looks like the SDXL refiner, which only refines images (img2img)"]
    elif has("conditioner.embedders.") and not (has(CLIP_XL) and has(OPENCLIP_XL)):
        missing.append(f"both SDXL text encoders ({CLIP_XL}* and {OPENCLIP_XL}*)")
    hint = _layout_hint(keys)
    shown = ", ".join(repr(k) for k in (unexpected or keys)[:4]) or "none"
    raise ModelLoadError(
        f"not a Stable Diffusion checkpoint in the original (A1111 / Civitai / LDM) layout{hint}: "
        f"{'unexpected keys' if unexpected else 'keys'} such as {shown} ({len(keys)} keys in all); "
        f"missing {'; '.join(missing) or 'the marker keys'}. Expected keys: {UNET}*, first_stage_model.*, and "
        f"{CLIP_SD}* (SD 1.x/2.x) or {CLIP_XL}* + {OPENCLIP_XL}* (SDXL); SD3 / Flux files by their marker keys "
        f"(e.g. {(markers['sd3'] or ['joint_blocks.0...'])[0]!r}, {(markers['flux'] or ['double_blocks.0...'])[0]!r})."
    )


# ----------------------------------------------------------------------------------------- loading

# diffusers' model types (infer_diffusers_model_type) each pipeline class may take its default config from
_MODEL_TYPES = {SD: ("v1", "v2"), SDXL: ("xl_base", "playground-v2-5"), SD3: ("sd3", "sd35_medium", "sd35_large"),
                FLUX: ("flux-dev", "flux-schnell")}
_COMPONENTS = {SD: ("unet", "vae", "text_encoder", "tokenizer", "scheduler"),
               SDXL: ("unet", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


INPAINT_CHANNELS = 9  # an inpainting UNet's inputs: latents 4, mask 1, the masked image's latents 4


def with_unet_inputs(folder: Path, in_channels: int) -> Path:
    """`folder`, or where its UNet config says another in_channels (an inpainting checkpoint loaded with its base
    model's configs, as A1111 users have them): a copy of its configs and tokenizers (no weights) in lowvram-gen's
    models folder with the UNet's in_channels set, made once."""
    import hashlib
    import shutil

    from lowvram_gen.paths import models_dir, writable_folder

    unet_config = folder / "unet" / "config.json"
    if not unet_config.is_file():
        return folder
    config = json.loads(unet_config.read_text())
    if int(config.get("in_channels", 4)) == in_channels:
        return folder
    tag = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    target = models_dir() / "configs" / f"{folder.name}-{tag}-in{in_channels}"
    if (target / "model_index.json").is_file():
        return target
    writable_folder(target.parent, "the models folder of LOWVRAM_GEN_HOME")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.ckpt", "*.pt", "*.pth",
                                                               "*.gguf", "*.onnx", "*.msgpack"))
    (tmp / "unet" / "config.json").write_text(json.dumps({**config, "in_channels": in_channels}, indent=2))
    try:
        os.rename(tmp, target)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _family(class_name: str) -> str:
    if class_name.startswith("StableDiffusionXL"):
        return "SDXL"
    if class_name.startswith("StableDiffusion3"):
        return "SD3"
    if class_name.startswith("Flux"):
        return "Flux"
    return "SD 1.x/2.x" if class_name.startswith("StableDiffusion") else class_name


def _default_repo(meta: dict, cls_name: str) -> str:
    """diffusers' default config repo for this checkpoint (from its shapes), kept within the detected family."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_DEFAULT_PIPELINE_PATHS, infer_diffusers_model_type

    try:
        model_type = infer_diffusers_model_type(meta)
    except Exception:  # noqa: BLE001 - a marker check that needs real values; fall back to the family default
        model_type = None
    if model_type not in _MODEL_TYPES[cls_name]:  # e.g. a small SDXL without resblocks.9 reads as "v1"
        model_type = _MODEL_TYPES[cls_name][0]
    return DIFFUSERS_DEFAULT_PIPELINE_PATHS[model_type]["pretrained_model_name_or_path"]


def _resolve_config(config: str | None, meta: dict, cls_name: str, path: Path, weights: bool = False) -> Path:
    """A local folder with the base architecture's configs: `config` itself, or a repo in the HF cache.

    Never downloads: diffusers' from_single_file would go online even with local_files_only=True when
    the configs are not cached, so only a local folder is ever handed to it. `weights`: the file holds
    only the denoiser (GGUF), so the folder must also hold the other components' weights.
    """
    if config:
        folder = Path(config).expanduser()
        if folder.is_dir():
            if not (folder / "model_index.json").is_file():
                raise ModelLoadError(f"--config {config} is a folder but not a diffusers pipeline (no model_index.json)")
            return folder
        if not _HUB_ID.match(config):
            raise ModelLoadError(f"--config {config}: no such folder, and not a hub id like 'org/name'")
        repo = config
    else:
        repo = _default_repo(meta, cls_name)
    from huggingface_hub import constants, snapshot_download

    def missing(what: str) -> ModelLoadError:
        if weights:
            return ModelLoadError(
                f"{path.name} (a GGUF {_family(cls_name)} denoiser) needs the rest of the pipeline (VAE, text "
                f"encoders, tokenizer, scheduler) from a diffusers copy of {repo}, {what} (cache: "
                f"{constants.HF_HUB_CACHE}); the hub is not contacted for it. Fix: pass --config FOLDER (a local "
                f"diffusers folder of the same base model), or download the base model once: hf download {repo}"
            )
        return ModelLoadError(
            f"{path.name} ({_family(cls_name)} checkpoint) needs the diffusers configs and tokenizer of {repo}, "
            f"{what} (cache: {constants.HF_HUB_CACHE}); the hub is not contacted for them. Fix: pass "
            f"--config FOLDER (a local diffusers folder of the same architecture), or download the configs once "
            f'(a few MB, no weights): hf download {repo} --include "*.json" --include "*.txt" --include "*.model"'
        )

    try:
        patterns = None if weights else list(CONFIG_PATTERNS)
        folder = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, offline mode, malformed id: all mean "not here"
        raise missing("which are not in the local Hugging Face cache") from None
    absent = [c for c in ("model_index.json", *_COMPONENTS.get(cls_name, ())) if not (folder / c).exists()]
    if absent:
        raise missing(f"which are only partly in the local Hugging Face cache (no {', '.join(absent)})")
    return folder


def _check_config(folder: Path, cls_name: str, path: Path) -> dict:
    """The config folder must be for the same architecture and have every component the file fills."""
    try:
        index = json.loads((folder / "model_index.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'model_index.json'}: {exc}") from None
    theirs = str(index.get("_class_name", "?"))
    lacking = [c for c in _COMPONENTS.get(cls_name, ())
               if not (isinstance(index.get(c), list) and index[c][0] and (folder / c).is_dir())]
    if _family(theirs) != _family(cls_name) or lacking:
        more = f" (it has no {', '.join(lacking)})" if lacking else ""
        raise ModelLoadError(
            f"the config folder {folder} is for {theirs}{more}, but {path.name} is for {cls_name} "
            f"({_family(cls_name)}): pass --config with a diffusers folder of the same architecture"
        )
    return index


def _check_architecture(meta: dict, folder: Path, index: dict, cls_name: str, path: Path,
                        only: tuple[str, ...] = ()) -> None:
    """Map the checkpoint with diffusers' own converters on the meta device (no memory, no weights read)
    and compare keys and shapes with the models the config folder describes: wrong architecture or a
    damaged file is refused here, naming missing/unexpected keys, instead of half-loading.
    `only`: the components the file holds (a GGUF UNet: ("unet",), a GGUF Flux: ("transformer",)); () means all."""
    import torch
    import transformers
    from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu

    def unet(m):
        return sfu.convert_ldm_unet_checkpoint(meta, m.config)

    def vae(m):
        return sfu.convert_ldm_vae_checkpoint(meta, m.config)

    def clip(prefix):
        def convert(m):
            if prefix in (OPENCLIP_SD2, OPENCLIP_XL):
                out = sfu.convert_open_clip_checkpoint(m, meta, prefix=prefix)
            else:
                out = sfu.convert_ldm_clip_checkpoint(meta)
            # transformers >= 5.6 flattened CLIPTextModel (no text_model.): as create_diffusers_clip_model_from_ldm
            return out if hasattr(m, "text_model") else {k.removeprefix("text_model."): v for k, v in out.items()}
        return convert

    def flux(m):
        return gguf_file.flux_checkpoint(meta, m.config)

    def diffusers_model(cls, sub):
        return lambda: cls.from_config(cls.load_config(folder, subfolder=sub))

    def transformers_model(sub):
        cls = getattr(transformers, index[sub][1])
        return lambda: cls(cls.config_class.from_pretrained(folder, subfolder=sub))

    checks = [("unet", UNET, diffusers_model(UNet2DConditionModel, "unet"), unet),
              ("vae", "first_stage_model.", diffusers_model(AutoencoderKL, "vae"), vae)]
    if cls_name == FLUX:  # a GGUF transformer on its own (BFL keys, no prefix)
        checks = [("transformer", "", diffusers_model(FluxTransformer2DModel, "transformer"), flux)]
    elif cls_name == SDXL:
        checks += [("text_encoder", CLIP_XL, transformers_model("text_encoder"), clip(CLIP_XL)),
                   ("text_encoder_2", OPENCLIP_XL, transformers_model("text_encoder_2"), clip(OPENCLIP_XL))]
    else:
        prefix = CLIP_SD if any(k.startswith(CLIP_SD) for k in meta) else OPENCLIP_SD2
        checks += [("text_encoder", prefix, transformers_model("text_encoder"), clip(prefix))]
    problems = []
    for name, prefix, build, convert in [c for c in checks if not only or c[0] in only]:
        try:
            with torch.device("meta"):
                model = build()
            expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            got = {k: tuple(v.shape) for k, v in convert(model).items() if v is not None}
        except KeyError as exc:
            problems.append(f"{name}: missing {prefix}{exc.args[0]}")
            continue
        except Exception as exc:  # noqa: BLE001 - the converters fail in many ways on foreign layouts
            problems.append(f"{name}: its weights do not map onto {folder.name}/{name} ({type(exc).__name__}: {exc})")
            continue
        missing = sorted(set(expected) - set(got))
        # non-persistent buffers (CLIP's position_ids, kept by many SD 1.5 files) are harmless extras
        unexpected = sorted(set(got) - set(expected) - {k for k, _ in model.named_buffers()})
        shapes = [f"{k} {list(got[k])} vs {list(expected[k])}" for k in sorted(set(got) & set(expected))
                  if got[k] != expected[k]]
        for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes)):
            if items:
                problems.append(f"{name}: {len(items)} {label} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})")
    if problems:
        raise ModelLoadError(
            f"{path.name} does not match the architecture of the config folder {folder} "
            f"(keys in diffusers naming): {'; '.join(problems)}. Pass --config with a folder of the model this "
            "checkpoint was trained from, or check that the file is complete."
        )


def _sdxl_text_encoder_2(path: Path, state: dict | None, folder: Path, torch_dtype):
    """SDXL's OpenCLIP encoder, converted from conditioner.embedders.1 only.

    diffusers tells SDXL's two text encoders apart by width (768 vs 1280); when both have the same width
    (small test models) it would load CLIP-L's weights into the second encoder and leave its projection
    empty. Given only the embedders.1 keys it can only pick the right ones.
    """
    from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm
    from transformers import CLIPTextModelWithProjection

    prefix = "conditioner.embedders.1."
    if state is None:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            sub = {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    else:
        sub = {k: v for k, v in state.items() if k.startswith(prefix)}
    return create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, sub, subfolder="text_encoder_2",
                                                config=str(folder), torch_dtype=torch_dtype, local_files_only=True)


def _text_encoder_prefixes(cls_name: str, name: str) -> tuple[str, ...]:
    """Where a single file keeps the text encoder `name`'s weights (SD 1.x's CLIP or SD 2.x's OpenCLIP under
    cond_stage_model, SDXL's two embedders)."""
    if cls_name == SDXL:
        return (CLIP_XL,) if name == "text_encoder" else ("conditioner.embedders.1.",)
    return (CLIP_SD, OPENCLIP_SD2)


def load_components(path, config: str | None, names: list[str], torch_dtype, from_folder,
                    quantize: str = "none", quantize_on: str | None = None) -> dict:
    """The components `names` of the pipeline `load_single_file(path, config)` builds, each read on its own:
    the UNet and VAE through their own class's `from_single_file` (which reads only their keys),
    a text encoder from its keys alone, a GGUF denoiser from its file and, for a GGUF, the other components
    from the config folder they came from. Issue 17: restoring precision used to build a whole second
    pipeline from the file (every component at once beside the loaded ones) to take one or two of them.
    `quantize` int8/int4: a UNet among them is quantized as it loads (`_from_own_keys`); the text encoders
    load unquantized (apply.py quantizes them), a GGUF denoiser as stored.

    A `.ckpt` is a pickle: it is opened with the weights-only unpickler, as at the first load.
    `from_folder(folder, name)`: a component of a diffusers folder (models/loading.load_component), for the
    parts of a GGUF pipeline that came from its config folder."""
    import torch

    p = Path(path)
    state = gguf = None
    kind = _kind(p)
    if kind == "gguf":
        gguf = gguf_file.read_header(p)
        shapes = gguf_file.checkpoint_shapes(gguf)
    elif kind == "safetensors":
        shapes = {k: tuple(v["shape"]) for k, v in _safetensors_header(p).items() if k != "__metadata__"}
    else:
        state = load_pickle_weights_only(p)
        shapes = {k: tuple(v.shape) for k, v in state.items()}
    cls_name = gguf_file.pipeline_class(gguf, p) if gguf else detect_pipeline_class(shapes)
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    folder = _resolve_config(config, meta, cls_name, p, weights=gguf is not None)
    index = _check_config(folder, cls_name, p)
    del meta
    out = {}
    for name in names:
        if gguf and name not in ("unet", "transformer"):
            out[name] = _one(p, folder, name, lambda: from_folder(folder, name))
        else:
            out[name] = _one(p, folder, name, lambda: _component(p, state, gguf, cls_name, folder, index, name,
                                                                 torch_dtype, quantize, quantize_on))
    return out


def _one(p: Path, folder: Path, name: str, make):
    """`make()`, the component `name` of the file `p`, with one clear message for whatever diffusers raises."""
    import torch

    try:
        return make()
    except (MemoryError, torch.OutOfMemoryError, ModelLoadError):
        raise
    except Exception as exc:  # noqa: BLE001 - as load_single_file: one clear message
        raise ModelLoadError(f"could not load the {name} of {p} with the configs in {folder}: "
                             f"{type(exc).__name__}: {_last_line(str(exc))}") from exc


# The denoiser of each pipeline that int8/int4 quantize as it loads from a single file (`_from_own_keys`). Not
# an SD3 / Flux transformer: diffusers' converters of those files assume the real models' widths (its Flux one
# splits fused weights at 3072), so no tiny file tests that path; they are quantized after the load, as before.
DENOISERS = {SD: "unet", SDXL: "unet"}


def _component(p: Path, state: dict | None, gguf, cls_name: str, folder: Path, index: dict, name: str, torch_dtype,
               quantize: str = "none", quantize_on: str | None = None):
    import diffusers

    if gguf:  # never quantized again
        return gguf_file.load_denoiser(p, gguf, cls_name, folder, torch_dtype)[1]
    library, class_name = index[name]
    if name in ("unet", "vae"):
        kind = quantize if name == DENOISERS.get(cls_name) else "none"
        return _from_own_keys(getattr(diffusers, class_name), p, state, folder, name, torch_dtype, kind, quantize_on)
    if name == "text_encoder_2" and cls_name == SDXL:
        return _sdxl_text_encoder_2(p, state, folder, torch_dtype)
    if name.startswith("text_encoder"):
        import transformers
        from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm

        prefixes = _text_encoder_prefixes(cls_name, name)
        if state is None:
            from safetensors import safe_open

            with safe_open(str(p), framework="pt") as f:
                sub = {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)}
        else:
            sub = {k: v for k, v in state.items() if k.startswith(prefixes)}
        return create_diffusers_clip_model_from_ldm(getattr(transformers, class_name), sub, subfolder=name,
                                                    config=str(folder), torch_dtype=torch_dtype,
                                                    local_files_only=True)
    raise ModelLoadError(f"{p.name}: its {name} cannot be read on its own from a single file")


def _from_own_keys(cls, p: Path, state: dict | None, folder: Path, name: str, torch_dtype, quantize: str = "none",
                   quantize_on: str | None = None):
    """The diffusers model `cls` (`name`: unet, vae) from its keys of the file (`state`: a pickle's tensors,
    already read weights-only). With `quantize` int8/int4, issue 17's lever for single files: sdnq's config
    goes to diffusers' `from_single_file` (models/quantize.from_single_file, as models/loading.load_component
    gives it to `from_pretrained`), which quantizes each layer as its tensor is converted, so the model never
    exists at full precision in RAM; its scales are then checked as after any quantization."""
    from lowvram_gen.models import quantize as quantize_mod

    source = str(p) if state is None else state
    kwargs = dict(config=str(folder), subfolder=name, torch_dtype=torch_dtype, local_files_only=True)
    with _weights_only_allowlist():
        if quantize == "none":
            return cls.from_single_file(source, **kwargs)
        return quantize_mod.from_single_file(cls, source, quantize, quantize_on, **kwargs)


def load_single_file(path, config: str | None, torch_dtype, quantize: str = "none", quantize_on: str | None = None):
    """A diffusers pipeline from one original-layout checkpoint, loaded safely and checked.

    A `.gguf` file holds only the denoiser (kept quantized, models/gguf_file.py); the other components
    are loaded, with their weights, from the config folder.

    `quantize` int8/int4 (sdnq; `quantize_on` a CUDA device rounds there): an SD 1.x/2.x or SDXL UNet is read
    first on its own, through its class's `from_single_file`, and quantized layer by layer as it loads
    (`_from_own_keys`), then handed to the pipeline, which does not read it again: RAM never holds it at full
    precision (issue 17). The text encoders are not: diffusers builds them from the file's keys (no
    `from_pretrained` for a quantizer to hook into), so they load at `torch_dtype` and apply.py quantizes them
    after the load, as before (planning/host.py counts them whole); so is an SD3 / Flux transformer (`DENOISERS`).
    A GGUF denoiser is never quantized again.

    `config`: a local diffusers folder, or a hub id already in the HF cache, with the base architecture's
    configs and tokenizer; None: diffusers' default repo for the detected architecture, from the cache only.
    """
    import torch

    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"checkpoint not found: {p}")
    state = gguf = None
    kind = _kind(p)
    if kind == "gguf":  # a denoiser on its own; the other components come from the config folder
        gguf = gguf_file.read_header(p)
        shapes = gguf_file.checkpoint_shapes(gguf)
    elif kind == "safetensors":
        header = _safetensors_header(p)  # refuses anything that is not safetensors: no pickle fallback
        shapes = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    else:
        state = load_pickle_weights_only(p)  # refuses unsafe pickles before diffusers opens the file
        shapes = {k: tuple(v.shape) for k, v in state.items()}
    cls_name = gguf_file.pipeline_class(gguf, p) if gguf else detect_pipeline_class(shapes)
    in_channels = shapes.get(UNET + "input_blocks.0.0.weight", (0, 4))[1]
    if cls_name in (SD, SDXL) and in_channels not in (4, INPAINT_CHANNELS):
        raise ModelLoadError(f"{p.name} is an instruct or depth model (its UNet takes {in_channels} input channels); "
                             "text-to-image (4 channels) and inpainting (9) checkpoints are supported")
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    folder = _resolve_config(config, meta, cls_name, p, weights=gguf is not None)
    if cls_name in (SD, SDXL):  # an inpainting file with its base model's configs: their UNet with 9 inputs
        folder = with_unet_inputs(folder, int(in_channels))
    index = _check_config(folder, cls_name, p)
    if cls_name in (SD, SDXL) or (gguf and cls_name == FLUX):
        denoiser = ("unet",) if cls_name in (SD, SDXL) else ("transformer",)
        _check_architecture(meta, folder, index, cls_name, p, only=denoiser if gguf else ())
    extra = {}
    if quantize != "none" and not gguf and cls_name in DENOISERS:  # first: nothing else is loaded beside it
        name = DENOISERS[cls_name]
        extra[name] = _one(p, folder, name, lambda: _component(p, state, None, cls_name, folder, index, name,
                                                               torch_dtype, quantize, quantize_on))
    if cls_name == SDXL and not gguf:
        width_1 = shapes.get(CLIP_XL + "text_model.embeddings.position_embedding.weight", (0, -1))[-1]
        if width_1 == shapes.get(OPENCLIP_XL + "positional_embedding", (0, -2))[-1]:
            extra["text_encoder_2"] = _sdxl_text_encoder_2(p, state, folder, torch_dtype)
    del state, meta  # diffusers reads the file again (weights-only for pickles); drop this copy first

    import diffusers

    try:
        if gguf:
            pipe = gguf_file.load_pipeline(p, gguf, cls_name, folder, torch_dtype)
        else:
            with _weights_only_allowlist():  # diffusers loads pickles with weights_only=True itself
                pipe = getattr(diffusers, cls_name).from_single_file(
                    str(p), config=str(folder), torch_dtype=torch_dtype, local_files_only=True, **extra
                )
    except (MemoryError, torch.OutOfMemoryError, ModelLoadError):
        raise
    except Exception as exc:  # noqa: BLE001 - diffusers raises many types; the user needs one clear message
        raise ModelLoadError(f"could not load {p} as {cls_name} with the configs in {folder}: "
                             f"{type(exc).__name__}: {_last_line(str(exc))}") from exc
    empty = {name: [k for k, v in comp.state_dict().items() if v.device.type == "meta"]
             for name, comp in pipe.components.items() if isinstance(comp, torch.nn.Module)}
    empty = {name: keys for name, keys in empty.items() if keys}
    if empty:  # diffusers leaves weights it did not find on the meta device instead of failing
        raise ModelLoadError(f"{p.name} has no weights for " + "; ".join(
            f"{name}: {len(keys)} missing ({', '.join(keys[:3])})" for name, keys in empty.items()))
    return pipe


def check_finite(pipe) -> None:
    """Every floating parameter of every module component is finite (docs/FAULTS.md 6): a NaN weight would
    otherwise surface only as black or noise images, and be blamed on the memory preset."""
    import torch

    for name, comp in pipe.components.items():
        if not isinstance(comp, torch.nn.Module):
            continue
        for pname, param in comp.named_parameters():
            if not param.is_floating_point() or param.device.type == "meta":
                continue
            try:
                finite = torch.isfinite(param.detach())
            except (RuntimeError, NotImplementedError):  # float8 storage on some builds
                finite = torch.isfinite(param.detach().float())
            if not bool(finite.all()):
                bad = int(finite.numel() - finite.sum())
                raise ModelLoadError(
                    f"the {name} weights contain NaN/Inf: {pname} has {bad} non-finite value(s) of "
                    f"{param.numel()}; the model file is damaged (or was saved in a precision too small for "
                    "it): download it again or use another copy"
                )
