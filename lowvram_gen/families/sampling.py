"""The steps and CFG scale a job runs when the user gives none: its family's (the record's `sampling`), for the
variant the model folder is (Z-Image Turbo or base, Flux.2 Klein distilled or base, FLUX.1 dev or schnell).

A request leaves `steps` and `cfg_scale` None when they were not given (request.py); the Session fills them here
once, where the model is known and before the plan (whose timing counts the steps), so the infotext, the JSON, the
progress line, hires fix and the API's `info` all see the numbers that ran. Only the folder's small JSON files are
read (model_index.json, transformer/config.json, by families/spec.py, which also says the record the index names):
no weights, no download. Nothing here imports torch or models/.
"""

from __future__ import annotations

from pathlib import Path

from lowvram_gen.families.record import FolderFacts
from lowvram_gen.families.spec import read_config


def model_name(spec: str, path: Path | None = None) -> str:
    """How the facts name a model, lower case: a hub id as it is ('tongyi-mai/z-image'), else the folder's or the
    file's own name (never the folders above it, whose names say nothing of the model)."""
    text = str(spec).strip()
    if "/" in text and not Path(text).expanduser().exists():
        return text.lower()
    return (Path(path).name if path is not None else Path(text).name).lower()


def folder_facts(spec: str, folder: Path | None, name_path: Path | None = None) -> FolderFacts:
    """What `folder` (a diffusers folder, or a single file's --config folder; None: none) says, named after `spec`
    (`name_path`: the file or folder whose name names the model, where `spec` is not a hub id)."""
    if folder is None or not Path(folder).is_dir():
        return FolderFacts(name=model_name(spec, name_path))
    folder = Path(folder)
    return FolderFacts(name=model_name(spec, name_path or folder), model_index=read_config(folder / "model_index.json"),
                       transformer=read_config(folder / "transformer" / "config.json"))

