"""The 16-bit dtype a checkpoint stores its weights in, read from a safetensors header (a few KB, no weights).

Half storage (settings.half_storage) loads the weights at the dtype their file has, so that they stay
memory-mapped from it: float16 for the SD 1.x/2.x and SDXL checkpoints, bfloat16 for FLUX.1 and others.
"""

from __future__ import annotations

import struct
from pathlib import Path

from lowvram_gen import safe_json

_HALF = {"F16": "float16", "BF16": "bfloat16"}


def header_dtypes(path: Path) -> dict[str, int]:
    """safetensors dtype name -> tensor count in the file's header; {} when it is not a readable safetensors."""
    try:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size <= 0 or size > 100 * 1024 * 1024:
                return {}
            header = safe_json.loads(fh.read(size), max_bytes=size)  # BadJson (too deep, ...) is a ValueError
    except (OSError, ValueError, struct.error):
        return {}
    if not isinstance(header, dict):
        return {}
    counts: dict[str, int] = {}
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            counts[info.get("dtype", "")] = counts.get(info.get("dtype", ""), 0) + 1
    return counts


def half_dtype(path, denoiser_dirs=("unet", "transformer")) -> str:
    """'bfloat16' when the model's denoiser file (a folder's, or a single file) stores mostly bf16, else 'float16'."""
    path = Path(path)
    files = [path] if path.is_file() else [f for d in denoiser_dirs for f in sorted((path / d).glob("*.safetensors"))]
    for f in files:
        counts = header_dtypes(f)
        if counts:
            return _HALF["BF16"] if counts.get("BF16", 0) > counts.get("F16", 0) else _HALF["F16"]
    return _HALF["F16"]
