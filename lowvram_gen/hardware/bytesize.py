"""Byte sizes as people write them ('6GiB', '512MB', '4GB') and as we print them ('3.7 GiB')."""

from __future__ import annotations

import re

GiB = 1024**3
MiB = 1024**2

# No memory, card or disk we plan for comes near a pebibyte; a larger size is a typo (or a probe), and
# planning with it printed figures like "102399999998976.0 GiB of RAM usable".
MAX_SIZE = 1024**5
_TOO_LARGE = "a size must be at most 1 PiB (1024 TiB)"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
# GB means GiB, as it does for graphics cards: a "4GB card" (A1111, ComfyUI, the box it came in) has
# 4096 MiB, which nvidia-smi shows. Decimal gigabytes would make `--vram 4GB` 7 % smaller than the card.
_UNITS = {"": GiB, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": MiB, "mb": MiB, "mib": MiB,
          "g": GiB, "gb": GiB, "gib": GiB, "t": 1024**4, "tb": 1024**4, "tib": 1024**4}


def parse_size(text: str | int | float, field: str = "size") -> int:
    """'6GiB', '6GB', '6G', '512MiB', '512MB', '6' (text without a unit: GiB) -> bytes; numbers are bytes.

    Units are binary with or without the i (see _UNITS): '4GB' is 4 GiB, the size of a "4GB card".
    """
    from lowvram_gen.errors import InvalidRequest

    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise InvalidRequest(field, text, "a size must not be negative")
        if not text <= MAX_SIZE:  # NaN too
            raise InvalidRequest(field, text, _TOO_LARGE)
        return int(text)
    match = _SIZE.match(str(text))
    unit = (match.group(2) or "").lower() if match else None
    if not match or unit not in _UNITS:
        raise InvalidRequest(field, text, "use a size like 6GiB, 6GB (= 6GiB), 512MiB or 6 (GiB)")
    size = float(match.group(1)) * _UNITS[unit]
    if not size <= MAX_SIZE:  # 99999999999TB: bad input, not a machine to plan for
        raise InvalidRequest(field, text, _TOO_LARGE)
    return int(size)


def format_size(n: int | float) -> str:
    """Bytes for people: '3.7 GiB', '512 MiB' (exact byte counts are for --json)."""
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB else f"{n / MiB:.0f} MiB"
