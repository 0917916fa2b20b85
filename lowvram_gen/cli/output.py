"""What every generating command prints after its job: the result (paths or one JSON object); its progress on
stderr is the job's tqdm bar (jobs/console.py ProgressBar)."""

from __future__ import annotations

import json
import sys


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
