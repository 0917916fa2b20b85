"""Counting what a leak would keep alive, for the out-of-memory cycle tests."""

from __future__ import annotations

import gc

import torch


def live_tensors() -> int:
    """Tensors reachable from Python now (after a full collection)."""
    gc.collect()
    # type(), not isinstance(): some lazily deprecated torch objects warn when asked for __class__
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))
