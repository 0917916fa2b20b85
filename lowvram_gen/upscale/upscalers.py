"""Upscalers by A1111's names: the latent ones, None, Lanczos, Nearest; ESRGAN-family models through spandrel;
diffusers' SD x4 upscaler (`sd-x4`).

The names and their check are a1111/upscaler_names.py's (plain data the request reads without this module's
model loading). The `Latent` family
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

from lowvram_gen.a1111.upscaler_names import LATENT_MODES, NONE, SD_X4, SD_X4_REPO, builtin, model_path
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.ladder import Ladder
from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only

log = logging.getLogger(__name__)
MIN_TILE = 64  # px: below this the overlap is most of the tile
TILE_OVERLAP = 16  # px of context on each side of a tile, cropped away after the model runs
MAX_MODEL_PASSES = 3  # as A1111: an x2 model reaches x8 at most; Lanczos does the rest


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
