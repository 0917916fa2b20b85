"""Measure host-to-device copy bandwidth on CUDA: the rate at which streamed weights cross the bus.

Done as CUDA's bandwidthTest and practitioners do it: one host buffer (256 MiB), one warm-up copy
(it pays for the CUDA context, the caching allocator's first block and first-touch page faults), then
a few timed `tensor.to(device, non_blocking=True)` copies, each between two CUDA events on the current
stream; the median copy gives bytes per second (a median, so that one copy slowed by another program
does not move it).

Pinned (page-locked) host memory is the number the planner wants: diffusers' group offloading pins
the CPU copies of the weights it streams when it prefetches on a CUDA stream, which is how the budget,
lowvram and novram presets run. Pageable memory is measured too (a few hundred milliseconds more):
copies from it go through a staging buffer and are often half as fast; model offload (medvram) moves
whole models from pageable memory.

torch is imported inside the functions (importing lowvram_gen stays light). The copy is a parameter so
that the tests run this same code on a machine without CUDA with a copy they time themselves.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from lowvram_gen.hardware.device import MiB

COPY_BYTES = 256 * MiB
MIN_COPY_BYTES = 32 * MiB  # below this a copy is latency-bound: it would understate the bus
REPEATS = 5

TimedCopy = Callable[[object, object], float]  # (host tensor, device) -> seconds the copy took


@dataclass(frozen=True)
class Bandwidth:
    pinned_bytes_per_s: float
    pageable_bytes_per_s: float | None  # None: not measured
    copy_bytes: int
    repeats: int

    def as_dict(self) -> dict:
        return {"pinned_bytes_per_s": self.pinned_bytes_per_s, "pageable_bytes_per_s": self.pageable_bytes_per_s,
                "copy_bytes": self.copy_bytes, "repeats": self.repeats}


def cuda_timed_copy(host, device) -> float:
    """Seconds one host-to-device copy of `host` took on the GPU, timed with CUDA events around it."""
    import torch

    stream = torch.cuda.current_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    copy = host.to(device, non_blocking=True)
    end.record(stream)
    end.synchronize()
    del copy
    return start.elapsed_time(end) / 1000.0  # milliseconds


def copy_rate(host, device, repeats: int = REPEATS, timed_copy: TimedCopy = cuda_timed_copy) -> float:
    """Bytes per second of copies of `host` to `device`: the median of `repeats` timed copies after one
    untimed warm-up."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    timed_copy(host, device)  # warm-up, not counted
    seconds = statistics.median(timed_copy(host, device) for _ in range(repeats))
    if not seconds > 0:
        raise RuntimeError(f"a {host.numel() * host.element_size()} byte copy was timed at {seconds} s")
    return host.numel() * host.element_size() / seconds


def measure(device="cuda", nbytes: int = COPY_BYTES, repeats: int = REPEATS, pageable: bool = True,
            timed_copy: TimedCopy | None = None) -> Bandwidth:
    """Host-to-device bandwidth to `device` from pinned memory (and from pageable memory with `pageable`).

    Without `timed_copy` the device must be CUDA (the copy is timed with CUDA events); with one, any
    device is taken and the host buffer is pinned only where a CUDA driver is there to pin it.
    """
    import torch

    target = torch.device(device)
    on_cuda = target.type == "cuda" and torch.cuda.is_available()
    if on_cuda and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    if timed_copy is None:
        if not on_cuda:
            raise ValueError(f"host-to-device bandwidth is measured on an available CUDA device, not {device!r}")
        timed_copy = cuda_timed_copy
    if nbytes < 1:
        raise ValueError(f"the copy size must be at least 1 byte, got {nbytes}")

    def rate(pinned: bool) -> float:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        host.fill_(1)  # real pages, as a model's weights are
        return copy_rate(host, target, repeats, timed_copy)

    pinned = rate(on_cuda)
    return Bandwidth(pinned, rate(False) if pageable else None, nbytes, repeats)
