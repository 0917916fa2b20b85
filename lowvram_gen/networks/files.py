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
    where = ", ".join(str(f) for f in folders)
    names = ", ".join(sorted(available)) or "none"
    raise InvalidRequest(kind, name, f"no such file in {where} ({'/'.join(suffixes)}); available: {names}")


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
