"""Where lowvram-gen keeps its own files. No side effects at import time."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def home() -> Path:
    """`$LOWVRAM_GEN_HOME`, else `~/.cache/lowvram-gen` (embedded models, remembered failures)."""
    env = os.environ.get("LOWVRAM_GEN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lowvram-gen"


def models_dir() -> Path:
    return home() / "models"


def write_atomically(file: Path, text: str) -> None:
    """Write `text` to `file` through a temporary file in the same folder and a rename, so a reader (or a
    crash half way) never sees a half-written file; the temporary file is removed if anything fails."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
