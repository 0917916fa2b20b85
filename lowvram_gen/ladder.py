"""The out-of-memory ladder every engine climbs down: one guard, one attempt record, one summary.

Each piece of work that can run out of memory (a Stable Diffusion denoise, decode or hires pass, a
VQGAN-CLIP setup or iteration, an upscaler's tiles) runs through `Ladder.attempt()`. On an
out-of-memory it leaves the `except` block first (the exception's frames pin the tensors: PyTorch
FAQ, ComfyUI does the same), then frees memory, records the attempt and reports the failure; the
engine then takes its own cheapest step down (split the batch, tile the decode, smaller cutout
chunks, halve the tile) or `step_preset()`, and when nothing is left, raises `exhausted()`: one
message listing everything that was tried.

The same `Ladder` lives for a whole job (all its images), so the next image starts where the last
one ended up, and the job's attempts are one list: in the result, the PNG metadata and the summary.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from lowvram_gen.errors import OutOfMemoryEverywhere
from lowvram_gen.oom import allocated_bytes, free_memory, is_oom, short_reason
from lowvram_gen.presets import Preset

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One stretch of work at one setting and how it ended."""

    preset: str
    batch: int  # images per pass (SD), cutouts per CLIP pass (VQGAN-CLIP), 1 (upscalers)
    width: int
    height: int
    stage: str  # place (weights onto the device) | denoise | decode | hires | setup | iterate | preview | upscale
    outcome: str  # ok | oom | nan | black
    seconds: float
    detail: str = ""
    unit: str = ""  # the work in words: "batch 4", "64 cutouts in chunks of 16", "128 px tiles"
    extra: dict = field(default_factory=dict)  # engine-specific keys, flattened into as_dict()

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data

    def describe(self) -> str:
        """'highvram (denoise, batch 4, 512x512)' or 'medvram (iteration 7, 64 cutouts in chunks of 32, 512x512)'."""
        where = f"iteration {self.extra['iteration']}" if self.stage == "iterate" and "iteration" in self.extra \
            else self.stage
        unit = f", {self.unit}" if self.unit else ""
        return f"{self.preset} ({where}{unit}, {self.width}x{self.height})"


Where = Callable[[], dict]  # the engine's current batch/width/height/unit/extra, for the record


class Ladder:
    """Where a job stands: the presets from the one it started at down to the cheapest, the rung it
    is on now, and every attempt so far."""

    def __init__(self, presets: list[Preset], device_kind: str = "cpu", attempts: list[Attempt] | None = None):
        self.presets = list(presets)
        self.rung = 0
        self.device_kind = device_kind
        self.attempts: list[Attempt] = attempts if attempts is not None else []

    @property
    def preset(self) -> Preset:
        return self.presets[self.rung]

    @property
    def preset_name(self) -> str:
        return self.presets[self.rung].name if self.presets else "none"

    def step_preset(self) -> bool:
        """Go one preset down; False at the bottom (the engine's last steps, or `exhausted()`, follow)."""
        if self.rung + 1 >= len(self.presets):
            return False
        self.rung += 1
        return True

    def record(self, stage: str, outcome: str, started: float, detail: str = "", *, batch: int = 1,
               width: int = 0, height: int = 0, unit: str = "", extra: dict | None = None) -> Attempt:
        attempt = Attempt(self.preset_name, batch, width, height, stage, outcome,
                          round(time.perf_counter() - started, 3), detail, unit, dict(extra or {}))
        self.attempts.append(attempt)
        return attempt

    def attempt(self, stage: str, fn: Callable[[], Any], where: Where, started: float | None = None,
                on_oom: Callable[[], None] | None = None) -> tuple[bool, Any]:
        """(True, fn()) or, after an out-of-memory, (False, None) with the attempt recorded and memory
        freed. Anything that is not an out-of-memory propagates unchanged. `on_oom` runs after the
        except block and before memory is freed (to drop what the engine itself still holds)."""
        begun = time.perf_counter() if started is None else started
        baseline = allocated_bytes(self.device_kind)
        reason = None
        try:
            return True, fn()
        except Exception as exc:  # noqa: BLE001 - anything but OOM is re-raised
            if not is_oom(exc):
                raise
            reason = short_reason(exc)
        # out of the except block: the failed frames, and the tensors they held, are gone now
        self.record(stage, "oom", begun, reason, **where())
        if on_oom is not None:
            on_oom()
        free_memory(self.device_kind, baseline)
        return False, None

    def exhausted(self, advice: str) -> OutOfMemoryEverywhere:
        """The error to raise when no step is left: what was tried, and what the user can do."""
        tried = ", ".join(a.describe() for a in self.attempts if a.outcome == "oom")
        return OutOfMemoryEverywhere(f"out of memory at every step of the ladder; tried: {tried}. {advice}",
                                     self.attempts)

    def went_down(self, what: str) -> None:
        log.warning("out of memory at %s; going on with %s", self.attempts[-1].describe(), what)

    def summary(self, seconds: float, generated: tuple[int, int], requested: tuple[int, int],
                resumed: bool = False) -> str:
        """One line for people: 'out of memory at highvram (denoise, batch 4, 512x512); finished at
        medvram in 14.2 s'. `resumed`: the engine kept its progress across the out-of-memory."""
        parts = []
        for a in self.attempts:
            if a.outcome == "oom":
                parts.append(f"out of memory at {a.describe()}")
            elif a.outcome != "ok":
                parts.append(f"{a.outcome} output at {a.preset} ({a.stage}): {a.detail}")
        tail = f"finished at {self.preset_name} in {seconds:.1f} s"
        if resumed and any(a.outcome == "oom" for a in self.attempts):
            tail = "resumed without starting over; " + tail
        if generated != requested:
            tail += f" (generated at {generated[0]}x{generated[1]}, upscaled)"
        return "; ".join(parts + [tail])

    def failed_presets(self) -> list[Attempt]:
        """The attempts worth remembering for this device: out-of-memory at a real preset."""
        return [a for a in self.attempts if a.outcome == "oom" and a.stage != "preview" and self.presets]
