"""The family of a model spec (a diffusers folder, or a hub id already in the HF cache) from its model_index.json,
without loading anything: what the CLI, the REST API's body reader and the Session ask before a model loads (an
editing model's request is shaped differently). Nothing here imports torch or diffusers.
"""

from __future__ import annotations

from pathlib import Path

from lowvram_gen.families.record import Family, Task
from lowvram_gen.families.registry import find_pipeline
from lowvram_gen.safe_json import load_file


def record_of_spec(spec: str) -> Family | None:
    """The family of a model spec from its model_index.json, without loading anything: a diffusers folder, or a hub
    id already in the HF cache (None: unknown, a single file, or not downloaded)."""
    index = Path(spec).expanduser() / "model_index.json"
    try:
        if not index.is_file():
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(spec, "model_index.json") if "/" in spec and not index.parent.exists() \
                else None
            index = Path(cached) if isinstance(cached, str) else None
        if index is None:
            return None
        index_json = load_file(index)
        return find_pipeline(str(index_json.get("_class_name", ""))) if isinstance(index_json, dict) else None
    except (OSError, ValueError):  # an unreadable index, or a spec the hub's cache cannot name
        return None


def edit_record_of_spec(spec: str) -> Family | None:
    """The family of `spec` where it is an editing model (its record has Task.EDIT), else None."""
    record = record_of_spec(spec)
    return record if record is not None and record.has_task(Task.EDIT) else None
