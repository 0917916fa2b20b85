"""A1111's resize modes: how an image of another aspect ratio is brought to a job's width x height.

Two sets of rules, written from their published behaviour and tested by pixels (tests/test_controlnet_resize.py):

- A ControlNet unit's control image (sd-webui-controlnet's ResizeMode, `control_map`):
  "Just Resize" stretches the image to the size. "Crop and Resize" scales it by the larger of the two side ratios
  (to round(side x k), half-way values to even as numpy rounds), makes the map there, and keeps the centre: the
  offset is (scaled - target) // 2 on each side. "Resize and Fill" scales it by the smaller ratio, makes the map
  there, and puts it at (target - scaled) // 2 on a canvas of the map's border colour: the per-channel median of
  its first and last rows and columns (taken together), as whole numbers.
- img2img's init image (A1111's "Resize mode", `init_resized`): "Just resize" stretches; "Crop and resize" scales
  to cover (the side that overflows is im_side x target_other // im_other, floored) and pastes it centred at
  (target // 2 - scaled // 2), cutting the rest; "Resize and fill" scales to fit the same way, pastes it centred,
  and fills each empty band by stretching the scaled image's outermost row (or column) over it. An inpaint job's mask
  is brought to the size the same way (A1111 resizes the mask with the image's mode; "Only masked" ignores the mode
  there, and here). "Just resize (latent upscale)" resizes no pixel: the init image is encoded at its own size and
  its latents interpolated (engines/sd/latent_resize.py); with a mask it is refused.

Images are resized with Pillow's Lanczos filter, as the rest of the app resizes them (A1111 uses it too where no
upscaler is named; the extension's own map resize picks OpenCV's area/cubic/nearest filters by content).
"""

from __future__ import annotations

from typing import Any, Callable

from lowvram_gen.errors import InvalidRequest

# the extension's resize modes: key -> its label; the API's integers and the names it has used are aliases
CONTROL_RESIZE = {"resize": "Just Resize", "crop": "Crop and Resize", "fill": "Resize and Fill"}
_CONTROL_ALIASES = {
    "0": "resize", "3": "resize", "just resize": "resize", "just_resize": "resize", "resizemode.resize": "resize",
    "just resize (latent upscale)": "resize", "1": "crop", "inner fit (scale to fit)": "crop",
    "scale to fit (inner fit)": "crop", "resizemode.inner_fit": "crop", "crop_resize": "crop", "2": "fill",
    "outer fit (shrink to fit)": "fill", "envelope (outer fit)": "fill", "resizemode.outer_fit": "fill",
    "fill_resize": "fill"}
# A1111's img2img "Resize mode" (its API's resize_mode integer is the index)
INIT_RESIZE = {"resize": "Just resize", "crop": "Crop and resize", "fill": "Resize and fill",
               "latent": "Just resize (latent upscale)"}


def check_control_resize(field: str, value: Any) -> str:
    """A unit's resize mode: resize | crop | fill, the extension's labels, or its API integers 0, 1, 2 (3, its
    latent variant of Just Resize, is Just Resize for a control image)."""
    text = "resize" if value is None or value == "" else str(value).strip()
    if isinstance(value, float) and value.is_integer():
        text = str(int(value))
    by_label = {label.lower(): k for k, label in CONTROL_RESIZE.items()}
    key = text.lower() if text.lower() in CONTROL_RESIZE else by_label.get(text.lower()) or \
        _CONTROL_ALIASES.get(text.lower())
    if key is None or isinstance(value, bool):
        raise InvalidRequest(field, value, "use resize, crop or fill (the extension's Just Resize, Crop and Resize, "
                                           "Resize and Fill, or 0, 1, 2)")
    return key


def check_init_resize(value: Any, masked: bool = False) -> str:
    """img2img's resize mode: resize | crop | fill | latent, A1111's labels, or its API integers 0-3 (`masked`: an
    inpaint job, whose mask is resized as its image is; latent, which acts on the encoded image, is refused there)."""
    text = "resize" if value is None or value == "" else str(value).strip()
    if isinstance(value, float) and value.is_integer():
        text = str(int(value))
    keys = list(INIT_RESIZE)
    by_label = {label.lower(): k for k, label in INIT_RESIZE.items()}
    key = text.lower() if text.lower() in INIT_RESIZE else by_label.get(text.lower()) or \
        (keys[int(text)] if text.isdigit() and int(text) < len(keys) else None)
    if key is None or isinstance(value, bool):
        raise InvalidRequest("resize mode", value, "use resize, crop, fill or latent (A1111's Just resize, Crop and "
                                                   "resize, Resize and fill, Just resize (latent upscale), or 0-3)")
    if masked and key == "latent":
        raise InvalidRequest("resize mode", value, "Just resize (latent upscale) with a mask (inpainting) is not built "
                                                   "here: use resize, crop or fill")
    return key


def _scaled(size: tuple[int, int], width: int, height: int, pick) -> tuple[int, int]:
    import numpy as np

    w, h = size
    k = pick(height / h, width / w)
    return int(np.round(w * k)), int(np.round(h * k))


def control_map(image, width: int, height: int, mode: str, make: Callable):
    """The control map of `image` (PIL RGB) at width x height under the unit's resize `mode`: `make(image)` makes
    the map of an image at the size it is given (the preprocessor), run where the extension runs it, before the
    crop or the fill."""
    from PIL import Image

    if mode == "resize" or image.size == (width, height):
        return make(image if image.size == (width, height) else image.resize((width, height), Image.LANCZOS))
    size = _scaled(image.size, width, height, max if mode == "crop" else min)
    made = make(image if image.size == size else image.resize(size, Image.LANCZOS)).convert("RGB")
    nw, nh = made.size
    if mode == "crop":
        x, y = max(0, (nw - width) // 2), max(0, (nh - height) // 2)
        return made.crop((x, y, x + width, y + height))
    import numpy as np

    pixels = np.asarray(made)
    borders = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]], axis=0)
    colour = tuple(int(c) for c in np.median(borders, axis=0).astype(np.uint8))
    canvas = Image.new("RGB", (width, height), colour)
    canvas.paste(made, (max(0, (width - nw) // 2), max(0, (height - nh) // 2)))
    return canvas


def init_resized(image, width: int, height: int, mode: str):
    """img2img's init image (PIL), or an inpaint job's mask, at width x height under A1111's resize `mode` ('latent'
    resizes as 'resize' here: the latent upscale acts on the encoded image, engines/sd/latent_resize.py). The
    canvas keeps the image's own mode (a mask stays L; A1111 pastes into RGB, the same values)."""
    from PIL import Image

    if image.size == (width, height):
        return image
    if mode not in ("crop", "fill"):
        return image.resize((width, height), Image.LANCZOS)
    iw, ih = image.size
    ratio, src = width / height, iw / ih
    cover = mode == "crop"
    wide = ratio > src if cover else ratio < src  # the target's width is the scaled image's
    sw, sh = (width, ih * width // iw) if wide else (iw * height // ih, height)
    scaled = image.resize((sw, sh), Image.LANCZOS)
    out = Image.new(image.mode, (width, height))
    out.paste(scaled, (width // 2 - sw // 2, height // 2 - sh // 2))
    if cover:
        return out
    if ratio < src:  # bands above and below
        band = height // 2 - sh // 2
        if band > 0:
            out.paste(scaled.resize((width, band), box=(0, 0, width, 0)), (0, 0))
            out.paste(scaled.resize((width, band), box=(0, sh, width, sh)), (0, band + sh))
    elif ratio > src:  # bands left and right
        band = width // 2 - sw // 2
        if band > 0:
            out.paste(scaled.resize((band, height), box=(0, 0, 0, height)), (0, 0))
            out.paste(scaled.resize((band, height), box=(sw, 0, sw, height)), (band + sw, 0))
    return out
