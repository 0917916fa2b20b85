"""Names, not server paths, in A1111's REST API: the upscaler, ControlNet, LoRA and checkpoint a body names must be
one of the names the API's own listing routes give (/sdapi/v1/upscalers, /controlnet/model_list, /sdapi/v1/loras,
/sdapi/v1/sd-models, /sdapi/v1/sd-vae), found in the model folders. Here the plain parts (the one refusal, the allowed folders, the
upscaler's check); api/names.py checks a body's ControlNet and LoRA names, which needs the model folders' scans.

A body is a stranger's: a path in it would let any client make the server open any file (and the error would say
whether it exists and what its first bytes are). So anything else is refused with one answer, the same for a
missing file, an unreadable one and a file of another kind: the field, and the route that lists the names. Paths
are taken only where the operator allowed them (`--api-allow-paths DIR[,DIR]`), and only inside those folders,
after symlinks and `..` are resolved. The CLI and the web UI keep taking paths: they are the operator's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lowvram_gen.errors import InvalidRequest

UPSCALERS = "GET /sdapi/v1/upscalers"
CONTROLNETS = "GET /controlnet/model_list"
LORAS = "GET /sdapi/v1/loras"
MODELS = "GET /sdapi/v1/sd-models"
VAES = "GET /sdapi/v1/sd-vae"


def parse_allowed(value: str | None, flag: str = "--api-allow-paths") -> tuple[Path, ...]:
    """The folders of `--api-allow-paths DIR[,DIR]`, resolved; each must be a folder (a typo must not pass unseen)."""
    if not value:
        return ()
    folders = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        folder = Path(item).expanduser()
        if not folder.is_dir():
            raise InvalidRequest(flag, item, "give folders that exist, comma-separated")
        folders.append(folder.resolve())
    return tuple(folders)


def refused(field: str, value, route: str) -> InvalidRequest:
    """The one answer for a value that is not a listed name: never says whether such a file exists or what it is."""
    return InvalidRequest(field, value, f"not a name this server lists; the API takes names, not server paths: "
                                        f"{route} lists them")


def allowed_path(value: str, allowed: Iterable[Path]) -> str | None:
    """`value` resolved (symlinks and `..`) when it lies inside one of the `allowed` folders, else None."""
    allowed = tuple(allowed)
    if not allowed or not isinstance(value, str) or not value.strip() or "\0" in value:
        return None
    try:
        resolved = Path(value.strip()).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name the OS refuses
        return None
    return str(resolved) if any(resolved == root or root in resolved.parents for root in allowed) else None


def check_upscaler(value, field: str, allowed: Iterable[Path] = ()) -> object:
    """A hires upscaler as the API takes it: a built-in name, a listed model file (by file name or stem, any case),
    or a path inside an allowed folder (returned resolved). Anything not a string is left to the request's check."""
    from lowvram_gen.a1111.upscaler_names import builtin, model_files

    if not isinstance(value, str) or not value.strip():
        return value
    name = value.strip()
    if builtin(name) is not None:
        return value
    key = name.lower()
    if any(file.lower() == key or Path(file).stem.lower() == key for file in model_files()):
        return value
    path = allowed_path(name, allowed)
    if path is None:
        raise refused(field, value, UPSCALERS)
    return path
