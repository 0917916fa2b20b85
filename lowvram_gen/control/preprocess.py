"""A unit's control image as the ControlNet reads it: resized to the pass's size, then its preprocessor.

The image is resized to the job's width x height (A1111's "Just Resize", with Pillow's Lanczos filter, the
one diffusers' image processor would use; "Crop and Resize" and "Resize and Fill" as control/resize.py brings
another aspect to it) and the preprocessor runs at that size (A1111's "Pixel Perfect"; crop and fill: at the
scaled image's size, before the crop or the fill, as the extension makes the map first):
`none` passes the image as the map; `canny` is control/canny.py; the model-based ones (depth_midas, openpose,
lineart, ...) are control/detectors.py. Maps are cached by file, size and settings,
so the passes and retries of a job compute each once.

Inpainting's "Only masked" (`crop`): the map follows the init image's crop, as A1111's extension does it for
`inpaint_full_res` (scripts/controlnet.py: the control image resized to the mask's size with the unit's resize
mode, cut with the init image's crop region, resized to the job's size, then preprocessed): the image is resized
to the canvas (the init image's size, with the unit's resize mode), cut with the same box as the init image, resized to the pass's
size, and its preprocessor runs there.
"""

from __future__ import annotations

import functools
from pathlib import Path


def control_map(path: str, width: int, height: int, preprocessor: str = "none", low: int = 100, high: int = 200,
                crop: tuple | None = None, resize: str = "resize"):
    """The control map (PIL RGB, width x height) of the image at `path`. `crop`: ((canvas width, height), (x0, y0,
    x1, y1)) for inpainting's only masked: the image at the canvas's size cut with that box first (see the module
    doc). `resize`: the unit's resize mode (control/resize.py: resize, crop or fill)."""
    stat = Path(path).stat()
    crop = None if crop is None else (tuple(crop[0]), tuple(crop[1]))
    return _cached(str(path), stat.st_mtime_ns, stat.st_size, width, height, preprocessor, low, high, crop,
                   resize).copy()


@functools.lru_cache(maxsize=8)
def _cached(path: str, _mtime: int, _size: int, width: int, height: int, preprocessor: str, low: int, high: int,
            crop: tuple | None = None, resize: str = "resize"):
    from PIL import Image

    from lowvram_gen.control import resize as modes

    with Image.open(path) as im:
        image = im.convert("RGB")
    if crop is not None:
        canvas, box = crop
        image = modes.control_map(image, *canvas, resize, lambda made: made).crop(box)
        resize = "resize"  # the box has the job's aspect already
    return modes.control_map(image, width, height, resize, lambda made: _preprocessed(made, preprocessor, low, high))


def _preprocessed(image, preprocessor: str, low: int, high: int):
    """The map of `image` at its own size by `preprocessor`."""
    if preprocessor == "canny":
        from lowvram_gen.control.canny import canny

        return canny(image, low, high)
    if preprocessor != "none":
        from lowvram_gen.control.detectors import run

        return run(preprocessor, image)
    return image
