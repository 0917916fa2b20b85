"""Where lowvram-gen keeps its own files. No side effects at import time."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path


def home() -> Path:
    """`$LOWVRAM_GEN_HOME`, else `~/.cache/lowvram-gen` (embedded models, remembered failures)."""
    env = os.environ.get("LOWVRAM_GEN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lowvram-gen"


def writable_folder(folder: str | Path, what: str) -> Path:
    """`folder`, created if missing, once a file could be made in it; else `UnwritableFolder` naming `what`
    (the output folder, LOWVRAM_GEN_HOME), the folder and the reason. Tried for real (a temporary file made
    and removed): permissions, a read-only mount, a full disk and a file in the way all show up, as root too."""
    from lowvram_gen.errors import UnwritableFolder

    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UnwritableFolder(f"{what} {folder} is a file, not a folder; point it at a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".lowvram-gen-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UnwritableFolder(f"{what} {folder} is not writable: {reason}; choose a folder you can write to"
                               ) from None
    return folder


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
    _remove_stale_temps(file)


STALE_TEMP_S = 60.0  # no live write_atomically keeps its temporary file this long: its writer was killed


def _remove_stale_temps(file: Path) -> None:
    """Remove the temporary files of earlier writes of `file` that a killed process left (mkstemp's names:
    `.<name>.<8 of [a-z0-9_]>.tmp`, untouched for STALE_TEMP_S); nobody else's file matches."""
    own = re.compile(re.escape(f".{file.name}.") + r"[a-z0-9_]{8}\.tmp")
    now = time.time()
    try:
        with os.scandir(file.parent) as entries:
            for entry in entries:
                if own.fullmatch(entry.name) and entry.is_file(follow_symlinks=False) \
                        and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S:
                    os.unlink(entry.path)
    except OSError:  # a leftover that cannot be removed costs nothing but its space
        pass
