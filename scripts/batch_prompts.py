#!/usr/bin/env python3
"""Generate every prompt of a file: a thin wrapper over `lowvram-gen batch FILE ...`.

    python scripts/batch_prompts.py prompts.txt --steps 25 --lowvram
    accelerate launch --multi_gpu --num_processes 4 scripts/batch_prompts.py prompts.jsonl

Every option of `lowvram-gen batch` works here (`--help` lists them); `-v` logs what the memory
layer does. Runs from a checkout without installing the package. A line with `video: true` (or a
`frames` field) makes a clip on a video model (docs/api-video.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lowvram_gen.cli.main import main  # noqa: E402 - after the path fix-up


def run(argv: list[str]) -> int:
    front = [a for a in argv if a in ("-v", "--verbose")]
    rest = [a for a in argv if a not in ("-v", "--verbose")]
    return main([*front, "batch", *rest])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
