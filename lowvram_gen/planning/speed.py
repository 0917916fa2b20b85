"""What the jobs measured: the planner's step times corrected by the seconds per step this device really took.

planning/timing.py estimates a step from stated constants (a card's FLOP/s, the CPU's, the slowdown of int8
and int4 weights). Every finished Stable Diffusion pass records here what its steps took on this device
(engines/sd/pipeline.denoise times the steps between the step-end callbacks), with what the estimate was
made of: the step's FLOPs and its transfers. The planner then scales the compute part of its estimate by

    factor = (measured seconds - transfer seconds) / assumed compute seconds

taken as the median of the newest records of the nearest work (pixels x images; within a factor 2 of the
nearest record's: a small model's step at 64 px is mostly overhead, at 512 px mostly FLOPs) of, in order,
1. this device, this model, this weight storage and offload kind ("this candidate's kind");
2. this device and model, any storage and offload on the same processor ("this model");
3. this device, any model whose step is long enough that the overhead of a step does not dominate it
   ("this device"; the tiny model's steps measure Python, not FLOP/s).
The transfer part is not scaled (doctor measures the bus), so a corrected estimate is never below what the
bus bound allows. A record keeps the FLOPs and transfers, not the factor, so a later change of the assumed
constants (doctor measuring the card's throughput) does not make the old records wrong.

The records live in `$LOWVRAM_GEN_HOME/timings.json`, the newest MAX_RECORDS kept; a damaged or hand-edited
file costs its bad records (skipped, with one warning; so are figures beyond PLAUSIBLE), never a plan.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from lowvram_gen import records as records_mod
from lowvram_gen.paths import home

log = logging.getLogger(__name__)

MAX_RECORDS = 500  # newest kept: a few months of jobs, a few hundred kB
NEAREST = 5  # records a factor is the median of
NEAR_BAND = math.log(2)  # records whose work is within a factor 2 of the nearest record's speak for a job
MIN_DEVICE_SECONDS = 0.05  # assumed compute of a record that may speak for other models on the device
COMPUTE_FLOOR = 0.1  # a step is at least this share compute, whatever the transfers were estimated at


@dataclass(frozen=True)
class StepTiming:
    """One pass's measured step and what its estimate was made of."""

    device: str
    model: str
    candidate: str  # the preset (rung) that ran: budget@2.5GiB, cpu+half, ...
    storage: str  # none | fp8 | half | int8 | int4
    offload: str  # none | model | group | sequential | budget | cpu
    on_gpu: bool
    dtype: str
    width: int
    height: int
    batch: int
    flops: float  # of one step
    transfer_s: float  # estimated bus seconds of one step
    measured_s: float  # measured seconds of one step
    date: str = ""

    @property
    def work(self) -> int:
        return self.width * self.height * self.batch


FIELDS = {"device": str, "model": str, "candidate": str, "storage": str, "offload": str, "on_gpu": bool,
          "dtype": str, "width": int, "height": int, "batch": int, "flops": float, "transfer_s": float,
          "measured_s": float}


# What a measured pass can be: beyond these no step was ever timed (a day per step, an exaFLOP per step, a side of
# 64k pixels), so a record holding more was hand-edited or damaged; it would make a plan's s/step `inf`.
PLAUSIBLE = {"measured_s": 86400.0, "transfer_s": 86400.0, "flops": 1e18, "width": 65536, "height": 65536,
             "batch": 4096}


def path() -> Path:
    return home() / "timings.json"


def _implausible(raw: dict) -> str:
    """The first figure of a record beyond what any pass measures, as 'name value'; '' when all are plausible."""
    for name, most in PLAUSIBLE.items():
        if raw[name] > most:
            return f"{name} {raw[name]!r}"
    return ""


def _timing(raw: dict) -> StepTiming | None:
    """A record as a StepTiming; None for one no pass measured (no size, no time)."""
    if min(raw["width"], raw["height"], raw["batch"]) < 1 or raw["measured_s"] <= 0:
        return None
    return StepTiming(**{k: raw[k] for k in FIELDS}, date=str(raw.get("date", "")))


def load() -> list[StepTiming]:
    """The stored records, oldest first; bad ones skipped with one warning (records.load), and so are records
    with absurd figures (PLAUSIBLE: `measured_s: 1e300` made a plan's s/step inf)."""
    raw = records_mod.load(path(), FIELDS, "step timings")
    absurd = [why for why in map(_implausible, raw) if why]
    if absurd:
        log.warning("set aside %d of %d records of %s with figures no pass measures (%s%s); the plans use the "
                    "others", len(absurd), len(raw), path(), absurd[0], ", ..." if len(absurd) > 1 else "")
    return [t for t in map(_timing, raw) if t is not None and not _implausible(asdict(t))]


def record(timing: StepTiming) -> None:
    """Add one measured pass (the oldest records beyond MAX_RECORDS go). A file that cannot be written costs
    the record, never the job that measured it."""
    entry = asdict(timing)
    if not records_mod.valid(entry, FIELDS) or _timing(entry) is None:
        raise ValueError(f"not a valid step timing: {timing}")
    entry["date"] = timing.date or date.today().isoformat()
    if _implausible(entry):  # kept out of the file, where every later plan would have to set it aside
        log.warning("not storing the measured step time: %s is beyond what any pass measures", _implausible(entry))
        return
    try:
        records_mod.save(path(), [asdict(r) for r in load()] + [entry], MAX_RECORDS)
    except OSError as exc:
        log.warning("could not store the measured step time in %s: %s", path(), exc)


def forget() -> int:
    n = len(load())
    path().unlink(missing_ok=True)
    return n


@dataclass(frozen=True)
class Correction:
    """How the planner's compute estimate is scaled for a candidate, and on what evidence."""

    factor: float = 1.0
    jobs: int = 0  # measured passes the factor is the median of; 0: assumed
    basis: str = ""  # "this candidate's kind" | "this model" | "this device"

    @property
    def measured(self) -> bool:
        return self.jobs > 0

    def describe(self) -> str:
        return f"measured on this device ({self.jobs} pass{'es' * (self.jobs != 1)}, {self.basis})" \
            if self.measured else "assumed"

    def as_dict(self) -> dict:
        return {"source": "measured" if self.measured else "assumed", "factor": round(self.factor, 4),
                "jobs": self.jobs, "basis": self.basis}


ASSUMED = Correction()


class Learned:
    """The records of one device, and the correction for each candidate of a plan."""

    def __init__(self, device: str, model: str, compute_of, records: list[StepTiming] | None = None):
        """`compute_of(record)`: the assumed compute seconds of a record's step under today's constants."""
        self.model = model
        self.compute_of = compute_of
        self.records = [r for r in (load() if records is None else records) if r.device == device]

    def _factor(self, r: StepTiming) -> float | None:
        compute = self.compute_of(r)
        if not compute > 0:
            return None
        return max(r.measured_s - r.transfer_s, COMPUTE_FLOOR * r.measured_s) / compute

    def correction(self, storage: str, offload: str, on_gpu: bool, work: int) -> Correction:
        same_proc = [r for r in self.records if r.on_gpu == on_gpu]
        tiers = (
            ("this candidate's kind",
             [r for r in same_proc if r.model == self.model and (r.storage, r.offload) == (storage, offload)]),
            ("this model", [r for r in same_proc if r.model == self.model]),
            ("this device", [r for r in same_proc if self.compute_of(r) >= MIN_DEVICE_SECONDS]),
        )
        for basis, matches in tiers:
            if not matches:
                continue
            # the records within a factor 2 of the nearest work, nearest and then newest first (oldest are first)
            distance = [abs(math.log(r.work / max(1, work))) for r in matches]
            band = min(distance) + NEAR_BAND
            nearest = sorted((i for i in range(len(matches)) if distance[i] <= band), key=lambda i: (distance[i], -i))
            factors = [f for f in (self._factor(matches[i]) for i in nearest[:NEAREST]) if f is not None]
            if factors:
                return Correction(statistics.median(factors), len(factors), basis)
        return ASSUMED
