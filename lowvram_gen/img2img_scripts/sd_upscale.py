"""A1111's img2img script "SD upscale": the init image upscaled, cut into tiles of the request's size, each tile
img2img'd as its own job, and the tiles put back with a feathered overlap (tile_grid.py).

A small card upscales a big image this way: each tile is one width x height img2img job through `run_one` (the
Session's plan and out-of-memory ladder, made for one tile), never the whole image at once.

A1111's rules (its scripts/sd_upscale.py), written here as ours:
- the seed is fixed once; batch n of the batch count starts at seed + n; its tiles go in groups of batch size,
  group i at start + i and the tile j of a group at start + i + j (j's variation seed subseed + j; with a
  variation strength the group's tiles keep its seed), as A1111's batches of tiles get their seeds;
- the upscale is to int(side x scale) // 8 x 8 with the named upscaler; "None" upscales nothing (the tiles cover
  the init image at its own size), as A1111's;
- the tiles are not saved (A1111's do_not_save_samples): ours are run into a temporary folder, read back and
  removed; the assembled image is saved under the seed of its batch, with the parameters of the run's first
  tile (its Size is the tile's), which carry `SD upscale overlap` and `SD upscale upscaler`;
- an Interrupt in a tile saves no half-assembled image: the batches already assembled are kept, and it says so.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from lowvram_gen import outputs
from lowvram_gen.a1111.upscaler_names import LATENT_MODES, NONE, builtin, model_files, model_path, sd_x4_installed
from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.img2img_scripts import tile_grid
from lowvram_gen.img2img_scripts.base import SCRIPT_PARAMS, PartFn, RunOne, ScriptResult, part_line
from lowvram_gen.request import MAX_SEED, MAX_SIDE, GenerationRequest, as_float, as_int

TITLE = "SD upscale"
MAX_SCALE = 8.0  # `lowvram-gen upscale`'s; A1111's slider stops at 4
MAX_OVERLAP = 256  # A1111's Tile overlap slider maximum
BYTES_PER_PIXEL = 36  # what the script holds per output pixel at its peak: a model upscaler's float32 input and
# output (12 bytes each), the upscaled and the assembled RGB images (3 each) and their numpy copies


def upscalers() -> list[str]:
    """The upscalers SD upscale offers, in A1111's order (its sd_upscalers: None, Lanczos, Nearest, the models)."""
    return [NONE, "Lanczos", "Nearest", *model_files(), *(["sd-x4"] if sd_x4_installed() else [])]


def check_upscaler(value) -> str:
    """A name (any case, a model's file name or stem or path) or A1111's API index into `upscalers()`."""
    allowed = upscalers()
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(allowed):
            return allowed[value]
        raise InvalidRequest("SD upscale upscaler", value, f"an index from 0 to {len(allowed) - 1} into "
                                                            f"{', '.join(allowed)}")
    name = str(value or "").strip()
    known = builtin(name)
    if known is not None and known not in LATENT_MODES:
        return known
    if known is None and name:
        if model_path(name) is not None:
            return name
        stem = next((f for f in model_files() if Path(f).stem.lower() == name.lower()), None)
        if stem is not None:
            return stem
    raise InvalidRequest("SD upscale upscaler", value, f"one of {', '.join(allowed)}")


def upscaled_size(width: int, height: int, scale: float) -> tuple[int, int]:
    """A1111's upscale target: each side times the scale, rounded down to a multiple of 8."""
    return int(width * scale) // 8 * 8, int(height * scale) // 8 * 8


def check_args(request: GenerationRequest, overlap, scale, upscaler, init_size: tuple[int, int],
               usable_ram: int | None) -> tuple[int, float, str, tuple[int, int]]:
    """(overlap, scale, upscaler, the size the tiles cover), or the first bad one named."""
    tile = min(request.width, request.height)
    overlap = as_int("SD upscale overlap", overlap, 0, min(MAX_OVERLAP, tile - 1),
                     f" px, smaller than the tile ({request.width}x{request.height}: the width and height)")
    given, scale = scale, as_float("SD upscale scale", scale, 0.0, MAX_SCALE)
    name = check_upscaler(upscaler)
    if name == NONE:  # A1111's: nothing is upscaled, the scale is not used
        size = init_size
    else:
        if scale <= 1:
            raise InvalidRequest("SD upscale scale", given, f"above 1, at most {MAX_SCALE:g} (upscaler None "
                                                            "tiles the image at its own size)")
        size = upscaled_size(*init_size, scale)
        if max(size) > 2 * MAX_SIDE:
            raise InvalidRequest("SD upscale scale", given, f"{init_size[0]}x{init_size[1]} x{scale:g} is "
                                 f"{size[0]}x{size[1]}; at most {2 * MAX_SIDE} px a side")
        need = size[0] * size[1] * BYTES_PER_PIXEL
        if usable_ram is not None and need > usable_ram:
            from lowvram_gen.hardware.device import format_size

            raise InvalidRequest("SD upscale scale", given, f"{size[0]}x{size[1]} needs about {format_size(need)} "
                                 f"of system RAM and {format_size(usable_ram)} is usable; a smaller scale")
    if size[0] < request.width or size[1] < request.height:
        raise InvalidRequest("width and height", f"{request.width}x{request.height}", f"the tile must fit in the "
                             f"image it cuts ({size[0]}x{size[1]}): at most that")
    return overlap, scale, name, size


def _read_init(path: str):
    """The init image in RGB, transparency on white (A1111's flatten with its default background)."""
    from PIL import Image

    with Image.open(path) as im:
        if im.mode in ("RGBA", "LA", "P"):
            im = im.convert("RGBA")
            flat = Image.new("RGBA", im.size, "#ffffff")
            flat.alpha_composite(im)
            return flat.convert("RGB")
        return im.convert("RGB")


def tile_seed(start: int, index: int, batch_size: int, varied: bool) -> tuple[int, int]:
    """(seed, index in its group) of tile `index` in a batch starting at seed `start`: A1111's groups of batch size,
    group i at start + i, tile j of it at + j (+ 0 with a variation strength: the subseed goes up instead)."""
    group, j = divmod(index, batch_size)
    return (start + group + (0 if varied else j)) % (MAX_SEED + 1), j


def run_sd_upscale(request: GenerationRequest, run_one: RunOne, overlap=64, upscaler="Lanczos", scale_factor=2.0,
                   on_part: PartFn | None = None, outdir: str | None = None, device: str = "cpu",
                   usable_ram: int | None = None) -> ScriptResult:
    """Run SD upscale over `request` (an img2img request; its width x height is the tile). `outdir`: where the
    assembled images go (default the request's, else outputs/<date>/); `device`: the upscaler model's;
    `usable_ram`: the bytes the script may use (default: what the machine has usable)."""
    from PIL import Image

    from lowvram_gen.upscale.upscalers import upscale_images

    if not request.init_image:
        raise InvalidRequest("init image", None, "SD upscale upscales an image: give an init image (--init IMAGE)")
    if request.mask:
        raise InvalidRequest("mask", request.mask, "SD upscale works on the whole image: run it from img2img, "
                                                   "without a mask")
    request = request.validated().with_subseed()
    init = _read_init(request.init_image)
    if usable_ram is None:
        from lowvram_gen.hardware.hostmem import probe_host

        usable_ram = probe_host().usable_bytes
    overlap, scale, name, size = check_args(request, overlap, scale_factor, upscaler, init.size, usable_ram)
    image = init if name == NONE else upscale_images([init], size, name, device)[0]
    grid = tile_grid.split(*size, request.width, request.height, overlap)
    boxes = grid.boxes
    varied = request.subseed_strength > 0
    seed = dataclasses.replace(request, batch_size=1, batch_count=1).resolved_seeds()[0]  # A1111's fix_seed
    extra = {**request.extra, SCRIPT_PARAMS: {"SD upscale overlap": overlap, "SD upscale upscaler": name}}
    target = Path(outdir or request.outdir or outputs.default_outdir())
    work = Path(tempfile.mkdtemp(prefix="lowvram-sd-upscale-"))
    finals, seeds, jobs, first = [], [], [], None
    total = len(boxes) * request.batch_count
    try:
        tiles_in = []
        for k, box in enumerate(boxes):
            path = work / f"tile-{k:04d}.png"
            image.crop(box).save(path)
            tiles_in.append(str(path))
        del image
        for n in range(request.batch_count):
            start = (seed + n) % (MAX_SEED + 1)
            made = []
            for k, tile in enumerate(tiles_in):
                tseed, j = tile_seed(start, k, request.batch_size, varied)
                job = dataclasses.replace(request, init_image=tile, seed=tseed, subseed=request.subseed_for(j),
                                          batch_size=1, batch_count=1, outdir=str(work / "out"), extra=extra)
                line = part_line("tile", k + 1, len(boxes)) + (f" · batch {n + 1}/{request.batch_count}"
                                                               if request.batch_count > 1 else "")
                if on_part is not None:
                    on_part(n * len(boxes) + k + 1, total, line)
                try:
                    result = run_one(job)
                except Cancelled as stop:
                    raise Cancelled(f"SD upscale interrupted in {line}: a half-assembled image is not saved; "
                                    f"{len(finals)} finished upscale(s) kept; {stop}", list(finals)) from None
                jobs.append(result)
                if first is None:
                    first = outputs.read_png_metadata(result.images[0])
                with Image.open(result.images[0]) as im:
                    made.append(im.convert("RGB"))
            combined = tile_grid.combine(grid, made)
            meta = {**(first[1] or {}), "script": TITLE, "seed": start, "tiles": len(boxes),
                    "tile_grid": list(grid.shape), "size": list(size), "scale": scale,
                    "attempts": [a for job in jobs[-len(boxes):] for a in job.attempts]}
            path = outputs.next_image_path(target, start, request.prompt)
            finals.append(str(outputs.save_png(combined, path, first[0] or "", meta)))
            seeds.append(start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cols, rows = grid.shape
    summary = (f"SD upscale: {init.size[0]}x{init.size[1]} -> {size[0]}x{size[1]} ({name}), {cols}x{rows} tiles of "
               f"{request.width}x{request.height} with {overlap} px overlap, {len(jobs)} job(s)")
    warnings = sorted({w for job in jobs for w in job.warnings})
    if name == NONE and scale != 1:
        warnings.insert(0, f"upscaler None upscales nothing (A1111's): scale {scale:g} not used")
    return ScriptResult(TITLE, finals, list(finals), seeds, summary, None, warnings, jobs)
