"""The steps and CFG scale a job runs when the user gives none: its family's (the record's `sampling`), for the
variant the model folder is (Z-Image Turbo or base, Flux.2 Klein distilled or base, FLUX.1 dev or schnell).

A request leaves `steps` and `cfg_scale` None when they were not given (request.py); the Session fills them here
once, where the model is known and before the plan (whose timing counts the steps), so the infotext, the JSON, the
progress line, hires fix and the API's `info` all see the numbers that ran. Only the folder's small JSON files are
read (model_index.json, transformer/config.json): no weights, no download. Nothing here imports torch or models/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from lowvram_gen.families.record import Family, FolderFacts
from lowvram_gen.families.registry import by_pipeline


def _json(path: Path) -> Mapping:
    """A small config file's object; {} where there is none (the defaults then are the record's). A file that is no
    JSON, or nested too deep, is refused naming it (safe_json), as every reader of the folder's configs refuses it."""
    from lowvram_gen.safe_json import load_file

    try:
        data = load_file(path)
    except OSError:
        return {}
    return data if isinstance(data, dict) else {}


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
    return FolderFacts(name=model_name(spec, name_path or folder), model_index=_json(folder / "model_index.json"),
                       transformer=_json(folder / "transformer" / "config.json"))


def record_of(facts: FolderFacts) -> Family | None:
    """The record of the folder's pipeline class (model_index.json's _class_name); None where it names none."""
    name = facts.model_index.get("_class_name")
    return by_pipeline(name) if isinstance(name, str) and name else None

