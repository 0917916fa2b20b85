"""Where model files of each kind are looked up, and the A1111 hashes that identify LoRAs and embeddings.

`kind_dirs(kind)` is the one place that knows a kind's folders: the folder of its A1111 launch flag
(--ckpt-dir, --lora-dir, --embeddings-dir, --controlnet-dir, --vae-dir: the CLI puts it in the
environment variable of `FOLDER_FLAGS`, so `accelerate launch` batch workers and the API server see it
too), then `<models root>/<kind>`, where the models root is `$LOWVRAM_GEN_MODELS` when that variable is
set, else `./models` (A1111's layout: `models/Lora`, `embeddings` -> here `models/embeddings`).
Sub-folders are searched too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from lowvram_gen.errors import InvalidRequest

_HASHES: dict[tuple[str, int, int, bool], str] = {}  # (path, mtime_ns, size, addnet) -> sha256 hex


# kind (the folder's name under the models root, as A1111 names it) -> (launch flag, environment variable)
FOLDER_FLAGS = {
    "Stable-diffusion": ("--ckpt-dir", "LOWVRAM_GEN_CKPT_DIR"),
    "Lora": ("--lora-dir", "LOWVRAM_GEN_LORA_DIR"),
    "embeddings": ("--embeddings-dir", "LOWVRAM_GEN_EMBEDDINGS_DIR"),
    "ControlNet": ("--controlnet-dir", "LOWVRAM_GEN_CONTROLNET_DIR"),
    "VAE": ("--vae-dir", "LOWVRAM_GEN_VAE_DIR"),
}


def models_root() -> Path:
    return Path(os.environ.get("LOWVRAM_GEN_MODELS", "models")).expanduser()


def kind_dirs(kind: str) -> list[Path]:
    """The folders a model of `kind` (a key of FOLDER_FLAGS, or any other folder name under the models root) is
    looked up in, in order: its flag's folder (its environment variable), then `models_root() / kind`."""
    flagged = os.environ.get(FOLDER_FLAGS[kind][1], "").strip() if kind in FOLDER_FLAGS else ""
    own = models_root() / kind
    first = Path(flagged).expanduser() if flagged else None
    return [own] if first is None or first == own else [first, own]


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
        flag = FOLDER_FLAGS.get(folders[-1].name, ("",))[0]
        text += ("; put the files there, " + (f"pass {flag} FOLDER, " if flag else "") +
                 f"or set LOWVRAM_GEN_MODELS to the folder that holds your {folders[-1].name}/ folder")
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
