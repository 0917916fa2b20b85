"""The X/Y/Z grid image: cells in rows and columns with A1111's legends (X values over the columns, Y values left of
the rows), the grids of a Z axis side by side under their Z titles, and (for the memory axes) a caption under each
cell with its seconds per step and peak memory. Pillow only; our drawing, A1111's look: black text on white
margins, the font sized from the cell, long legends wrapped to the column's width.
"""

from __future__ import annotations

from PIL import Image, ImageDraw, ImageFont

BACKGROUND, INK = "white", "black"


def font(size: int):
    """Pillow's own scalable font (no font file to ship or find)."""
    return ImageFont.load_default(size=max(8, size))


def _wrap(draw: ImageDraw.ImageDraw, text: str, face, width: int) -> list[str]:
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}".strip()
            if line and draw.textlength(trial, font=face) > width:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return lines


def image_grid(images: list[Image.Image], rows: int) -> Image.Image:
    """`images` in `rows` rows (filled row by row), each cell the size of the first."""
    cols = -(-len(images) // max(1, rows))
    w, h = images[0].size
    grid = Image.new("RGB", (cols * w, rows * h), BACKGROUND)
    for i, image in enumerate(images):
        grid.paste(image.convert("RGB").resize((w, h)) if image.size != (w, h) else image.convert("RGB"),
                   (i % cols * w, i // cols * h))
    return grid


def annotate(grid: Image.Image, width: int, height: int, columns: list[str], rows: list[str],
             margin: int = 0) -> Image.Image:
    """`grid` (cells of width x height, `margin` px apart) with `columns`' legends on top and `rows`' on the left;
    no margin is added for an axis whose legends are all empty (A1111's Nothing)."""
    size = max(12, (width + height) // 25)
    face = font(size)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = size + size // 3
    top_lines = max((len(_wrap(probe, t, face, width)) for t in columns if t), default=0)
    pad_top = (top_lines * line_h + size) if top_lines else 0
    pad_left = (width * 3 // 4) if any(rows) else 0
    out = Image.new("RGB", (grid.width + pad_left, grid.height + pad_top), BACKGROUND)
    out.paste(grid, (pad_left, pad_top))
    draw = ImageDraw.Draw(out)
    for i, text in enumerate(columns):
        lines = _wrap(draw, text, face, width) if text else []
        y = pad_top // 2 - len(lines) * line_h // 2
        for line in lines:
            x = pad_left + i * (width + margin) + width // 2
            draw.text((x, y + line_h // 2), line, font=face, fill=INK, anchor="mm")
            y += line_h
    for j, text in enumerate(rows):
        lines = _wrap(draw, text, face, pad_left - size // 2) if text else []
        y = pad_top + j * (height + margin) + height // 2 - len(lines) * line_h // 2
        for line in lines:
            draw.text((pad_left // 2, y + line_h // 2), line, font=face, fill=INK, anchor="mm")
            y += line_h
    return out


def captioned(image: Image.Image, text: str) -> Image.Image:
    """The image with `text` in a band under it (a cell's s/step and peak memory)."""
    size = max(10, image.width // 14)
    face = font(size)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    lines = _wrap(probe, text, face, image.width - 4)
    band = len(lines) * (size + 3) + 4
    out = Image.new("RGB", (image.width, image.height + band), BACKGROUND)
    out.paste(image.convert("RGB"), (0, 0))
    draw = ImageDraw.Draw(out)
    for i, line in enumerate(lines):
        draw.text((image.width // 2, image.height + 2 + i * (size + 3)), line, font=face, fill=INK, anchor="mt")
    return out


def xyz_image(cells: list[Image.Image], shape: tuple[int, int, int], x_legends: list[str], y_legends: list[str],
              z_legends: list[str], legend: bool = True, margin: int = 0) -> tuple[Image.Image, list[Image.Image]]:
    """(the whole grid, the grid of each Z value): cells in A1111's order (x fastest), each Z value's grid with the
    X and Y legends, side by side under the Z titles."""
    nx, ny, nz = shape
    w, h = cells[0].size
    subs = []
    for iz in range(nz):
        grid = image_grid(cells[iz * nx * ny:(iz + 1) * nx * ny], rows=ny)
        subs.append(annotate(grid, w, h, x_legends, y_legends) if legend else grid)
    if nz == 1:
        return subs[0], subs
    sw, sh = subs[0].size
    joined = Image.new("RGB", (nz * sw + (nz - 1) * margin, sh), BACKGROUND)
    for iz, sub in enumerate(subs):
        joined.paste(sub, (iz * (sw + margin), 0))
    if legend and any(z_legends):
        joined = annotate(joined, sw, sh, z_legends, [], margin)
    return joined, subs
