"""A1111's img2img script "Loopback": `loops` img2img passes, each pass's image the next pass's init image.

A1111's rules (its scripts/loopback.py), written here as ours:
- the seed is fixed once (-1: a random one) and goes up by one every loop, on through the batches;
- the denoising strength of loop i (0-based) is the request's moved towards `final_denoising_strength` by
  curve(i / (loops - 1)): Linear p, Aggressive sin(p pi/2), Lazy 1 - cos(p pi/2); one loop keeps the request's;
- batch size is one: each of the batch count's batches is its own chain from the original init image, its
  strength starting again from the request's;
- an inpaint's masked content is "original" from the second loop on (the loop's image is what is repainted);
- every loop's image is saved as a job's image is, its PNG with `Final denoising strength` and `Denoising curve`;
  with one batch every loop's image goes in the grid, with several each chain's last; a grid of two or more is
  saved in one row, with no parameters (A1111 writes none for it);
- "Append interrogated prompt" other than None is refused: interrogate (CLIP, DeepBooru) is not built.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from lowvram_gen import outputs
from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.img2img_scripts.base import SCRIPT_PARAMS, PartFn, RunOne, ScriptResult, part_line
from lowvram_gen.request import MAX_SEED, GenerationRequest, as_float, as_int

TITLE = "Loopback"
MAX_LOOPS = 32  # A1111's Loops slider maximum
CURVES = ("Aggressive", "Linear", "Lazy")  # A1111's Denoising strength curve choices
INTERROGATE = ("None", "CLIP", "DeepBooru")  # A1111's "Append interrogated prompt at each iteration"


def check_curve(value) -> str:
    """A1111's curve name for `value` in any case."""
    found = {c.lower(): c for c in CURVES}.get(str(value).strip().lower())
    if found is None:
        raise InvalidRequest("denoising curve", value, f"one of {', '.join(CURVES)}")
    return found


def check_interrogation(value) -> str:
    """None only: the other choices need interrogate, which lowvram-gen does not have."""
    if value in (None, "") or str(value).strip().lower() == "none":
        return "None"
    if str(value).strip().lower() in ("clip", "deepbooru"):
        raise InvalidRequest("append interrogated prompt", value, "only None: interrogate (CLIP, DeepBooru) is not "
                             "built in lowvram-gen")
    raise InvalidRequest("append interrogated prompt", value, f"one of {', '.join(INTERROGATE)} (only None is built)")


def strengths(loops: int, initial: float, final: float, curve: str) -> list[float]:
    """The denoising strength of each loop, A1111's calculate_denoising_strength(i) for i in 0..loops-1."""
    if loops == 1:
        return [initial]
    shape = {"Aggressive": lambda p: math.sin(p * math.pi * 0.5), "Lazy": lambda p: 1 - math.cos(p * math.pi * 0.5),
             "Linear": lambda p: p}[curve]
    return [initial + (final - initial) * shape(i / (loops - 1)) for i in range(loops)]


def one_row(paths: list[str]):
    """A1111's image_grid(rows=1): the images side by side, each cell the first image's size, on black."""
    from PIL import Image

    images = []
    for path in paths:
        with Image.open(path) as im:
            images.append(im.convert("RGB"))
    w, h = images[0].size
    grid = Image.new("RGB", (w * len(images), h), "black")
    for i, im in enumerate(images):
        grid.paste(im, (i * w, 0))
    return grid


def save_grid(history: list[str], seed: int) -> str:
    """The one-row grid of `history`, saved beside its images under the folder's next counter."""
    folder = Path(history[0]).parent
    meta = {"script": TITLE, "grid_of": [Path(p).name for p in history], "seed": seed, "version": 1}
    path = outputs.next_image_path(folder, None, "grid")
    return str(outputs.save_png(one_row(history), path, "", meta))


def run_loopback(request: GenerationRequest, run_one: RunOne, loops=4, final_denoising_strength=0.5,
                 denoising_curve="Linear", append_interrogation="None", on_part: PartFn | None = None) -> ScriptResult:
    """Run Loopback over `request` (an img2img or inpaint request) with A1111's arguments; see the module."""
    loops = as_int("loops", loops, 1, MAX_LOOPS, " (A1111's Loops slider)")
    final = as_float("final denoising strength", final_denoising_strength, 0.0, 1.0)
    curve = check_curve(denoising_curve)
    check_interrogation(append_interrogation)
    if not request.init_image:
        raise InvalidRequest("init image", None, "Loopback starts from an image: give an init image (--init IMAGE)")
    request = request.validated().with_subseed()
    warnings = []
    if request.batch_size > 1:
        warnings.append(f"Loopback makes one image a batch, as A1111's: batch size {request.batch_size} ran as 1 "
                        "(batch count makes that many chains)")
    seed = dataclasses.replace(request, batch_size=1, batch_count=1).resolved_seeds()[0]  # A1111's fix_seed
    plan = strengths(loops, request.strength, final, curve)
    params = {"Final denoising strength": final, "Denoising curve": curve}
    extra = {**request.extra, SCRIPT_PARAMS: params}
    chains, total = request.batch_count, request.batch_count * loops
    images, history, seeds, jobs = [], [], [], []
    for n in range(chains):
        init, last = request.init_image, None
        for i in range(loops):
            job = dataclasses.replace(
                request, init_image=init, strength=plan[i], seed=(seed + n * loops + i) % (MAX_SEED + 1),
                batch_size=1, batch_count=1, extra=extra,
                masked_content=request.masked_content if i == 0 else "original")
            line = part_line("loop", i + 1, loops) + (f" · batch {n + 1}/{chains}" if chains > 1 else "")
            if on_part is not None:
                on_part(n * loops + i + 1, total, line)
            try:
                result = run_one(job)
            except Cancelled as stop:
                kept = images + [str(p) for p in stop.images]
                grid = save_grid(history, seed) if len(history) > 1 else None
                raise Cancelled(f"Loopback interrupted in {line}: {len(images)} finished loop image(s) kept"
                                + (f" and their grid {grid}" if grid else "") + f"; {stop}",
                                ([grid] if grid else []) + kept) from None  # the grid first, as A1111's
            jobs.append(result)
            images += result.images
            seeds += result.seeds
            last = result.images[0]
            init = last
            if chains == 1:
                history.append(last)
        if chains > 1:
            history.append(last)
    grid = save_grid(history, seed) if len(history) > 1 else None
    warnings += sorted({w for job in jobs for w in job.warnings})
    final_images = [history[-1]] if chains == 1 else history
    summary = (f"Loopback: {loops} loop(s)" + (f" x {chains} batches" if chains > 1 else "")
               + f", strength {plan[0]:g} -> {plan[-1]:g} ({curve}); {len(images)} image(s)"
               + (" and a grid" if grid else ""))
    return ScriptResult(TITLE, images, final_images, seeds, summary, grid, warnings, jobs)
