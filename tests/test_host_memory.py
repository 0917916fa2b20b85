"""System RAM, the second memory (issue 17): the probe reads /proc and the cgroup's limit files, the
planner estimates each candidate's host peak and never picks one that does not fit, and a job that
fits nowhere stops before loading with one sentence, at the CLI, in a batch and in the UI.

The cgroup files are fixtures laid out as the kernel lays them out (v1: memory.limit_in_bytes and
memory.usage_in_bytes under /sys/fs/cgroup/memory/<path>; v2: memory.max and memory.current under
/sys/fs/cgroup/<path>); the real-size measurements under cgroup limits are benchmarks/host_peaks.py's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import procmaps

from lowvram_gen.errors import PresetError
from lowvram_gen.hardware import device as device_mod
from lowvram_gen.hardware.hostmem import HostMemory, probe_host, simulated_host
from lowvram_gen.models import counting
from lowvram_gen.models import profile as profiles
from lowvram_gen.planning import estimate as memory
from lowvram_gen.planning import host as host_mod
from lowvram_gen.planning.planner import plan
from lowvram_gen.presets import load_presets
from lowvram_gen.settings import MemorySettings

GiB = 1024**3
MiB = 1024**2
NO_LIMIT_V1 = 9223372036854771712  # what cgroup v1 writes for "no limit"


def fake_root(tmp_path: Path, meminfo_total_gib: float, available_gib: float, cgroup: str | None = None,
              files: dict[str, str] | None = None, rss_kib: int = 102400) -> Path:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal:       {int(meminfo_total_gib * GiB / 1024)} kB\n"
                                       f"MemFree:        1000 kB\n"
                                       f"MemAvailable:   {int(available_gib * GiB / 1024)} kB\n")
    (root / "proc/self/status").write_text(f"Name:\tpython\nVmRSS:\t  {rss_kib} kB\n")
    (root / "proc/self/cgroup").write_text(cgroup or "0::/\n")
    for rel, text in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ------------------------------------------------------------------------------------------ probe


def test_probe_without_a_cgroup_limit_reads_meminfo(tmp_path):
    root = fake_root(tmp_path, 32, 20, "0::/user.slice\n", {"sys/fs/cgroup/user.slice/memory.max": "max\n"})
    host = probe_host(root=root)
    assert host.total_bytes == 32 * GiB and host.available_bytes == 20 * GiB and host.limit_bytes is None
    assert host.process_bytes == 100 * MiB
    assert host.usable_bytes == 20 * GiB + 100 * MiB  # what is free plus what this process holds already


def test_probe_reads_a_cgroup_v1_limit_and_leaves_reclaimable_cache_out_of_the_usage(tmp_path):
    cg = "sys/fs/cgroup/memory/docker/abc"
    root = fake_root(tmp_path, 64, 50, "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n", {
        f"{cg}/memory.limit_in_bytes": f"{12 * GiB}\n",
        f"{cg}/memory.usage_in_bytes": f"{5 * GiB}\n",
        f"{cg}/memory.stat": f"cache 100\ninactive_file {2 * GiB}\ntotal_inactive_file {2 * GiB}\n",
        "sys/fs/cgroup/memory/docker/memory.limit_in_bytes": f"{NO_LIMIT_V1}\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{NO_LIMIT_V1}\n",
    })
    host = probe_host(root=root)
    assert host.limit_bytes == 12 * GiB and host.limit_source.endswith("docker/abc/memory.limit_in_bytes")
    assert host.total_bytes == 12 * GiB  # the container's, not the machine's 64
    assert host.available_bytes == 12 * GiB - (5 - 2) * GiB  # page cache the kernel can drop is room


def test_probe_reads_a_cgroup_v2_limit_and_a_tighter_parent_wins(tmp_path):
    root = fake_root(tmp_path, 64, 50, "0::/colab/kernel\n", {
        "sys/fs/cgroup/colab/kernel/memory.max": f"{16 * GiB}\n",
        "sys/fs/cgroup/colab/kernel/memory.current": f"{1 * GiB}\n",
        "sys/fs/cgroup/colab/memory.max": f"{12 * GiB}\n",
        "sys/fs/cgroup/colab/memory.current": f"{3 * GiB}\n",
        "sys/fs/cgroup/colab/memory.stat": "anon 1\ninactive_file 0\n",
    })
    host = probe_host(root=root)
    assert host.limit_bytes == 12 * GiB and host.limit_source == "/sys/fs/cgroup/colab/memory.max"
    assert host.available_bytes == 9 * GiB


def test_probe_takes_meminfo_when_it_is_tighter_than_the_cgroup(tmp_path):
    cg = "sys/fs/cgroup/memory/slice"
    root = fake_root(tmp_path, 16, 3, "4:memory:/slice\n", {f"{cg}/memory.limit_in_bytes": f"{12 * GiB}\n",
                                                           f"{cg}/memory.usage_in_bytes": f"{1 * GiB}\n"})
    assert probe_host(root=root).available_bytes == 3 * GiB


def test_ram_budget_caps_the_usable_ram(tmp_path):
    root = fake_root(tmp_path, 32, 20)
    assert probe_host(budget_bytes=6 * GiB, root=root).usable_bytes == 6 * GiB


def test_the_real_probe_reads_this_machine():
    host = probe_host()
    assert 0 < host.available_bytes <= host.total_bytes
    assert host.process_bytes > 0


# ------------------------------------------------------------------------------------ estimate


def test_host_estimate_counts_float32_weights_twice_the_fp16_ones_and_int8_at_a_byte():
    sdxl = profiles.profile_builtin("sdxl")
    f32 = host_mod.host_estimate(sdxl, MemorySettings(dtype="float32"), "cpu", 512, 512, 1)
    i8 = host_mod.host_estimate(sdxl, MemorySettings(dtype="float32", quantize="int8"), "cpu", 512, 512, 1)
    params = sum(sdxl.params.values())
    assert f32.weights_bytes == params * 4
    assert i8.weights_bytes < params * 1.5  # denoiser and text encoders at ~1 byte, the VAE at 4
    assert f32.activation_bytes > 0 and f32.peak_bytes > f32.weights_bytes + host_mod.BASELINE_BYTES


def test_a_quantized_t5_keeps_its_float32_wo_layers_at_the_load_dtype():
    # sdnq skips a transformers model's _keep_in_fp32_modules: T5's 24 wo projections (1.0 B of T5-XXL's 4.76 B)
    # stay unquantized; the cut FLUX.1 at int8 held 11.19 GiB where counting the embedding alone planned 8.13
    from transformers import T5Config, T5EncoderModel

    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4,
                                 feed_forward_proj="gated-gelu"))
    wo = sum(b.layer[1].DenseReluDense.wo.weight.numel() for b in t5.encoder.block)
    assert counting.text_quant_kept(t5) == counting.sdnq_kept(t5) - t5.shared.weight.numel() + wo  # embedding once
    flux = profiles.profile_builtin("flux")
    kept = flux.text_quant_kept["text_encoder_2"]
    assert 1.0e9 < kept < 1.2e9  # 24 x 10240 x 4096 wo weights, the 32128 x 4096 embedding, norms
    i8 = host_mod.kept_bytes(flux, MemorySettings(dtype="float32", quantize="int8"))["text_encoder_2"]
    n = flux.params["text_encoder_2"]
    assert i8 == int((n - kept) * memory.QUANTIZED_BYTES["int8"] + kept * 4)
    old = replace(flux, text_quant_kept={})  # a stored profile without the count: the embedding alone
    old_i8 = host_mod.kept_bytes(old, MemorySettings(dtype="float32", quantize="int8"))["text_encoder_2"]
    assert old_i8 < i8 - 2.5 * GiB  # 1.0 B wo weights at 4 bytes, not ~1


def test_a_component_loaded_at_its_file_dtype_stays_mapped_and_a_gpu_job_holds_one_at_a_time():
    sd15 = profiles.profile_builtin("sd15")  # published checkpoints: 2 bytes a weight
    assert host_mod.mapped(sd15, MemorySettings(dtype="float16"), "unet")
    assert not host_mod.mapped(sd15, MemorySettings(dtype="float32"), "unet")
    assert not host_mod.mapped(sd15, MemorySettings(dtype="float16", quantize="int8"), "unet")
    gpu = host_mod.host_estimate(sd15, MemorySettings(dtype="float16"), "cuda", 512, 512, 1)
    assert gpu.weights_bytes == host_mod.profile_file_bytes(sd15, "unet")  # the largest, while it moves


def test_pinned_copies_double_the_denoiser_group_offload_streams_from_ram():
    flux = profiles.profile_builtin("flux")
    s = MemorySettings(dtype="bfloat16", offload="group")
    pinned = host_mod.host_estimate(flux, s, "cuda", 1024, 1024, 1, pinned=True)
    plain = host_mod.host_estimate(flux, s, "cuda", 1024, 1024, 1, pinned=False)
    den = host_mod.kept_bytes(flux, s)["transformer"]
    assert pinned.pinned_bytes == den and plain.weights_bytes > den  # the text encoders stream unpinned
    assert pinned.run_bytes - plain.run_bytes == den


# ------------------------------------------------------------------------------------- planner


def _cpu(ram: str):
    return replace(device_mod.fake(0, kind="cpu"), host=simulated_host(ram))


@pytest.mark.parametrize("ram, expected", [("32GiB", "cpu"), ("12GiB", "cpu+half"),
                                           # 16-bit weights fit once the text encoders leave before the UNet runs
                                           ("8GiB", "cpu+half+te-reload"), ("6GiB", "cpu+int8"),
                                           ("5GiB", "cpu+int8+te-reload"), ("4GiB", "cpu+int4+te-reload")])
def test_on_a_cpu_the_planner_picks_the_fastest_candidate_whose_host_peak_fits(ram, expected):
    result = plan(_cpu(ram), profiles.profile_builtin("sdxl"), 512, 512, 1, load_presets())
    assert result.preset.name == expected and not result.refusal
    chosen = next(e for e in result.estimates if e.name == expected)
    assert chosen.fits_host and chosen.host_peak_bytes <= simulated_host(ram).usable_bytes
    faster = [e for e in result.estimates if e.est_seconds_per_step < chosen.est_seconds_per_step and not e.lossy]
    assert all(not e.fits_host for e in faster)


def test_nothing_fits_the_ram_gives_one_sentence_with_what_it_needs_what_there_is_and_what_would_fit():
    result = plan(_cpu("2GiB"), profiles.profile_builtin("sdxl"), 512, 512, 1, load_presets())
    assert result.refusal.startswith("SDXL at 512x512 needs about ")
    assert "this machine has 2.0 GiB (simulated)" in result.refusal
    assert "\n" not in result.refusal and result.refusal.count(";") == 2


def test_a_forced_quantize_none_that_does_not_fit_names_the_quantization_that_would():
    sdxl = profiles.profile_builtin("sdxl")
    assert plan(_cpu("12GiB"), sdxl, 512, 512, 1, load_presets(), quantize_forced=True).preset.name == "cpu+half"
    # 8 GiB hold its 16-bit weights with the text encoders reloaded per job (cpu+half+te-reload); 7 GiB do not
    assert plan(_cpu("8GiB"), sdxl, 512, 512, 1, load_presets(), quantize_forced=True).preset.name == \
        "cpu+half+te-reload"
    # 7 GiB do not: its weights stay in the files (the last rung, lossless as the user asked, and slow)
    assert plan(_cpu("7GiB"), sdxl, 512, 512, 1, load_presets(), quantize_forced=True).preset.name == \
        "cpu+half+disk"
    # a single file (converted as it loads: no +disk) names the quantization that would fit
    result = plan(_cpu("7GiB"), sdxl, 512, 512, 1, load_presets(), quantize_forced=True, reloadable=False)
    assert "--quantize int8 would fit" in result.refusal


def test_cpu_flag_runs_on_the_cpu_with_the_weights_the_ram_allows():
    from lowvram_gen.presets import find_preset

    result = plan(_cpu("12GiB"), profiles.profile_builtin("sdxl"), 512, 512, 1, load_presets(),
                  forced=find_preset("cpu"))
    assert result.preset.name == "cpu+half" and result.reason.startswith("forced by the user: cpu")


def test_gpu_plan_for_flux_with_16_gib_of_ram_picks_a_candidate_under_it():
    dev = replace(device_mod.simulated("8GiB"), host=simulated_host("16GiB"))
    result = plan(dev, profiles.profile_builtin("flux"), 1024, 1024, 1, load_presets())
    chosen = next(e for e in result.estimates if e.name == result.preset.name)
    assert not result.refusal and chosen.fits and chosen.fits_host
    assert chosen.host_peak_bytes < 16 * GiB
    assert any(e.fits and not e.fits_host for e in result.estimates)  # what VRAM alone would have picked
    rows = {e.name: e for e in result.estimates}
    assert all(rows[p.name].fits_host for p in result.ladder if p.name in rows)  # no rung the RAM cannot hold


def test_unknown_ram_changes_nothing():
    dev = device_mod.simulated("8GiB")
    assert dev.host is None
    result = plan(dev, profiles.profile_builtin("flux"), 1024, 1024, 1, load_presets())
    assert not result.refusal and all(e.fits_host for e in result.estimates)


def test_plan_cli_json_has_the_host_peak_of_every_candidate_and_the_sentence(capsys):
    from lowvram_gen.cli.main import main

    assert main(["plan", "--vram", "8GiB", "--ram", "16GiB", "--model", "flux", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    chosen = next(p for p in data["presets"] if p["name"] == data["preset"])
    assert chosen["host_peak_bytes"] < 16 * GiB and chosen["fits_host"] and not data["refusal"]
    # on a CPU with 8 GiB FLUX.1 runs only with its weights left in their files (the last rung), with 4 not at all
    assert main(["plan", "--ram", "8GiB", "--model", "flux"]) == 0
    out = capsys.readouterr().out
    assert "would run: cpu+half+disk" in out and "read from disk as the layers run" in out
    assert main(["plan", "--ram", "4GiB", "--model", "flux"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("would not run: ")]
    assert len(lines) == 1 and "FLUX.1-dev" in lines[0] and "this machine has 4.0 GiB" in lines[0]


# ------------------------------------------------------------------------- refusal before loading


def test_generate_that_does_not_fit_the_ram_exits_2_before_loading(tmp_path, capsys, monkeypatch):
    from lowvram_gen import session as session_mod
    from lowvram_gen.cli.main import main

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded although the plan does not fit the RAM")

    monkeypatch.setattr(session_mod, "load", no_load)
    code = main(["generate", "a red fox", "--width", "64", "--height", "64", "--steps", "1", "--ram-budget", "64MiB",
                 "--outdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "needs about" in err and "of system RAM" in err and "this machine has 64 MiB usable" in err
    assert not list(tmp_path.rglob("*.png"))


def test_a_batch_records_a_line_that_does_not_fit_as_failed_and_goes_on(tmp_path):
    from lowvram_gen.batch import manifest as bm
    from lowvram_gen.batch.command import run_batch
    from lowvram_gen.session import Session

    prompts = tmp_path / "p.txt"
    prompts.write_text("first\nsecond\n")
    outdir = tmp_path / "out"
    session = Session(device="cpu", ram_budget=64 * MiB, outdir=str(outdir))
    code = run_batch(prompts, outdir, {"model": "tiny", "width": 64, "height": 64, "steps": 1}, {"device": "cpu"},
                     session=session)
    records = bm.read_records(bm.current_manifests(outdir))
    assert code != 0 and [r["status"] for r in records] == ["failed", "failed"]
    assert all("of system RAM" in r["error"] for r in records)


# ----------------------------------------------------------------------------------- half storage


@pytest.fixture(scope="module")
def tiny_fp16(tiny_path, tmp_path_factory):
    """The tiny model saved as the published SD checkpoints are: fp16 safetensors."""
    import torch
    from diffusers import StableDiffusionPipeline

    folder = tmp_path_factory.mktemp("fp16") / "tiny-fp16"
    StableDiffusionPipeline.from_pretrained(tiny_path, dtype=torch.float16).save_pretrained(folder)
    return folder


def _cpu_presets(tmp_path, half: bool, extra: str = "") -> Path:
    folder = tmp_path / (("half" if half else "plain") + ("-extra" if extra else ""))
    folder.mkdir()
    from lowvram_gen.presets import presets_dir

    text = (presets_dir() / "cpu.toml").read_text()
    (folder / "cpu.toml").write_text(text.replace("[memory]\n", f"[memory]\nhalf_storage = {str(half).lower()}\n{extra}"))
    return folder


def test_half_storage_gives_the_float32_image_from_16_bit_weights(tiny_fp16, tmp_path):
    import numpy as np
    import torch
    from PIL import Image

    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    images = {}
    for half in (False, True):
        session = Session(device="cpu", presets_dir=str(_cpu_presets(tmp_path, half)), outdir=str(tmp_path / "out"))
        result = session.generate(GenerationRequest(prompt="a fox", model=str(tiny_fp16), width=64, height=64,
                                                    steps=2, seed=3))
        images[half] = np.asarray(Image.open(result.images[0]))
        unet = session.model.pipe.unet
        weights = {p.dtype for n, p in unet.named_parameters() if n.endswith("conv1.weight")}
        assert weights == ({torch.float16} if half else {torch.float32})
        assert session.model.dtype == ("float16" if half else "float32")
    assert np.array_equal(images[False], images[True])


@pytest.mark.skipif(not procmaps.HAS_MAPS, reason="reads Linux's /proc/self/maps")
def test_half_storage_keeps_the_weights_in_the_files_pages_through_a_job(tiny_fp16, tmp_path):
    """Issue 17: diffusers' layerwise casting casts each layer back to a fresh 16-bit copy after its forward,
    so after one step every weight was anonymous memory (real-size SDXL's cpu+half held 9.0 GiB of it for
    6.4 GiB of weights) and the kernel could only kill. After a whole job the UNet's cast layers still point
    into the safetensors file's map (clean pages the kernel can drop and read again)."""
    import torch

    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    session = Session(device="cpu", presets_dir=str(_cpu_presets(tmp_path, True)), outdir=str(tmp_path / "out"))
    session.generate(GenerationRequest(prompt="a fox", model=str(tiny_fp16), width=64, height=64, steps=2, seed=3))
    unet = session.model.pipe.unet
    ranges = procmaps.mapped_ranges(tiny_fp16 / "unet" / "diffusion_pytorch_model.safetensors")
    assert ranges, "the UNet's file is not mapped"
    cast = [m.weight for m in unet.modules()
            if getattr(m, "_diffusers_hook", None) is not None and m._diffusers_hook.get_hook("layerwise_casting")]
    assert cast and all(w.dtype == torch.float16 for w in cast)
    outside = [w for w in cast if not procmaps.inside(w, ranges)]
    assert not outside, f"{len(outside)} of {len(cast)} cast layers hold a copy instead of the file's pages"


def test_a_preset_with_paged_weights_runs_as_written_from_the_files_pages(tiny_fp16, tmp_path):
    """paged_weights changes what the planner counts, not what runs: a cpu preset written with it (half storage,
    no pinned copies) gives the float32 image, and its weights stay the file's pages."""
    import numpy as np
    from PIL import Image

    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    images = {}
    for extra in ("", "paged_weights = true\npin_memory = false\n"):
        session = Session(device="cpu", presets_dir=str(_cpu_presets(tmp_path, bool(extra), extra)),
                          outdir=str(tmp_path / "out"))
        result = session.generate(GenerationRequest(prompt="a fox", model=str(tiny_fp16), width=64, height=64,
                                                    steps=2, seed=3))
        images[bool(extra)] = np.asarray(Image.open(result.images[0]))
    assert session.runner.applied.paged_weights and session.runner.applied.half_storage
    ranges = procmaps.mapped_ranges(tiny_fp16 / "unet" / "diffusion_pytorch_model.safetensors")
    assert procmaps.inside(session.model.pipe.unet.conv_in.weight, ranges)
    assert np.array_equal(images[False], images[True])


def test_half_files_are_what_a_folder_stores():
    assert host_mod.half_files(profiles.profile_builtin("sdxl"))  # the published checkpoints
    sd15 = profiles.profile_builtin("sd15")
    fp32 = replace(sd15, file_bytes={"unet": sd15.params["unet"] * 4})
    assert not host_mod.half_files(fp32)
    assert host_mod.kept_bytes(sd15, MemorySettings(dtype="float32", half_storage=True))["unet"] == sd15.params["unet"] * 2


def test_the_file_dtype_is_read_from_the_safetensors_header(tiny_fp16, tiny_path, tmp_path):
    import torch
    from safetensors.torch import save_file

    from lowvram_gen.models.filedtype import half_dtype

    assert half_dtype(tiny_fp16) == "float16"
    single = tmp_path / "bf16.safetensors"
    save_file({"a": torch.zeros(2, dtype=torch.bfloat16), "b": torch.zeros(2, dtype=torch.bfloat16)}, single)
    assert half_dtype(single) == "bfloat16"
    assert half_dtype(tmp_path / "missing.safetensors") == "float16"


# ----------------------------------------------------------------------------------- cpu bfloat16


@pytest.mark.parametrize("flags, native", [("fpu sse avx2 fma", False), ("fpu avx512f avx512_bf16", True),
                                           ("fpu avx512f amx_bf16 amx_tile", True), ("fpu avx512f avx512bw", False)])
def test_native_bfloat16_is_read_from_the_cpu_flags(tmp_path, monkeypatch, flags, native):
    monkeypatch.delenv("LOWVRAM_GEN_CPU_BF16")  # the suite pins it (conftest): here the flags decide
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert device_mod.cpu_native_bf16(str(cpuinfo)) is native


@pytest.mark.parametrize("value, flags, native", [("0", "avx512_bf16", False), ("1", "avx2", True),
                                                  ("yes", "avx512_bf16", True), ("yes", "avx2", False)])
def test_lowvram_gen_cpu_bf16_overrides_the_flags(tmp_path, monkeypatch, caplog, value, flags, native):
    """0 keeps float32 on a bf16 CPU (the user prefers full precision), 1 offers bf16 where a VM hides the
    flags; anything else is said once and the flags decide."""
    monkeypatch.setenv("LOWVRAM_GEN_CPU_BF16", value)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"flags\t\t: fpu {flags}\n")
    assert device_mod.cpu_native_bf16(str(cpuinfo)) is native
    assert ("neither 0 nor 1" in caplog.text) is (value == "yes")


def test_a_cpu_with_native_bfloat16_computes_in_it_and_one_without_never_does():
    sd15 = profiles.profile_builtin("sd15")
    with_bf16 = replace(_cpu("32GiB"), bf16=True)
    result = plan(with_bf16, sd15, 512, 512, 1, load_presets())
    assert result.preset.name == "cpu+bf16" and result.preset.memory.dtype == "bfloat16"
    without = plan(replace(_cpu("32GiB"), bf16=False), sd15, 512, 512, 1, load_presets())
    assert without.preset.name == "cpu" and all("bf16" not in e.name for e in without.estimates)


def test_the_reason_for_a_cpu_variant_is_its_real_one():
    """Issue 29 item 9: where float32 fits the RAM, a faster variant is picked for its speed, and the plan must not
    say that float32 did not fit (it said so with any --ram, even 1000 TB); where it does not fit, it says so."""
    sd15 = profiles.profile_builtin("sd15")
    roomy = plan(replace(_cpu("1000TB"), bf16=True), sd15, 512, 512, 1, load_presets())
    assert roomy.preset.name == "cpu+bf16"
    assert "estimated faster than float32, which fits" in roomy.reason and "needs more than" not in roomy.reason
    tight = plan(replace(_cpu("6GiB"), bf16=True), sd15, 512, 512, 1, load_presets())
    assert tight.preset.name != "cpu" and "the whole pipeline in float32 needs more than" in tight.reason


def test_a_single_file_quantizes_its_unet_as_it_loads_but_not_its_text_encoders_and_the_plan_counts_it():
    """A single .safetensors checkpoint with int8: its UNet is quantized as it loads, through its own class's
    from_single_file (models/checkpoint.py); its text encoders, built by diffusers from the file's keys with no
    from_pretrained for sdnq to hook into, load whole at the dtype and are quantized after. Its load peak: the
    UNet at its int8 bytes plus sdnq's scratch (its largest layer in float32, thrice), the text encoder and
    the VAE at float32. Below the whole float32 pipeline, above the folder's (whose text encoder is int8 too)."""
    sd15 = profiles.profile_builtin("sd15")
    s = MemorySettings(dtype="float32", quantize="int8")
    folder = host_mod.host_estimate(sd15, s, "cpu", 256, 256, 1)
    single = host_mod.host_estimate(sd15, s, "cpu", 256, 256, 1, single_file=True)
    full = host_mod.kept_bytes(sd15, MemorySettings(dtype="float32"))
    int8 = host_mod.kept_bytes(sd15, s)
    scratch = int(host_mod.QUANTIZE_LOAD_TRANSIENT * sd15.largest_layer["unet"] * 4)
    assert single.load_bytes == int8["unet"] + scratch + full["text_encoder"] + full["vae"] + host_mod.BASELINE_BYTES
    assert folder.load_bytes < single.load_bytes < sum(full.values()) + host_mod.BASELINE_BYTES
    assert single.phase == "load" and folder.peak_bytes < single.peak_bytes
    between = (folder.peak_bytes + single.peak_bytes) // 2  # the folder's int8 fits, the file's does not
    dev = replace(_cpu("1GiB"), host=replace(simulated_host("1GiB"), total_bytes=between, available_bytes=between))
    presets = {n: replace(p, memory=p.memory.with_quantize("int8")) for n, p in load_presets().items()}  # --quantize
    kept = plan(dev, sd15, 256, 256, 1, presets, quantize_forced=True)
    assert kept.preset.memory.quantize == "int8" and not kept.refusal
    refused = plan(dev, sd15, 256, 256, 1, presets, quantize_forced=True, reloadable=False, single_file=True)
    assert refused.refusal.startswith("SD 1.5 at 256x256 needs about")


def test_a_single_files_flux_transformer_loads_whole_before_it_is_quantized():
    """SD3 / Flux single files keep the post-load way (models/checkpoint.DENOISERS: diffusers' converters assume
    the real widths, so no tiny file tests the while-loading path): the transformer is whole at the dtype too."""
    flux = profiles.profile_builtin("flux")
    s = MemorySettings(dtype="bfloat16", quantize="int8")
    single = host_mod.host_estimate(flux, s, "cpu", 512, 512, 1, single_file=True)
    full = sum(host_mod.kept_bytes(flux, MemorySettings(dtype="bfloat16")).values())
    assert full + host_mod.BASELINE_BYTES < single.load_bytes < full * 1.05 + host_mod.BASELINE_BYTES


# ------------------------------------------------------------------- the last rung: weights left on disk


def test_paged_weights_leave_the_peak_and_show_in_an_unlimited_runs_rss():
    """settings.paged_weights: what stays in the files' pages (the mapped components, less a text encoder's
    embeddings, which half storage casts to float32) is out of the must-fit peak, and in the RSS."""
    sdxl = profiles.profile_builtin("sdxl")
    s = MemorySettings(dtype="float32", half_storage=True)
    kept = host_mod.host_estimate(sdxl, s, "cpu", 512, 512, 1)
    paged = host_mod.host_estimate(sdxl, replace(s, paged_weights=True, pin_memory=False), "cpu", 512, 512, 1)
    in_files = host_mod.paged(sdxl, s, host_mod.kept_bytes(sdxl, s))
    assert set(in_files) == {"unet", "vae", "text_encoder", "text_encoder_2"}
    assert in_files["unet"] == host_mod.profile_file_bytes(sdxl, "unet")
    emb = sdxl.largest_layer["text_encoder_2"]
    assert in_files["text_encoder_2"] == host_mod.profile_file_bytes(sdxl, "text_encoder_2") - emb * 2
    assert paged.paged_bytes == sum(in_files.values())
    assert kept.run_bytes - paged.run_bytes == paged.paged_bytes - host_mod.PAGED_WORKING_SET
    assert paged.rss_peak_bytes == kept.run_bytes + host_mod.PAGED_WORKING_SET


def test_a_folders_profile_knows_its_files_16_bit_dtype(tiny_fp16, tiny_path):
    """Which 16-bit dtype a folder stores decides whether a bfloat16 load keeps it mapped (float16 files are
    converted): read from the denoiser's safetensors header; float32 files and config-only folders say ''."""
    assert profiles.profile_from_folder(tiny_fp16).file_dtype == "float16"
    assert host_mod.can_page(profiles.profile_from_folder(tiny_fp16), MemorySettings(dtype="float16"))
    assert not host_mod.can_page(profiles.profile_from_folder(tiny_fp16), MemorySettings(dtype="bfloat16"))
    assert profiles.profile_from_folder(profiles.CONFIGS / "sdxl").file_dtype == ""


def test_only_weights_loaded_at_their_files_dtype_can_stay_in_the_files():
    sdxl, flux = profiles.profile_builtin("sdxl"), profiles.profile_builtin("flux")  # float16 and bfloat16 files
    assert host_mod.can_page(sdxl, MemorySettings(dtype="float32", half_storage=True))
    assert host_mod.can_page(sdxl, MemorySettings(dtype="float16"))
    assert not host_mod.can_page(sdxl, MemorySettings(dtype="bfloat16"))  # converted as it loads
    assert not host_mod.can_page(sdxl, MemorySettings(dtype="float32"))
    assert not host_mod.can_page(sdxl, MemorySettings(dtype="float16", quantize="int8"))
    assert host_mod.can_page(flux, MemorySettings(dtype="bfloat16"))
    assert not host_mod.can_page(flux, MemorySettings(dtype="float16"))
    bf16_folder = replace(sdxl, file_dtype="bfloat16")  # as read from a folder's safetensors header
    assert host_mod.can_page(bf16_folder, MemorySettings(dtype="bfloat16"))


def test_on_a_cpu_the_last_rung_leaves_the_weights_in_their_files_and_only_when_nothing_else_fits():
    from lowvram_gen.planning.planner import DISK_BYTES_PER_S

    sdxl = profiles.profile_builtin("sdxl")
    result = plan(_cpu("3GiB"), sdxl, 512, 512, 1, load_presets())
    assert result.preset.name == "cpu+half+disk" and not result.refusal
    assert result.preset.memory.paged_weights and not result.preset.memory.pin_memory
    rows = {e.name: e for e in result.estimates}
    chosen = rows["cpu+half+disk"]
    assert chosen.fits_host and all(not e.fits_host for n, e in rows.items() if "+disk" not in n)
    unet = host_mod.profile_file_bytes(sdxl, "unet")
    assert chosen.timing["disk_read_seconds_per_step"] == pytest.approx(unet / DISK_BYTES_PER_S, rel=1e-4)
    assert chosen.est_seconds_per_step > rows["cpu+half"].est_seconds_per_step
    assert any("read from disk as the layers run" in w for w in result.warnings)
    for ram in ("4GiB", "32GiB"):  # something else fits: no candidate leaves its weights on disk
        assert not any("+disk" in e.name for e in plan(_cpu(ram), sdxl, 512, 512, 1, load_presets()).estimates)


def test_on_a_gpu_the_last_rung_streams_from_the_files_without_pinned_copies():
    sdxl = profiles.profile_builtin("sdxl")
    dev = replace(device_mod.simulated("4GiB"), host=simulated_host("3GiB"))
    result = plan(dev, sdxl, 1024, 1024, 1, load_presets())
    assert not result.refusal and "+disk" in result.preset.name
    assert result.preset.memory.offload in ("group", "sequential", "budget") and not result.preset.memory.pin_memory
    rows = {e.name: e for e in result.estimates}
    assert all("+disk" in p.name and rows.get(p.name, rows[result.preset.name]).fits_host for p in result.ladder)
    chosen = rows[result.preset.name]
    # what a step reads from disk is at most what it streams: the resident part stays on the card
    assert 0 < chosen.timing["disk_read_seconds_per_step"] * 500e6 <= chosen.streamed_bytes_per_step * (1 + 1e-6)
    # model offload moves whole components into RAM copies: never a +disk candidate
    assert not any(n.startswith(("medvram", "highvram")) and "+disk" in n for n in rows)


def test_paged_weights_need_pinning_off():
    with pytest.raises(PresetError, match="pin_memory = false"):
        MemorySettings(paged_weights=True).check()
    MemorySettings(paged_weights=True, pin_memory=False).check()


def test_a_forced_streaming_preset_drops_its_pinned_copies_when_they_do_not_fit():
    from lowvram_gen.presets import find_preset

    flux = profiles.profile_builtin("flux")
    lowvram = find_preset("lowvram").memory
    kept = host_mod.host_estimate(flux, lowvram.with_quantize("int4"), "cuda", 1024, 1024, 1, pinned=False)
    pinned = host_mod.host_estimate(flux, lowvram.with_quantize("int4"), "cuda", 1024, 1024, 1, pinned=True)
    between = (kept.peak_bytes + pinned.peak_bytes) // 2  # fits without the pinned copies, not with them
    dev = replace(device_mod.simulated("8GiB"), host=replace(simulated_host("1GiB"), total_bytes=between,
                                                             available_bytes=between))
    import dataclasses

    forced = dataclasses.replace(find_preset("lowvram"), memory=lowvram.with_quantize("int4"))
    result = plan(dev, flux, 1024, 1024, 1, load_presets(), forced=forced, quantize_forced=True)
    assert not result.refusal and result.preset.name == "lowvram+unpinned"
    assert result.preset.memory.pin_memory is False


# ------------------------------------------------------------------------------------- allocator


def test_loading_runs_with_glibc_handing_freed_memory_back_and_trims_after(tiny_path, monkeypatch):
    """glibc keeps freed heap blocks (its mmap threshold grows as big blocks are freed), so a load that
    converts tensor by tensor ratchets up: the real-size SDXL int8 load kept 14.0 GiB of 3.4 GiB of weights.
    The load sets a small fixed mmap threshold, and afterwards glibc's upper bound and a trim."""
    from lowvram_gen.hardware import hostmem
    from lowvram_gen.models import loading
    from lowvram_gen.models.resolve import resolve

    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append(("mallopt", param, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))
            return 1

    monkeypatch.setattr(hostmem, "_glibc", lambda: FakeLibc())
    real_folder = loading._from_folder
    monkeypatch.setattr(loading, "_from_folder", lambda *a, **k: calls.append(("load",)) or real_folder(*a, **k))
    loading.load(resolve("tiny"), "float32")
    assert calls == [("mallopt", -3, hostmem.LOAD_MMAP_THRESHOLD), ("mallopt", -1, hostmem.LOAD_MMAP_THRESHOLD),
                     ("load",), ("mallopt", -3, hostmem.RUN_MMAP_THRESHOLD), ("trim", 0)]


def test_the_real_glibc_is_found_on_linux():
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system")
    from lowvram_gen.hardware import hostmem

    libc = hostmem._glibc()
    assert libc is not None and libc.mallopt(-3, hostmem.RUN_MMAP_THRESHOLD) == 1


def test_processes_of_one_launch_share_the_ram(tmp_path, monkeypatch):
    """`accelerate launch` on one machine starts a process per GPU, each loading its own model: each may
    plan with its share of what is free, not all of it."""
    root = fake_root(tmp_path, 64, 40)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    host = probe_host(root=root)
    assert host.available_bytes == 10 * GiB and "shared by 4 processes" in host.limit_source
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert probe_host(root=root).available_bytes == 40 * GiB


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_t5_loaded_in_float16_keeps_its_wo_in_float32_and_the_estimates_count_it(tmp_path, dtype):
    """transformers keeps T5's `_keep_in_fp32_modules` (`wo`) in float32 when the rest loads in float16 (T5
    overflows there): 1.0 B of T5-XXL's parameters at 4 bytes, which neither the VRAM nor the host estimate
    counted (1.9 GiB for FLUX.1's T5). `text_encoder_bytes` is the one count both use; checked here against
    the bytes a tiny T5 really holds after `from_pretrained` at each dtype."""
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)).save_pretrained(
        tmp_path / "t5")
    loaded = T5EncoderModel.from_pretrained(tmp_path / "t5", torch_dtype=getattr(torch, dtype))
    held = sum(p.numel() * p.element_size() for p in {id(p): p for p in loaded.parameters()}.values())
    meta = T5EncoderModel(T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4))
    profile = profiles.ModelProfile(arch="custom", params={"text_encoder_2": sum(p.numel() for p in meta.parameters())},
                                  text_fp32_kept={"text_encoder_2": counting.text_fp32_kept(meta)})
    assert counting.text_fp32_kept(meta) == 2 * 64 * 32  # the two layers' wo
    assert memory.text_encoder_bytes(profile, "text_encoder_2", dtype) == held
    if dtype == "float16":
        assert held > profile.params["text_encoder_2"] * 2  # the float32 wo is there


def test_the_flux_profile_counts_t5s_float32_wo_in_a_float16_plan():
    flux = profiles.profile_builtin("flux")
    t5 = flux.params["text_encoder_2"]
    assert flux.text_fp32_kept["text_encoder_2"] == 24 * 10240 * 4096
    assert memory.text_encoder_bytes(flux, "text_encoder_2", "float16") == (t5 - 24 * 10240 * 4096) * 2 + 24 * 10240 * 4096 * 4
    assert memory.text_encoder_bytes(flux, "text_encoder_2", "bfloat16") == t5 * 2
    settings = MemorySettings(dtype="float16", offload="model")
    assert host_mod.kept_bytes(flux, settings)["text_encoder_2"] == memory.text_encoder_bytes(flux, "text_encoder_2",
                                                                                         "float16")


# ------------------------------------------------------------------------- the check for NaN after the load


def test_the_nan_check_after_the_load_holds_isfinites_temporaries_of_one_chunk():
    """models/checkpoint.check_finite runs torch.isfinite over each weight after the load: 7 bytes a weight of a
    float32 tensor, 5 of a 16-bit one (measured, CHECK_FINITE_BYTES), CHECK_FINITE_CHUNK weights at a time. Whole,
    Z-Image's float32 Qwen3 embedding (151936 x 2560, at int8 on a CPU) held 2.5 GiB over every weight, the job's
    peak (the scaled folder: 6.13 GiB where the plan said 5.15); in chunks, 112 MB."""
    from lowvram_gen.models import checkpoint

    assert host_mod.CHECK_FINITE_CHUNK == checkpoint.CHECK_FINITE_CHUNK == 1 << 24
    z = profiles.profile_builtin("z-image")
    assert z.largest_layer["text_encoder"] == 151936 * 2560 > host_mod.CHECK_FINITE_CHUNK
    s = MemorySettings(dtype="float32", quantize="int8")
    kept = host_mod.kept_bytes(z, s)
    assert host_mod._check_finite_peak(z, s, kept) == (sum(kept.values()) + (1 << 24) * 7, 0)
    small = replace(z, largest_layer={name: 1000 for name in z.largest_layer})
    assert host_mod._check_finite_peak(small, s, kept) == (sum(kept.values()) + 1000 * 7, 0)
    est = host_mod.host_estimate(z, s, "cpu", 512, 512, 1)
    assert est.load_bytes >= host_mod.BASELINE_BYTES + sum(kept.values()) + (1 << 24) * 7


def test_the_nan_check_of_a_mapped_component_reads_its_file_pages_beside_the_temporaries():
    """Qwen-Image in bfloat16 from its bf16 files: every weight stays mapped, so what must fit at the check is the
    converted nothing plus one chunk's temporaries (5 bytes a weight), and the text encoder's pages, which the
    check reads, show on top in an unlimited run's RSS."""
    q = profiles.profile_builtin("qwen-image")
    s = MemorySettings(dtype="bfloat16", half_storage=True)
    assert all(host_mod.mapped(q, s, n) for n in q.params)
    assert host_mod._check_finite_transient(q, s) == ((1 << 24) * 5, "text_encoder")
    kept = host_mod.kept_bytes(q, s)
    assert host_mod._check_finite_peak(q, s, kept) == ((1 << 24) * 5, host_mod.profile_file_bytes(q, "text_encoder"))


def test_the_nan_check_skips_a_quantized_denoisers_layers_and_counts_reloaded_encoders():
    z = profiles.profile_builtin("z-image")
    s = MemorySettings(dtype="float32", quantize="int8")
    tiny = replace(z, largest_layer={"text_encoder": 1000, "transformer": 5000, "vae": 10})
    # int8 layers are not floating: the check skips them, so the largest it meets is the embedding sdnq leaves
    assert host_mod._check_finite_transient(tiny, s) == (1000 * 7, "text_encoder")
    assert host_mod._check_finite_transient(tiny, MemorySettings(dtype="float32")) == (5000 * 7, "transformer")
    # text encoders reloaded per job: the whole pipeline is checked again once they are back
    reloaded = host_mod.host_estimate(z, replace(s, text_encoders="reloaded"), "cpu", 512, 512, 1)
    assert reloaded.encode_bytes >= reloaded.baseline_bytes + reloaded.weights_bytes + (1 << 24) * 7


def test_check_finite_checks_in_chunks_and_finds_a_nan_in_the_last_one(monkeypatch):
    """The chunked check (models/checkpoint.check_finite) still finds a NaN past the first chunk and counts every
    bad value of the tensor."""
    import torch
    from types import SimpleNamespace

    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.models import checkpoint

    monkeypatch.setattr(checkpoint, "CHECK_FINITE_CHUNK", 7)
    layer = torch.nn.Linear(10, 10)
    checkpoint.check_finite(SimpleNamespace(components={"text_encoder": layer}))  # all finite: no error
    with torch.no_grad():
        layer.weight[9, 8] = float("nan")
        layer.weight[9, 9] = float("inf")
    with pytest.raises(ModelLoadError, match="text_encoder weights contain NaN/Inf: weight has 2 non-finite"):
        checkpoint.check_finite(SimpleNamespace(components={"text_encoder": layer}))


def test_a_t5_file_that_stores_its_tied_embedding_twice_stays_mapped_and_its_whole_file_is_resident():
    """T5's `shared` and `encoder.embed_tokens` are one tensor transformers saves under both names: a bf16 file of
    2.5 bytes a weight (the scaled Chroma folder's). It loads mapped all the same, and every page of the file was
    resident in the measured run (host_peaks.py's Chroma cell): the estimate holds the second copy too."""
    chroma = profiles.profile_builtin("chroma")
    n, emb = chroma.params["text_encoder"], chroma.largest_layer["text_encoder"]
    assert emb == 32128 * 4096
    s = MemorySettings(dtype="bfloat16", half_storage=True)
    once = replace(chroma, file_bytes={**(chroma.file_bytes or {}), "text_encoder": n * 2})
    twice = replace(chroma, file_bytes={**(chroma.file_bytes or {}), "text_encoder": (n + emb) * 2})
    converted = replace(chroma, file_bytes={**(chroma.file_bytes or {}), "text_encoder": n * 4})
    assert host_mod.tied_twice(twice, "text_encoder", 2) == emb * 2 and not host_mod.tied_twice(once, "text_encoder", 2)
    assert host_mod.mapped(twice, s, "text_encoder") and host_mod.mapped(once, s, "text_encoder")
    assert not host_mod.mapped(converted, s, "text_encoder")  # a float32 file is converted, as before
    run_once, run_twice = (host_mod.host_estimate(p, s, "cpu", 512, 512, 1).run_bytes for p in (once, twice))
    assert run_twice - run_once == emb * 2


# ------------------------------------------------------------------------- SANA's decode (issue 30)

HOST_PEAKS = Path(__file__).resolve().parents[1] / "docs" / "bench" / "host_peaks.json"


@pytest.mark.parametrize("cell", ["sana-8g-default"])
def test_sanas_host_peak_counts_its_bin_and_its_dc_ae_decode(cell):
    """benchmarks/host_peaks.py's SANA cell (the scaled folder, 8 GiB, the planner's own pick, 512 px): the plan,
    made again from the profile the planner read of that folder, within 10 % of the run's peak RSS. It was 26 % low:
    SanaPipeline decodes at its resolution bin (1024 x 1024 for a square job; the image is resized to 512 after)
    and SANA's DC-AE holds 0.37 of the SD VAE's feature where the global coefficient says 0.57 (calibrate_memory.py's
    vae-sana points): the decode held 1.8 GiB where the plan had 0.6."""
    c = json.loads(HOST_PEAKS.read_text())["cells"][cell]
    profile = profiles.ModelProfile.from_dict(c["plan_profile"])
    assert profile.resolution_bins and memory.rendered_size(profile, 512, 512) == (1024, 1024)
    device = replace(device_mod.fake(0, kind="cpu"), host=simulated_host(f"{c['limit_gib']}GiB"), bf16=True)
    result = plan(device, profile, c["size"], c["size"], 1, load_presets())
    assert result.preset.name == c["plan_preset"] == c["child_result"]["preset"]
    chosen = next(e for e in result.estimates if e.name == c["plan_preset"])
    measured = c["peak_rss_bytes"]
    assert abs(chosen.host["rss_peak_bytes"] / measured - 1) <= 0.10, (chosen.host, measured)


def test_on_a_cpu_a_step_with_hidden_states_over_glibcs_mmap_threshold_takes_turns_with_the_decode():
    """The run phase on a CPU: a step whose hidden states are under glibc's mmap threshold leaves its freed blocks in
    the heap and the decode's activations come on top (SD 1.5 at 512 px in float32: 10 MiB); one whose hidden states
    are over it (HiDream at its 1024 x 1024 in float32: 80 MiB, two images with CFG) hands them back to the kernel,
    and the decode takes their place: the larger of the two (the +35 % of host_peaks.py's HiDream int8 cell)."""
    s = MemorySettings(dtype="float32", quantize="int8")
    for key, wide in (("sd15", False), ("hidream", True)):
        p = profiles.profile_builtin(key)
        hidden = host_mod._hidden_state_bytes(p, 512, 512, 2, 4)
        assert (hidden >= host_mod.MMAP_THRESHOLD) == wide, (key, hidden)
        unet = memory.unet_activation_bytes(p, 512, 512, 2, 4, s.attention)
        vae = memory.vae_activation_bytes(p, 512, 512, 1, 4)
        est = host_mod.host_estimate(p, s, "cpu", 512, 512, 1)
        both = max(unet, vae) if wide else unet + vae
        assert est.activation_bytes == int(host_mod.CPU_ACTIVATION_FACTOR * both), key


@pytest.mark.parametrize("cell", ["hidream-8g-int8", "sana-8g-int8", "qwen-image-10g-int8"])
def test_the_int8_cells_what_must_fit_is_within_10_percent(cell):
    """benchmarks/host_peaks.py's int8 cells of the scaled HiDream (half width) and SANA folders at 8 GiB, and of
    Qwen-Image at 10 GiB (killed at 8 GiB before its untied lm_head was counted at 4 bytes a weight), 512 px, the
    planner's own pick with --quantize int8 (float32 compute on the CPU): the plan, made again from the profile the
    planner read of the folder, picks what ran, and what it says must fit is within 10 % of the anonymous peak plus
    the libraries' pages (host_peaks.py's LIB_FILE_PAGES, 0.30 GiB). They were +35 % and +21 %: the step and the
    decode added where HiDream's step freed its tensors to the kernel, and both decodes counted at twice the bf16
    coefficient where a float32 decode holds 1.4x (DC-AE) to 1.9x (the SD VAE) of the bf16 one."""
    c = json.loads(HOST_PEAKS.read_text())["cells"][cell]
    profile = profiles.ModelProfile.from_dict(c["plan_profile"])
    device = replace(device_mod.fake(0, kind="cpu"), host=simulated_host(f"{c['limit_gib']}GiB"), bf16=True)
    presets = {n: replace(p, memory=p.memory.with_quantize("int8")) for n, p in load_presets().items()}
    result = plan(device, profile, c["size"], c["size"], 1, presets, quantize_forced=True)
    assert result.preset.name == c["child_result"]["preset"]
    chosen = next(e for e in result.estimates if e.name == result.preset.name)
    held = c["polled_rss_anon_max_bytes"] + int(0.30 * 2**30)
    assert abs(chosen.host_peak_bytes / held - 1) <= 0.10, (chosen.host, held)
