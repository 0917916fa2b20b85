"""The reference of tests/ksampling_ref.py is the app's Euler and Euler a (issue 31): a job through the app equals
the published algorithm run around plain diffusers' UNet with A1111's levels and noise, on the tiny SD 1.x and SDXL
models. The sampler tests of issue 31 build on this reference, so it is checked here first."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import sigmas as a1111_sigmas
from lowvram_gen.session import Session

import ksampling_ref as ref


@pytest.fixture(scope="module")
def session():
    return Session()


def pipeline(folder):
    from diffusers import AutoPipelineForText2Image

    return AutoPipelineForText2Image.from_pretrained(str(folder))


def levels(pipe, kind: str, steps: int) -> list[float]:
    return a1111_sigmas.a1111(kind, steps, pipe.scheduler.alphas_cumprod.double().numpy())


def made(session, tmp_path, folder, **fields) -> list[np.ndarray]:
    result = session.generate(GenerationRequest(prompt="a lighthouse", model=str(folder), outdir=str(tmp_path),
                                                width=64, height=64, cfg_scale=7.0, **fields))
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in result.images]


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
@pytest.mark.parametrize("sampler, schedule, algorithm", [("Euler", "automatic", ref.euler),
                                                           ("Euler", "karras", ref.euler),
                                                           ("Euler a", "automatic", ref.euler_ancestral)])
def test_the_apps_euler_samplers_equal_the_published_algorithm(session, tmp_path, request, model, sampler,
                                                                schedule, algorithm):
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    steps = 4
    kind = "uniform" if schedule == "automatic" else schedule
    want, calls = ref.txt2img(pipe, algorithm, levels(pipe, kind, steps), [5, 6], "a lighthouse")
    got = made(session, tmp_path, folder, sampler=sampler, schedule_type=schedule, steps=steps, seed=5,
               batch_size=2)
    assert calls == steps
    for ours, theirs in zip(got, want):
        assert np.abs(ours - theirs).max() <= 2
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images: the comparison can fail
