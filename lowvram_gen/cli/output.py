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
        """The first callback of a chunk (step 1 has just ended) starts a bar at that step: its rate is
        measured from there on, not 1 step over the microseconds since the bar was made."""
        from tqdm import tqdm

        if self.bar is None or step == 1:
            self.close()
            self.bar = tqdm(total=total, initial=step, unit=self.unit, file=sys.stderr, leave=False)
        elif step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def print_result(result, as_json: bool, paths: list[str], said: list[str] = ()) -> int:
    """Warnings and the summary to stderr; stdout gets one JSON object, or one path per line.

    `said`: what the command already said on stderr before the job ran (--from-png's notes: fields of the PNG
    not used, a model that is not here); not printed again, but first in the JSON's `warnings`, since a script
    reading `--json` does not read stderr."""
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.summary, file=sys.stderr)
    if as_json:
        data = result.as_json()
        data["warnings"] = [*said, *(w for w in data["warnings"] if w not in said)]
        print(json.dumps(data))
    else:
        for path in paths:
            print(path)
    return 0
