"""Single-file checkpoints (A1111 / Civitai / original LDM layout): validate, load safely, convert.

Why this module exists instead of a bare `from_single_file` call:

* Safety (docs/FAULTS.md 1, 2). A `.ckpt` is a pickle and a pickle can run code. Files are read through
  models/safe_files.py: pickles only with torch's weights-only unpickler, and a `.safetensors` never unpickled.
* Clear errors (docs/FAULTS.md 3, 4, 6, 7). diffusers fills missing weights with nothing (they stay on the
  `meta` device), only logs unexpected ones, and with `local_files_only=True` it still goes online when
  the base configs are not cached. Here the checkpoint's keys and shapes are checked against the target
  architecture on the meta device before anything is loaded, and the configs are found locally only: `--config`,
  the HF cache, else the ones lowvram-gen ships (models/offline_configs.py, docs/single-file-offline.md).

What the file is comes from the family records (lowvram_gen/families: their `SingleFile`): which keys make
which family, its pipeline class, its default configs, the components its config folder needs, which
denoiser int8/int4 quantize as it loads, and where its text encoders' weights are.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from lowvram_gen import families, safe_json
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.families.keys import CLIP_SD, CLIP_XL, OPENCLIP_SD2, OPENCLIP_XL, UNET, VAE_PREFIXES, diffusers_markers
from lowvram_gen.models import gguf_file, offline_configs, transformer_file, unreadable_files
from lowvram_gen.models.checkpoint_keys import layout_hint
from lowvram_gen.models.safe_files import (check_safetensors, last_line, load_pickle_weights_only, safetensors_header,
                                           weights_only_allowlist)

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"

# What diffusers' own config download fetches (loaders/single_file.py): configs, vocabularies, spm models.
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model")

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
    """The diffusers pipeline class for an original-layout (LDM / A1111 / Civitai) checkpoint's keys."""
    return detect_family(keys).single_file.pipeline


def detect_family(keys) -> families.Family:
    """The family record of an original-layout (LDM / A1111 / Civitai) checkpoint's keys.

    SD 1.x/2.x and SDXL need all three parts (UNet, VAE, text encoders): `from_single_file` takes every
    weight from the file. Anything else is refused with a few of its keys and the keys expected.
    """
    keys = list(keys)
    found = families.by_checkpoint(frozenset(keys))
    if found is not None:
        return found
    markers = diffusers_markers()

    def has(*prefixes):
        return any(k.startswith(prefixes) for k in keys)

    unet, vae = has(UNET + "input_blocks.") and has(UNET + "output_blocks."), has(*VAE_PREFIXES)

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
    hint = layout_hint(keys)
    shown = ", ".join(repr(k) for k in (unexpected or keys)[:4]) or "none"
    raise ModelLoadError(
        f"not a Stable Diffusion checkpoint in the original (A1111 / Civitai / LDM) layout{hint}: "
        f"{'unexpected keys' if unexpected else 'keys'} such as {shown} ({len(keys)} keys in all); "
        f"missing {'; '.join(missing) or 'the marker keys'}. Expected keys: {UNET}*, first_stage_model.*, and "
        f"{CLIP_SD}* (SD 1.x/2.x) or {CLIP_XL}* + {OPENCLIP_XL}* (SDXL); SD3 / Flux files by their marker keys "
        f"(e.g. {(markers['sd3'] or ['joint_blocks.0...'])[0]!r}, {(markers['flux'] or ['double_blocks.0...'])[0]!r})."
    )


# ----------------------------------------------------------------------------------------- loading

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
    config = safe_json.load_file(unet_config)
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


def _file_facts(family: families.Family) -> families.SingleFile:
    return family.single_file or families.SingleFile(pipeline=family.pipeline_for("txt2img") or "")


def _default_repo(meta: dict, family: families.Family) -> str:
    """diffusers' default config repo for this checkpoint (from its shapes), kept within the detected family."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_DEFAULT_PIPELINE_PATHS, infer_diffusers_model_type

    try:
        model_type = infer_diffusers_model_type(meta)
    except Exception:  # noqa: BLE001 - a marker check that needs real values; fall back to the family default
        model_type = None
    types = _file_facts(family).model_types
    if not types:  # a 2026 family's transformer file: the components of its own repo
        return family.hub_id or ""
    if model_type not in types:  # e.g. a small SDXL without resblocks.9 reads as "v1"
        model_type = types[0]
    return DIFFUSERS_DEFAULT_PIPELINE_PATHS[model_type]["pretrained_model_name_or_path"]


def _resolve_config(config: str | None, meta: dict, family: families.Family, path: Path, weights: bool = False,
                    read=None) -> Path:
    """A local folder with the base architecture's configs: `config` itself, a repo in the HF cache, else (no
    `config`, a whole file) the shipped configs fitted to the file (models/offline_configs.py; `read`: one tensor's
    values, for SD 2.x's v test).

    Never downloads: diffusers' from_single_file would go online even with local_files_only=True when
    the configs are not cached, so only a local folder is ever handed to it. `weights`: the file holds
    only the denoiser (GGUF), so the folder must also hold the other components' weights.
    """
    if config:
        flag = "--components" if weights and not gguf_file.is_gguf(path) else "--config"
        unreadable_files.refuse_file_as_folder(flag, config)
        folder = Path(config).expanduser()
        if folder.is_dir():
            if not (folder / "model_index.json").is_file():
                raise ModelLoadError(f"--config {config} is a folder but not a diffusers pipeline (no model_index.json)")
            return folder
        if not _HUB_ID.match(config):
            raise ModelLoadError(f"--config {config}: no such folder, and not a hub id like 'org/name'")
        repo = config
    else:
        repo = _default_repo(meta, family)
    from huggingface_hub import constants, snapshot_download

    def missing(what: str) -> ModelLoadError:
        if weights:
            gguf = gguf_file.is_gguf(path)
            alone = f"a GGUF {family.name} denoiser" if gguf else f"a {family.name} transformer file"
            flag = "--config" if gguf else "--components"  # one flag, two names: the one its help text says
            return ModelLoadError(
                f"{path.name} ({alone}) needs the rest of the pipeline (VAE, text "
                f"encoders, tokenizer, scheduler) from a diffusers copy of {repo}, {what} (cache: "
                f"{constants.HF_HUB_CACHE}); the hub is not contacted for it. Fix: pass {flag} FOLDER (a local "
                f"diffusers folder of the same base model), or download the base model once: hf download {repo}"
            )
        return ModelLoadError(
            f"{path.name} ({family.name} checkpoint) needs the diffusers configs and tokenizer of {repo}, "
            f"{what} (cache: {constants.HF_HUB_CACHE}); the hub is not contacted for them. Fix: pass "
            f"--config FOLDER (a local diffusers folder of the same architecture), or download the configs once "
            f'(a few MB, no weights): hf download {repo} --include "*.json" --include "*.txt" --include "*.model"'
        )

    try:
        patterns = None if weights else list(CONFIG_PATTERNS)
        folder = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, offline mode, malformed id: all mean "not here"
        folder = None
    absent = [c for c in ("model_index.json", *_file_facts(family).components)
              if folder and not (folder / c).exists()]
    local = transformer_file.local_components(family) if folder is None and config is None and weights else None
    if local is not None:  # a diffusers folder of its family among the user's models
        return local
    if (folder is None or absent) and config is None and not weights and offline_configs.ships(family):
        shapes = {k: tuple(v.shape) for k, v in meta.items()}
        return offline_configs.offline_configs(family, shapes, path, read).folder
    if folder is None:
        raise missing("which are not in the local Hugging Face cache")
    if absent:
        raise missing(f"which are only partly in the local Hugging Face cache (no {', '.join(absent)})")
    return folder


def check_config(folder: Path, family: families.Family, path: Path) -> dict:
    """The config folder must be for the same architecture (the same family group) and have every component the
    file fills."""
    try:
        index = safe_json.load_file(folder / "model_index.json")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'model_index.json'}: {exc}") from None
    theirs = str(index.get("_class_name", "?"))
    lacking = [c for c in _file_facts(family).components
               if not (isinstance(index.get(c), list) and index[c][0] and (folder / c).is_dir())]
    cls_name = _file_facts(family).pipeline
    if families.by_pipeline(theirs).group != family.group or lacking:
        more = f" (it has no {', '.join(lacking)})" if lacking else ""
        raise ModelLoadError(
            f"the config folder {folder} is for {theirs}{more}, but {path.name} is for {cls_name} "
            f"({family.name}): pass --config with a diffusers folder of the same architecture"
        )
    return index


def _check_architecture(meta: dict, folder: Path, index: dict, family: families.Family, path: Path,
                        only: tuple[str, ...] = ()) -> None:
    """Map the checkpoint with diffusers' own converters on the meta device (no memory, no weights read)
    and compare keys and shapes with the models the config folder describes: wrong architecture or a
    damaged file is refused here, naming missing/unexpected keys, instead of half-loading.
    `only`: the components the file holds (a GGUF UNet: ("unet",), a GGUF Flux: ("transformer",)); () means all."""
    import diffusers
    import torch
    import transformers
    from diffusers import AutoencoderKL
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

    denoiser = getattr(diffusers, family.denoiser_classes[0])
    facts = _file_facts(family)
    if family.denoiser != "unet":  # a GGUF transformer on its own (BFL keys, no prefix); converted as it loads
        converters = {"bfl-flux1": flux}
        if facts.gguf_layout not in converters:
            return
        checks = [("transformer", "", diffusers_model(denoiser, "transformer"), converters[facts.gguf_layout])]
    else:
        checks = [("unet", UNET, diffusers_model(denoiser, "unet"), unet),
                  ("vae", "first_stage_model.", diffusers_model(AutoencoderKL, "vae"), vae)]
        for name, prefixes in facts.text_encoder_prefixes.items():  # the one the file has (SD 1.x's CLIP or 2.x's)
            prefix = next((p for p in prefixes if any(k.startswith(p) for k in meta)), prefixes[-1])
            checks.append((name, prefix, transformers_model(name), clip(prefix)))
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


def _second_text_encoder(path: Path, state: dict | None, folder: Path, torch_dtype, family: families.Family):
    """A second (OpenCLIP) text encoder, as SDXL's, converted from its own keys only (the family's prefix for
    text_encoder_2: conditioner.embedders.1 for SDXL).

    diffusers tells SDXL's two text encoders apart by width (768 vs 1280); when both have the same width
    (small test models) it would load CLIP-L's weights into the second encoder and leave its projection
    empty. Given only the embedders.1 keys it can only pick the right ones.
    """
    from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm
    from transformers import CLIPTextModelWithProjection

    prefix = _file_facts(family).text_encoder_prefixes["text_encoder_2"]
    if state is None:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            sub = {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    else:
        sub = {k: v for k, v in state.items() if k.startswith(prefix)}
    return create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, sub, subfolder="text_encoder_2",
                                                config=str(folder), torch_dtype=torch_dtype, local_files_only=True)


def _has_second_text_encoder(family: families.Family) -> bool:
    """The family's files hold a second text encoder (SDXL's OpenCLIP), read on its own (`_second_text_encoder`)."""
    return "text_encoder_2" in _file_facts(family).text_encoder_prefixes


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
        shapes = {k: tuple(v["shape"]) for k, v in safetensors_header(p).items() if k != "__metadata__"}
    else:
        state = load_pickle_weights_only(p)
        shapes = {k: tuple(v.shape) for k, v in state.items()}
    alone = None if gguf or state is not None else transformer_file.family_of(shapes)
    family = gguf_file.family_of(gguf, p) if gguf else (alone or detect_family(shapes))
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    folder = _resolve_config(config, meta, family, p, bool(gguf or alone), offline_configs.tensor_reader(p, state))
    index = check_config(folder, family, p) if not alone else {}
    del meta
    out = {}
    for name in names:
        if (gguf or alone) and name not in ("unet", "transformer"):
            out[name] = _one(p, folder, name, lambda: from_folder(folder, name))
        elif alone:
            out[name] = _one(p, folder, name, lambda: transformer_file.load_denoiser(p, family, folder, torch_dtype,
                                                                                     quantize, quantize_on))
        else:
            out[name] = _one(p, folder, name, lambda: _component(p, state, gguf, family, folder, index, name,
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
                             f"{type(exc).__name__}: {last_line(str(exc))}") from exc


# The denoiser int8/int4 quantize as it loads from a single file (`_from_own_keys`) is the family's
# (`SingleFile.quantize_on_load`). Not an SD3 / Flux transformer: diffusers' converters of those files assume the
# real models' widths (its Flux one splits fused weights at 3072), so no tiny file tests that path; they are
# quantized after the load, as before.
def _component(p: Path, state: dict | None, gguf, family: families.Family, folder: Path, index: dict, name: str,
               torch_dtype,
               quantize: str = "none", quantize_on: str | None = None):
    import diffusers

    if gguf:  # never quantized again
        return gguf_file.load_denoiser(p, gguf, family, folder, torch_dtype)[1]
    library, class_name = index[name]
    if name in ("unet", "vae"):
        kind = quantize if name == _file_facts(family).quantize_on_load else "none"
        return _from_own_keys(getattr(diffusers, class_name), p, state, folder, name, torch_dtype, kind, quantize_on)
    if name == "text_encoder_2" and _has_second_text_encoder(family):
        return _second_text_encoder(p, state, folder, torch_dtype, family)
    if name.startswith("text_encoder"):
        import transformers
        from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm

        prefixes = _file_facts(family).text_encoder_prefixes[name]
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
    with weights_only_allowlist():
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
    after the load, as before (planning/host.py counts them whole); so is an SD3 / Flux transformer (the family's
    `SingleFile.quantize_on_load` is None).
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
        header = safetensors_header(p)  # refuses anything that is not safetensors: no pickle fallback
        shapes = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    else:
        state = load_pickle_weights_only(p)  # refuses unsafe pickles before diffusers opens the file
        shapes = {k: tuple(v.shape) for k, v in state.items()}
    unreadable_files.refuse(p, shapes)  # ComfyUI's own formats (scaled fp8, a text encoder alone): one sentence
    # a 2026 family's transformer alone (ComfyUI's diffusion_models/): the rest from a diffusers folder, as a GGUF's
    alone = None if gguf or state is not None else transformer_file.family_of(shapes)
    family = gguf_file.family_of(gguf, p) if gguf else (alone or detect_family(shapes))
    facts = _file_facts(family)
    cls_name = facts.pipeline
    in_channels = shapes.get(UNET + "input_blocks.0.0.weight", (0, 4))[1]
    if facts.inpaint_unet and in_channels not in (4, INPAINT_CHANNELS):
        raise ModelLoadError(f"{p.name} is an instruct or depth model (its UNet takes {in_channels} input channels); "
                             "text-to-image (4 channels) and inpainting (9) checkpoints are supported")
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    folder = _resolve_config(config, meta, family, p, bool(gguf or alone), offline_configs.tensor_reader(p, state))
    if alone:
        return _one(p, folder, family.denoiser, lambda: transformer_file.load_pipeline(p, family, folder, torch_dtype,
                                                                                       quantize, quantize_on))
    if facts.inpaint_unet:  # an inpainting file with its base model's configs: their UNet with 9 inputs
        folder = with_unet_inputs(folder, int(in_channels))
    index = check_config(folder, family, p)
    if facts.architecture_check == "file" or (gguf and facts.architecture_check == "gguf"):
        _check_architecture(meta, folder, index, family, p, only=(family.denoiser,) if gguf else ())
    extra = dict.fromkeys(() if gguf else offline_configs.absent_components(family, shapes, folder))  # SD3 sans T5
    if quantize != "none" and not gguf and facts.quantize_on_load:  # first: nothing else is loaded beside it
        name = facts.quantize_on_load
        extra[name] = _one(p, folder, name, lambda: _component(p, state, None, family, folder, index, name,
                                                               torch_dtype, quantize, quantize_on))
    if _has_second_text_encoder(family) and not gguf:
        first, second = facts.text_encoder_prefixes["text_encoder"][0], facts.text_encoder_prefixes["text_encoder_2"][0]
        width_1 = shapes.get(first + "text_model.embeddings.position_embedding.weight", (0, -1))[-1]
        if width_1 == shapes.get(second + "positional_embedding", (0, -2))[-1]:
            extra["text_encoder_2"] = _second_text_encoder(p, state, folder, torch_dtype, family)
    del state, meta  # diffusers reads the file again (weights-only for pickles); drop this copy first

    import diffusers

    try:
        if gguf:
            pipe = gguf_file.load_pipeline(p, gguf, family, folder, torch_dtype)
        else:
            with weights_only_allowlist():  # diffusers loads pickles with weights_only=True itself
                pipe = getattr(diffusers, transformer_file.file_pipeline(folder, family)).from_single_file(
                    str(p), config=str(folder), torch_dtype=torch_dtype, local_files_only=True, **extra
                )
    except (MemoryError, torch.OutOfMemoryError, ModelLoadError):
        raise
    except Exception as exc:  # noqa: BLE001 - diffusers raises many types; the user needs one clear message
        raise ModelLoadError(f"could not load {p} as {cls_name} with the configs in {folder}: "
                             f"{type(exc).__name__}: {last_line(str(exc))}") from exc
    empty = {name: [k for k, v in comp.state_dict().items() if v.device.type == "meta"]
             for name, comp in pipe.components.items() if isinstance(comp, torch.nn.Module)}
    empty = {name: keys for name, keys in empty.items() if keys}
    if empty:  # diffusers leaves weights it did not find on the meta device instead of failing
        raise ModelLoadError(f"{p.name} has no weights for " + "; ".join(
            f"{name}: {len(keys)} missing ({', '.join(keys[:3])})" for name, keys in empty.items()))
    return pipe


# Weights per torch.isfinite call in check_finite: on the CPU it holds a float32 upcast and boolean temporaries of
# what it checks (5 bytes a weight of a 16-bit tensor, 7 of a float32 one), so a 0.5-0.7 B-weight text-encoder
# embedding checked whole held 2.5-4.7 GB for a moment (docs/benchmarks.md); 16M at a time hold at most 112 MB.
# planning/host.py's CHECK_FINITE_CHUNK is this number.
CHECK_FINITE_CHUNK = 1 << 24


def check_finite(pipe) -> None:
    """Every floating parameter of every module component is finite (docs/FAULTS.md 6): a NaN weight would
    otherwise surface only as black or noise images, and be blamed on the memory preset."""
    import torch

    def finite(part):
        try:
            return torch.isfinite(part)
        except (RuntimeError, NotImplementedError):  # float8 storage on some builds
            return torch.isfinite(part.float())

    for name, comp in pipe.components.items():
        if not isinstance(comp, torch.nn.Module):
            continue
        for pname, param in comp.named_parameters():
            if not param.is_floating_point() or param.device.type == "meta":
                continue
            flat = param.detach().reshape(-1)
            parts = [flat[i:i + CHECK_FINITE_CHUNK] for i in range(0, flat.numel(), CHECK_FINITE_CHUNK)]
            if not all(bool(finite(part).all()) for part in parts):
                bad = sum(int(part.numel() - finite(part).sum()) for part in parts)
                raise ModelLoadError(
                    f"the {name} weights contain NaN/Inf: {pname} has {bad} non-finite value(s) of "
                    f"{param.numel()}; the model file is damaged (or was saved in a precision too small for "
                    "it): download it again or use another copy"
                )
