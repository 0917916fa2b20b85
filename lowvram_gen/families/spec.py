"""The one reader of a model's model_index.json for its family: the folder a spec names (a diffusers folder, or a
hub id already in the HF cache), its small config files, and the record its pipeline class names, without loading
anything. Session.plan, the sampling defaults (families/sampling.py), the web UI's sliders, the CLI and the REST
API's body reader all ask `record_of_index` / `record_of_spec` here, so they cannot disagree on a folder's family.
Nothing here imports torch or diffusers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from lowvram_gen.families.record import Family, Task
from lowvram_gen.families.registry import find_pipeline
from lowvram_gen.safe_json import load_file


def read_config(path: Path) -> Mapping:
    """A small config file's object; {} where there is none. A file that is no JSON, or nested too deep, is refused
    naming it (safe_json), as every reader of the folder's configs refuses it."""
    try:
        data = load_file(path)
    except OSError:
        return {}
    return data if isinstance(data, dict) else {}


def index_folder(spec: str) -> Path | None:
    """The diffusers folder `spec` names: a local folder with a model_index.json, or a hub id's snapshot in the HF
    cache (never downloaded here); None for a single file, a missing path or a hub id not downloaded."""
    path = Path(str(spec)).expanduser()
    if (path / "model_index.json").is_file():
        return path
    if "/" not in str(spec) or path.exists():  # a folder without an index, a file, or no hub id
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(str(spec), "model_index.json")
    except ValueError:  # a spec the hub's cache cannot name
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def record_of_index(index: Mapping) -> Family | None:
    """The record that claims the pipeline class model_index.json names (its _class_name); None where it names none
    or no record claims it (the caller then asks the denoiser's class, as for a single file)."""
    name = index.get("_class_name")
    return find_pipeline(name) if isinstance(name, str) and name else None


def record_of_spec(spec: str) -> Family | None:
    """The family of a model spec from its model_index.json (`index_folder`); None: unknown, a single file, not
    downloaded, or an index that cannot be read (loading the model then says what is wrong with it)."""
    try:
        folder = index_folder(spec)
        return record_of_index(read_config(folder / "model_index.json")) if folder is not None else None
    except (OSError, ValueError):
        return None


def edit_record_of_spec(spec: str) -> Family | None:
    """The family of `spec` where it is an editing model (its record has Task.EDIT), else None."""
    record = record_of_spec(spec)
    return record if record is not None and record.has_task(Task.EDIT) else None
