"""Turn what the user typed for --model into a local source: embedded name, folder, file or hub id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models.tiny import TINY_MODELS, ensure_tiny

SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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
                "give a diffusers folder, a single .safetensors checkpoint, a hub id or tiny/tiny-sdxl"
            )
        return ModelSource(spec, "folder", path.resolve())
    if path.is_file():
        if path.suffix.lower() not in SINGLE_FILE_SUFFIXES:
            raise ModelLoadError(f"{spec}: unknown checkpoint type {path.suffix!r}; use one of {', '.join(SINGLE_FILE_SUFFIXES)}")
        return ModelSource(spec, "single_file", path.resolve(), config)
    if path.suffix.lower() in SINGLE_FILE_SUFFIXES or spec.startswith((".", "/", "~")) or "\\" in spec:
        raise ModelLoadError(f"model file or folder not found: {spec}")
    if not _HUB_ID.match(spec):
        raise ModelLoadError(
            f"model not found: {spec!r} is not an embedded model ({', '.join(TINY_MODELS)}), "
            "an existing folder or file, or a hub id like 'org/name'"
        )
    return ModelSource(spec, "hub", Path(_download(spec)))


def _download(repo_id: str) -> str:
    """The pipeline's files in the normal Hugging Face cache (downloaded on first use)."""
    from diffusers import DiffusionPipeline

    try:
        return DiffusionPipeline.download(repo_id)
    except Exception as exc:  # offline, not cached, gated, not found: all end the same way for the user
        raise ModelLoadError(
            f"could not get {repo_id!r} from the Hugging Face hub or its cache ({_first_line(exc)}). "
            f"Download it once while online with `hf download {repo_id}` (log in with `hf auth login` for gated "
            "models), or pass a local folder or .safetensors file to --model"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
