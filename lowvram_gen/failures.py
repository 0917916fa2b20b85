"""Remember what ran out of memory on this device, so the next comparable job starts lower.

A small JSON file in the user cache; one record per (device, model, preset) with the smallest
job (pixels x images per pass) that failed. A job at least that big starts below that preset.
"""

from __future__ import annotations

import json
from pathlib import Path

from lowvram_gen.paths import home, write_atomically


def _path() -> Path:
    return home() / "failures.json"


def load() -> list[dict]:
    try:
        data = json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []


def _save(records: list[dict]) -> None:
    write_atomically(_path(), json.dumps(records, indent=1))


def on_cpu(device: str) -> bool:
    """Whether `device` (a probed device's name) is this machine's CPU. Out of memory there is system RAM or
    simulated (tests, benchmarks), never a GPU's: it is not remembered, and not shown as a GPU failure."""
    from lowvram_gen.device import _cpu_name

    return device == _cpu_name()


def record(device: str, model: str, preset: str, pixels: int, batch: int, kind: str | None = None) -> None:
    """Remember a GPU failure; one on the CPU (`kind` 'cpu', or the CPU's name) is not remembered."""
    if kind == "cpu" or on_cpu(device):
        return
    records = load()
    work = pixels * batch
    for r in records:
        if (r.get("device"), r.get("model"), r.get("preset")) == (device, model, preset):
            if work < r.get("work", work + 1):
                r.update(work=work, pixels=pixels, batch=batch)
            break
    else:
        records.append({"device": device, "model": model, "preset": preset, "pixels": pixels, "batch": batch, "work": work})
    _save(records)


def failed_presets(device: str, model: str, pixels: int, batch: int) -> set[str]:
    """Presets that already ran out of memory on this device for a job no bigger than this one."""
    work = pixels * batch
    return {r["preset"] for r in load() if r.get("device") == device and r.get("model") == model and r.get("work", 0) <= work}


def forget() -> int:
    n = len(load())
    try:
        _path().unlink()
    except FileNotFoundError:
        pass
    return n
