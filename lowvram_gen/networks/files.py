"""Where LoRA and embedding files are looked up, and the A1111 hashes that identify them.

Folders follow the convention the rest of lowvram-gen uses for ESRGAN models and checkpoints:
`$LOWVRAM_GEN_MODELS/<kind>` when that variable is set, else `./models/<kind>` (A1111's layout:
`models/Lora`, `embeddings` -> here `models/embeddings`). Sub-folders are searched too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from lowvram_gen.errors import InvalidRequest

_HASHES: dict[tuple[str, int, int, bool], str] = {}  # (path, mtime_ns, size, addnet) -> sha256 hex


def models_root() -> Path:
    return Path(os.environ.get("LOWVRAM_GEN_MODELS", "models")).expanduser()


def scan(folder: Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """{stem: path} of the files under `folder` with `suffixes`, sorted, .safetensors first on a tie."""
    found: dict[str, Path] = {}
    if not folder.is_dir():
        return found
    rank = {s: i for i, s in enumerate(suffixes)}
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in rank]
    for p in sorted(files, key=lambda p: (rank[p.suffix.lower()], str(p))):
        found.setdefault(p.stem, p)
    return found


def find(name: str, available: dict[str, Path], kind: str, folders: list[Path], suffixes: tuple[str, ...]) -> Path:
    """A file by stem (exact, then ignoring case), by stem with suffix, or an existing path."""
    direct = Path(name).expanduser()
    if direct.suffix.lower() in suffixes and direct.is_file():
        return direct
    stem = name[: -len(direct.suffix)] if direct.suffix.lower() in suffixes else name
    stem = Path(stem).name if ("/" in stem or "\\" in stem) else stem
    if stem in available:
        return available[stem]
    folded = {k.lower(): v for k, v in available.items()}
    if stem.lower() in folded:
        return folded[stem.lower()]
    raise InvalidRequest(kind, name, not_found(stem, available, folders, suffixes))


LISTED_MAX = 12  # more names than this and the message lists only the closest ones


def not_found(stem: str, available: dict[str, Path], folders: list[Path], suffixes: tuple[str, ...]) -> str:
    """Why a name matched no file: the folders looked in (absolute: `./models` depends on where the command
    runs; a missing folder said so, with how to point elsewhere) and the names there are, or the closest of
    them when there are many."""
    import difflib

    where = ", ".join(f"{f.expanduser().resolve()}" + ("" if f.is_dir() else " (no such folder)") for f in folders)
    text = f"no {'/'.join(suffixes)} file of that name in {where}"
    if not any(f.is_dir() for f in folders):
        text += (f"; put the files there, or set LOWVRAM_GEN_MODELS to the folder that holds your "
                 f"{folders[0].name}/ folder")
    names = sorted(available)
    if not names:
        return text + "; there are none"
    if len(names) <= LISTED_MAX:
        return text + f"; there are: {', '.join(names)}"
    close = difflib.get_close_matches(stem, names, n=5, cutoff=0.5)
    return text + (f"; there are {len(names)}, the closest: {', '.join(close)}" if close
                   else f"; there are {len(names)}, none with a name close to this one")


def sha256(path: Path, addnet: bool = False) -> str:
    """sha256 of the file, or with `addnet` of its bytes after the safetensors header: the hash
    kohya's trainer and A1111 use for LoRAs ("addnet hash", stable when only metadata changes).
    Cached by path, mtime and size."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, addnet)
    if key in _HASHES:
        return _HASHES[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if addnet:
            n = int.from_bytes(f.read(8), "little")
            f.seek(8 + n)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    _HASHES[key] = digest.hexdigest()
    return _HASHES[key]
