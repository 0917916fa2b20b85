"""A1111's upscaler names and the check of a name: the built-in ones (the latent ones, None, Lanczos, Nearest,
diffusers' `sd-x4`) and the ESRGAN-family model files of the models folders, found by file name or stem.

Plain names and file look-ups, no torch and no model loading: the request (request.py) checks its hires upscaler
here, and upscale/upscalers.py runs what these names name. A1111's spellings are the canonical names (what the
request holds, the PNG says and the UI lists); every name is taken case-insensitively, so our older lower-case
ones (`latent`, `lanczos`) still work.
"""

from __future__ import annotations

import os
from pathlib import Path

from lowvram_gen.errors import InvalidRequest

# A1111's latent upscalers: name -> (torch.nn.functional.interpolate mode, antialias)
LATENT_MODES = {
    "Latent": ("bilinear", False),
    "Latent (antialiased)": ("bilinear", True),
    "Latent (bicubic)": ("bicubic", False),
    "Latent (bicubic antialiased)": ("bicubic", True),
    "Latent (nearest)": ("nearest", False),
    "Latent (nearest-exact)": ("nearest-exact", False),
}
NONE = "None"  # A1111's "no upscaler": a hires pass resizes the image with Lanczos
PIXEL = ("Lanczos", "Nearest")  # A1111's built-in pixel upscalers (Pillow)
SD_X4 = "sd-x4"
BUILTIN = (*LATENT_MODES, NONE, *PIXEL, SD_X4)
_BY_KEY = {" ".join(name.lower().split()): name for name in BUILTIN}
MODEL_SUFFIXES = (".pth", ".pt", ".safetensors")
SD_X4_REPO = "stabilityai/stable-diffusion-x4-upscaler"


def builtin(name: str) -> str | None:
    """A built-in upscaler's canonical (A1111) name for `name` in any case ("latent" -> "Latent"), else None."""
    return _BY_KEY.get(" ".join(name.lower().split())) if isinstance(name, str) else None


def is_latent(name: str) -> bool:
    """Whether `name` is one of A1111's latent upscalers (in any case)."""
    return builtin(name) in LATENT_MODES


def latent_mode(name: str) -> tuple[str, bool]:
    """(interpolate mode, antialias) of a latent upscaler, as A1111's `latent_upscale_modes` has them."""
    return LATENT_MODES[builtin(name)]


def upscaler_dirs() -> list[Path]:
    """Where ESRGAN-family models are looked up by name: $LOWVRAM_GEN_MODELS/ESRGAN (./models/ESRGAN), ComfyUI's
    upscale_models/ there (networks/files.kind_dirs), then upscalers/."""
    from lowvram_gen.networks.files import kind_dirs, models_root

    return [*kind_dirs("ESRGAN"), models_root() / "upscalers"]


def available(hires: bool = False) -> list[str]:
    """The upscalers this machine can run now (what the UI offers), in A1111's order: for a hires pass the latent
    ones and None first; Lanczos, Nearest, the model files; sd-x4 only where its model is here."""
    names = [*LATENT_MODES, NONE] if hires else []
    names += list(PIXEL)
    names += model_files()
    return names + ([SD_X4] if sd_x4_installed() else [])


def model_files() -> list[str]:
    """The ESRGAN-family model files in the models folders, by file name."""
    names: list[str] = []
    for folder in upscaler_dirs():
        if folder.is_dir():
            names += sorted(p.name for p in folder.iterdir() if p.suffix.lower() in MODEL_SUFFIXES)
    return names


def sd_x4_installed() -> bool:
    """Whether the SD x4 upscaler loads without a download: $LOWVRAM_GEN_SD_X4 is a folder, or the HF cache
    holds the repo's model_index.json (a file check: nothing is loaded or fetched)."""
    folder = os.environ.get("LOWVRAM_GEN_SD_X4")
    if folder:
        return (Path(folder).expanduser() / "model_index.json").is_file()
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(SD_X4_REPO, "model_index.json"), str)


def model_path(name: str) -> Path | None:
    path = Path(name).expanduser()
    if path.is_file():
        return path
    for folder in upscaler_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


def _by_stem(name: str) -> str | None:
    """The model file whose stem is `name` (A1111 names a user's ESRGAN model by it), in any case; None if none."""
    key = name.lower()
    return next((file for file in model_files() if Path(file).stem.lower() == key or file.lower() == key), None)


def check_upscaler(value, field: str = "upscaler", latent_ok: bool = False) -> str:
    """The canonical name of an upscaler: a built-in one in A1111's spelling (any case), an upscaler model file, or
    a model's name (or stem, as A1111 writes it) in the models folder. `latent_ok`: a hires pass, where the latent
    upscalers and None are offered too."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field, value, "use Lanczos, Nearest, Latent (hires only), sd-x4 or an ESRGAN-family "
                                           "model file")
    name = value.strip()
    known = builtin(name)
    if known is not None:
        if not latent_ok and (known in LATENT_MODES or known == NONE):
            what = "upscales latents" if known in LATENT_MODES else "(no upscaler) resizes the first pass"
            raise InvalidRequest(field, name, f"{known!r} {what} inside a hires pass; for an image use Lanczos, "
                                              "Nearest, sd-x4 or an ESRGAN-family model")
        return known
    if Path(name).suffix.lower() in MODEL_SUFFIXES or "/" in name or "\\" in name:
        if model_path(name) is None:
            raise InvalidRequest(field, name, f"no such upscaler model file (looked in {', '.join(map(str, upscaler_dirs()))})")
        return name
    found = _by_stem(name)
    if found is not None:
        return found
    raise InvalidRequest(field, name, "use one of: " + ", ".join(available(hires=latent_ok)))
