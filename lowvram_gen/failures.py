"""Remember what ran out of memory on this device, so the next comparable job starts lower.

A small JSON file in the user cache; one record per (device, model, preset) with the smallest
job (pixels x images per pass) that failed. A job at least that big starts below that preset.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lowvram_gen import records as records_mod
from lowvram_gen.paths import home

log = logging.getLogger(__name__)
# what a record must hold (records.load skips, with one warning, those that do not: a hand-edited file)
FIELDS = {"device": str, "model": str, "preset": str, "pixels": int, "batch": int, "work": int}
MAX_RECORDS = 1000


def _path() -> Path:
    return home() / "failures.json"


def load() -> list[dict]:
    """The remembered failures whose fields are all there and of the right type."""
    return records_mod.load(_path(), FIELDS, "remembered out-of-memory failures")


def _save(records: list[dict]) -> None:
    """A failure that cannot be remembered (a read-only home) costs the next job a retry, never this one."""
    try:
        records_mod.save(_path(), records, MAX_RECORDS)
    except OSError as exc:
        log.warning("could not remember the out-of-memory failure in %s: %s", _path(), exc)


def on_cpu(device: str) -> bool:
    """Whether `device` (a probed device's name) is this machine's CPU. Out of memory there is system RAM or
    simulated (tests, benchmarks), never a GPU's: it is not remembered, and not shown as a GPU failure."""
    from lowvram_gen.hardware.device import _cpu_name

    return device == _cpu_name()


def record(device: str, model: str, preset: str, pixels: int, batch: int, kind: str | None = None) -> None:
    """Remember a GPU failure; one on the CPU (`kind` 'cpu', or the CPU's name) is not remembered."""
    if kind == "cpu" or on_cpu(device):
        return
    records = load()
    work = pixels * batch
    for r in records:
        if (r.get("device"), r.get("model"), r.get("preset")) == (device, model, preset):
            if work < r["work"]:
                r.update(work=work, pixels=pixels, batch=batch)
            break
    else:
        records.append({"device": device, "model": model, "preset": preset, "pixels": pixels, "batch": batch, "work": work})
    _save(records)


def failed_presets(device: str, model: str, pixels: int, batch: int) -> set[str]:
    """Presets that already ran out of memory on this device for a job no bigger than this one."""
    work = pixels * batch
    return {r["preset"] for r in load() if r["device"] == device and r["model"] == model and r["work"] <= work}


def forget() -> int:
    n = len(load())
    try:
        _path().unlink()
    except FileNotFoundError:
        pass
    return n
