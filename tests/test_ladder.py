"""The retry ladder under simulated out-of-memory.

There is no GPU here, so OOM is simulated: forward pre-hooks on the tiny model's UNet or VAE
decoder raise `torch.OutOfMemoryError` (the exception CUDA raises) under the conditions each test
names. Everything else is real: the GPU presets are applied to the loaded pipeline on the CPU
(offload hooks included), weights are never reloaded, and the images are really decoded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leaks import live_tensors  # tests/leaks.py
from lowvram_gen import failures
from lowvram_gen.hardware.device import probe
from lowvram_gen.errors import OutOfMemoryEverywhere
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.oom import allocated_bytes
from lowvram_gen.presets import gpu_ladder, load_presets
from lowvram_gen.engines.sd.stepdown import Runner
from lowvram_gen.request import GenerationRequest


@pytest.fixture()
def model(tiny_path):
    return load(resolve("tiny"), "float32")


@pytest.fixture()
def ladder():
    return gpu_ladder(load_presets())


class UnetCounter:
    def __init__(self):
        self.calls = 0
        self.batches = []


def run(runner, ladder, seeds, size=(64, 64), steps=3):
    done = []
    request = GenerationRequest(prompt="a boat", width=size[0], height=size[1], steps=steps, batch_size=len(seeds))
    report = runner.run(request, seeds, ladder, done.append)
    return report, done


def oom_when(module, condition, counter=None, allocate_mb=0):
    """Make `module` raise OutOfMemoryError whenever `condition(input)` holds."""

    def hook(_module, args, kwargs):
        sample = args[0] if args else next(iter(kwargs.values()))
        if counter is not None:
            counter.calls += 1
            counter.batches.append(sample.shape[0])
        if condition(sample):
            # ones, not empty: untouched pages never reach the RSS that the CPU leak test measures
            waste = torch.ones(allocate_mb * 2**20, dtype=torch.uint8) if allocate_mb else None  # noqa: F841
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def test_oom_at_top_preset_finishes_at_the_next(model, ladder):
    runner = Runner(model, probe("cpu"))
    # simulated: the first preset (highvram: no offload) runs out of memory in every UNet call
    oom_when(model.pipe.unet, lambda s: runner.applied.offload == "none")
    weights_before = model.pipe.unet.conv_in.weight
    report, done = run(runner, ladder, [1])
    assert report.preset_name == "medvram"
    assert [(a.preset, a.stage, a.outcome) for a in report.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok"), ("medvram", "decode", "ok")]
    assert done[0].images[0].size == (64, 64)
    assert model.pipe.unet.conv_in.weight is weights_before  # reconfigured, not reloaded
    assert "out of memory at highvram" in report.summary(1.0, (64, 64), (64, 64)) and "finished at medvram" in report.summary(1.0, (64, 64), (64, 64))


def test_result_after_recovery_equals_a_job_started_at_that_preset(model, ladder, tiny_path):
    runner = Runner(model, probe("cpu"))
    handle = oom_when(model.pipe.unet, lambda s: runner.applied.offload == "none")
    _, recovered = run(runner, ladder, [42])
    handle.remove()
    fresh = Runner(load(resolve("tiny"), "float32"), probe("cpu"))
    _, direct = run(fresh, ladder[1:], [42])
    a, b = (np.asarray(d[0].images[0], dtype=int) for d in (recovered, direct))
    assert np.abs(a - b).max() <= 1


def test_oom_in_decode_retries_only_the_decode_tiled(model, ladder):
    runner = Runner(model, probe("cpu"))
    unet = UnetCounter()
    oom_when(model.pipe.unet, lambda s: False, counter=unet)
    # simulated: the untiled VAE decode runs out of memory; tiles fit
    oom_when(model.pipe.vae.decoder, lambda s: not model.pipe.vae.use_tiling)
    report, done = run(runner, ladder, [1], size=(64, 64), steps=4)
    steps_run = len(model.pipe.scheduler.timesteps)
    assert unet.calls == steps_run  # the UNet ran once per step: denoising was not redone
    assert [(a.stage, a.outcome) for a in report.attempts] == [("denoise", "ok"), ("decode", "oom"), ("decode", "ok")]
    assert report.preset_name == "highvram" and model.pipe.vae.use_tiling
    assert done[0].images[0].size == (64, 64)


def test_batch_of_four_is_split_before_changing_preset(model, ladder):
    runner = Runner(model, probe("cpu"))
    counter = UnetCounter()
    # simulated: more than 2 images per pass (4 with CFG) do not fit at any preset
    oom_when(model.pipe.unet, lambda s: s.shape[0] > 4, counter=counter)
    report, done = run(runner, ladder, [1, 2, 3, 4])
    ooms = [a for a in report.attempts if a.outcome == "oom"]
    assert [(a.preset, a.batch) for a in ooms] == [("highvram", 4)]
    assert report.preset_name == "highvram"
    assert [d.seeds for d in done] == [[1, 2], [3, 4]]
    assert sum(len(d.images) for d in done) == 4


def test_oom_at_every_preset_gives_one_clear_error_and_the_next_job_works(model, ladder):
    runner = Runner(model, probe("cpu"))
    handle = oom_when(model.pipe.unet, lambda s: True)
    with pytest.raises(OutOfMemoryEverywhere) as err:
        run(runner, ladder, [1, 2])
    message = str(err.value)
    for name in ("highvram", "medvram", "lowvram", "novram"):
        assert name in message
    assert "--cpu" in message and "smaller size" in message
    tried = [(a.preset, a.batch, a.width) for a in err.value.attempts]
    assert tried[0] == ("highvram", 2, 64) and ("novram", 1, 64) in tried
    assert any(w < 64 for _, _, w in tried) or tried[-1][0] == "novram"  # resolution steps come last
    handle.remove()
    report, done = run(runner, ladder, [3])  # same runner, same weights: the process is healthy
    assert done and done[0].images[0].size == (64, 64)


def test_resolution_is_lowered_last_and_upscaled_to_the_request(model, ladder):
    runner = Runner(model, probe("cpu"))
    # simulated: a 128x128 latent pass (1024 px) never fits; 64x64 px fits everywhere
    oom_when(model.pipe.unet, lambda s: s.shape[-1] * 8 > 96)
    report, done = run(runner, ladder, [1], size=(128, 128), steps=2)
    assert report.preset_name == "novram"
    assert done[-1].generated_size[0] < 128  # generated smaller, upscaled to the request
    assert done[0].images[0].size == (128, 128)


@pytest.mark.slow
def test_thirty_oom_cycles_do_not_leak(model, ladder):
    runner = Runner(model, probe("cpu"))
    # simulated: every first-preset UNet call allocates 32 MB, then runs out of memory
    oom_when(model.pipe.unet, lambda s: runner.applied.offload == "none", allocate_mb=32)
    run(runner, ladder[:2], [1])  # warm-up: allocator pools, hooks, caches
    baseline, tensors = allocated_bytes("cpu"), live_tensors()
    for i in range(30):
        runner.use(ladder[0].memory)
        run(runner, ladder[:2], [i])
    growth = allocated_bytes("cpu") - baseline
    assert growth < 200 * 2**20, f"memory grew by {growth / 2**20:.0f} MB over 30 OOM cycles"  # a leak would be ~1 GB
    # RSS misses small leaks (a kept latent is a few kB): no tensor may outlive its cycle either
    assert live_tensors() - tensors < 20, f"{live_tensors() - tensors} more live tensors after 30 OOM cycles"


def test_failures_are_remembered_per_device_and_model(tmp_path):
    failures.record("GPU X", "sd15", "highvram", 512 * 512, 2)
    assert failures.failed_presets("GPU X", "sd15", 512 * 512, 2) == {"highvram"}
    assert failures.failed_presets("GPU X", "sd15", 1024 * 1024, 1) == {"highvram"}  # bigger job: also skip
    assert failures.failed_presets("GPU X", "sd15", 256 * 256, 1) == set()  # smaller job may fit
    assert failures.failed_presets("GPU Y", "sd15", 512 * 512, 2) == set()
    assert failures.forget() == 1 and failures.load() == []


def test_session_reports_attempts_in_result_metadata_and_forgets_cpu_failures(tmp_path):
    from lowvram_gen import GenerationRequest
    from lowvram_gen.outputs import read_png_metadata
    from lowvram_gen.session import Session

    session = Session(preset="highvram")  # the GPU ladder, run on this CPU
    session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=1, outdir=str(tmp_path)))
    # simulated: highvram (no offload) runs out of memory on every UNet call from now on
    session.model.pipe.unet.register_forward_pre_hook(
        lambda m, a: _raise_oom() if session.runner.applied.offload == "none" else None)
    result = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=3,
                                                outdir=str(tmp_path)))
    assert result.preset == "medvram"
    assert [(a["preset"], a["outcome"]) for a in result.attempts][:2] == [("highvram", "oom"), ("medvram", "ok")]
    assert "out of memory at highvram" in result.summary
    _, meta = read_png_metadata(result.images[0])
    assert meta["preset"] == "medvram" and meta["attempts"][0]["outcome"] == "oom"
    assert failures.load() == []  # a CPU's out-of-memory says nothing about a GPU: never remembered


def test_session_remembers_out_of_memory_on_a_gpu_only():
    from lowvram_gen.hardware.device import fake
    from lowvram_gen.ladder import Ladder
    from lowvram_gen.session import Session

    ladder = Ladder(gpu_ladder(load_presets()), "cuda")
    ladder.record("denoise", "oom", 0.0, "simulated", batch=2, width=64, height=64)
    ladder.record("denoise", "ok", 0.0, batch=2, width=64, height=64)
    Session()._remember(probe("cpu"), "tiny", ladder)
    assert failures.load() == []
    Session()._remember(fake(8), "tiny", ladder)
    assert [(r["preset"], r["model"], r["pixels"], r["batch"]) for r in failures.load()] == [
        ("highvram", "tiny", 64 * 64, 2)]


def _raise_oom():
    raise torch.OutOfMemoryError("CUDA out of memory (simulated)")


def test_nan_decode_in_half_precision_is_retried_in_float32_and_float32_nan_is_an_error(model, ladder):
    from dataclasses import replace

    from lowvram_gen.errors import BadOutput

    runner = Runner(model, probe("cpu"))
    half = replace(ladder[0], memory=replace(ladder[0].memory, dtype="bfloat16"))  # bfloat16 runs on a CPU
    # simulated: the half-precision VAE decoder overflows to NaN, as SD VAEs do in float16
    model.pipe.vae.decoder.register_forward_hook(
        lambda m, a, out: out * float("nan") if out.dtype != torch.float32 else out)
    report, done = run(runner, [half], [1])
    assert [(a.stage, a.outcome) for a in report.attempts] == [("denoise", "ok"), ("decode", "nan"), ("decode", "ok")]
    assert np.isfinite(np.asarray(done[0].images[0], dtype=float)).all()
    assert model.pipe.vae.dtype == torch.bfloat16  # the upcast was for that decode only
    model.pipe.vae.decoder.register_forward_hook(lambda m, a, out: out * float("nan"))
    with pytest.raises(BadOutput, match="NaN"):
        run(runner, [half], [1])


def test_oom_at_a_quantized_candidate_steps_down_the_same_list_and_finishes(tmp_path):
    """quantize = int8 through the request (as --quantize / a batch line / the UI set it): simulated
    out-of-memory on every UNet call without offload; the job finishes at the next rung, still int8
    (the ladder keeps the weights' storage: no reload), and the PNG says so."""
    from lowvram_gen import GenerationRequest
    from lowvram_gen.models.quantize import is_quantized
    from lowvram_gen.outputs import read_png_metadata
    from lowvram_gen.session import Session

    session = Session(preset="highvram")  # the GPU ladder, run on this CPU
    request = dict(prompt="x", width=64, height=64, steps=2, seed=3, outdir=str(tmp_path), quantize="int8")
    session.generate(GenerationRequest(**{**request, "steps": 1}))
    unet = session.model.pipe.unet
    assert any(is_quantized(m) for m in unet.modules())
    unet.register_forward_pre_hook(lambda m, a: _raise_oom() if session.runner.applied.offload == "none" else None)
    result = session.generate(GenerationRequest(**request))
    assert [(a["preset"], a["outcome"]) for a in result.attempts][:2] == [("highvram", "oom"), ("medvram", "ok")]
    assert session.runner.applied.quantize == "int8" and session.model.pipe.unet is unet  # not reloaded
    assert "Quantize: int8" in read_png_metadata(result.images[0])[0]


def test_oom_while_placing_the_first_presets_weights_steps_down_and_finishes(model, ladder, monkeypatch):
    """Simulated: moving highvram's weights onto the device runs out of memory (seen for real on an H100 with
    `--preset highvram --vram-budget 1536MiB` and a real-size SD 1.5, where it crashed before this guard). The job
    goes on at the next preset, with the weights it already had."""
    from lowvram_gen.engines.sd import apply as apply_mod

    real = apply_mod.apply_settings
    placed = []

    def apply_settings(pipe, settings, *args, **kwargs):
        placed.append(settings.offload)
        if settings.offload == "none":
            model.pipe.unet.to(torch.float32)  # part of the move happened, as a real one that fails midway
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 58.00 MiB (simulated)")
        return real(pipe, settings, *args, **kwargs)

    monkeypatch.setattr(apply_mod, "apply_settings", apply_settings)
    weights_before = model.pipe.unet.conv_in.weight
    runner = Runner(model, probe("cpu"))
    report, done = run(runner, ladder, [5])
    assert [(a.preset, a.stage, a.outcome) for a in report.attempts] == [
        ("highvram", "place", "oom"), ("medvram", "denoise", "ok"), ("medvram", "decode", "ok")]
    assert placed[:2] == ["none", "model"] and report.preset_name == "medvram"
    assert done[0].images[0].size == (64, 64)
    assert model.pipe.unet.conv_in.weight is weights_before  # reconfigured, not reloaded


def test_oom_placing_every_preset_is_one_clear_error(model, ladder, monkeypatch):
    """Simulated: no preset's weights can be placed at all; the error lists every rung, nothing crashes."""
    from lowvram_gen.engines.sd import apply as apply_mod

    def apply_settings(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(apply_mod, "apply_settings", apply_settings)
    with pytest.raises(OutOfMemoryEverywhere) as err:
        run(Runner(model, probe("cpu")), ladder, [1])
    assert [a.stage for a in err.value.attempts] == ["place"] * len(ladder)
    assert "novram (place, weights" in str(err.value)
