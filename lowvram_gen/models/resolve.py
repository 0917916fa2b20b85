"""Turn what the user typed for --model into a local source: embedded name, folder, file or hub id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen import families
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models.tiny import TINY_MODELS, ensure_tiny

SINGLE_FILE_SUFFIXES = (".safetensors", ".gguf", ".ckpt", ".pt", ".pth", ".bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The hub id of each architecture `plan` knows offline is its family record's (`Family.hub_id`): its short names
# (sd15, sd1.5, sdxl, flux-dev, ...: the record's aliases) load it, so `generate --model sd15` takes what `plan` takes.


@dataclass(frozen=True)
class ModelSource:
    spec: str  # what the user gave
    kind: str  # 'tiny' | 'folder' | 'single_file' | 'hub'
    path: Path  # the local diffusers folder, or the checkpoint file
    config: str | None = None  # base configs for a single file

    @property
    def is_tiny(self) -> bool:
        return self.kind == "tiny"


def resolve(spec: str, config: str | None = None) -> ModelSource:
    """Find the model locally (building an embedded one, or fetching a hub id into the HF cache)."""
    if spec in TINY_MODELS:
        return ModelSource(spec, "tiny", ensure_tiny(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ModelLoadError(
                f"{spec} is a folder but not a diffusers pipeline (no model_index.json); "
                "give a diffusers folder, a single .safetensors or .gguf file, a hub id or tiny/tiny-sdxl"
            )
        return ModelSource(spec, "folder", path.resolve())
    if path.is_file():
        if path.suffix.lower() not in SINGLE_FILE_SUFFIXES:
            raise ModelLoadError(f"{spec}: unknown checkpoint type {path.suffix!r}; use one of {', '.join(SINGLE_FILE_SUFFIXES)}")
        return ModelSource(spec, "single_file", path.resolve(), config)
    named = None if spec.startswith((".", "/", "~")) or "\\" in spec or "/" in spec else checkpoint_by_name(spec)
    if named is not None:  # A1111's --ckpt NAME: a checkpoint of the Stable-diffusion folders (--ckpt-dir) by name
        return resolve(str(named), config)
    if path.suffix.lower() in SINGLE_FILE_SUFFIXES or spec.startswith((".", "/", "~")) or "\\" in spec:
        raise ModelLoadError(f"model file or folder not found: {spec}")
    hub_id = alias_hub_id(spec)
    if hub_id is not None:
        return ModelSource(spec, "hub", Path(_download(hub_id, alias=spec)))
    if not _HUB_ID.match(spec):
        raise ModelLoadError(
            f"model not found: {spec!r} is not an embedded model ({', '.join(TINY_MODELS)}), "
            "an existing folder or file, or a hub id like 'org/name'"
        )
    return ModelSource(spec, "hub", Path(_download(spec)))


def checkpoint_by_name(name: str) -> Path | None:
    """A checkpoint file (`name` with or without its suffix) or diffusers folder named `name` in the Stable-diffusion
    folders (--ckpt-dir, then models/Stable-diffusion, then ComfyUI's checkpoints/, diffusion_models/ and unet/:
    networks/files.kind_dirs), their sub-folders too, or None."""
    from lowvram_gen.networks.files import kind_dirs, model_entries

    for folder in kind_dirs("Stable-diffusion"):
        if not folder.is_dir():
            continue
        for entry in model_entries(folder, SINGLE_FILE_SUFFIXES):
            if entry.is_dir() and entry.name == name:
                return entry
            if entry.is_file() and entry.suffix.lower() in SINGLE_FILE_SUFFIXES and name in (entry.name, entry.stem):
                return entry
    return None


def alias_hub_id(spec: str) -> str | None:
    """The hub id behind a short name such as 'sd15' or 'sdxl'; None for anything else (a hub id stays
    as given: a user with runwayml/stable-diffusion-v1-5 in the cache keeps loading that)."""
    family = None if "/" in spec else families.by_name(spec)
    return family.hub_id if family is not None else None


def _download(repo_id: str, alias: str | None = None) -> str:
    """The pipeline's files in the normal Hugging Face cache (downloaded on first use)."""
    from diffusers import DiffusionPipeline

    try:
        return DiffusionPipeline.download(repo_id)
    except Exception as exc:  # offline, not cached, gated, not found: all end the same way for the user
        named = repr(repo_id) + (f" (--model {alias})" if alias else "")
        raise ModelLoadError(
            f"could not get the model {named}: {hub_problem(exc)}. Download it once while online with "
            f"`hf download {repo_id}` (log in with `hf auth login` for gated models), or pass a local folder or "
            ".safetensors file to --model."
        ) from exc


def hub_problem(exc: BaseException) -> str:
    """Why the hub and its cache could not give a model, as one whole clause.

    The hub's own text runs to several sentences with nested parentheses (diffusers wraps the hub's
    error in its own); cutting it at a character count left half a sentence. The usual causes are
    named from the exception types; anything else gives its first whole sentence.
    """
    import os

    from huggingface_hub import errors as hub

    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    if any(isinstance(e, hub.GatedRepoError) for e in chain):  # before its base, RepositoryNotFoundError
        return "it is gated: accept its terms on huggingface.co and log in"
    if any(isinstance(e, hub.RepositoryNotFoundError) for e in chain):
        return "the hub has no model by that name (or it is private)"
    if any(isinstance(e, (hub.OfflineModeIsEnabled, hub.LocalEntryNotFoundError)) or "cached locally" in str(e)
           for e in chain):
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
        return "it is not in the local Hugging Face cache, and " + (
            "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached")
    return _first_sentence(str(chain[0])) or type(chain[0]).__name__


def _first_sentence(text: str) -> str:
    """Up to the first full stop outside parentheses, without it; the whole text if there is none."""
    text = " ".join(text.split())
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char in ".!?" and depth <= 0 and text[i + 1:i + 2] in ("", " "):
            return text[:i]
    return text
