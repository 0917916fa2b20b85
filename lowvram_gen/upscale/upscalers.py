"""Upscalers by A1111's names: the latent ones, None, Lanczos, Nearest; ESRGAN-family models through spandrel;
diffusers' SD x4 upscaler (`sd-x4`).

A1111's spellings are the canonical names (what the request holds, the PNG says and the UI lists); every name is
taken case-insensitively, so our older lower-case ones (`latent`, `lanczos`) still work. The `Latent` family
(A1111's `shared.latent_upscale_modes`: the interpolation mode and antialiasing of each) upscales latents, not
images: it exists only inside a hires pass (`runner`), so asking `upscale` for it is an error, as is `None`
(A1111's "no upscaler": in a hires pass a plain Lanczos resize). An ESRGAN-family model is named by its file
(`4x-UltraSharp.pth`, a path) or, as A1111 names it, by the file's stem in the models folder. Model upscalers
run in tiles; on out-of-memory the tile is halved down to a floor (ComfyUI's habit), then it is a clear error.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.ladder import Ladder
from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only

log = logging.getLogger(__name__)
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
MIN_TILE = 64  # px: below this the overlap is most of the tile
TILE_OVERLAP = 16  # px of context on each side of a tile, cropped away after the model runs
MAX_MODEL_PASSES = 3  # as A1111: an x2 model reaches x8 at most; Lanczos does the rest
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
    """Where ESRGAN-family models are looked up by name: $LOWVRAM_GEN_MODELS/ESRGAN, ./models/ESRGAN."""
    root = os.environ.get("LOWVRAM_GEN_MODELS", "models")
    return [Path(root).expanduser() / "ESRGAN", Path(root).expanduser() / "upscalers"]


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


@dataclass
class UpscaleReport:
    upscaler: str
    ladder: Ladder = field(default_factory=lambda: Ladder([]))  # a job's own, when it upscales a capped image
    tiles: list[int] = field(default_factory=list)  # the tile sizes tried, OOM halvings included
    passes: int = 0  # model runs, all images together (an image gets several when the scale exceeds the factor)

    @property
    def attempts(self) -> list[dict]:
        return [a.as_dict() for a in self.ladder.attempts if a.stage == "upscale"]


def upscale_images(images: list, size: tuple[int, int], name: str, device: str = "cpu", tile: int = 512,
                   report: UpscaleReport | None = None, prompt: str = "", steps: int = 20,
                   ladder: Ladder | None = None) -> list:
    """Every image at exactly `size` (W, H) using upscaler `name`. A job's `ladder` records the
    upscaler's out-of-memory attempts with the job's others."""
    from PIL import Image

    report = report or UpscaleReport(name, ladder or Ladder([]))
    known = builtin(name)
    if known in ("Lanczos", NONE):  # None: A1111's resize without an upscaler, Lanczos
        return [im.resize(size, Image.Resampling.LANCZOS) for im in images]
    if known == "Nearest":
        return [im.resize(size, Image.Resampling.NEAREST) for im in images]
    if known in LATENT_MODES:
        raise InvalidRequest("upscaler", name, f"{known!r} works only inside a hires pass")
    if known == SD_X4:
        out = [_sd_x4(im, device, prompt, steps) for im in images]
    else:
        model = load_model(name)
        out = [_model_passes(model, im, size, device, tile, report) for im in images]
    # the model's own factor rarely equals the request: finish with Lanczos, as A1111 does
    return [im if im.size == size else im.resize(size, Image.Resampling.LANCZOS) for im in out]


def _model_passes(descriptor, image, size: tuple[int, int], device: str, tile: int, report: UpscaleReport):
    """Run the model until the image reaches `size` (x4 from an x2 model: two passes), at most
    MAX_MODEL_PASSES times, as A1111 does; a model of factor 1 (a restorer) runs once."""
    for _ in range(MAX_MODEL_PASSES):
        image = run_tiled(descriptor, image, device, tile, report)
        report.passes += 1
        if descriptor.scale <= 1 or (image.width >= size[0] and image.height >= size[1]):
            break
    return image


_MODELS: dict[str, object] = {}  # loaded upscalers, by file; Session.free() empties it


def forget_models() -> None:
    """Drop every loaded upscaler (the UI's Free VRAM, through Session.free)."""
    _MODELS.clear()


def load_model(name: str):
    """An ESRGAN-family model through spandrel, from weights loaded without unpickling code."""
    path = model_path(name)
    if path is None:
        raise InvalidRequest("upscaler", name, "no such upscaler model file")
    key = str(path.resolve())
    if key not in _MODELS:
        from spandrel import ModelLoader, UnsupportedModelError

        if path.suffix.lower() == ".safetensors":
            check_safetensors(path)
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = load_pickle_weights_only(path)  # weights-only: a pickle that runs code is refused
        try:
            descriptor = ModelLoader().load_from_state_dict(state)
        except UnsupportedModelError as exc:
            raise InvalidRequest("upscaler", name, f"spandrel does not recognise this architecture ({exc})") from None
        descriptor.model.eval()
        _MODELS[key] = descriptor
    return _MODELS[key]


def run_tiled(descriptor, image, device: str, tile: int, report: UpscaleReport):
    """Run the model tile by tile; on out-of-memory halve the tile, down to MIN_TILE."""
    import numpy as np
    import torch
    from PIL import Image

    x = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    descriptor.model.to(device)
    ladder = report.ladder

    def where() -> dict:
        return dict(width=image.width, height=image.height, unit=f"{report.upscaler}, {tile} px tiles",
                    extra={"tile": tile})

    while True:
        report.tiles.append(tile)
        ok, out = ladder.attempt("upscale", lambda: _tiles(descriptor, x, device, tile), where)
        if ok:
            break
        if tile // 2 < MIN_TILE:
            raise ladder.exhausted(f"{report.upscaler} ran out of memory even with {tile} px tiles: free GPU memory, "
                                   "use --cpu, or the lanczos upscaler")
        tile //= 2
        ladder.went_down(f"{tile} px tiles")
    array = (out[0].clamp(0, 1).permute(1, 2, 0).cpu().numpy() * 255.0).round().astype("uint8")
    return Image.fromarray(array)


def _tiles(descriptor, x, device: str, tile: int):
    import torch

    scale = descriptor.scale
    _, c, h, w = x.shape
    out = torch.zeros((1, c, h * scale, w * scale))
    with torch.inference_mode():
        for top in range(0, h, tile):
            for left in range(0, w, tile):
                t0, l0 = max(0, top - TILE_OVERLAP), max(0, left - TILE_OVERLAP)
                t1, l1 = min(h, top + tile + TILE_OVERLAP), min(w, left + tile + TILE_OVERLAP)
                piece = descriptor(x[:, :, t0:t1, l0:l1].to(device)).float().cpu()
                bottom, right = min(h, top + tile), min(w, left + tile)
                out[:, :, top * scale:bottom * scale, left * scale:right * scale] = piece[
                    :, :, (top - t0) * scale:(bottom - t0) * scale, (left - l0) * scale:(right - l0) * scale]
    return out


def _sd_x4(image, device: str, prompt: str, steps: int):
    """diffusers' SD x4 upscaler, when the user has it (HF cache or $LOWVRAM_GEN_SD_X4 folder)."""
    source = os.environ.get("LOWVRAM_GEN_SD_X4") or SD_X4_REPO
    pipe = _MODELS.get(f"sd-x4:{source}")
    if pipe is None:
        try:
            from diffusers import StableDiffusionUpscalePipeline

            pipe = StableDiffusionUpscalePipeline.from_pretrained(source, local_files_only=True)
        except Exception as exc:  # not downloaded, or a broken folder
            raise ModelLoadError(
                f"the sd-x4 upscaler is not available offline ({str(exc).strip().splitlines()[0]}); download it once "
                f"with `hf download {SD_X4_REPO}` or set LOWVRAM_GEN_SD_X4 to a local copy"
            ) from None
        _MODELS[f"sd-x4:{source}"] = pipe
    pipe.set_progress_bar_config(disable=True)
    pipe.to(device)
    pipe.vae.enable_tiling()  # its decode at 4x is the peak; tiles keep it flat
    return pipe(prompt=prompt, image=image.convert("RGB"), num_inference_steps=steps).images[0]
