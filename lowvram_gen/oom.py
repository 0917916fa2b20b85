"""Out-of-memory: recognise it on every back end, and give memory back after it.

The known messages are named once here (ComfyUI's habit): CUDA's `torch.OutOfMemoryError`, and
the RuntimeErrors of cuBLAS/cuDNN, MPS, ROCm and the CPU allocator, which are not OOM subclasses.
"""

from __future__ import annotations

import gc

OOM_MESSAGES = (
    "out of memory",  # CUDA / ROCm ("CUDA out of memory", "HIP out of memory")
    "cublas_status_alloc_failed",  # cuBLAS handle/workspace allocation
    "cudnn_status_not_enough_workspace",
    "cudnn_status_alloc_failed",
    "mps backend out of memory",
    "defaultcpuallocator: can't allocate memory",  # CPU allocator
    "not enough memory",  # Windows CPU allocator: "[enforce fail at ...] not enough memory"
)


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, (RuntimeError, MemoryError)):
        text = str(exc).lower()
        return isinstance(exc, MemoryError) or any(m in text for m in OOM_MESSAGES)
    return False


def short_reason(exc: BaseException) -> str:
    """The first line of the error, for the attempt log (the traceback is not kept: it pins tensors)."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:160]


def free_memory(device_kind: str, baseline: int | None = None) -> None:
    """Call *after* the except block: only then are the failed frames (and their tensors) gone.

    Dropping the exception frees their tensors by reference counting; a young-generation
    collection catches short-lived cycles. A full `gc.collect()` costs ~0.3 s with diffusers and
    gradio loaded, so on an accelerator it runs only when memory is still above `baseline` (what
    was allocated before the failed attempt).
    """
    import torch

    gc.collect(1)
    if device_kind == "cuda" and torch.cuda.is_available():
        if baseline is None or torch.cuda.memory_allocated() > baseline:
            gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()
    elif device_kind == "mps" and hasattr(torch, "mps"):
        if baseline is None or torch.mps.current_allocated_memory() > baseline:
            gc.collect()
        torch.mps.empty_cache()


def allocated_bytes(device_kind: str) -> int:
    """Memory held by tensors now: the CUDA allocator's count, or this process' RSS on a CPU."""
    import torch

    if device_kind == "cuda" and torch.cuda.is_available():
        return torch.cuda.memory_allocated()
    if device_kind == "mps" and hasattr(torch, "mps"):
        return torch.mps.current_allocated_memory()
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            import os

            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
