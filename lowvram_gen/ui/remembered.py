"""The txt2img and img2img values of the last job, kept in `ui-settings.json` in lowvram-gen's home folder
(`$LOWVRAM_GEN_HOME`, else ~/.cache/lowvram-gen), so a restarted UI starts where the user left off.

Saved when a job passes validation (so the file never holds what the UI would refuse), read once when
the UI is built. The file is a convenience: a missing one is normal, and an unreadable, corrupt or
foreign one is ignored with a logged warning, as is a value of the wrong type; a file that cannot be
written costs a warning, never the job. Writes are atomic (a temporary file in the same folder, fsync'ed,
then renamed over the old one), so a crash mid-write leaves the previous file, not half of one.

The Model box is not remembered: it starts at `lowvram-gen ui --model`, which the user chose at start.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from lowvram_gen import paths
from lowvram_gen.paths import write_atomically

log = logging.getLogger(__name__)
FILE_NAME = "ui-settings.json"
VERSION = 1
_LOCK = threading.Lock()  # two browsers finishing validation at once: one read-modify-write at a time


def path() -> Path:
    return paths.home() / FILE_NAME


def load() -> dict[str, dict]:
    """{tab: {control: value}} from the file; {} when there is none or it cannot be used (logged)."""
    file = path()
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        log.warning("ignoring the UI settings in %s: %s", file, exc)
        return {}
    tabs = data.get("tabs") if isinstance(data, dict) and data.get("version") == VERSION else None
    if not isinstance(tabs, dict):
        log.warning("ignoring the UI settings in %s: not a version-%d lowvram-gen settings file", file, VERSION)
        return {}
    return {tab: values for tab, values in tabs.items() if isinstance(values, dict)}


def save(tab: str, values: dict) -> None:
    """Remember `values` as `tab`'s, keeping the other tabs'; a write that fails is logged, not raised."""
    file = path()
    with _LOCK:
        tabs = load()
        tabs[tab] = values
        text = json.dumps({"version": VERSION, "tabs": tabs}, indent=1, ensure_ascii=False, default=str)
        try:
            write_atomically(file, text)
        except OSError as exc:
            log.warning("could not save the UI settings in %s: %s", file, exc)


def initial(saved: dict[str, dict], tab: str, name: str, default):
    """The remembered value of a control, or `default` when none is remembered or it has the wrong type
    (a number for a number box, text for a text box); a wrong one is logged."""
    value = saved.get(tab, {}).get(name, default)
    number = (int, float)
    if isinstance(default, bool) or isinstance(value, bool):
        ok = type(value) is type(default)
    elif isinstance(default, number):
        ok = isinstance(value, number)
    else:
        ok = isinstance(value, str) or value is None
    if not ok:
        log.warning("ignoring the remembered %s %s: %r is not a %s", tab, name, value, type(default).__name__)
        return default
    return value
