"""The host-to-device bandwidth the planner divides streamed bytes by: measured on this GPU, else assumed.

Streamed candidates (budget, lowvram, novram) spend much of a step copying weights over the bus, so
their estimated seconds per step is only as good as this number. `lowvram-gen doctor` measures it on
CUDA (lowvram_gen/hardware/bandwidth.py: pinned host memory, which is what diffusers' group offloading copies
from when it prefetches on a stream) and stores it here, in `$LOWVRAM_GEN_HOME/bus.json`, one record
per GPU name (a machine with two different cards keeps both). A GPU without a record gets the stated
assumption of planning/timing.py (PCIe 4.0 x16); so does a simulated card (`plan --vram`).

A file that cannot be read as such records (corrupt, written by something else, a value no bus has)
is ignored with a warning that says so: the plan falls back to the assumption, it never fails.
Nothing here imports torch.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.records import MAX_BYTES
from lowvram_gen.paths import home, write_atomically
from lowvram_gen.planning.timing import BUS_BYTES_PER_S

log = logging.getLogger(__name__)

ASSUMED = "assumed PCIe 4.0 x16"
# What a stored value may be: below 0.1 GB/s or above 10 TB/s no host-to-device link exists (PCIe 3.0 x1
# is ~1 GB/s, NVLink-C2C ~450 GB/s each way); such a value is a broken file, not a slow bus.
PLAUSIBLE = (1e8, 1e13)
# Copies from pageable (unpinned) host memory, as group offloading makes them with low_cpu_mem_usage
# (the `pin_memory = false` lever, when pinned copies would not fit the RAM), run at about half the
# pinned rate on PCIe 4.0 (CUDA stages them through a pinned bounce buffer): a judgement, used unless
# doctor measured the pageable rate too.
PAGEABLE_RATIO = 0.5


@dataclass(frozen=True)
class Bus:
    """The bandwidth a plan used, and where it came from (shown by `plan` and in `plan --json`)."""

    bytes_per_s: float
    source: str  # "assumed PCIe 4.0 x16" | "measured by doctor on 2025-06-01"
    measured: bool = False
    warning: str = ""  # why a stored measurement was not used
    pageable: float | None = None  # measured pageable bytes/s; None: PAGEABLE_RATIO of bytes_per_s
    # doctor's compute measurements of this GPU (lowvram_gen/hardware/throughput.py), None: timing.py's assumptions
    half_flops: float | None = None  # half-precision matmul FLOP/s
    slowdown: dict | None = None  # {"int8": x, "int4": y}: a quantized layer's time over a 16-bit one's

    @property
    def pageable_bytes_per_s(self) -> float:
        return self.pageable or self.bytes_per_s * PAGEABLE_RATIO

    def as_dict(self) -> dict:
        return {"bytes_per_s": self.bytes_per_s, "source": self.source, "measured": self.measured}

    def describe(self) -> str:
        return f"{self.bytes_per_s / 1e9:.1f} GB/s host-to-device ({self.source})"


ASSUMPTION = Bus(BUS_BYTES_PER_S, ASSUMED)


def path() -> Path:
    return home() / "bus.json"


def _records() -> tuple[dict, str]:
    """The stored records by GPU name, and why the file was ignored ('' when it was not)."""
    file = path()
    try:
        data = safe_json.load_file(file, max_bytes=MAX_BYTES)
    except FileNotFoundError:
        return {}, ""
    except safe_json.BadJson as exc:  # not JSON, nested too deep (no RecursionError), too large, NaN/Infinity
        return {}, f"{file} is not readable JSON ({exc.problem})"
    except OSError as exc:
        return {}, f"{file} is not readable JSON ({type(exc).__name__})"
    if not isinstance(data, dict) or not all(isinstance(r, dict) for r in data.values()):
        return {}, f"{file} is not a bus measurement file (an object of GPU name -> record)"
    return data, ""


def _value(record: dict) -> float | None:
    value = record.get("bus_bytes_per_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if PLAUSIBLE[0] <= value <= PLAUSIBLE[1] else None


def _compute(record: dict) -> dict:
    """The plausible compute measurements of a record (others are left to the assumptions)."""
    out = {}
    flops = record.get("half_flops_per_s")
    if not isinstance(flops, bool) and isinstance(flops, (int, float)) and 1e11 <= flops <= 1e16:
        out["half_flops"] = float(flops)
    slowdown = record.get("slowdown")
    if isinstance(slowdown, dict):
        kept = {k: float(v) for k, v in slowdown.items() if k in ("int8", "int4") and not isinstance(v, bool)
                and isinstance(v, (int, float)) and 0.5 <= v <= 20}
        out["slowdown"] = kept or None
    return out


def for_device(name: str) -> Bus:
    """The measured bandwidth of the GPU called `name` if doctor stored one, else the assumption."""
    records, problem = _records()
    record = records.get(name)
    if record is not None and not problem:
        value = _value(record)
        if value is not None:
            pageable = _value({"bus_bytes_per_s": record.get("pageable_bytes_per_s")})
            return Bus(value, f"measured by doctor on {record.get('date') or 'an unknown date'}", True,
                       pageable=pageable, **_compute(record))
        problem = (f"{path()} has no plausible bus_bytes_per_s for {name!r} "
                   f"(got {record.get('bus_bytes_per_s')!r}; allowed {PLAUSIBLE[0]:g} to {PLAUSIBLE[1]:g} bytes/s)")
    if not problem:
        return ASSUMPTION
    warning = (f"ignoring the stored bus measurement: {problem}; using the {ASSUMED} bandwidth "
               f"({BUS_BYTES_PER_S / 1e9:g} GB/s). `lowvram-gen doctor` on the GPU measures it again")
    log.warning(warning)
    return Bus(BUS_BYTES_PER_S, ASSUMED, False, warning)


def store(name: str, bytes_per_s: float, pageable_bytes_per_s: float | None = None, when: date | None = None,
          half_flops_per_s: float | None = None, slowdown: dict | None = None) -> Path:
    """Record a measurement of GPU `name` (replacing its last one; other GPUs' records are kept; a file
    that is not ours is replaced). `half_flops_per_s`, `slowdown`: doctor's compute measurements."""
    if _value({"bus_bytes_per_s": bytes_per_s}) is None:
        raise ValueError(f"bus bandwidth {bytes_per_s!r} bytes/s is not plausible "
                         f"(allowed {PLAUSIBLE[0]:g} to {PLAUSIBLE[1]:g})")
    records, _ = _records()
    records[name] = {"bus_bytes_per_s": float(bytes_per_s), "pageable_bytes_per_s": pageable_bytes_per_s,
                     "device": name, "date": (when or date.today()).isoformat(), "pinned": True,
                     "half_flops_per_s": half_flops_per_s, "slowdown": slowdown}
    file = path()
    write_atomically(file, json.dumps(records, indent=1))
    return file
