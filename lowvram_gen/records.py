"""The small JSON files of records the app keeps in `$LOWVRAM_GEN_HOME` (remembered failures, measured step
times): read so that a damaged, hand-edited or other-version file never fails a job, written atomically.

A file is a JSON list of objects. Reading keeps the records whose fields are all there with the right types
(`Fields`: name -> type; an int field takes no bool, a float field takes an int and no NaN/Inf/negative) and
skips the others with ONE warning that names the file and how many were skipped; a file that is not such a
list at all is ignored with one warning; one that is not JSON at all (nor UTF-8; nested too deep, too large:
lowvram_gen.safe_json) is also set aside as `<name>.bad`, so that it is warned about once. Writing keeps the
newest `limit` records and goes through a temporary file and a rename (paths.write_atomically), so a reader or
a crash never sees half a file.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.paths import write_atomically

log = logging.getLogger(__name__)

Fields = dict[str, type]

# A records file is a few hundred small records (a few hundred kB); JSON far beyond that is not ours, and nesting
# is refused past safe_json's depth before it can recurse (a RecursionError is no ValueError)
MAX_BYTES = 16 * 1024 * 1024


def valid(record, fields: Fields) -> bool:
    """Whether `record` is an object with every field of `fields` of its type."""
    if not isinstance(record, dict):
        return False
    for name, kind in fields.items():
        value = record.get(name)
        if isinstance(value, bool) and kind is not bool:
            return False
        if kind is float:
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                return False
        elif kind is int:
            if not isinstance(value, int) or value < 0:
                return False
        elif not isinstance(value, kind):
            return False
    return True


def load(path: Path, fields: Fields, what: str) -> list[dict]:
    """The valid records of the file at `path` (oldest first); [] when there is none. `what` names the records
    in the warning ("remembered failures")."""
    try:
        data = safe_json.load_file(path, max_bytes=MAX_BYTES)
    except FileNotFoundError:
        return []
    except safe_json.BadJson as exc:  # not JSON, not UTF-8, nested too deep, too large, NaN/Infinity
        log.warning("ignoring %s: not readable as %s (%s)%s", path, what, exc.problem, _set_aside(path))
        return []
    except OSError as exc:  # unreadable
        log.warning("ignoring %s: not readable as %s (%s)", path, what, type(exc).__name__)
        return []
    if not isinstance(data, list):
        log.warning("ignoring %s: not a list of %s", path, what)
        return []
    records = [r for r in data if valid(r, fields)]
    if len(records) < len(data):
        log.warning("skipped %d of %d records of %s that are not %s (missing or mistyped fields)",
                    len(data) - len(records), len(data), path, what)
    return records


def _set_aside(path: Path) -> str:
    """Move a file that is not JSON out of the way (to `<name>.bad`, replacing an older one), so that it is
    warned about once, not at every read, and kept for whoever wants to look at it; what to add to the warning."""
    aside = path.with_name(path.name + ".bad")
    try:
        path.replace(aside)
    except OSError:
        return ""
    return f"; set aside as {aside}"


def save(path: Path, records: list[dict], limit: int | None = None) -> None:
    """Write `records` (the newest `limit` of them) to `path` atomically. OSError propagates: the caller decides
    whether a record that could not be kept matters."""
    kept = records[-limit:] if limit else records
    write_atomically(path, json.dumps(kept, indent=1))
