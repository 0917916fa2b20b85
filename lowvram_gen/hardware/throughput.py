"""Measure a GPU's compute in a few seconds, as doctor measures its bus: half-precision matmul FLOP/s, and how
much slower a layer with int8 or int4 weights (sdnq, as the planner's +int8/+int4 candidates run) is than the
same layer in 16 bits.

The planner's step estimate is FLOPs over a throughput times a slowdown per weight storage
(planning/timing.py); these replace its stated constants for the measured card. Each figure is the median of a
few timed runs after an untimed warm-up (CUDA's context, cuBLAS's heuristics, sdnq's first dequantize), timed
with CUDA events on the current stream. The shapes are a diffusion model's: 4096 tokens (a 1024 px SDXL image's
64x64 latent) through a 1280 -> 5120 feed-forward projection, SDXL's widest.

torch is imported inside the functions (importing lowvram_gen stays light). The timer is a parameter so that
the tests run this same code on the CPU with a timer of their own.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

MATMUL_SIDE = 4096  # a 4096^3 matmul: 137 GFLOP, long enough to time on any card, short on all
TOKENS, IN_FEATURES, OUT_FEATURES = 4096, 1280, 5120
REPEATS = 7

Timed = Callable[[Callable[[], object]], float]  # run the function once; the seconds it took


@dataclass(frozen=True)
class Compute:
    half_flops_per_s: float
    slowdown: dict  # {"int8": x, "int4": y}: a quantized layer's time over the 16-bit one's
    dtype: str

    def as_dict(self) -> dict:
        return {"half_flops_per_s": self.half_flops_per_s, "slowdown": dict(self.slowdown), "dtype": self.dtype}


def cuda_timed(fn: Callable[[], object]) -> float:
    """Seconds `fn` took on the GPU, between two CUDA events on the current stream."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0  # milliseconds


def wall_timed(fn: Callable[[], object]) -> float:
    """Seconds `fn` took by the wall clock (a CPU: its kernels finish before they return)."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _median(fn: Callable[[], object], timed: Timed, repeats: int) -> float:
    timed(fn)  # warm-up, not counted
    seconds = statistics.median(timed(fn) for _ in range(repeats))
    if not seconds > 0:
        raise RuntimeError(f"a run was timed at {seconds} s")
    return seconds


def matmul_flops(device: str, dtype: str = "float16", side: int = MATMUL_SIDE, repeats: int = REPEATS,
                 timed: Timed = cuda_timed) -> float:
    """FLOP/s of a `side`-square matmul in `dtype` on `device`."""
    import torch

    a = torch.randn(side, side, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(side, side, device=device, dtype=getattr(torch, dtype))
    return 2 * side ** 3 / _median(lambda: a @ b, timed, repeats)


def quantized_slowdown(device: str, kinds: tuple[str, ...] = ("int8", "int4"), dtype: str = "float16",
                       shape: tuple[int, int, int] = (TOKENS, IN_FEATURES, OUT_FEATURES), repeats: int = REPEATS,
                       timed: Timed = cuda_timed) -> dict[str, float]:
    """For each kind, the time of a linear layer with `kind` weights (sdnq, as models/quantize.py makes them)
    over the same layer's in `dtype`, on the same input."""
    import torch

    from lowvram_gen.models.quantize import quantize_module

    tokens, fan_in, fan_out = shape
    torch_dtype = getattr(torch, dtype)
    layer = torch.nn.Sequential(torch.nn.Linear(fan_in, fan_out)).to(device, torch_dtype)
    x = torch.randn(tokens, fan_in, device=device, dtype=torch_dtype)
    with torch.inference_mode():
        base = _median(lambda: layer(x), timed, repeats)
        out = {}
        for kind in kinds:
            quantized = copy.deepcopy(layer)
            quantize_module(quantized, kind, device)
            out[kind] = _median(lambda q=quantized: q(x), timed, repeats) / base
            del quantized
    return out


def measure(device: str = "cuda", repeats: int = REPEATS, timed: Timed | None = None, dtype: str = "float16",
            side: int = MATMUL_SIDE, shape: tuple[int, int, int] = (TOKENS, IN_FEATURES, OUT_FEATURES)) -> Compute:
    """Half-precision matmul throughput and the int8/int4 slowdown of `device`. Without `timed` the device must
    be CUDA (the runs are timed with CUDA events)."""
    import torch

    if timed is None:
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            raise ValueError(f"compute is measured on an available CUDA device, not {device!r}")
        timed = cuda_timed
    flops = matmul_flops(device, dtype, side, repeats, timed)
    return Compute(flops, quantized_slowdown(device, dtype=dtype, shape=shape, repeats=repeats, timed=timed), dtype)
