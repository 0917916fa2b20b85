"""Test utility: the out-of-memory check every transformer family's tiny folder goes through (the GPU ladder run on
this CPU, an out-of-memory simulated in the denoiser), shared by tests/test_transformer_pipelines.py (SD3, FLUX.1)
and the issue-30 families' tests (tests/test_family_*.py)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from tiny_transformers import pixels

from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session


def out_of_memory_steps_down(make_request: Callable[..., GenerationRequest]):
    """One job at highvram whose transformer runs out of memory in every step there: it must finish at medvram, on
    the same transformer object (reconfigured, not reloaded), with the pixels of the job run without the fault.
    `make_request(**overrides)` gives the family's request. Returns the result for the caller's own checks."""
    session = Session(preset="highvram")
    session.generate(make_request(steps=1))
    transformer = session.model.pipe.transformer

    def oom(_module, _args, _kwargs):  # simulated: highvram (no offload) runs out of memory in every step
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = transformer.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        result = session.generate(make_request(seed=3))
    finally:
        handle.remove()
    assert result.preset == "medvram"
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert session.model.pipe.transformer is transformer  # reconfigured, not reloaded
    plain = Session().generate(make_request(seed=3))
    assert np.abs(pixels(result.images[0]) - pixels(plain.images[0])).max() <= 1  # the retry is the same job
    return result
