"""docs/FAULTS.md 18 for VQGAN-CLIP: many out-of-memory-and-resume cycles in one process do not leak.

The Stable Diffusion counterpart is `test_thirty_oom_cycles_do_not_leak` in test_ladder.py.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from leaks import live_tensors  # tests/leaks.py
from lowvram_gen.engines.vqgan.request import VqganRequest
from lowvram_gen.oom import allocated_bytes
from lowvram_gen.presets import Preset, VqganKnobs
from lowvram_gen.settings import MemorySettings

CYCLES = 20
WASTE_MB = 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """As in test_vqgan.py: tiny models gain nothing from a second thread on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def preset(name: str, rank: int, **knobs) -> Preset:
    return Preset(name=name, rank=rank, device="gpu", description="", memory=MemorySettings(), max_pixels=2**22,
                  max_batch=1, vqgan=VqganKnobs(**{"clip_autocast": False, **knobs}))


@pytest.mark.slow
def test_many_vqgan_oom_cycles_do_not_leak(tmp_path):
    """Simulated: a card on which CLIP's vision tower runs out of memory when it is given more than
    two cutouts at once. Each job starts at "big" (4 cutouts per CLIP call); at iteration 1, 2 or 3
    (in turn) the call allocates and touches 32 MB, then raises `torch.OutOfMemoryError` as CUDA
    would. The loop leaves the except block, frees memory, steps down to "small" (2 cutouts per
    call, decoder checkpointing, text tower offloaded) and resumes from the same latent.

    After a warm-up job, `CYCLES` more such jobs run in the same session. Live torch tensors must not
    grow (a kept exception, traceback, frame, optimiser or latent would pin tensors at every cycle,
    and its 32 MB with them), nor the process RSS (the measure of the SD test), and every job must
    finish with its image.
    """
    from lowvram_gen.session import Session

    session = Session(device="cpu", outdir=str(tmp_path))
    ladder = [preset("big", 0, cutn_chunk=4),
              preset("small", 1, cutn_chunk=2, gradient_checkpointing=True, clip_text_offload=True)]
    request = VqganRequest(prompt="a red fox|blurry:-0.5", width=64, height=64, cutn=4, iterations=3,
                           save_every=0, seed=1, outdir=str(tmp_path))
    models = session.vqgan_models(request)
    big_calls, oom_at = [0], [1]

    def hook(_module, args, kwargs):
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        if pixels.shape[0] > 2:
            big_calls[0] += 1
            if big_calls[0] == oom_at[0]:
                waste = torch.ones(WASTE_MB * 2**20, dtype=torch.uint8)  # noqa: F841 - touched pages, held by the frame
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = models.clip.model.vision_model.register_forward_pre_hook(hook, with_kwargs=True)

    def job(i: int):
        big_calls[0], oom_at[0] = 0, 1 + i % request.iterations
        result = session.generate_vqgan(request, presets=ladder)
        tried = [(a["preset"], a["outcome"], a["iteration"]) for a in result.attempts]
        assert tried == [("big", "oom", oom_at[0]), ("small", "ok", request.iterations)], f"job {i}: {tried}"
        assert len(result.images) == 1 and Image.open(result.images[0]).size == (64, 64), f"job {i}"
        assert "resumed without starting over" in result.summary

    try:
        job(0)  # warm-up: allocator pools, autograd and checkpointing caches, the failure memory file
        tensors, rss = live_tensors(), allocated_bytes("cpu")
        for i in range(1, CYCLES + 1):
            job(i)
        tensor_growth, rss_growth = live_tensors() - tensors, allocated_bytes("cpu") - rss
    finally:
        handle.remove()
    assert tensor_growth < CYCLES, f"{tensor_growth} more live tensors after {CYCLES} OOM cycles"
    leak = CYCLES * WASTE_MB * 2**20  # what keeping the failed frames alone would pin
    assert rss_growth < leak / 4, f"RSS grew by {rss_growth / 2**20:.0f} MB over {CYCLES} OOM cycles"
