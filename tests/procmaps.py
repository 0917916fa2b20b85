"""Which of a process's memory is a file's pages, for the tests of weights kept memory-mapped (issue 17)."""

from __future__ import annotations

from pathlib import Path

HAS_MAPS = Path("/proc/self/maps").exists()


def mapped_ranges(path) -> list[tuple[int, int]]:
    """Address ranges where this process maps `path` (/proc/self/maps, Linux)."""
    ranges, name = [], str(Path(path).resolve())
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == name:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((start, end))
    return ranges


def inside(tensor, ranges: list[tuple[int, int]]) -> bool:
    """Whether `tensor`'s storage starts inside one of `ranges`."""
    return any(a <= tensor.data_ptr() < b for a, b in ranges)
