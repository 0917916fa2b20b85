"""Canny edges in numpy, as A1111's extension computes them with OpenCV's `cv2.Canny(image, low, high)`.

OpenCV is not a dependency of lowvram-gen (and not installed here); a canny map needs no more than numpy and
scipy (already a dependency) and is computed once per job. The steps are OpenCV's for an RGB image: 3x3 Sobel
gradients per channel (borders replicated), per pixel the channel whose |dx| + |dy| (OpenCV's default L1
magnitude) is largest, non-maximum suppression along the gradient direction quantized to 0/45/90/135 degrees,
then hysteresis: a pixel above `high` is an edge, one above `low` is an edge when it is 8-connected to one. No
blur first (cv2.Canny blurs nothing; neither does the extension). White edges on black, as RGB.
"""

from __future__ import annotations

TAN_22_5 = 0.41421356  # tan(22.5 degrees): the sector bounds of the gradient direction
TAN_67_5 = 2.41421356


def _sobel(channel):
    """(dx, dy) of one channel with OpenCV's 3x3 Sobel kernels, borders replicated."""
    import numpy as np

    p = np.pad(channel, 1, mode="edge")
    dx = (p[:-2, 2:] + 2 * p[1:-1, 2:] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[1:-1, :-2] + p[2:, :-2])
    dy = (p[2:, :-2] + 2 * p[2:, 1:-1] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[:-2, 1:-1] + p[:-2, 2:])
    return dx, dy


def edges(array, low: float, high: float):
    """A boolean edge mask of an HxWxC (or HxW) array of pixel values."""
    import numpy as np
    from scipy import ndimage

    a = np.asarray(array, dtype=np.float32)
    if a.ndim == 2:
        a = a[:, :, None]
    grads = [_sobel(a[:, :, c]) for c in range(a.shape[2])]
    mags = np.stack([np.abs(dx) + np.abs(dy) for dx, dy in grads])
    pick = mags.argmax(axis=0)[None]
    mag = np.take_along_axis(mags, pick, 0)[0]
    dx = np.take_along_axis(np.stack([g[0] for g in grads]), pick, 0)[0]
    dy = np.take_along_axis(np.stack([g[1] for g in grads]), pick, 0)[0]

    p = np.pad(mag, 1, mode="constant")
    h, w = mag.shape

    def at(oy: int, ox: int):
        return p[1 + oy:1 + oy + h, 1 + ox:1 + ox + w]

    ax, ay = np.abs(dx), np.abs(dy)
    horizontal = ay <= ax * TAN_22_5  # the gradient points along x: compare left and right
    vertical = ay > ax * TAN_67_5
    same_sign = (dx * dy) >= 0
    keep = np.zeros_like(mag, dtype=bool)
    keep |= horizontal & (mag > at(0, -1)) & (mag >= at(0, 1))
    keep |= vertical & (mag > at(-1, 0)) & (mag >= at(1, 0))
    diagonal = ~horizontal & ~vertical
    # image rows grow downwards: a gradient with dx and dy of the same sign points down-right
    keep |= diagonal & same_sign & (mag > at(-1, -1)) & (mag >= at(1, 1))
    keep |= diagonal & ~same_sign & (mag > at(-1, 1)) & (mag >= at(1, -1))
    candidates = keep & (mag > low)
    labels, count = ndimage.label(candidates, structure=np.ones((3, 3), dtype=bool))
    if count == 0:
        return candidates
    strong = np.zeros(count + 1, dtype=bool)
    strong[np.unique(labels[candidates & (mag > high)])] = True
    strong[0] = False
    return strong[labels]


def canny(image, low: int = 100, high: int = 200):
    """The canny map of a PIL image: white edges on black, RGB, the image's size."""
    import numpy as np
    from PIL import Image

    mask = edges(np.asarray(image.convert("RGB")), low, high)
    return Image.fromarray(np.repeat((mask * 255).astype(np.uint8)[:, :, None], 3, axis=2), "RGB")
