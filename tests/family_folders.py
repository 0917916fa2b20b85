"""Test utility: the tiny seeded folder of every 2026 family that has a record (issue 30), built once per test module
into one models folder, as a user keeps them (`<root>/<family key>/model_index.json`).

The builders are the families' own test utilities (tests/tiny_qwen.py, tiny_flux2.py, tiny_zimage.py, tiny_dit.py):
diffusers' own test shapes, seeded, offline. `family_folders()` makes a module-scoped `folders` fixture:
{family key: folder path}. Not a test module: test modules import from here, never from each other.
"""

from __future__ import annotations

import json

import pytest
from tiny_dit import build_tiny_chroma, build_tiny_lumina2, build_tiny_sana
from tiny_flux2 import build_tiny_flux2_klein
from tiny_qwen import build_tiny_qwen_image
from tiny_zimage import build_tiny_zimage

# family key (families/records_*.py) -> the builder of its tiny pipeline
BUILDERS = {
    "qwen-image": build_tiny_qwen_image,
    "z-image": build_tiny_zimage,
    "flux2-klein": build_tiny_flux2_klein,
    "sana": build_tiny_sana,
    "chroma": build_tiny_chroma,
    "lumina2": build_tiny_lumina2,
}


def record_of(folder: str):
    """The family record the folder's pipeline class is."""
    from pathlib import Path

    from lowvram_gen import families

    return families.by_pipeline(json.loads((Path(folder) / "model_index.json").read_text())["_class_name"])


def family_folders(name: str = "family-models", keys=tuple(BUILDERS)):
    """A module-scoped fixture: the tiny folders of `keys` saved under one temporary models folder."""

    @pytest.fixture(scope="module")
    def folders(tmp_path_factory) -> dict[str, str]:
        root = tmp_path_factory.mktemp(name)
        out = {}
        for key in keys:
            BUILDERS[key]().save_pretrained(root / key, safe_serialization=True)
            assert record_of(str(root / key)).key == key  # the folder is read as its family
            out[key] = str(root / key)
        return out

    return folders
