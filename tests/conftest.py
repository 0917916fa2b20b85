"""Shared fixtures: an isolated user cache (the tiny models are built once per run), no network."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory):
    """Every test run gets its own LOWVRAM_GEN_HOME and HF cache; the hub is never contacted."""
    home = tmp_path_factory.mktemp("lowvram-home")
    saved = {k: os.environ.get(k) for k in ("LOWVRAM_GEN_HOME", "HF_HOME", "HF_HUB_OFFLINE")}
    os.environ["LOWVRAM_GEN_HOME"] = str(home)
    # the cpu preset's plans must not depend on the CPU the suite runs on (AVX512-BF16 adds cpu+bf16): the
    # bfloat16 tests say which CPU they simulate
    saved["LOWVRAM_GEN_CPU_BF16"] = os.environ.get("LOWVRAM_GEN_CPU_BF16")
    os.environ["LOWVRAM_GEN_CPU_BF16"] = "0"
    os.environ["HF_HOME"] = str(home / "hf")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield home
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def fresh_failures(isolated_home):
    """Remembered OOM failures must not leak from one test into the next."""
    from lowvram_gen import failures

    failures.forget()
    yield


@pytest.fixture(autouse=True)
def fresh_measurements(isolated_home):
    """A bus bandwidth stored by one test (or by doctor on a CUDA machine), or step times measured by one test's
    jobs (planning/speed.py), must not change another's plans."""
    paths = [isolated_home / name for name in ("bus.json", "timings.json")]
    for path in paths:
        path.unlink(missing_ok=True)
    yield
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def tiny_path(isolated_home):
    from lowvram_gen.models.tiny import ensure_tiny

    return ensure_tiny("tiny")


@pytest.fixture(scope="session")
def tiny_sdxl_path(isolated_home):
    from lowvram_gen.models.tiny import ensure_tiny

    return ensure_tiny("tiny-sdxl")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def batch_script():
    """scripts/batch_prompts.py as a module (it is a script, not part of the package): `.run(argv)`."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "batch_prompts.py"
    spec = importlib.util.spec_from_file_location("batch_prompts", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture()
def unet_passes(monkeypatch):
    """The UNet's calls of each SD-family pass a job runs, as the list of timesteps it was given (a forward pre-hook
    on the pipeline's UNet around `engines.sd.pipeline.denoise`): the sampler tests count A1111's model calls."""
    from lowvram_gen.engines.sd import pipeline as sd_pipeline

    seen = []
    real = sd_pipeline.denoise

    def watch(pipe, step, *args, **kwargs):
        ts = []
        handle = pipe.unet.register_forward_pre_hook(
            lambda module, positional, named: ts.append(float((positional[1] if len(positional) > 1
                                                               else named["timestep"]).flatten()[0])),
            with_kwargs=True)
        try:
            return real(pipe, step, *args, **kwargs)
        finally:
            handle.remove()
            seen.append(ts)

    monkeypatch.setattr(sd_pipeline, "denoise", watch)
    return seen


@pytest.fixture
def unet_calls(monkeypatch) -> list:
    """Every UNet call of the app's jobs (and of plain diffusers' references), counted at the class."""
    from diffusers import UNet2DConditionModel

    calls, forward = [], UNet2DConditionModel.forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "forward", counted)
    return calls


@pytest.fixture()
def posterior_mode(monkeypatch):
    """Plain diffusers references for img2img/inpaint encode the init image as A1111 (and the app) do: the VAE
    posterior's mode, no draw from the images' generators, so the seed's first draw is its noise. A reference-side
    patch of diffusers' posterior class for the test; the app sets it per call on its VAE (engines/sd/posterior.py)."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    monkeypatch.setattr(DiagonalGaussianDistribution, "sample", lambda self, generator=None: self.mode())
