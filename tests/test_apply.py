"""Memory settings on a loaded pipeline: which calls each preset makes, and that they really run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.hardware.device import fake, probe
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.presets import load_presets
from lowvram_gen.settings import MemorySettings


class RecordingOps(apply_mod.PipelineOps):
    """Records the calls a plan makes instead of making them (a CUDA device is not there)."""

    def __init__(self, pipe):
        super().__init__(pipe)
        self.log = []

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name in ("reset", "cast", "fp8_storage", "place", "model_offload", "group_offload", "attention_slicing",
                    "xformers", "vae_slicing", "vae_tiling"):
            log = object.__getattribute__(self, "log")
            return lambda *a, **k: log.append((name, a, k))
        return attr


@pytest.fixture()
def model(tiny_path):
    return load(resolve("tiny"), "float32")


EXPECTED_CUDA_CALLS = {
    "highvram": ["reset", "cast", "place"],
    "medvram": ["reset", "cast", "model_offload", "vae_slicing"],
    "lowvram": ["reset", "cast", "group_offload", "vae_slicing", "vae_tiling"],
    "novram": ["reset", "cast", "fp8_storage", "group_offload", "vae_slicing", "vae_tiling"],
}


@pytest.mark.parametrize("name", list(EXPECTED_CUDA_CALLS))
def test_each_gpu_preset_makes_exactly_its_calls_on_cuda(name, model):
    preset = load_presets()[name]
    ops = RecordingOps(model.pipe)
    applied = apply_mod.apply_settings(model.pipe, preset.memory, fake(8), ops)
    assert [c[0] for c in ops.log] == EXPECTED_CUDA_CALLS[name]
    assert applied.skipped == []  # nothing is skipped on a CUDA device
    assert ("cast", ("float16",), {"skip": ()}) in ops.log
    if name == "novram":
        assert ("group_offload", ("cuda:0",), {"leaf": True, "use_stream": True, "pinned": True}) in ops.log
    if name == "lowvram":
        assert ("group_offload", ("cuda:0",), {"leaf": False, "use_stream": True, "pinned": True}) in ops.log


def test_gpu_only_settings_are_skipped_and_logged_on_cpu(model):
    settings = MemorySettings(dtype="float16", attention="xformers", offload="model")
    applied = apply_mod.apply_settings(model.pipe, settings, probe("cpu"))
    assert applied.effective.dtype == "float32" and applied.effective.attention == "sdpa"
    text = " ".join(applied.skipped)
    assert "float16 -> float32" in text and "xformers -> sdpa" in text and "saves nothing" in text
    assert model.pipe.unet.dtype == torch.float32


def _image(pipe):
    out = pipe("a", num_inference_steps=2, width=64, height=64, generator=torch.Generator().manual_seed(3),
               output_type="np")
    return out.images[0]


@pytest.mark.parametrize("settings", [
    MemorySettings(dtype="float32", offload="model", vae_slicing=True),
    MemorySettings(dtype="float32", offload="group", vae_tiling=True),
    MemorySettings(dtype="float32", offload="sequential", attention="slicing"),
], ids=["model-offload", "group-offload", "sequential-offload"])
def test_offload_modes_run_for_real_and_give_the_same_pixels(settings, model):
    reference = _image(model.pipe)
    applied = apply_mod.apply_settings(model.pipe, settings, probe("cpu"))
    assert applied.effective.offload == settings.offload
    assert np.abs(_image(model.pipe) - reference).max() < 1e-4
    apply_mod.apply_settings(model.pipe, MemorySettings(dtype="float32"), probe("cpu"))  # and back again
    assert np.abs(_image(model.pipe) - reference).max() < 1e-4


def test_group_offload_streams_text_encoders_leaf_by_leaf(model):
    """Block-level grouping only splits top-level block lists; a text encoder (CLIP here, T5-XXL in
    SD3/Flux) has none and would be moved whole, so text encoders are offloaded leaf by leaf."""

    def own_hook(module) -> bool:
        registry = getattr(module, "_diffusers_hook", None)
        return registry is not None and registry.get_hook("group_offloading") is not None

    apply_mod.apply_settings(model.pipe, MemorySettings(dtype="float32", offload="group"), probe("cpu"))
    try:
        text_linears = [m for m in model.pipe.text_encoder.modules() if isinstance(m, torch.nn.Linear)]
        unet_linears = [m for m in model.pipe.unet.modules() if isinstance(m, torch.nn.Linear)]
        assert text_linears and all(own_hook(m) for m in text_linears)  # each layer is its own group
        assert not any(own_hook(m) for m in unet_linears)  # the UNet is grouped by blocks
        assert np.isfinite(_image(model.pipe)).all()
    finally:
        apply_mod.apply_settings(model.pipe, MemorySettings(dtype="float32"), probe("cpu"))
    assert not any(own_hook(m) for m in model.pipe.text_encoder.modules())  # and removed again


def test_fp8_storage_really_stores_float8_and_asks_for_a_reload_to_undo(model):
    apply_mod.apply_settings(model.pipe, MemorySettings(dtype="bfloat16", fp8_storage=True), probe("cpu"))
    assert model.pipe.unet.conv_in.weight.dtype == torch.float8_e4m3fn
    assert np.isfinite(_image(model.pipe)).all()
    # fp8 stays: no reload needed for another fp8 preset; going back to full precision needs one
    assert apply_mod.needs_reload(model.pipe, MemorySettings(dtype="bfloat16", fp8_storage=True, offload="group")) == []
    assert set(apply_mod.needs_reload(model.pipe, MemorySettings(dtype="float32"))) >= {"unet", "vae", "text_encoder"}
    with pytest.raises(RuntimeError, match="reload"):
        apply_mod.apply_settings(model.pipe, MemorySettings(dtype="float32"), probe("cpu"))


def test_runner_reloads_only_what_lost_precision(model):
    from lowvram_gen.engines.sd.stepdown import Runner

    runner = Runner(model, probe("cpu"))
    runner.use(MemorySettings(dtype="bfloat16", fp8_storage=True))
    runner.use(MemorySettings(dtype="float32"))
    assert model.pipe.unet.conv_in.weight.dtype == torch.float32
    fresh = load(resolve("tiny"), "float32").pipe
    assert torch.equal(model.pipe.unet.conv_in.weight, fresh.unet.conv_in.weight)  # full precision is back


def test_vae_tile_size_follows_usable_vram(model):
    from lowvram_gen.planning.sizes import vae_tile_size

    assert [vae_tile_size(fake(g)) for g in (2, 4, 8, 24)] == [256, 512, 768, 1024]
    assert vae_tile_size(probe("cpu")) == 512
    apply_mod.apply_settings(model.pipe, MemorySettings(dtype="float32", vae_tiling=True), probe("cpu"))
    assert model.pipe.vae.use_tiling and model.pipe.vae.tile_sample_min_size == 512
    assert model.pipe.vae.tile_latent_min_size == 64
    other = load(resolve("tiny"), "float32")
    ops = RecordingOps(other.pipe)
    apply_mod.apply_settings(other.pipe, load_presets()["lowvram"].memory, fake(4), ops)
    assert ("vae_tiling", (512,), {}) in ops.log


def test_unpinned_streaming_asks_diffusers_for_no_pinned_copies(model, monkeypatch):
    """pin_memory = false (the planner's +unpinned candidates) reaches diffusers as low_cpu_mem_usage=True;
    the group offloading itself runs here on the CPU with a recorded call (no CUDA stream)."""
    from dataclasses import replace

    ops = RecordingOps(model.pipe)
    settings = replace(load_presets()["lowvram"].memory, pin_memory=False)
    apply_mod.apply_settings(model.pipe, settings, fake(8), ops)
    assert ("group_offload", ("cuda:0",), {"leaf": False, "use_stream": True, "pinned": False}) in ops.log
    seen = []
    monkeypatch.setattr("diffusers.hooks.apply_group_offloading", lambda module, **kw: seen.append(kw))
    for component in model.pipe.components.values():
        if hasattr(component, "enable_group_offload"):
            monkeypatch.setattr(component, "enable_group_offload", lambda _c=component, **kw: seen.append(kw))
    apply_mod.PipelineOps(model.pipe).group_offload("cpu", leaf=False, use_stream=True, pinned=False)
    assert seen and all(kw["low_cpu_mem_usage"] is True for kw in seen)


def test_pinned_streaming_pins_only_the_denoiser(model, monkeypatch):
    """Issue 17: pinned host copies only for what is streamed every step. The text encoders and the VAE run once
    per job and stream without them (a pinned T5-XXL would hold its 9.5 GB twice for the whole session); the
    host estimate counts the denoiser's pinned copy alone."""
    seen = {}
    monkeypatch.setattr("diffusers.hooks.apply_group_offloading",
                        lambda module, **kw: seen.__setitem__(type(module).__name__, kw))
    for name, component in model.pipe.components.items():
        if hasattr(component, "enable_group_offload"):
            monkeypatch.setattr(component, "enable_group_offload", lambda _n=name, **kw: seen.__setitem__(_n, kw))
    apply_mod.PipelineOps(model.pipe).group_offload("cpu", leaf=False, use_stream=True, pinned=True)
    pinned = {k for k, kw in seen.items() if not kw["low_cpu_mem_usage"]}
    assert pinned == {"unet"} and len(seen) >= 3


def test_the_host_estimate_counts_a_pinned_copy_of_the_streamed_denoiser_only():
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.planning import host as host_mod
    from lowvram_gen.settings import MemorySettings

    flux = profiles.profile_builtin("flux")
    s = MemorySettings(dtype="bfloat16", offload="group")
    pinned = host_mod.host_estimate(flux, s, "cuda", 1024, 1024, 1, pinned=True)
    assert pinned.pinned_bytes == host_mod.kept_bytes(flux, s)["transformer"]
    budget = host_mod.host_estimate(flux, MemorySettings(dtype="bfloat16", offload="budget"), "cuda", 1024, 1024,
                                    1, resident_bytes=4 << 30, pinned=True)
    assert budget.pinned_bytes == host_mod.kept_bytes(flux, s)["transformer"] - (4 << 30)


def test_keep_mapped_switches_diffusers_casting_hooks_and_leaves_one_it_cannot_rebind():
    """engines/sd/casting.keep_mapped: a layer's hook is switched to put the stored weight back after the forward
    (the same storage before and after); a hook whose registry bound its methods some other way is left as
    diffusers' own, which still computes the same numbers."""
    import torch
    from diffusers.hooks import apply_layerwise_casting
    from diffusers.hooks.layerwise_casting import LayerwiseCastingHook

    from lowvram_gen.engines.sd.casting import MappedCastingHook, keep_mapped

    layers = [torch.nn.Linear(4, 4).to(torch.float16) for _ in range(2)]
    x = torch.randn(1, 4)
    expected = [torch.nn.functional.linear(x, layer.weight.float(), layer.bias.float()) for layer in layers]
    for layer in layers:
        apply_layerwise_casting(layer, storage_dtype=torch.float16, compute_dtype=torch.float32,
                                skip_modules_pattern=None)
    del layers[1]._diffusers_hook.get_hook("layerwise_casting").fn_ref
    assert keep_mapped(layers[0]) == 1 and keep_mapped(layers[1]) == 0
    assert type(layers[0]._diffusers_hook.get_hook("layerwise_casting")) is MappedCastingHook
    assert type(layers[1]._diffusers_hook.get_hook("layerwise_casting")) is LayerwiseCastingHook
    stored = layers[0].weight.data_ptr()
    for layer, want in zip(layers, expected):
        assert torch.allclose(layer(x), want, atol=1e-6) and layer.weight.dtype == torch.float16
    assert layers[0].weight.data_ptr() == stored  # the stored tensor itself, not a fresh copy
