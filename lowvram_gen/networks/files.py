"""Where model files of each kind are looked up, and the A1111 hashes that identify LoRAs and embeddings.

`kind_dirs(kind)` is the one place that knows a kind's folders: the folder of its A1111 launch flag
(--ckpt-dir, --lora-dir, --embeddings-dir, --controlnet-dir, --vae-dir: the CLI puts it in the
environment variable of `FOLDER_FLAGS`, so `accelerate launch` batch workers and the API server see it
too), then `<models root>/<kind>`, where the models root is `$LOWVRAM_GEN_MODELS` (or `--models-dir`) when set,
else `./models` (A1111's layout: `models/Lora`, `embeddings` -> here `models/embeddings`).

The models root may be ComfyUI's or A1111/Forge's own `models/` folder, read as it is (nothing copied, no link
made): the other names a kind's folder has there (`SHARED_NAMES`: ComfyUI's `checkpoints/`, `diffusion_models/` and
its old name `unet/`, `diffusers/`, `loras/`, `vae/`, `controlnet/` and `model_patches/`, `upscale_models/`, `text_encoders/` and its old
name `clip/`) are looked in after the A1111 name, where they exist, and so is A1111's `embeddings/` beside `models/`.
Sub-folders are searched too, symlinked ones included (users link one drive's folders into another's).
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


# kind -> the names its folder has in ComfyUI's models/ (a shared models root, read as it is): where the UI and
# `--model NAME` find checkpoints and ComfyUI's transformer files, LoRAs, VAEs, ControlNets, upscalers, text encoders
SHARED_NAMES = {
    "Stable-diffusion": ("checkpoints", "diffusion_models", "unet", "diffusers"),
    "Lora": ("loras",),
    "VAE": ("vae",),
    # model_patches/: where ComfyUI keeps the ControlNets it loads as patches (alibaba-pai's Z-Image Fun files)
    "ControlNet": ("controlnet", "model_patches"),
    "ESRGAN": ("upscale_models",),
    "text_encoders": ("clip",),
}


def models_root() -> Path:
    return Path(os.environ.get("LOWVRAM_GEN_MODELS", "models")).expanduser()


def kind_dirs(kind: str) -> list[Path]:
    """The folders a model of `kind` (a key of FOLDER_FLAGS, or any other folder name under the models root) is
    looked up in, in order: its flag's folder (its environment variable), then `models_root() / kind`, then the
    kind's ComfyUI names under the models root (`SHARED_NAMES`) and, for embeddings, A1111's `embeddings/` beside
    the models root, those two only where they exist."""
    flagged = os.environ.get(FOLDER_FLAGS[kind][1], "").strip() if kind in FOLDER_FLAGS else ""
    root = models_root()
    own = root / kind
    found = [Path(flagged).expanduser()] if flagged else []
    shared = [root / name for name in SHARED_NAMES.get(kind, ())]
    if kind == "embeddings":
        shared.append(root.parent / "embeddings")
    for folder in [own, *(f for f in shared if f.is_dir())]:
        if not any(folder == seen or _same_folder(folder, seen) for seen in found):
            found.append(folder)
    return found


def _same_folder(a: Path, b: Path) -> bool:
    """Two names of one folder (`VAE` and `vae` on a case-insensitive disk, a link and its target)."""
    try:
        return a.is_dir() and b.is_dir() and os.path.samefile(a, b)
    except OSError:
        return False


def scan(folder: Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """{stem: path} of the files under `folder` with `suffixes`, sorted, .safetensors first on a tie."""
    found: dict[str, Path] = {}
    if not folder.is_dir():
        return found
    rank = {s: i for i, s in enumerate(suffixes)}
    files = [p for p in walk(folder) if p.suffix.lower() in rank]
    for p in sorted(files, key=lambda p: (rank[p.suffix.lower()], str(p))):
        found.setdefault(p.stem, p)
    return found


def walk(folder: Path) -> list[Path]:
    """The files under `folder`, following symlinked sub-folders (pathlib's rglob does not before Python 3.13),
    each real folder once (a link back up a tree does not loop)."""
    out: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for top, dirs, names in os.walk(folder, followlinks=True):
        st = os.stat(top)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        out += [p for p in (Path(top) / n for n in names) if p.is_file()]
    return out


SUB_FOLDER_LEVELS = 4  # model_entries: how deep it looks (a folder tree of a few levels; a link loop ends here)


def model_entries(root: Path, suffixes: tuple[str, ...], levels: int = SUB_FOLDER_LEVELS) -> list[Path]:
    """The diffusers folders and model files (`suffixes`) under `root`, `levels` sub-folder levels deep (0: `root`'s
    own), sorted by path; a diffusers folder is one entry, never looked into."""
    found: list[Path] = []
    try:
        entries = sorted(root.iterdir())
    except OSError:  # an unreadable folder, a dangling link: nothing there
        return found
    for entry in entries:
        if entry.is_dir() and (entry / "model_index.json").is_file():
            found.append(entry)
        elif entry.is_file() and entry.suffix.lower() in suffixes:
            found.append(entry)
        elif entry.is_dir() and levels > 0 and not entry.name.startswith("."):
            found += model_entries(entry, suffixes, levels - 1)
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
