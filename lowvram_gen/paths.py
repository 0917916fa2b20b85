"""Where lowvram-gen keeps its own files. No side effects at import time."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """`$LOWVRAM_GEN_HOME`, else `~/.cache/lowvram-gen` (embedded models, remembered failures)."""
    env = os.environ.get("LOWVRAM_GEN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lowvram-gen"


def models_dir() -> Path:
    return home() / "models"
