"""The one way JSON from outside the process is read: state files, batch manifests and `.jsonl` prompt lines,
safetensors headers, PNG metadata (and request bodies).

`json.loads` recurses once per nesting level, so 100000 `[` (200 kB, valid JSON) end in a RecursionError that
no `except ValueError` catches; it also takes NaN and Infinity, which no file of ours holds and which break
whatever computes or serialises the value later. `loads` refuses such text BEFORE parsing it: a size limit,
a nesting depth found by one linear scan of the brackets outside strings, and NaN/Infinity refused while
parsing. Every refusal is a `BadJson` (a ValueError, so a caller's existing `except ValueError` still holds)
whose message says what was wrong and names what was read (`what`); each caller keeps its own policy (a
warning for a state file, a failed line for a batch, a ModelLoadError for a header, ...).
"""

from __future__ import annotations

import json
import math
import re

from lowvram_gen.errors import LowVramError

MAX_DEPTH = 64  # none of our files nests beyond a handful of levels; far below Python's recursion limit
MAX_BYTES = 64 * 1024 * 1024  # the largest thing read this way (a safetensors header, timings) is a few MB

# a whole string (its escapes included) or one bracket; everything else is skipped by the regex engine
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


class BadJson(LowVramError, ValueError):
    """JSON refused before or while parsing: too large, nested too deep, a NaN/Infinity (or a number too large for a float), or not JSON."""

    exit_code = 2

    def __init__(self, what: str, problem: str, kind: str = "invalid"):
        self.what, self.problem, self.kind = what, problem, kind  # kind: too large | too deep | not finite | invalid
        super().__init__(f"{what}: {problem}")


def depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in `text`, brackets inside strings not counted. One linear
    scan that never recurses (the regex finds each string whole, its closing quote optional so an
    unterminated one cannot make it backtrack); it does not check the JSON is well formed (json.loads does)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    deepest = level = 0
    for token in _TOKENS.findall(data):
        if token in b"[{":
            level += 1
            if level > deepest:
                deepest = level
        elif token in b"]}":
            level -= 1
    return deepest


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # 1e400: a valid JSON number no float holds
        raise ValueError(f"{literal} is not a number JSON allows (out of a float's range)")
    return value


def loads(text: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
          what: str = "JSON"):
    """`text` parsed as JSON, or BadJson saying why not: larger than `max_bytes`, nested deeper than
    `max_depth`, holding NaN/Infinity, not UTF-8 or not JSON. `what` names the source in the message
    ("/home/u/.lowvram/timings.json", "line 7 of prompts.jsonl", "the request body")."""
    size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)
    if size > max_bytes:
        raise BadJson(what, f"{size} bytes of JSON is more than the {max_bytes} allowed", "too large")
    deepest = depth(text)
    if deepest > max_depth:
        raise BadJson(what, f"JSON nested {deepest} levels deep; at most {max_depth} are allowed", "too deep")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except UnicodeDecodeError as exc:
        raise BadJson(what, f"not UTF-8 text ({exc.reason})") from None
    except ValueError as exc:
        if "allows" in str(exc):
            raise BadJson(what, f"not finite: {exc}", "not finite") from None
        raise BadJson(what, f"not valid JSON ({exc})") from None
    except RecursionError:  # only reachable with a max_depth near the interpreter's limit
        raise BadJson(what, "JSON nested too deep to read", "too deep") from None


def load_file(path, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES, what: str | None = None):
    """The JSON in the file at `path` (see `loads`); OSError (FileNotFoundError too) propagates. The size is
    checked before the file is read."""
    from pathlib import Path

    path = Path(path)
    name = what or str(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise BadJson(name, f"{size} bytes of JSON is more than the {max_bytes} allowed", "too large")
    return loads(path.read_bytes(), max_depth=max_depth, max_bytes=max_bytes, what=name)
