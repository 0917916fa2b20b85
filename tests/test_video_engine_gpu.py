"""The video engine on a CUDA card (skipped without one): Wan 2.2 A14B's two experts are never both on the device under
each offload (none, model, budget, group), as their weights' devices show at every denoiser forward, and the clip is
plain diffusers' on the same card at float32 (--no-half).

Not run on the CPU machines the suite runs on; a check for a GPU session (a few seconds on one card).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_video import plain_pipeline, save, saved_frames

from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session
from lowvram_gen.settings import Precision

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA card")
TOLERANCE = 2
SEED = 11


@pytest.fixture(scope="module")
def a14b(tmp_path_factory) -> str:
    return str(save("wan22-a14b", tmp_path_factory.mktemp("tiny-a14b") / "wan22-a14b"))


@pytest.fixture(scope="module")
def plain(a14b):
    pipe = plain_pipeline(a14b).to("cuda")
    video = pipe(prompt="a heron", negative_prompt="", num_frames=9, width=64, height=64, num_inference_steps=2,
                 guidance_scale=4.0, guidance_scale_2=3.0, generator=torch.Generator("cuda").manual_seed(SEED),
                 output_type="np").frames[0]
    del pipe
    torch.cuda.empty_cache()
    return (np.clip(video, 0, 1) * 255).round().astype(np.uint8)


@pytest.mark.parametrize("preset", ["highvram", "medvram", "budget", "lowvram"])
def test_one_expert_on_the_card_at_a_time(preset, a14b, plain, tmp_path):
    session = Session(preset=preset, precision=Precision(full=True))
    result = session.generate(GenerationRequest(prompt="a heron", model=a14b, frames=9, width=64, height=64, steps=2,
                                                seed=SEED, cfg_scale=4.0, outdir=str(tmp_path), save_frames=True))
    experts = session.runner.experts
    assert [name for name, _ in experts.record] == ["transformer"] * 2 + ["transformer_2"] * 2
    assert all(len(on) <= 1 and set(on) <= {name} for name, on in experts.record), experts.record
    assert len(experts.swaps) <= 1
    assert np.abs(saved_frames(result.frames).astype(int) - plain.astype(int)).max() <= TOLERANCE
