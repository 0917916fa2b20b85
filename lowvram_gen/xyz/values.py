"""A1111's X/Y/Z value syntax, read into lists of values (no request, no model: text in, values out).

The text is read as one CSV line (so `"a, b", c` is two values), each value stripped. For a whole-number axis a value
may be a range: `1-5` (1, 2, 3, 4, 5: the end included), `1-10 (+3)` (1, 4, 7, 10: a step, the end included where the
steps reach it), `10-1 (-3)`, `1-10 [4]` (four values spread evenly from 1 to 10, cut to whole numbers as A1111's
int(linspace)). For a number axis the same with decimals: `0.5-1 (+0.25)` (the end included where the steps reach it,
within a small tolerance, as numpy's arange with the end plus a step), `5-8 [4]`. A value that is no range is
converted as it is, and one that does not convert is an error naming the axis, the value and what is allowed.
"""

from __future__ import annotations

import csv
import io
import re

from lowvram_gen.errors import InvalidRequest

_INT = r"[+-]?\s*\d+"
_FLOAT = r"[+-]?\s*\d+(?:\.\d*)?"
RANGE = re.compile(rf"\s*({_INT})\s*-\s*({_INT})(?:\s*\(\s*([+-]\d+)\s*\))?\s*")
RANGE_COUNT = re.compile(rf"\s*({_INT})\s*-\s*({_INT})\s*\[\s*(\d+)\s*\]\s*")
RANGE_FLOAT = re.compile(rf"\s*({_FLOAT})\s*-\s*({_FLOAT})(?:\s*\(\s*([+-]\d+(?:\.\d*)?)\s*\))?\s*")
RANGE_COUNT_FLOAT = re.compile(rf"\s*({_FLOAT})\s*-\s*({_FLOAT})\s*\[\s*(\d+)\s*\]\s*")
MAX_VALUES = 1000  # of one axis, before the grid's cell cap: a typo such as `1-1000000` is refused, not expanded


def split_csv(text: str) -> list[str]:
    """The values of an axis box: one CSV line (quotes keep commas), each stripped, empty ones dropped."""
    if not isinstance(text, str):
        raise InvalidRequest("X/Y/Z values", text, "give the values as text, e.g. 1, 2, 3")
    rows = list(csv.reader(io.StringIO(text.replace("\n", " "), newline=""), skipinitialspace=True))
    return [v.strip() for row in rows for v in row if v.strip()]


def join_csv(values) -> str:
    """The inverse of `split_csv`: values as one CSV line (quoted where they hold commas or quotes)."""
    out = io.StringIO()
    csv.writer(out).writerow([str(v) for v in values])
    return out.getvalue().strip()


def _num(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _check_count(axis: str, text: str, count: int) -> None:
    if count > MAX_VALUES:
        raise InvalidRequest(f"{axis} values", text, f"that range makes {count} values; at most {MAX_VALUES} values an axis")


def int_values(axis: str, items: list[str]) -> list[int]:
    """Whole numbers and integer ranges, in order."""
    out: list[int] = []
    for item in items:
        if m := RANGE.fullmatch(item):
            start, end = int(_num(m[1])), int(_num(m[2]))
            step = int(m[3]) if m[3] else (1 if end >= start else -1)  # `5-1` counts down, as a user means it
            if step == 0 or (end - start) * step < 0:
                raise InvalidRequest(f"{axis} values", item, "a range's step must go from its start towards its end")
            _check_count(axis, item, abs(end - start) // abs(step) + 1)
            out.extend(range(start, end + (1 if step > 0 else -1), step))
        elif m := RANGE_COUNT.fullmatch(item):
            start, end, count = int(_num(m[1])), int(_num(m[2])), int(m[3])
            _check_count(axis, item, count)
            out.extend(int(v) for v in _linspace(start, end, count))
        else:
            text = _num(item)
            if not re.fullmatch(r"[+-]?\d+", text):
                raise InvalidRequest(f"{axis} value", item, "a whole number or a range: 1, 2, 3 or 1-5 or 1-10 (+2) or "
                                                            "1-10 [5]")
            out.append(int(text))
    return out


def float_values(axis: str, items: list[str]) -> list[float]:
    """Numbers and ranges, in order, rounded to 8 decimals as A1111's labels show them."""
    out: list[float] = []
    for item in items:
        if m := RANGE_FLOAT.fullmatch(item):
            start, end = float(_num(m[1])), float(_num(m[2]))
            step = float(m[3]) if m[3] else (1.0 if end >= start else -1.0)
            if step == 0 or (end - start) * step < 0:
                raise InvalidRequest(f"{axis} values", item, "a range's step must go from its start towards its end")
            count = int((end - start) / step + 1e-9) + 1  # the end counts where the steps reach it
            _check_count(axis, item, count)
            out.extend(round(start + i * step, 8) for i in range(count))
        elif m := RANGE_COUNT_FLOAT.fullmatch(item):
            start, end, count = float(_num(m[1])), float(_num(m[2])), int(m[3])
            _check_count(axis, item, count)
            out.extend(round(v, 8) for v in _linspace(start, end, count))
        else:
            try:
                out.append(float(_num(item)))
            except ValueError:
                raise InvalidRequest(f"{axis} value", item, "a number or a range: 5, 7.5 or 5-8 (+0.5) or 5-8 [4]") \
                    from None
    return out


def _linspace(start: float, end: float, count: int) -> list[float]:
    """numpy's linspace (the end included; one value: the start), without numpy."""
    if count <= 0:
        return []
    if count == 1:
        return [start]
    return [start + (end - start) * i / (count - 1) for i in range(count)]
