"""Cost of the NaN/Inf checks on quantized weights (docs/FAULTS.md 6), on real-size layers, one CPU thread.

- GGUF (models/gguf_file.check_finite_blocks): one 1280x5120 tensor per block type, checked by reading
  the float16 scale bytes, against the alternative of dequantizing it (diffusers' dequantize_gguf_tensor)
  and calling isfinite. Q8_0/Q4_0 are quantized by gguf from random weights; gguf-py cannot make K types,
  so those are random blocks with finite scales (the check reads the same bytes either way).
- sdnq (models/quantize.check_scales): 8 Linear(5120 -> 1280) layers quantized to int8, the check
  against the quantization itself.

Run: python benchmarks/bench_nan_checks.py (prints one line per case; best of 7 / of 3 for dequantizing).
"""

from __future__ import annotations

import os
import time


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def gguf_cases() -> None:
    import gguf
    import numpy as np
    import torch
    from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor

    from lowvram_gen.models.gguf_file import F16_FIELDS, check_finite_blocks

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((1280, 5120), dtype=np.float32)
    for name in ("Q8_0", "Q4_0", "Q4_K", "Q6_K"):
        qtype = getattr(gguf.GGMLQuantizationType, name)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if name in ("Q8_0", "Q4_0"):
            raw = gguf.quants.quantize(weights, qtype)
        else:
            raw = rng.integers(0, 256, (1280, 5120 // block * size), dtype=np.uint8)
            for offset in F16_FIELDS[name]:
                raw.reshape(-1, size)[:, offset:offset + 2] = np.array([0.01], dtype=np.float16).view(np.uint8)
        param = GGUFParameter(torch.from_numpy(raw), quant_type=qtype)
        check = _best(lambda: check_finite_blocks({"w": param}, "x.gguf"), 7)
        full = _best(lambda: bool(torch.isfinite(dequantize_gguf_tensor(param)).all()), 3)
        print(f"gguf {name} 1280x5120 ({param.numel() / 2**20:.2f} MiB stored): scale check {check:.2f} ms, "
              f"dequantize + isfinite {full:.1f} ms")


def sdnq_case() -> None:
    os.environ.setdefault("SDNQ_USE_TORCH_COMPILE", "0")
    import torch

    from lowvram_gen.models.quantize import check_scales, quantize_module

    module = torch.nn.Sequential(*[torch.nn.Linear(5120, 1280) for _ in range(8)])
    start = time.perf_counter()
    quantize_module(module, "int8")  # includes one check_scales
    quantize = (time.perf_counter() - start) * 1e3
    check = _best(lambda: check_scales(module, "int8"), 7)
    print(f"sdnq int8 8 x Linear(5120->1280): quantize {quantize:.0f} ms, scale check {check:.2f} ms")


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    gguf_cases()
    sdnq_case()
