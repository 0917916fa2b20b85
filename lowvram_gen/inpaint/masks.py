"""Masks as A1111's inpaint uses them, on PIL images (no torch): read, invert, blur, crop, fill, paste back.

White is repainted, black kept, grey in between (A1111 1.10's `create_binary_mask`): a grey or RGB mask is kept
grey; a mask with an alpha channel that is not all opaque (a layer drawn in an editor) is the alpha, cut at 128
(above: white) unless the request's `mask_round` is off. The blur is OpenCV's Gaussian of standard deviation
`mask_blur` (A1111's default 4), written here with scipy (OpenCV is an optional dependency). The pixel steps (the
crop box, "fill", the paste back) use the grey mask as it is; the latents are blended with the mask resized to the
latent size (Pillow's bicubic), rounded to 0/1 with `mask_round` on (A1111's default), kept grey with it off
(`latent_weights`, the rule engines/sd/inpaint.py applies). The crop of "only masked" is the mask's box grown by
the padding, then to the job's aspect ratio as A1111's `expand_crop_region` grows it; "fill" paints the masked
area with the colours around it as A1111's masking.fill does; the result keeps the original outside the (blurred)
mask.
"""

from __future__ import annotations

from dataclasses import dataclass

AREAS = ("whole", "masked")  # A1111's "Whole picture" / "Only masked"
CONTENTS = ("original", "fill", "latent-noise", "latent-nothing")  # A1111's masked content, its order 1, 0, 2, 3
MAX_BLUR = 64  # A1111's slider maximum
MAX_PADDING = 256  # A1111's slider maximum
ALPHA_CUT = 128  # an alpha layer's pixels above this are white, with mask_round on (A1111's create_binary_mask)
# A1111's masking.fill: (blur radius, how many times that blur is composited), the widest first
FILL_LAYERS = ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1))


def mask_of(image, invert: bool = False, rounded: bool = True):
    """The mask as an L image: the alpha where it is an RGBA layer with any transparency (cut at ALPHA_CUT to 0/255
    when `rounded`), else the grey value as it is; inverted when asked (A1111's "Inpaint not masked")."""
    from PIL import ImageOps

    if image.mode in ("RGBA", "LA") and image.getextrema()[-1] != (255, 255):
        mask = image.getchannel("A")
        if rounded:
            mask = mask.point(lambda v: 255 if v > ALPHA_CUT else 0)
    else:
        mask = image.convert("L")
    return ImageOps.invert(mask) if invert else mask


def read(path: str, invert: bool = False, rounded: bool = True):
    """The mask file as an L image (`mask_of`)."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return mask_of(image, invert, rounded)


def blurred(mask, radius: int):
    """The mask blurred by a Gaussian of standard deviation `radius` pixels (0: as it is) as A1111 blurs it: OpenCV's
    GaussianBlur across, then down, each a kernel of 2 x int(2.5 x radius + 0.5) + 1 taps (`gaussian_taps`) with
    the edge mirrored (OpenCV's default border), each pass's sum rounded to 8 bits."""
    if radius <= 0:
        return mask
    import numpy as np
    from PIL import Image
    from scipy.ndimage import correlate1d

    taps = np.asarray(gaussian_taps(radius), dtype=np.float64)
    out = np.asarray(mask.convert("L"), dtype=np.float64)
    for axis in (1, 0):  # whole numbers over 256: float64 holds the sums exactly
        out = np.minimum(255.0, np.floor((correlate1d(out, taps, axis=axis, mode="mirror") + 128) / 256))
    return Image.fromarray(out.astype(np.uint8), "L")


def gaussian_taps(sigma: float) -> list[int]:
    """OpenCV's 8-bit Gaussian kernel (its bit-exact one, the one it uses for 8-bit images): the normalised Gaussian
    of 2 x int(2.5 x sigma + 0.5) + 1 taps in 256ths, each outer tap rounded (half to even) with the last one's
    rounding error carried into the next, from the outside in; the centre tap takes what is left of 256."""
    import math

    n = 2 * int(2.5 * sigma + 0.5) + 1
    half = n // 2
    values = [math.exp(-((i - half) ** 2) / (2.0 * sigma * sigma)) for i in range(half)]
    total = 2 * sum(values) + 1.0
    taps, carried = [0] * n, 0.0
    for i, value in enumerate(values):
        wanted = value / total * 256 + carried
        taps[i] = taps[n - 1 - i] = round(wanted)
        carried = wanted - taps[i]
    taps[half] = 256 - 2 * sum(taps[:half])
    return taps


def latent_weights(mask, size: tuple[int, int], rounded: bool = True):
    """How much of each latent pixel is repainted (numpy float32, height x width of `size`, 0..1): the pass's mask
    resized to the latent size with Pillow's bicubic filter, over 255, rounded half to even when `rounded` (A1111's
    latent mask: `nmask`; what is kept is 1 minus it)."""
    import numpy as np
    from PIL import Image

    small = mask.convert("L").resize(tuple(size), Image.BICUBIC)
    weights = np.asarray(small, dtype=np.float32) / 255.0
    return np.around(weights) if rounded else weights


def crop_box(mask, padding: int) -> tuple[int, int, int, int] | None:
    """The box (x0, y0, x1, y1) of the mask's non-black pixels grown by `padding` on each side, within the image;
    None for an empty mask."""
    box = mask.point(lambda v: 255 if v > 0 else 0).getbbox()
    if box is None:
        return None
    x0, y0, x1, y1 = box
    w, h = mask.size
    return max(0, x0 - padding), max(0, y0 - padding), min(w, x1 + padding), min(h, y1 + padding)


def to_aspect(box: tuple[int, int, int, int], width: int, height: int, canvas: tuple[int, int]):
    """`box` grown to the aspect ratio of width x height (the job's size) as A1111's `expand_crop_region` grows it:
    the short side gets int(the side that aspect needs - its own) more pixels, half (floored) before, the rest after,
    the box then shifted back inside the canvas and cut at its edge. Where the canvas is too small for the aspect,
    the box keeps another aspect (for_pass brings its cut to the job's size with "resize and fill")."""
    x0, y0, x1, y1 = box
    cw, ch = canvas

    def grown(a0: int, a1: int, want: float, edge: int) -> tuple[int, int]:
        more = int(want - (a1 - a0))
        a0, a1 = a0 - more // 2, a1 + more - more // 2
        if a1 >= edge:
            a0, a1 = a0 - (a1 - edge), edge
        if a0 < 0:
            a0, a1 = 0, a1 - a0
        return a0, min(a1, edge)

    ratio = width / height
    if (x1 - x0) / (y1 - y0) > ratio:  # too flat: heighten
        y0, y1 = grown(y0, y1, (x1 - x0) / ratio, ch)
    else:
        x0, x1 = grown(x0, x1, (y1 - y0) * ratio, cw)
    return x0, y0, x1, y1


def fill(image, mask):
    """A1111's "fill": the unmasked pixels (each weighted by 255 minus the mask: premultiplied alpha) blurred at each
    of FILL_LAYERS' radii, widest first, each composited over the last (alpha over, as many times as the layer
    says) on a transparent canvas; the last layer (radius 0) is the unmasked image itself. So the masked area
    takes the colours around it, smoothly, and the unmasked pixels stay (within 8-bit rounding)."""
    from PIL import Image, ImageFilter, ImageOps

    size = image.size
    kept = Image.new("RGBa", size)
    kept.paste(image.convert("RGBA").convert("RGBa"), mask=ImageOps.invert(mask.convert("L")))
    out = Image.new("RGBA", size)
    for radius, times in FILL_LAYERS:
        layer = kept.filter(ImageFilter.GaussianBlur(radius)).convert("RGBA")
        for _ in range(times):
            out.alpha_composite(layer)
    return out.convert("RGB")


def overlay(generated, original, mask):
    """The original over the generated image with alpha 255 minus the mask (A1111's overlay image, premultiplied as
    it makes it, composited as its apply_overlay does): the generated pixels where the mask is white, the
    original's where it is black, blended in between; every pixel outside the blurred mask is the original's."""
    from PIL import Image, ImageOps

    kept = Image.new("RGBa", original.size)
    kept.paste(original.convert("RGBA").convert("RGBa"), mask=ImageOps.invert(mask.convert("L")))
    out = generated.convert("RGBA")
    out.alpha_composite(kept.convert("RGBA"))
    return out.convert("RGB")


@dataclass(frozen=True)
class Prepared:
    """A job's mask, read once: the mask at the init image's size (inverted when asked; grey kept, an alpha layer
    cut unless mask_round is off) and its blur."""

    mask: object  # L, the init image's size
    soft: object  # L, blurred by mask_blur
    resized_from: tuple[int, int] | None  # the mask file's size where it was not the init image's


def prepare(path: str, canvas: tuple[int, int], invert: bool, blur: int, rounded: bool = True) -> Prepared:
    """The mask file for an init image of size `canvas`: resized to it (nearest) where it differs, inverted when
    asked, blurred."""
    from PIL import Image

    mask = read(path, invert, rounded)
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
