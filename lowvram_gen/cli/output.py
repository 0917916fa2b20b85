"""What every generating command prints: progress on stderr, then the result (paths or one JSON object)."""

from __future__ import annotations

import json
import sys


class ProgressBar:
    """A tqdm bar on stderr that follows (step, total) callbacks across the chunks of a job."""

    def __init__(self, unit: str = "step"):
        self.unit = unit
        self.bar = None

    def update(self, step: int, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None or step == 1:
            self.close()
            self.bar = tqdm(total=total, unit=self.unit, file=sys.stderr, leave=False)
        self.bar.n = step
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def print_result(result, as_json: bool, paths: list[str]) -> int:
    """Warnings and the summary to stderr; stdout gets one JSON object, or one path per line."""
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.summary, file=sys.stderr)
    if as_json:
        print(json.dumps(result.as_json()))
    else:
        for path in paths:
            print(path)
    return 0
