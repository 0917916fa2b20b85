"""offload = "budget": the denoiser's blocks split into resident and streamed, applied, measured.

On this CPU the offload hooks run for real with the CPU as both devices (nothing is copied, but the
hooks onload and offload as they would on a GPU; `engines/sd/traffic.py` counts what they onload).
The CUDA path (a stream, the free-memory rule) is checked by recording the calls with a fake device.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.engines.sd.traffic import count_onloads
from lowvram_gen.errors import PresetError
from lowvram_gen.hardware.device import GiB, fake, probe
from lowvram_gen.models.blocks import blocks_of, fixed_bytes, module_bytes
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.planning.residency import fit, split
from lowvram_gen.presets import load_preset_file, load_presets
from lowvram_gen.settings import MemorySettings

BLOCKS = [("a", 10), ("b", 40), ("c", 20), ("d", 40), ("e", 5)]  # execution order; 115 bytes in all


@pytest.fixture()
def model(tiny_path):
    return load(resolve("tiny"), "float32")


def budget(resident_bytes: int) -> MemorySettings:
    return MemorySettings(dtype="float32", offload="budget", resident_bytes=resident_bytes)


def group_hooked(module) -> bool:
    registry = getattr(module, "_diffusers_hook", None)
    return registry is not None and registry.get_hook("group_offloading") is not None


# ----------------------------------------------------------------------------------- split, fit


def test_split_keeps_nothing_at_zero_and_everything_at_the_total():
    none = split(BLOCKS, 0)
    assert none.resident == () and none.streamed == ("a", "b", "c", "d", "e")
    assert (none.resident_bytes, none.streamed_bytes_per_step, none.largest_streamed) == (0, 115, 40)
    for enough in (115, 116, 10**12):
        every = split(BLOCKS, enough)
        assert every.streamed == () and every.resident_bytes == 115 and every.streamed_bytes_per_step == 0
    assert split([], 5).resident == () and split([], 5).streamed_bytes_per_step == 0


def test_split_keeps_the_largest_blocks_first_and_fills_the_rest_with_smaller_ones():
    half = split(BLOCKS, 60)  # b (40, first of the two largest) fits, d (40) does not, c (20) fills the rest
    assert half.resident == ("b", "c") and half.streamed == ("a", "d", "e")
    assert (half.resident_bytes, half.streamed_bytes_per_step, half.largest_streamed) == (60, 55, 40)
    assert half.in_flight_bytes == 80
    # every block is resident or streamed, once, each list in execution order
    assert sorted(half.resident + half.streamed) == sorted(n for n, _ in BLOCKS)
    assert split(BLOCKS, 95).resident == ("a", "b", "d", "e")  # 40 + 40 + 10 + 5: c (20) does not fit after them


@pytest.mark.parametrize("budget_bytes,resident", [
    (39, ("c", "a", "e")),  # one byte short of a 40-byte block: 20 + 10 + 5
    (40, ("b",)),  # exactly one block
    (80, ("b", "d")),  # exactly the two largest
    (114, ("b", "d", "c", "a")),  # one byte short of everything: the 5-byte block streams
])
def test_split_edges(budget_bytes, resident):
    result = split(BLOCKS, budget_bytes)
    assert set(result.resident) == set(resident)
    assert result.resident_bytes == sum(b for n, b in BLOCKS if n in resident) <= budget_bytes
    assert result.resident_bytes + result.streamed_bytes_per_step == 115


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1GiB"])
def test_split_refuses_a_budget_that_is_not_a_byte_count(bad):
    with pytest.raises(ValueError, match="resident_bytes"):
        split(BLOCKS, bad)
    with pytest.raises(ValueError, match="repeat"):
        split([("a", 1), ("a", 2)], 1)


@pytest.mark.parametrize("available", [0, 50, 79, 80, 99, 100, 150, 195, 10**6])
def test_fit_leaves_room_for_the_two_streamed_blocks_in_flight(available):
    result = fit(BLOCKS, available)
    assert result.resident_bytes + result.in_flight_bytes <= available or result.resident == ()
    if available >= 115:
        assert result.streamed == ()
    assert fit(BLOCKS, -5).resident == ()


# ------------------------------------------------------------------------------------- blocks_of


def test_blocks_of_the_tiny_unet_cover_its_bytes_in_execution_order(model):
    unet = model.pipe.unet
    blocks = blocks_of(unet)
    names = [n for n, _ in blocks]
    total = sum(p.numel() * p.element_size() for p in unet.parameters()) + \
        sum(b.numel() * b.element_size() for b in unet.buffers())
    assert sum(b for _, b in blocks) + fixed_bytes(unet) == total == module_bytes(unet)
    assert 0 < fixed_bytes(unet) < 0.1 * total  # conv_in/out, time embedding, norms
    assert all(b == module_bytes(unet.get_submodule(n)) for n, b in blocks)
    # down blocks, then the mid block, then the up blocks; resnets[i] before attentions[i]
    first = {prefix: min(i for i, n in enumerate(names) if n.startswith(prefix))
             for prefix in ("down_blocks", "mid_block", "up_blocks")}
    assert first["down_blocks"] < first["mid_block"] < first["up_blocks"]
    assert names.index("down_blocks.1.resnets.0") < names.index("down_blocks.1.attentions.0")
    assert names.index("mid_block.resnets.0") < names.index("mid_block.attentions.0") < names.index("mid_block.resnets.1")
    # no block inside another
    assert not any(a != b and b.startswith(a + ".") for a in names for b in names)


def test_blocks_of_a_meta_model_from_the_config_match_the_real_one(model):
    from accelerate import init_empty_weights
    from diffusers import UNet2DConditionModel

    with init_empty_weights(include_buffers=True):
        meta = UNet2DConditionModel.from_config(model.pipe.unet.config)
    assert next(meta.parameters()).device.type == "meta"
    assert blocks_of(meta) == blocks_of(model.pipe.unet)
    assert fixed_bytes(meta) == fixed_bytes(model.pipe.unet)
    # planning float16 on a float32 model: every floating tensor at 2 bytes
    assert [b for _, b in blocks_of(meta, 2)] == [b // 2 for _, b in blocks_of(meta)]


def test_residency_imports_no_torch():
    code = ("import sys, lowvram_gen.planning.residency; "
            "print(sorted(m for m in ('torch', 'diffusers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# ------------------------------------------------------------------------------------ settings


@pytest.mark.parametrize("line,words", [
    ('offload = "budget"\nresident_bytes = -1', ["resident_bytes", "-1", "0 or more"]),
    ('offload = "budget"\nresident_bytes = 1.5', ["memory.resident_bytes", "1.5", "whole number"]),
    ('offload = "budget"\nresident_bytes = true', ["memory.resident_bytes", "True", "whole number"]),
    ('offload = "model"\nresident_bytes = 1024', ["resident_bytes = 1024", "offload = 'budget'", "'model'"]),
])
def test_bad_resident_bytes_are_refused_naming_the_value(tmp_path, line, words):
    path = tmp_path / "mine.toml"
    path.write_text(f'rank = 1\ndevice = "gpu"\nmax_pixels = 262144\nmax_batch = 1\n[memory]\n{line}\n')
    with pytest.raises(PresetError) as err:
        load_preset_file(path)
    for word in [str(path), *words]:
        assert word in str(err.value)
    with pytest.raises(PresetError, match="resident_bytes"):
        MemorySettings(offload="budget", resident_bytes=-3).check()


def test_the_shipped_budget_preset():
    presets = load_presets()
    memory = presets["budget"].memory
    assert memory.offload == "budget" and memory.resident_bytes == 0
    assert presets["medvram"].rank < presets["budget"].rank < presets["lowvram"].rank  # streams less than lowvram


# ------------------------------------------------------------------------- applied on this CPU


def _image(pipe, steps=2):
    out = pipe("a", num_inference_steps=steps, width=64, height=64, generator=torch.Generator().manual_seed(3),
               output_type="np")
    return out.images[0]


def test_budget_gives_the_same_pixels_as_no_offload_and_reapplies_without_reloading(model):
    """Pixel-equal, not within a tolerance: on the CPU the hooks move tensors from the CPU to the CPU
    (no copy, no dtype change), so the same kernels run on the same weights in the same order."""
    pipe = model.pipe
    reference = _image(pipe)
    blocks = blocks_of(pipe.unet)
    weights = {n: p for n, p in pipe.unet.named_parameters()}
    total = sum(b for _, b in blocks)
    seen = []
    for resident in (total // 2, 1, total // 4, total):
        applied = apply_mod.apply_settings(pipe, budget(resident), probe("cpu"))
        expected = split(blocks, resident)
        assert applied.residency == expected
        assert applied.calls[-1] == f"budget_offload:{expected.resident_bytes}:cpu"
        assert "saves nothing" in " ".join(applied.skipped)
        # hooks on exactly the streamed blocks; the resident ones and the fixed part have none
        assert [n for n, _ in blocks if group_hooked(pipe.unet.get_submodule(n))] == list(expected.streamed)
        assert not group_hooked(pipe.unet.conv_in) and not group_hooked(pipe.unet.time_embedding)
        assert group_hooked(pipe.vae.decoder) or any(group_hooked(m) for m in pipe.vae.modules())
        assert np.array_equal(_image(pipe), reference)
        seen.append(expected.streamed)
    assert len(set(seen)) == 4  # four different splits ran
    assert all(p is weights[n] for n, p in pipe.unet.named_parameters())  # re-applied, never reloaded
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), probe("cpu"))
    assert not any(group_hooked(m) for m in pipe.unet.modules())
    assert np.array_equal(_image(pipe), reference)


def test_measured_bytes_per_step_equal_the_split(model):
    """What the hooks onload during each UNet forward (one per step: CFG is batched) is exactly the
    streamed blocks' bytes that split() predicts; none of it before the first step is counted twice."""
    pipe = model.pipe
    blocks = blocks_of(pipe.unet)
    for resident in (sum(b for _, b in blocks) // 3, 0 + 1):
        with count_onloads() as meter:
            meter.watch(pipe.unet)
            applied = apply_mod.apply_settings(pipe, budget(resident), probe("cpu"))
            _image(pipe, steps=3)
        expected = applied.residency.streamed_bytes_per_step
        assert expected > 0 and len(meter.forwards) >= 3
        assert meter.forwards == [expected] * len(meter.forwards)
    with count_onloads() as meter:  # budget decided on a CPU: everything resident, nothing moves
        meter.watch(pipe.unet)
        applied = apply_mod.apply_settings(pipe, budget(0), probe("cpu"))
        _image(pipe, steps=2)
    assert applied.residency.streamed == () and set(meter.forwards) == {0}
    assert not pipe.unet._forward_pre_hooks and not pipe.unet._forward_hooks  # the meters' hooks are gone


def test_the_meter_sees_model_offload_move_the_unet_once_per_job(model):
    pipe = model.pipe
    with count_onloads() as meter:
        meter.watch(pipe.unet)
        apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload="model"), probe("cpu"))
        _image(pipe, steps=3)
        _image(pipe, steps=3)  # the VAE's hook offloaded the UNet at the end of the first job
    per_job = len(meter.forwards) // 2
    whole = module_bytes(pipe.unet)
    assert meter.forwards == ([whole] + [0] * (per_job - 1)) * 2


def test_resident_to_moves_the_resident_blocks_and_the_fixed_part_and_leaves_the_streamed_ones(model):
    """The move the runner makes around the VAE decode, onto a device where it shows: "meta" (tensors
    with no data; the model is not used afterwards). Every tensor outside the streamed blocks goes;
    the streamed blocks stay with their hooks' host copies."""
    pipe = model.pipe
    blocks = blocks_of(pipe.unet)
    applied = apply_mod.apply_settings(pipe, budget(sum(b for _, b in blocks) // 2), probe("cpu"))
    streamed = applied.residency.streamed
    assert streamed and applied.residency.resident
    apply_mod.PipelineOps(pipe).resident_to("meta", streamed)
    inside = {f"{n}.{p}" for n in streamed for p, _ in pipe.unet.get_submodule(n).named_parameters()}
    devices = {name: param.device.type for name, param in pipe.unet.named_parameters()}
    assert {devices[n] for n in inside} == {"cpu"}
    assert {d for n, d in devices.items() if n not in inside} == {"meta"}
    assert pipe.unet.conv_in.weight.device.type == "meta"  # the fixed part goes too


def test_the_resident_part_is_on_the_device_while_the_unet_runs_and_off_it_while_the_vae_decodes(model):
    """Where the runner says the budget split's resident part is, seen from the text encoder's, the UNet's and
    the VAE decode's calls of real jobs: off while the prompts are encoded (planning/estimate.py counts the text
    phase without it), moved on at the UNet's first forward, on for every step, off for the decode (planned
    without it too), and the same again for the next job; the moves go through PipelineOps.resident_to, in that
    order. (Before, apply placed it and it stayed on through the next job's prompt encoding.)"""
    from itertools import groupby

    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.presets import gpu_ladder
    from lowvram_gen.request import GenerationRequest

    events = []

    class Ops(apply_mod.PipelineOps):
        def resident_to(self, device, streamed):
            events.append(("move", device, streamed))
            super().resident_to(device, streamed)

    pipe = model.pipe
    preset = next(p for p in gpu_ladder(load_presets()) if p.name == "budget")
    resident = sum(b for _, b in blocks_of(pipe.unet)) // 2
    from dataclasses import replace

    planned = replace(preset, memory=replace(preset.memory, dtype="float32", resident_bytes=resident))
    runner = Runner(model, probe("cpu"), ops_factory=Ops)
    pipe.text_encoder.register_forward_pre_hook(lambda *_: events.append(("text", runner.resident_on_device)))
    pipe.unet.register_forward_pre_hook(lambda *_: events.append(("unet", runner.resident_on_device)))
    decode = pipe.vae.decode

    def watched_decode(*args, **kwargs):
        events.append(("vae", runner.resident_on_device))
        return decode(*args, **kwargs)

    pipe.vae.decode = watched_decode
    request = GenerationRequest(prompt="a boat", width=64, height=64, steps=2, batch_size=1)
    for seed in (1, 2):
        runner.run(request, [seed], [planned], lambda done: None)
    streamed = runner.residency.streamed
    assert streamed  # half the blocks stream: the split is a real one
    move = ("move", "cpu", streamed)  # this CPU is the device: the order of the moves is what shows
    assert len([e for e in events if e[0] == "unet"]) >= 4  # every step's UNet forward, twice
    # apply leaves it on the host; each job: prompts encoded without it, on at the UNet's first forward, off before
    # the decode
    job = [("text", False), move, ("unet", True), move, ("vae", False)]
    assert [key for key, _ in groupby(events)] == [move] + job * 2


def test_oom_in_the_decode_under_budget_retries_only_the_decode_without_the_resident_part(model):
    """FAULTS 19 under budget offload. Simulated: the VAE decoder raises torch.OutOfMemoryError (what CUDA
    raises) on its first call. The retry re-applies the settings with a tiled VAE, which puts the resident
    part back on the device; the runner takes it off again before the decode runs. The UNet's steps are
    not run again."""
    from dataclasses import replace

    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.presets import gpu_ladder
    from lowvram_gen.request import GenerationRequest

    pipe = model.pipe
    preset = next(p for p in gpu_ladder(load_presets()) if p.name == "budget")
    memory = replace(preset.memory, dtype="float32", vae_tiling=False, vae_slicing=False,
                     resident_bytes=sum(b for _, b in blocks_of(pipe.unet)) // 2)
    runner = Runner(model, probe("cpu"))
    unet_calls, decodes = [], []
    pipe.unet.register_forward_pre_hook(lambda *_: unet_calls.append(1))

    def decoder_hook(_module, _args):
        decodes.append(runner.resident_on_device)
        if len(decodes) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated)")

    pipe.vae.decoder.register_forward_pre_hook(decoder_hook)
    done = []
    request = GenerationRequest(prompt="a boat", width=64, height=64, steps=2, batch_size=1)
    report = runner.run(request, [5], [replace(preset, memory=memory)], done.append)
    assert [(a.stage, a.outcome) for a in report.attempts] == [("denoise", "ok"), ("decode", "oom"), ("decode", "ok")]
    assert decodes == [False, False]  # off the device for the first decode and again for the retry
    assert runner.applied.vae_tiling and runner.residency is not None  # the retry: tiled, still budget
    steps = len(unet_calls)
    assert steps >= 2 and done[0].images[0].size == (64, 64)
    runner.run(request, [5], [replace(preset, memory=memory)], lambda d: None)
    assert len(unet_calls) == 2 * steps  # the first job ran its steps once: only the decode was retried


# -------------------------------------------------------------------------------- fake CUDA


class RecordingOps(apply_mod.PipelineOps):
    """Records the calls a plan makes instead of making them; `free` is what CUDA would report."""

    RECORDED = ("reset", "cast", "fp8_storage", "place", "model_offload", "group_offload", "budget_offload",
                "attention_slicing", "xformers", "vae_slicing", "vae_tiling")

    def __init__(self, pipe, free: int):
        super().__init__(pipe)
        self.log, self.free = [], free

    def free_bytes(self, device: str) -> int:
        self.log.append(("free_bytes", (device,), {}))
        return self.free

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name in RecordingOps.RECORDED:
            log = object.__getattribute__(self, "log")
            return lambda *a, **k: log.append((name, a, k))
        return attr


def test_budget_preset_on_cuda_makes_exactly_its_calls(model):
    preset = load_presets()["budget"]
    pipe = model.pipe
    blocks = blocks_of(pipe.unet)  # float32 here; the recorded cast does not run
    ops = RecordingOps(pipe, free=8 * GiB)
    applied = apply_mod.apply_settings(pipe, preset.memory, fake(8), ops)
    assert [c[0] for c in ops.log] == ["reset", "cast", "free_bytes", "budget_offload", "vae_slicing", "vae_tiling"]
    assert applied.skipped == []
    # 8 GiB free, 0.5 GiB reserve, 2 GiB margin: the tiny UNet fits whole
    assert ("budget_offload", ("cuda:0", ()), {"use_stream": True, "pinned": True, "place": True}) in ops.log
    assert f"budget_offload:{sum(b for _, b in blocks)}:cuda:0" in applied.calls


@pytest.mark.parametrize("free_mib,expect", [(2048 + 512, "none resident"), (2048 + 512 + 2, "some"), (64 * 1024, "all")])
def test_free_memory_decides_the_budget_when_no_plan_did(model, free_mib, expect):
    """resident_bytes = 0 on CUDA: the memory the pipeline can use, less the reserve (512 MiB), the
    2 GiB margin and the fixed part, with room left for two streamed blocks in flight."""
    pipe = model.pipe
    blocks = blocks_of(pipe.unet)
    extra = fixed_bytes(pipe.unet) + (2 * max(b for _, b in blocks) if expect == "some" else 0)
    ops = RecordingOps(pipe, free=free_mib * 2**20 + extra)
    applied = apply_mod.apply_settings(pipe, MemorySettings(offload="budget"), fake(80), ops)
    res = applied.residency
    available = ops.free - 512 * 2**20 - apply_mod.BUDGET_MARGIN - fixed_bytes(pipe.unet)
    assert res == fit(blocks, available)
    if res.resident:  # what stays plus what is in flight fits what is left
        assert res.resident_bytes + (res.in_flight_bytes if res.streamed else 0) <= available
    if expect == "none resident":
        assert res.resident == ()
    elif expect == "all":
        assert res.streamed == ()
    else:
        assert res.resident and res.streamed
    # a user budget (--vram-budget) caps it
    capped = apply_mod.apply_settings(pipe, MemorySettings(offload="budget"), fake(80, budget_bytes=1 * GiB),
                                      RecordingOps(pipe, free=ops.free))
    assert capped.residency.resident == ()


def test_a_planned_resident_bytes_is_used_as_given_on_cuda(model):
    pipe = model.pipe
    blocks = blocks_of(pipe.unet)
    wanted = sum(b for _, b in blocks) // 2
    ops = RecordingOps(pipe, free=0)
    applied = apply_mod.apply_settings(pipe, MemorySettings(offload="budget", resident_bytes=wanted), fake(4), ops)
    expected = split(blocks, wanted)
    assert "free_bytes" not in [c[0] for c in ops.log]  # the plan decided: the device is not asked
    assert ("budget_offload", ("cuda:0", expected.streamed),
            {"use_stream": True, "pinned": True, "place": True}) in ops.log
    assert f"budget_offload:{expected.resident_bytes}:cuda:0" in applied.calls


# ----------------------------------------------------------------------------------- the ladder


def test_oom_at_a_budget_preset_steps_down_the_ladder_and_finishes(model):
    """Simulated: the UNet raises torch.OutOfMemoryError (what CUDA raises) on every call while the
    budget preset is applied, as when the resident blocks leave too little room for the activations;
    the ladder re-applies the next preset to the same weights and finishes."""
    from dataclasses import replace

    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.presets import gpu_ladder
    from lowvram_gen.request import GenerationRequest

    pipe = model.pipe
    ladder = gpu_ladder(load_presets())
    start = [p.name for p in ladder].index("budget")
    planned = replace(ladder[start], memory=replace(ladder[start].memory,
                                                    resident_bytes=sum(b for _, b in blocks_of(pipe.unet)) // 2))
    runner = Runner(model, probe("cpu"))

    def hook(_module, _args):
        if runner.applied.offload == "budget":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    pipe.unet.register_forward_pre_hook(hook)
    weight = pipe.unet.conv_in.weight
    done = []
    request = GenerationRequest(prompt="a boat", width=64, height=64, steps=2, batch_size=1)
    report = runner.run(request, [7], [planned, *ladder[start + 1:]], done.append)
    assert [(a.preset, a.stage, a.outcome) for a in report.attempts][:2] == [
        ("budget", "denoise", "oom"), (ladder[start + 1].name, "denoise", "ok")]
    assert report.preset_name == ladder[start + 1].name
    assert done[0].images[0].size == (64, 64)
    assert pipe.unet.conv_in.weight is weight  # reconfigured, not reloaded


# ------------------------------------------------------------------------------- a real GPU


@pytest.mark.cuda
def test_on_cuda_streamed_blocks_are_prefetched_and_the_image_matches(model):
    """The CUDA path: blocks onloaded on a side stream, prefetched along the traced execution order.
    float32 on both sides; the streamed run may differ from the resident one by float noise only
    (same kernels, same weights; the copies are exact), so the tolerance is that of test_apply."""
    pipe = model.pipe
    gpu = probe()
    reference = _image_on(pipe, apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), gpu))
    blocks = blocks_of(pipe.unet)
    with count_onloads() as meter:
        meter.watch(pipe.unet)
        applied = apply_mod.apply_settings(pipe, budget(sum(b for _, b in blocks) // 2), gpu)
        image = _image_on(pipe, applied)
    res = applied.residency
    assert res.resident and res.streamed
    assert np.abs(image - reference).max() < 1e-4
    assert set(meter.forwards) == {res.streamed_bytes_per_step}
    for name in res.resident:
        assert next(pipe.unet.get_submodule(name).parameters()).device.type == "cuda"
    for name in res.streamed:  # offloaded between forwards, with a pinned host copy to stream from
        weight = next(pipe.unet.get_submodule(name).parameters())
        assert weight.device.type == "cpu" and weight.is_pinned()
    hook = pipe.unet.get_submodule(res.streamed[0])._diffusers_hook.get_hook("group_offloading")
    assert hook.group.stream is not None and hook.group.onload_self is False  # prefetched by the group before
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), gpu)
    assert all(p.device.type == "cuda" for p in pipe.unet.parameters())


def _image_on(pipe, applied):
    assert applied.effective.dtype == "float32"
    return _image(pipe)
