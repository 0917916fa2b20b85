"""Masks as A1111's inpaint uses them, on PIL images (no torch): read, invert, blur, crop, fill, paste back.

White (above half grey) is repainted, black kept. A mask with an alpha channel that is not all opaque (a layer
drawn in an editor) is the alpha. The blur is a Gaussian of radius `mask_blur` (A1111's default 4); the crop of
"only masked" is the mask's box grown by the padding, then to the job's aspect ratio; "fill" paints the masked
area with the colours around it, blurred; the result keeps the original outside the (blurred) mask.
"""

from __future__ import annotations

from dataclasses import dataclass

AREAS = ("whole", "masked")  # A1111's "Whole picture" / "Only masked"
CONTENTS = ("original", "fill", "latent-noise", "latent-nothing")  # A1111's masked content, its order 1, 0, 2, 3
MAX_BLUR = 64  # A1111's slider maximum
MAX_PADDING = 256  # A1111's slider maximum


def binary(image, invert: bool = False):
    """The mask as an L image of 0/255: the alpha where it is an RGBA layer with any transparency, else the grey
    value, thresholded at half; inverted when asked (A1111's "Inpaint not masked")."""
    from PIL import ImageOps

    if image.mode in ("RGBA", "LA") and image.getextrema()[-1] != (255, 255):
        grey = image.getchannel("A")
    else:
        grey = image.convert("L")
    mask = grey.point(lambda v: 255 if v > 127 else 0)
    return ImageOps.invert(mask) if invert else mask


def read(path: str, invert: bool = False):
    """The mask file as a 0/255 L image (binary)."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return binary(image, invert)


def blurred(mask, radius: int):
    """The mask blurred by a Gaussian of `radius` pixels (0: as it is)."""
    from PIL import ImageFilter

    return mask.filter(ImageFilter.GaussianBlur(radius)) if radius > 0 else mask


def crop_box(mask, padding: int) -> tuple[int, int, int, int] | None:
    """The box (x0, y0, x1, y1) of the mask's white pixels grown by `padding` on each side, within the image; None
    for an empty mask."""
    box = mask.point(lambda v: 255 if v > 0 else 0).getbbox()
    if box is None:
        return None
    x0, y0, x1, y1 = box
    w, h = mask.size
    return max(0, x0 - padding), max(0, y0 - padding), min(w, x1 + padding), min(h, y1 + padding)


def to_aspect(box: tuple[int, int, int, int], width: int, height: int, canvas: tuple[int, int]):
    """`box` grown to the aspect ratio of width x height (the job's size), centred, shifted to stay inside the
    canvas where it can: the crop is then resized to the job's size without distortion."""
    x0, y0, x1, y1 = box
    cw, ch = canvas
    bw, bh = x1 - x0, y1 - y0
    if bw * height < bh * width:  # too narrow: widen
        want = min(cw, -(-bh * width // height))
        x0 -= (want - bw) // 2
        x0 = min(max(0, x0), cw - want)
        x1 = x0 + want
    elif bw * height > bh * width:  # too flat: heighten
        want = min(ch, -(-bw * height // width))
        y0 -= (want - bh) // 2
        y0 = min(max(0, y0), ch - want)
        y1 = y0 + want
    return x0, y0, x1, y1


def fill(image, mask):
    """A1111's "fill": the masked area painted with the image's colours around it, blurred, largest blur first,
    then smaller ones over it (a normalised convolution: the blur of the kept pixels over the blur of the
    keep-mask), so the masked area starts from the surrounding colours instead of what was there."""
    import numpy as np
    from PIL import Image, ImageFilter

    keep = np.asarray(mask.convert("L"), dtype=np.float32) / 255.0 < 0.5
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    out = pixels.copy()
    weight = Image.fromarray((keep * 255).astype(np.uint8))
    kept = Image.fromarray((pixels * keep[..., None]).astype(np.uint8))
    for radius in (256, 64, 16, 4, 1):
        w = np.asarray(weight.filter(ImageFilter.GaussianBlur(radius)), dtype=np.float32)
        if not w.any():
            continue
        colour = np.asarray(kept.filter(ImageFilter.GaussianBlur(radius)), dtype=np.float32)
        target = (w >= 32) & ~keep  # masked pixels with kept ones around (an eighth of the weight: 8-bit blurs)
        out[target] = np.clip(colour[target] / w[target][:, None] * 255.0, 0, 255)
    out[keep] = pixels[keep]
    return Image.fromarray(out.astype(np.uint8))


def overlay(generated, original, mask):
    """The generated pixels where the mask is white, the original's where it is black, blended in between
    (A1111's apply_overlay): every pixel outside the blurred mask is the original's, unchanged."""
    from PIL import Image

    return Image.composite(generated.convert("RGB"), original.convert("RGB"), mask.convert("L"))


@dataclass(frozen=True)
class Prepared:
    """A job's mask, read once: the binary mask at the init image's size (inverted when asked) and its blur."""

    mask: object  # L, 0/255, the init image's size
    soft: object  # L, blurred by mask_blur
    resized_from: tuple[int, int] | None  # the mask file's size where it was not the init image's


def prepare(path: str, canvas: tuple[int, int], invert: bool, blur: int) -> Prepared:
    """The mask file for an init image of size `canvas`: resized to it (nearest) where it differs, inverted when
    asked, blurred."""
    from PIL import Image

    mask = read(path, invert)
    resized = None
    if mask.size != tuple(canvas):
        resized = mask.size
        mask = mask.resize(canvas, Image.NEAREST)
    return Prepared(mask, blurred(mask, blur), resized)


def size_note(request) -> str | None:
    """What is said when the mask is not the init image's size (it is resized to it), else None."""
    from PIL import Image

    with Image.open(request.mask) as mask, Image.open(request.init_image) as init:
        if mask.size == init.size:
            return None
        return (f"the mask is {mask.size[0]}x{mask.size[1]}, the init image {init.size[0]}x{init.size[1]}: the mask "
                "was resized to the init image's size")
