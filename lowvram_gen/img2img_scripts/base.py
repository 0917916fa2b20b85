"""What the img2img scripts share: the result of a script run, its descriptor for the fronts, progress lines.

A script's `result.images` are every image it saved in order (A1111's `Processed.images` less its grid), `grid`
the grid it saved (Loopback's), `final` the image(s) a front shows as the outcome; `jobs` the GenerationResults of
the jobs it ran, one per loop or tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from lowvram_gen.request import GenerationRequest
from lowvram_gen.result import GenerationResult

RunOne = Callable[[GenerationRequest], GenerationResult]
# on_part(index, total, line): told before each job of the script, line "loop 2/4" / "tile 3/6"
PartFn = Callable[[int, int, str], None]
# the request's `extra` key whose {label: value} the job writes into each PNG's parameters after its own fields
# (engines/sd/job.py), as A1111's scripts fill p.extra_generation_params
SCRIPT_PARAMS = "script_params"


def part_line(what: str, index: int, total: int) -> str:
    """The progress line of one job of a script: `loop 2/4`, `tile 3/6` (1-based)."""
    return f"{what} {index}/{total}"


@dataclass
class ScriptResult:
    script: str  # A1111's title: "Loopback", "SD upscale"
    images: list[str]  # every image saved, in order
    final: list[str]  # the result: Loopback's last loop of each batch, SD upscale's assembled image(s)
    seeds: list[int]
    summary: str
    grid: str | None = None
    warnings: list[str] = field(default_factory=list)
    jobs: list[GenerationResult] = field(default_factory=list)

    def shown(self) -> list[str]:
        """What a front answers, as A1111's: Loopback's grid (its return_grid) and then every image; SD upscale's
        assembled image(s)."""
        if self.grid:
            return [self.grid, *self.images]
        return list(self.final) if self.script != "Loopback" else list(self.images)

    def as_json(self) -> dict:
        return {"script": self.script, "images": self.images, "final": self.final, "grid": self.grid,
                "seeds": self.seeds, "summary": self.summary, "warnings": self.warnings, "jobs": len(self.jobs),
                "attempts": [a for job in self.jobs for a in job.attempts]}


@dataclass(frozen=True)
class ScriptArg:
    """One of A1111's `script_args` in its API order: its label in A1111's UI, its default there."""

    name: str
    label: str
    default: Any


@dataclass(frozen=True)
class ScriptDescriptor:
    """What the Script dropdown and the API's `script_name`/`script_args` need of a script: A1111's title (the
    API matches it case-insensitively), its script_args in order with defaults, `args_from_script_args(list)` ->
    the script function's keyword arguments (a short list takes the defaults for the rest, as A1111's does),
    and `run(request, run_one, **kwargs)`."""

    title: str
    args: tuple[ScriptArg, ...]
    args_from_script_args: Callable[[list], dict]
    run: Callable[..., ScriptResult]

    def defaults(self) -> list:
        return [a.default for a in self.args]
