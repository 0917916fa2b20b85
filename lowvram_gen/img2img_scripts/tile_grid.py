"""SD upscale's tiles: where A1111 cuts a big image into tiles of the request's size, and how it puts them back.

The split (A1111's images.split_grid): cols = ceil((W - overlap) / (tile_w - overlap)) (rows likewise), spread
evenly: tile c at int(c (W - tile_w) / (cols - 1)), a tile that would reach the edge put flush against it.
The combine (A1111's images.combine_grid): each row is assembled left to right, a tile's first `overlap` columns
blended over what is there with weight floor(255 i / overlap) / 255 for column i (0 at the left: the earlier
tile's pixels, rising towards the tile's own), the rest pasted; then the rows top to bottom the same way over
their first `overlap` lines. No torch: numpy and Pillow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TileGrid:
    image_w: int
    image_h: int
    tile_w: int
    tile_h: int
    overlap: int
    rows: tuple[tuple[int, tuple[int, ...]], ...]  # (y, (x of each tile in the row)) top to bottom

    @property
    def boxes(self) -> list[tuple[int, int, int, int]]:
        """Every tile's (left, top, right, bottom), row by row: the order the tiles run in."""
        return [(x, y, x + self.tile_w, y + self.tile_h) for y, xs in self.rows for x in xs]

    @property
    def shape(self) -> tuple[int, int]:
        """(columns, rows)."""
        return len(self.rows[0][1]), len(self.rows)


def _starts(size: int, tile: int, overlap: int) -> tuple[int, ...]:
    count = math.ceil((size - overlap) / (tile - overlap))
    step = (size - tile) / (count - 1) if count > 1 else 0
    return tuple(size - tile if int(i * step) + tile >= size else int(i * step) for i in range(count))


def split(image_w: int, image_h: int, tile_w: int, tile_h: int, overlap: int) -> TileGrid:
    """The tiles of an image_w x image_h image (each side at least its tile's; 0 <= overlap < both tile sides)."""
    ys, xs = _starts(image_h, tile_h, overlap), _starts(image_w, tile_w, overlap)
    return TileGrid(image_w, image_h, tile_w, tile_h, overlap, tuple((y, xs) for y in ys))


def _blend(over, under, weight):
    """`over` on `under` with `weight` (0..1, broadcast), rounded to uint8."""
    import numpy as np

    return np.rint(over * weight + under * (1.0 - weight)).astype(np.uint8)


def _ramp(overlap: int):
    import numpy as np

    return np.floor(np.arange(overlap, dtype=np.float64) * 255 / overlap) / 255 if overlap else np.zeros(0)


def combine(grid: TileGrid, tiles: list) -> "object":
    """The tiles (PIL images, in `grid.boxes` order) put back into one image_w x image_h RGB image."""
    import numpy as np
    from PIL import Image

    ov, ramp = grid.overlap, _ramp(grid.overlap)
    out = np.zeros((grid.image_h, grid.image_w, 3), dtype=np.uint8)
    arrays = iter(np.asarray(t.convert("RGB"), dtype=np.float64) for t in tiles)
    for y, xs in grid.rows:
        row = np.zeros((grid.tile_h, grid.image_w, 3), dtype=np.uint8)
        for x in xs:
            tile = next(arrays)
            if x == 0:
                row[:, :grid.tile_w] = tile
                continue
            row[:, x:x + ov] = _blend(tile[:, :ov], row[:, x:x + ov], ramp[None, :, None])
            row[:, x + ov:x + grid.tile_w] = tile[:, ov:]
        if y == 0:
            out[:grid.tile_h] = row
            continue
        out[y:y + ov] = _blend(row[:ov].astype(np.float64), out[y:y + ov], ramp[:, None, None])
        out[y + ov:y + grid.tile_h] = row[ov:]
    return Image.fromarray(out, "RGB")
