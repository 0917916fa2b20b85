"""Hires fix's sizes: what the first pass is upscaled to, and the part of it the second pass keeps.

A1111's rules (its StableDiffusionProcessingTxt2Img.calculate_target_resolution), which the request, the planner
and the runner all take from here:

* `Hires upscale: X`: the first pass times X.
* `Hires resize: Wx0` or `0xH` (one side given): that side, the other following the first pass's aspect.
* `Hires resize: WxH` (both): the first pass is upscaled to cover WxH (its aspect kept) and the middle WxH is kept,
  as A1111 crops its latents after the upscale (more from the right and the bottom when the excess is odd).

Sides come out in multiples of the pipeline's grid (`multiple`: 8 for SD/SDXL, 16 for SD3/Flux), rounded down, as
A1111's latent upscale rounds them down to whole latents. Standard library only: the request validates with it.
"""

from __future__ import annotations

from dataclasses import dataclass

LATENT = 8  # pixels per latent cell: where A1111 crops (its `opt_f`)


@dataclass(frozen=True)
class HiresGeometry:
    """The first pass upscaled to `upscale_to` (W, H), then the `size` (W, H) at `offset` (x, y) of it kept: the
    second pass's size. Without a crop `upscale_to` is `size` and `offset` is (0, 0)."""

    upscale_to: tuple[int, int]
    size: tuple[int, int]
    offset: tuple[int, int] = (0, 0)

    @property
    def cropped(self) -> bool:
        return self.upscale_to != self.size

    def box(self) -> tuple[int, int, int, int]:
        """The kept part in pixels of the upscaled image: (left, top, right, bottom), as PIL's crop takes it."""
        x, y = self.offset
        return x, y, x + self.size[0], y + self.size[1]

    def scaled(self, width: int, height: int, multiple: int) -> "HiresGeometry":
        """The same crop for a second pass of (width, height) instead of `size` (a preset's cap, or a first pass
        the ladder made smaller): the upscale and the offset shrink with it."""
        if (width, height) == self.size:
            return self
        fx, fy = width / self.size[0], height / self.size[1]
        up = (max(width, _floor(self.upscale_to[0] * fx, multiple)),
              max(height, _floor(self.upscale_to[1] * fy, multiple)))
        return HiresGeometry(up, (width, height), _offset(up, (width, height)))


def _floor(value: float, multiple: int) -> int:
    return int(value) // multiple * multiple


def _offset(upscale_to: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """A1111's crop: the excess in whole latents, half of it (rounded down) on the left/top."""
    return tuple((up - kept) // LATENT // 2 * LATENT for up, kept in zip(upscale_to, size))


def geometry(first: tuple[int, int], scale: float, resize: tuple[int, int], multiple: int = 8) -> HiresGeometry:
    """The hires geometry of a first pass of `first` (W, H): `resize` (W, H; 0 for a side not given, (0, 0): none)
    wins over `scale`, as in A1111."""
    width, height = first
    rx, ry = resize
    if not rx and not ry:
        size = (_floor(width * scale, multiple), _floor(height * scale, multiple))
        return HiresGeometry(size, size)
    if not ry:
        size = (_floor(rx, multiple), _floor(rx * height // width, multiple))
        return HiresGeometry(size, size)
    if not rx:
        size = (_floor(ry * width // height, multiple), _floor(ry, multiple))
        return HiresGeometry(size, size)
    if width / height < rx / ry:  # the first pass is taller than WxH: full width, cropped top and bottom
        up = (rx, rx * height // width)
    else:
        up = (ry * width // height, ry)
    size = (_floor(rx, multiple), _floor(ry, multiple))
    up = (max(size[0], _floor(up[0], multiple)), max(size[1], _floor(up[1], multiple)))
    return HiresGeometry(up, size, _offset(up, size))
