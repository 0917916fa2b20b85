"""Running an X/Y/Z grid through the Session, cell by cell, and saving its grid PNG.

Before the first cell the plan of the largest cell of each memory setting is checked (a grid that cannot run is
refused before it starts, naming the cell). Each cell is one `Session.generate` (its images saved as usual, with their
own infotext); `on_cell(i, n)` says which runs. Interrupt (`cancel`) ends the running cell as a job's Interrupt does
(what it finished is kept) and no later cell starts; the grid of the finished cells is still drawn and saved, the
missing cells blank, as A1111 does. A cell that fails (out of RAM, a model that will not load) is left blank with its
error, and the grid goes on, as A1111's.

Each cell is measured: its seconds per step (the denoising passes' own timing, from the ladder's attempts) and its
peak memory. On CUDA that is torch's peak allocated VRAM of the cell (reset before it); elsewhere the process's peak
resident set (Linux's VmHWM, reset through /proc/self/clear_refs before the cell): on a CPU the job's host memory,
weights loaded for it included, and anything else the process did meanwhile. Where neither can be read, no peak.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from PIL import Image

from lowvram_gen import outputs
from lowvram_gen.errors import Cancelled, InvalidRequest, LowVramError, NotEnoughRam
from lowvram_gen.xyz import draw
from lowvram_gen.xyz.grid import SCRIPT_TITLE, Grid, largest

CellFn = Callable[[int, int], None]


@dataclass
class CellResult:
    index: int  # in grid order (x fastest)
    labels: tuple[str, ...]
    images: list[str] = field(default_factory=list)
    seconds_per_step: float | None = None
    peak_bytes: int | None = None
    peak_kind: str = ""  # "VRAM" (CUDA's peak allocated) or "host" (the process's peak resident set)
    preset: str = ""
    error: str | None = None
    result: object | None = None  # the cell's GenerationResult

    def caption(self) -> str:
        """'0.021 s/step, peak 1.2 GiB host': what the grid writes under the cell."""
        from lowvram_gen.hardware.bytesize import format_size

        if self.error:
            return "failed"
        speed = f"{self.seconds_per_step:.3g} s/step" if self.seconds_per_step else "s/step: n/a"
        peak = f"peak {format_size(self.peak_bytes)} {self.peak_kind}" if self.peak_bytes else "peak: n/a"
        return f"{speed}, {peak}"

    def as_json(self) -> dict:
        return {"index": self.index, "labels": list(self.labels), "images": self.images,
                "seconds_per_step": self.seconds_per_step, "peak_bytes": self.peak_bytes, "peak_kind": self.peak_kind,
                "preset": self.preset, "error": self.error}


@dataclass
class XyzResult:
    grid: str | None  # the grid PNG's path (None: no cell finished)
    sub_grids: list[str]
    cells: list[CellResult]
    shape: tuple[int, int, int]
    interrupted: bool = False
    grid_image: Image.Image | None = None  # the grid as drawn (for the UI and the API's answer)
    sub_images: list[Image.Image] = field(default_factory=list)
    infotext: str = ""

    @property
    def images(self) -> list[str]:
        """Every cell's saved images, in grid order."""
        return [path for cell in self.cells for path in cell.images]

    @property
    def warnings(self) -> list[str]:
        """The cells' warnings (each once) and each failed cell's error."""
        said = [w for cell in self.cells if cell.result for w in cell.result.warnings]
        said += [f"cell {', '.join(l for l in cell.labels if l)} failed: {cell.error}" for cell in self.cells
                 if cell.error]
        return list(dict.fromkeys(said))

    @property
    def summary(self) -> str:
        done = sum(1 for c in self.cells if c.images)
        nx, ny, nz = self.shape
        how = "interrupted: " if self.interrupted else ""
        return (f"X/Y/Z plot {how}{done} of {len(self.cells)} cells made ({nx}x{ny}"
                + (f"x{nz}" if nz > 1 else "") + ")" + (f"; grid {self.grid}" if self.grid else ""))

    def as_json(self) -> dict:
        return {"grid": self.grid, "sub_grids": self.sub_grids, "shape": list(self.shape),
                "interrupted": self.interrupted, "cells": [c.as_json() for c in self.cells],
                "images": self.images, "summary": self.summary}


def check_styles(session, grid: Grid) -> None:
    """Each Styles axis value's styles in the session's styles file, before the first cell: an unknown one is
    refused naming the axis, the value and the styles there are."""
    for which, axes in (("X", grid.x), ("Y", grid.y), ("Z", grid.z)):
        if axes.axis.label != "Styles":
            continue
        book = session.style_book()
        for value in axes.values:
            try:
                book.check(s.strip() for s in value.split(",") if s.strip())
            except InvalidRequest as exc:
                raise InvalidRequest(f"{which} axis Styles value", value, f"{exc.allowed} (style {exc.value!r})") \
                    from None


def check_plans(session, grid: Grid) -> None:
    """The plan of each memory setting's largest cell, before the first cell: a refusal names the cell."""
    for cell in largest(grid):
        try:
            with _budget(session, cell.vram_budget):
                the_plan = session.plan(cell.request)
        except InvalidRequest as exc:
            raise InvalidRequest(f"X/Y/Z plot cell ({_said(cell)}) {exc.field}", exc.value, exc.allowed) from None
        if the_plan.refusal:
            raise NotEnoughRam(f"X/Y/Z plot cell ({_said(cell)}): {the_plan.refusal}")


def _said(cell) -> str:
    return ", ".join(label for label in cell.labels if label) or "the base request"


class _budget:
    """The session's VRAM budget set to a cell's (None: left as it is) while the cell runs, and put back after;
    held under the session's lock so no other job starts under it."""

    def __init__(self, session, budget: int | None):
        self.session, self.budget, self.saved = session, budget, None

    def __enter__(self):
        if self.budget is not None:
            self.session.lock.acquire()
            self.saved = self.session.vram_limits()
            self.session.set_vram_limits(self.budget or None, self.saved[1])

    def __exit__(self, *exc):
        if self.budget is not None:
            self.session.set_vram_limits(*self.saved)
            self.session.lock.release()


def _reset_peak() -> str:
    """Reset the peak counter this cell is measured by; its kind ('VRAM', 'host' or '' where none can be read)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
        return "VRAM"
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM back to the resident set now
        return "host"
    except OSError:
        return ""


def _peak(kind: str) -> int | None:
    if kind == "VRAM":
        return int(sys.modules["torch"].cuda.max_memory_allocated())
    if kind == "host":
        try:
            found = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        except OSError:
            return None
        return int(found[1]) * 1024 if found else None
    return None


def _seconds_per_step(result) -> float | None:
    """The first denoising pass's seconds per step, as the ladder measured it."""
    timed = [a.get("seconds_per_step") for a in result.attempts if a.get("stage") == "denoise"
             and a.get("outcome") == "ok" and a.get("seconds_per_step")]
    return float(timed[0]) if timed else None


def run_grid(session, grid: Grid, outdir: str | None = None, *, on_cell: CellFn | None = None,
             cancel=None, **generate_kwargs) -> XyzResult:
    """Run every cell of `grid` with `session` (its `generate`'s keywords: on_step, skip, on_preview...), then save
    the grid PNG in the cells' folder (`outdir`, or the base request's, or the session's)."""
    check_styles(session, grid)
    check_plans(session, grid)
    cells = [CellResult(i, c.labels) for i, c in enumerate(grid.cells)]
    interrupted = False
    for n, index in enumerate(grid.order, start=1):
        if cancel is not None and cancel.is_set():
            interrupted = True
            break
        if on_cell is not None:
            on_cell(n, len(grid))
        cell, out = grid.cells[index], cells[index]
        request = dataclasses.replace(cell.request, outdir=outdir) if outdir else cell.request
        try:
            with _budget(session, cell.vram_budget):
                kind = _reset_peak()
                result = session.generate(request, cancel=cancel, **generate_kwargs)
        except Cancelled as exc:
            out.images = [str(p) for p in exc.images]
            interrupted = True
            break
        except LowVramError as exc:
            out.error = str(exc)
            continue
        out.result, out.images, out.preset = result, list(result.images), result.preset
        out.seconds_per_step = _seconds_per_step(result)
        out.peak_bytes, out.peak_kind = _peak(kind), kind
    return _save_grid(session, grid, cells, interrupted, outdir)


def _save_grid(session, grid: Grid, cells: list[CellResult], interrupted: bool, outdir: str | None) -> XyzResult:
    first = next((c for c in cells if c.images), None)
    result = XyzResult(None, [], cells, grid.shape, interrupted)
    if first is None:
        return result
    with Image.open(first.images[0]) as opened:
        size = opened.size
    pictures = []
    for cell in cells:
        if cell.images:
            with Image.open(cell.images[0]) as opened:
                picture = opened.convert("RGB")
        else:
            picture = Image.new("RGB", size, "black")
        pictures.append(draw.captioned(picture, cell.caption()) if grid.memory_axes else picture)
    image, subs = draw.xyz_image(pictures, grid.shape, grid.x.legends, grid.y.legends, grid.z.legends,
                                 grid.draw_legend, grid.margin)
    text, meta = outputs.read_png_metadata(first.images[0])
    infotext = grid_infotext(text or "", grid)
    folder = Path(first.images[0]).parent if outdir is None else Path(outdir)
    seed = grid.cells[first.index].request.seed
    prompt = grid.base.prompt
    meta = {"xyz": {"shape": list(grid.shape), "cells": [c.as_json() for c in cells]}, "first_cell": meta,
            "version": 1}
    path = outputs.save_png(image, outputs.next_image_path(folder, seed, f"xyz grid {prompt}"), infotext, meta)
    result.grid, result.grid_image, result.sub_images, result.infotext = str(path), image, subs, infotext
    if grid.include_sub_grids and len(subs) > 1:
        for sub in subs:
            saved = outputs.save_png(sub, outputs.next_image_path(folder, seed, f"xyz grid {prompt}"), infotext, meta)
            result.sub_grids.append(str(saved))
    return result


def grid_infotext(first: str, grid: Grid) -> str:
    """The first cell's infotext with A1111's Script, X/Y/Z Type and Values (and the Fixed values of a Seed axis)."""
    parsed = outputs.parse_a1111_parameters(first)
    prompt, negative = parsed.pop("prompt"), parsed.pop("negative_prompt")
    parsed["Script"] = SCRIPT_TITLE
    for name, axes in (("X", grid.x), ("Y", grid.y), ("Z", grid.z)):
        if axes.active:
            parsed[f"{name} Type"] = axes.axis.label
            parsed[f"{name} Values"] = axes.text
            if axes.axis.label in ("Seed", "Var. seed") and not grid.no_fixed_seeds:
                parsed[f"Fixed {name} Values"] = ", ".join(str(v) for v in axes.values)
    return outputs.a1111_parameters(prompt, negative, parsed)
