"""LoRA files as named PEFT adapters on a loaded pipeline, re-weighted per job, never fused.

Each file is loaded once per pipeline through diffusers' `load_lora_weights` (which converts
kohya/A1111 `lora_unet_*`/`lora_te*_*` keys with their `alpha`, and reads diffusers/peft
`unet.*.lora_A/lora_B` keys) under an adapter name derived from its path. Every job then calls
`set_adapters` with that job's weights, or `disable_lora` when it asks for none, so switching LoRAs
on, off or to another weight costs nothing and leaves the base weights as they are. We do not
`fuse_lora`: fused weights cannot be re-weighted without unfusing, and fusing into fp8-stored
weights would round the LoRA's delta to fp8.

A component reloaded from disk (the runner restores precision that way) loses its adapters; that is
noticed and the LoRA is loaded again.
"""

from __future__ import annotations

import hashlib
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lowvram_gen import families
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.models.quiet import libraries_silenced
from lowvram_gen.networks import files
from lowvram_gen.networks.hooks import fp8_lifted, hooks_lifted
from lowvram_gen.networks.tags import LoraRef, merge_refs

log = logging.getLogger(__name__)

SUFFIXES = (".safetensors", ".pt", ".ckpt", ".bin")
_STATE = "_lowvram_loras"  # on the pipeline: {adapter name: _Loaded}
# the first matrix of each LoRA layer, in every key layout diffusers produces or accepts
_DOWN = re.compile(r"(lora_A|lora[._]down|lora_linear_layer\.down)\.weight$")


@dataclass
class _Loaded:
    path: str
    stamp: tuple[int, int]  # mtime_ns, size: a changed file is loaded again
    components: tuple[str, ...]  # where the adapter went


def lora_dirs() -> list[Path]:
    return files.kind_dirs("Lora")


def available_loras() -> dict[str, Path]:
    """{name (file stem): path} of the LoRA files in `lora_dirs()`."""
    found: dict[str, Path] = {}
    for folder in lora_dirs():
        for stem, path in files.scan(folder, SUFFIXES).items():
            found.setdefault(stem, path)
    return found


def find_lora(name: str) -> Path:
    """The file for `name` (stem, stem with suffix, or a path); InvalidRequest listing what exists."""
    return files.find(name, available_loras(), "LoRA", lora_dirs(), SUFFIXES)


def lora_hash(path) -> str:
    """A1111's short hash of a LoRA (`Lora hashes:` in the infotext; Civitai looks models up by it):
    the first 12 hex digits of the kohya "addnet" sha256 (the bytes after the safetensors header),
    or of the whole file for pickles; a kohya `sshs_model_hash` in the metadata wins, as in A1111."""
    p = Path(path)
    if p.suffix.lower() == ".safetensors":
        from lowvram_gen.models.safe_files import safetensors_header

        meta = safetensors_header(p).get("__metadata__") or {}
        stored = meta.get("sshs_model_hash") if isinstance(meta, dict) else None
        if isinstance(stored, str) and re.fullmatch(r"[0-9a-fA-F]{12,64}", stored):
            return stored[:12].lower()
        return files.sha256(p, addnet=True)[:12]
    return files.sha256(p)[:12]


def read_lora_file(path: Path) -> dict:
    """The tensors of a LoRA file, read safely: safetensors headers checked, pickles weights-only."""
    from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only

    if path.suffix.lower() == ".safetensors":
        check_safetensors(path)
        from safetensors.torch import load_file

        return load_file(str(path))
    return load_pickle_weights_only(path)


def adapter_name(path: Path) -> str:
    """A PEFT adapter name for a file: no dots (module-dict keys), unique per path."""
    stem = re.sub(r"\W", "_", path.stem)[:40]
    return f"lora_{stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:6]}"


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def _targets(pipe, state: dict) -> dict[str, int]:
    """LoRA layers per component prefix ('unet', 'text_encoder', ...) after diffusers' conversion."""
    kwargs = {"unet_config": pipe.unet.config} if getattr(pipe, "unet", None) is not None else {}
    converted = pipe.lora_state_dict(dict(state), **kwargs)
    if isinstance(converted, tuple):  # SD/SDXL/FLUX.1's loaders: (state dict, network alphas); the others the dict
        converted = converted[0]
    _check_widths(pipe, converted)
    counts: dict[str, int] = {}
    for key in converted:
        if _DOWN.search(key):
            prefix = key.split(".", 1)[0]
            counts[prefix] = counts.get(prefix, 0) + 1
    return counts


def _check_widths(pipe, converted: dict) -> None:
    """A LoRA layer whose widths are not its model layer's is another model's: refused (a ValueError in torch's
    'size mismatch' words, which _does_not_fit reads) before diffusers' FLUX.1 loader, which Chroma's pipeline
    takes too, widens the model's layer to fit it (meant for FLUX.1's Control LoRAs: the record's `lora_widens`, the
    one family left to it) and the job then fails in its first step."""
    import torch

    if families.of_pipe(pipe).lora_widens:
        return
    found = []
    for key, down in converted.items():
        if not key.endswith(".lora_A.weight") or "." not in key:
            continue
        comp, path = key.removesuffix(".lora_A.weight").split(".", 1)
        try:
            layer = getattr(pipe, comp).get_submodule(path)
        except AttributeError:
            continue  # matches nothing: counted as such after the load
        if isinstance(layer, torch.nn.Linear) and down.shape[1] != layer.in_features:
            found.append(f"size mismatch for {key}: copying a param with shape torch.Size([{down.shape[0]}, "
                         f"{down.shape[1]}]) from checkpoint, the shape in current model is torch.Size("
                         f"[{down.shape[0]}, {layer.in_features}])")
    if found:
        raise _WidthMismatch("\n".join(found))


class _WidthMismatch(ValueError):
    """Layers of a LoRA wider or narrower than the model's (_check_widths)."""


def injected(pipe, name: str) -> dict[str, int]:
    """LoRA layers of adapter `name` per component, as they are in the models now."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    counts = {}
    for comp in getattr(pipe, "_lora_loadable_modules", []):
        module = getattr(pipe, comp, None)
        if module is None:
            continue
        n = sum(1 for m in module.modules() if isinstance(m, BaseTunerLayer) and name in getattr(m, "lora_A", {}))
        if n:
            counts[comp] = n
    return counts


def _delete(pipe, name: str) -> None:
    from diffusers.utils.peft_utils import delete_adapter_layers

    for comp in getattr(pipe, "_lora_loadable_modules", []):
        module = getattr(pipe, comp, None)
        if module is not None and name in getattr(module, "peft_config", {}):
            delete_adapter_layers(module, name)
            if hasattr(module, "peft_config"):  # this module's state: peft's adapters on it
                module.peft_config.pop(name, None)


def _load(pipe, path: Path, name: str) -> tuple[tuple[str, ...], list[str]]:
    state = read_lora_file(path)
    cls = type(pipe).__name__
    hint = f"is it a LoRA for another model family ({_families_apart(pipe)})?"
    try:
        wanted = _targets(pipe, state)
    except _WidthMismatch as exc:
        raise ModelLoadError(_does_not_fit(path, name, cls, exc, _families_apart(pipe))) from None
    except (ValueError, KeyError, AssertionError, IndexError, RuntimeError) as exc:
        # diffusers' converters raise these (an AssertionError where a fused layer does not split at the widths
        # they expect): a layout they do not read for this family is said as such, a broken file as one
        if layout_of(state)[0] != "diffusers":
            raise ModelLoadError(_not_converted(pipe, path, state)) from None
        raise ModelLoadError(f"LoRA {path} could not be read as a LoRA ({_first_line(exc)})") from None
    state = _without_absent(pipe, state, wanted)
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    try:
        # peft's "multiple adapters in the model" warning: that is the point
        with libraries_silenced("Already found a `peft_config`"), \
                (fp8_lifted(denoiser) if denoiser is not None else _nothing()):
            pipe.load_lora_weights(dict(state), adapter_name=name)
    except (ValueError, RuntimeError, KeyError, TypeError, AssertionError) as exc:
        _delete(pipe, name)
        raise ModelLoadError(_does_not_fit(path, name, cls, exc, _families_apart(pipe), layout_of(state)[1])) \
            from None
    got = injected(pipe, name)
    total, matched = sum(wanted.values()), sum(got.values())
    if matched == 0:
        _delete(pipe, name)
        if not set(wanted) & set(getattr(pipe, "_lora_loadable_modules", ())) and layout_of(state)[0] != "diffusers":
            raise ModelLoadError(_not_converted(pipe, path, state))  # diffusers left its keys as they were
        raise ModelLoadError(f"LoRA {path}: none of its {total} layers match a layer of this {cls}; {hint}")
    warnings = []
    if matched < total:
        warnings.append(f"LoRA {path.name}: {total - matched} of its {total} layers match nothing in this {cls} "
                        f"and are ignored (loaded into {', '.join(got)})")
    return tuple(got), warnings


# the keys of a text encoder's layers in the layouts A1111 and diffusers save (kohya's `lora_te_` is SD 1.x's one)
_ENCODER_KEYS = {"text_encoder": ("lora_te1_", "lora_te_", "text_encoder."), "text_encoder_2": ("lora_te2_",
                                                                                                 "text_encoder_2.")}


def _without_absent(pipe, state: dict, wanted: dict) -> dict:
    """`state` without the layers of a text encoder the pipeline lacks (the SDXL refiner has no first one): A1111
    skips them, diffusers' SDXL loader fails on them; they are counted among the layers that match nothing."""
    absent = [c for c in wanted if c in _ENCODER_KEYS and hasattr(pipe, c) and getattr(pipe, c) is None]
    prefixes = tuple(p for c in absent for p in _ENCODER_KEYS[c])
    return {k: v for k, v in state.items() if not k.startswith(prefixes)} if prefixes else state


def layout_of(state: dict) -> tuple[str, str]:
    """(kind, how a sentence names it) of a LoRA file's keys, as its users' tools save them: 'kohya' (sd-scripts'
    flattened `lora_unet_...` names, on BFL's original blocks or the model's own), 'comfy' (ComfyUI's and
    ai-toolkit's `diffusion_model.` prefix), 'peft' (`base_model.model.`), 'lycoris' (LoKr/LoHa), 'diffusers' (a
    pipeline component's name first: `transformer.`, `unet.`, `text_encoder.`) or 'unknown'."""
    keys = [k for k in state if isinstance(k, str)]
    example = next((k for k in keys if re.search(r"lora_A|lora_down|lokr_|hada_", k)), keys[0] if keys else "")
    bfl = " on BFL's original block names" if any("double_blocks" in k or "single_blocks" in k for k in keys) else ""
    if any(".lokr_" in k or ".hada_" in k for k in keys):
        kind, said = "lycoris", "LyCORIS's (LoKr/LoHa) layout"
    elif any(k.startswith(("lora_unet_", "lora_te", "lora_transformer_")) for k in keys):
        kind, said = "kohya", f"kohya/sd-scripts' layout{bfl}"
    elif any(k.startswith("diffusion_model.") for k in keys):
        kind, said = "comfy", f"ComfyUI/ai-toolkit's layout{bfl}"
    elif any(k.startswith("base_model.model.") for k in keys):
        kind, said = "peft", "PEFT's layout"
    elif any(k.split(".", 1)[0] in ("transformer", "unet", "text_encoder", "text_encoder_2", "prior") for k in keys):
        kind, said = "diffusers", "diffusers' layout"
    else:
        kind, said = "unknown", "a layout diffusers does not name"
    return kind, f"{said} ({example})" if example else said


def _not_converted(pipe, path: Path, state: dict) -> str:
    """One sentence for a LoRA whose key layout diffusers' loader of this family does not convert (its converters'
    own errors are lists of the keys they could not place: not repeated here)."""
    family = families.of_pipe(pipe).name or type(pipe).__name__
    return (f"LoRA {path.name} is in {layout_of(state)[1]}, which diffusers' LoRA loader does not convert for "
            f"{family}; a LoRA for {family} in diffusers' layout (transformer.<module>.lora_A/lora_B) loads "
            f"({path})")


@contextmanager
def _nothing():
    yield


_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) from "
                       r"checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")


def _families_apart(pipe) -> str:
    """How a LoRA of another family is told apart, for the hint: SD 1.x/2.x vs SDXL (the usual mix-up among the
    families that take A1111's LoRA keys), or the pipeline's family by name ('not Qwen-Image')."""
    record = families.of_pipe(pipe)
    return "SD 1.x/2.x vs SDXL" if record.lora == "a1111" or record.is_generic else f"not {record.name}"


def _does_not_fit(path: Path, adapter: str, cls: str, exc: BaseException, apart: str = "SD 1.x/2.x vs SDXL",
                  layout: str = "") -> str:
    """One complete sentence for a LoRA that failed to load: torch's 'size mismatch' list (one line per layer,
    its first line only a heading) becomes the count and one layer's shapes in the file and in the model; any other
    failure names the file's key layout (`layout_of`) beside the loader's first line."""
    found = _MISMATCH.findall(str(exc))
    if not found:
        said = f" ({layout})" if layout else ""
        return (f"LoRA {path.name}{said} does not fit this {cls}: {_first_line(exc).rstrip('.')}; is it a LoRA for "
                f"another model family ({apart})? ({path})")
    key, in_file, in_model = found[0]
    key = key.replace(f".{adapter}.", ".")  # peft's per-adapter key: the layer as the file names it
    return (f"LoRA {path.name} is for another base model than this {cls} ({apart}?): "
            f"{len(found)} of its weights do not fit the model's layers, e.g. {key} is {_shape(in_file)} in the "
            f"file but {_shape(in_model)} in the model ({path})")


def _shape(text: str) -> str:
    """'4, 64' (torch.Size's text) -> '4x64'."""
    return "x".join(part.strip() for part in text.split(","))


def _first_line(exc: BaseException) -> str:
    """The exception's first line that says something (a line ending in ':' is a heading of what follows)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.endswith(":")] or lines
    return (said[0] if said else type(exc).__name__)[:240]


def takes_loras(pipe) -> bool:
    """Whether the pipeline has a LoRA loader: its family's record says (`lora`); a family no record knows is asked
    whether its pipeline object has diffusers' loader (the generic record's 'its loader, if it has one')."""
    record = families.of_pipe(pipe)
    if record.lora is None:
        return False
    return not record.is_generic or hasattr(pipe, "load_lora_weights")


def activate_loras(pipe, refs: list[LoraRef], reapply_memory: Callable[[], object] | None = None) -> list[str]:
    """Make exactly `refs` active on `pipe` with their weights for the next job; returns warnings.

    Call it after the job's first preset is applied and before the pipeline runs. New files are
    loaded (hooks handled as in `hooks.py`; `reapply_memory` re-applies the engine's current preset),
    files already loaded are only re-weighted, LoRAs not asked for are switched off (not unloaded:
    asking for them again is free). Unknown names raise InvalidRequest listing what exists; a file
    that fits nothing in this model raises ModelLoadError naming it.
    """
    refs, warnings = merge_refs(list(refs))
    loaded: dict[str, _Loaded] = getattr(pipe, _STATE, None) or {}
    if not refs and not loaded:
        return warnings
    if refs and not takes_loras(pipe):
        raise InvalidRequest("LoRA", refs[0].name, f"{type(pipe).__name__} does not take LoRAs")
    paths = [find_lora(ref.name) for ref in refs]  # every name checked before anything is loaded
    if refs:
        _require_peft()
    names = [adapter_name(p) for p in paths]
    stale = []
    for path, name in zip(paths, names):
        entry = loaded.get(name)
        if entry is None or entry.stamp != _stamp(path) or set(injected(pipe, name)) != set(entry.components):
            stale.append((path, name))
    if stale:
        with hooks_lifted(pipe, reapply_memory):
            for path, name in stale:
                _delete(pipe, name)
                loaded.pop(name, None)
                components, more = _load(pipe, path, name)
                loaded[name] = _Loaded(str(path), _stamp(path), components)
                warnings += more
                log.info("loaded LoRA %s into %s", path, ", ".join(components))
        setattr(pipe, _STATE, loaded)
    for name in [n for n, e in loaded.items() if not injected(pipe, n)]:
        loaded.pop(name)  # its component was reloaded from disk and not asked for now
    if refs:
        pipe.enable_lora()
        pipe.set_adapters(names, adapter_weights=[ref.weight for ref in refs])
    elif any(pipe.get_list_adapters().values()):
        pipe.disable_lora()
    return warnings


def _require_peft() -> None:
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ModelLoadError("LoRAs need the peft package: pip install 'peft>=0.17'")
