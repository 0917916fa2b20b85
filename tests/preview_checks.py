"""Test utility: what the live-preview tests of the 2026 families share (tests/test_preview_families.py,
tests/test_preview_edit_families.py). Not a test module."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from lowvram_gen import families, preview


def tiny_channels(monkeypatch, folder: str) -> None:
    """The tiny folders' VAEs have fewer latent channels than the real ones (diffusers' test shapes: Qwen-Image's 4,
    not 16): the family's format is given a map of their count (its own rows, repeated), so the run checks what it
    can at this size: that the latents reach the preview laid out as the format reads them, at the image's size.
    The published maps at the real channel counts are checked on latents of that count."""
    config = json.loads((Path(folder) / "vae" / "config.json").read_text())
    channels = int(config.get("latent_channels") or config.get("z_dim"))
    key = families.by_pipeline(json.loads((Path(folder) / "model_index.json").read_text())["_class_name"]).latent_format
    fmt = preview.FORMATS[key]
    monkeypatch.setitem(preview.FORMATS, key,
                        replace(fmt, factors=tuple(fmt.factors[i % len(fmt.factors)] for i in range(channels))))


def distinct_colours(image) -> int:
    import numpy as np

    return len(np.unique(np.asarray(image).reshape(-1, 3), axis=0))
