"""Text encoders that leave RAM between prompts (issue 17's open lever): text_encoders = "reloaded".

The planner offers a `+te-reload` candidate beside one whose host peak does not fit the RAM, for a
diffusers folder only; its host estimate has an encode phase (the encoders beside what the rest keeps)
and load/run phases without them. The end-to-end tests run the tiny SD and Flux folders with the setting:
the same image as with the encoders kept, the encoders gone while the denoiser runs, back for the next job.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lowvram_gen.errors import PresetError
from lowvram_gen.hardware import device as device_mod
from lowvram_gen.hardware.hostmem import simulated_host
from lowvram_gen.models import profile as profiles
from lowvram_gen.planning import host as host_mod
from lowvram_gen.planning.planner import DISK_BYTES_PER_S, plan
from lowvram_gen.presets import load_presets, parse_preset
from lowvram_gen.settings import MemorySettings

GiB = 1024**3


def _cpu(ram: str):
    return replace(device_mod.fake(0, kind="cpu"), host=simulated_host(ram))


def _flux_gpu(vram: str, ram: str):
    return replace(device_mod.simulated(vram), host=simulated_host(ram))


# ------------------------------------------------------------------------------ setting


def test_the_setting_is_kept_by_default_and_validated_in_preset_files():
    assert MemorySettings().text_encoders == "kept"
    base = {"rank": 0, "device": "gpu", "max_pixels": 4096 * 4, "max_batch": 1}
    p = parse_preset("mine", {**base, "memory": {"text_encoders": "reloaded"}}, "mine.toml")
    assert p.memory.text_encoders == "reloaded"
    with pytest.raises(PresetError, match="text_encoders = 'dropped' is not allowed; use one of kept, reloaded"):
        parse_preset("mine", {**base, "memory": {"text_encoders": "dropped"}}, "mine.toml")
    with pytest.raises(PresetError, match="must be text"):
        parse_preset("mine", {**base, "memory": {"text_encoders": True}}, "mine.toml")


# ------------------------------------------------------------------------------ host estimate


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_the_encode_phase_holds_the_encoders_beside_the_rest_and_the_run_phase_is_without_them(quantize):
    flux = profiles.profile_builtin("flux")
    kept = MemorySettings(dtype="bfloat16", offload="none", quantize=quantize)
    reloaded = replace(kept, text_encoders="reloaded")
    a = host_mod.host_estimate(flux, kept, "cuda", 1024, 1024, 1)
    b = host_mod.host_estimate(flux, reloaded, "cuda", 1024, 1024, 1)
    enc = host_mod.kept_bytes(flux, kept)
    encoders = enc["text_encoder"] + enc["text_encoder_2"]
    scratch = 0 if quantize == "none" else int(host_mod.QUANTIZE_LOAD_TRANSIENT * 4 *
                                               host_mod._largest_quantized_layer(flux, "text_encoder_2"))
    # the NaN check once the encoders are back (models/checkpoint.check_finite): one chunk's temporaries, or the
    # quantizing scratch where that is larger
    scratch = max(scratch, host_mod._check_finite_transient(flux, replace(reloaded, text_encoders="kept"))[0])
    assert a.encode_bytes == 0 and b.encode_bytes == b.baseline_bytes + b.weights_bytes + encoders + scratch
    assert b.peak_bytes == max(b.load_bytes, b.run_bytes, b.encode_bytes)
    assert b.phase == {b.load_bytes: "load", b.run_bytes: "run", b.encode_bytes: "encode"}[b.peak_bytes]
    if quantize == "int8":  # offload none: everything converted at once while loading, the encoders among them
        assert a.load_bytes - b.load_bytes >= encoders  # (and the T5 quantizing scratch, if the largest)
        assert b.peak_bytes < a.peak_bytes - 4 * GiB  # T5-XXL int8 (~4.7 GB) no longer on top of the transformer


def test_on_a_cpu_the_run_phase_drops_the_encoders_and_the_encode_phase_has_no_activations():
    sdxl = profiles.profile_builtin("sdxl")
    kept = MemorySettings(dtype="float32")
    a = host_mod.host_estimate(sdxl, kept, "cpu", 512, 512, 1)
    b = host_mod.host_estimate(sdxl, replace(kept, text_encoders="reloaded"), "cpu", 512, 512, 1)
    enc = sum(v for k, v in host_mod.kept_bytes(sdxl, kept).items() if k.startswith("text_encoder"))
    assert a.run_bytes - b.run_bytes == enc
    # the same weights, before any step, and the NaN check's one chunk of temporaries once the encoders are back
    assert b.encode_bytes == a.run_bytes - a.activation_bytes + host_mod._check_finite_transient(sdxl, kept)[0]
    assert b.as_dict()["encode_bytes"] == b.encode_bytes


# ------------------------------------------------------------------------------ planner


def test_the_planner_picks_te_reload_only_where_the_plain_candidate_does_not_fit_the_ram():
    flux = profiles.profile_builtin("flux")
    result = plan(_cpu("16GiB"), flux, 1024, 1024, 1, load_presets())
    assert result.preset.name == "cpu+int4+te-reload" and not result.refusal
    assert result.preset.memory.text_encoders == "reloaded"
    rows = {e.name: e for e in result.estimates}
    assert not rows["cpu+int4"].fits_host and rows["cpu+int4+te-reload"].fits_host
    # never beside a candidate that fits: with the RAM to hold everything, no +te-reload row at all
    roomy = plan(_cpu("256GiB"), flux, 1024, 1024, 1, load_presets())
    assert roomy.preset.name == "cpu" and not any("te-reload" in e.name for e in roomy.estimates)
    # a GPU plan: with 16 GiB of RAM the chosen candidate reloads, with plenty it keeps them
    gpu = plan(_flux_gpu("24GiB", "16GiB"), flux, 1024, 1024, 1, load_presets())
    assert all(("te-reload" in e.name) <= (not rows_fit) for e, rows_fit in
               ((e, {r.name: r for r in gpu.estimates}.get(e.name.replace("+te-reload", ""), e).fits_host)
                for e in gpu.estimates))
    big = plan(_flux_gpu("24GiB", "256GiB"), flux, 1024, 1024, 1, load_presets())
    assert "te-reload" not in big.preset.name and not any("te-reload" in e.name for e in big.estimates)


def test_without_it_the_same_job_is_refused():
    flux = profiles.profile_builtin("flux")
    result = plan(_cpu("16GiB"), flux, 1024, 1024, 1, load_presets(), reloadable=False)
    assert result.refusal and "te-reload" not in result.refusal
    assert not any("te-reload" in e.name for e in result.estimates)


def test_a_single_file_checkpoint_gets_no_te_reload_candidate():
    sdxl = profiles.profile_builtin("sdxl")
    result = plan(_cpu("8GiB"), sdxl, 512, 512, 1, load_presets(), reloadable=False)
    assert result.preset.name == "cpu+int8" and not any("te-reload" in e.name for e in result.estimates)


def test_the_step_estimate_adds_the_encoders_read_from_disk_spread_over_the_steps():
    sdxl = profiles.profile_builtin("sdxl")
    result = plan(_cpu("8GiB"), sdxl, 512, 512, 1, load_presets(), steps=10)
    rows = {e.name: e for e in result.estimates}
    reload_s = host_mod.encoder_file_bytes(sdxl) / DISK_BYTES_PER_S / 10
    assert rows["cpu+half+te-reload"].timing["text_encoder_reload_seconds_per_step"] == pytest.approx(reload_s, rel=1e-4)
    assert rows["cpu+half+te-reload"].est_seconds_per_step == pytest.approx(rows["cpu+half"].est_seconds_per_step
                                                                            + reload_s)


def test_a_forced_preset_that_does_not_fit_reloads_its_encoders_when_that_fits():
    from lowvram_gen.presets import find_preset

    result = plan(_cpu("8GiB"), profiles.profile_builtin("sdxl"), 512, 512, 1, load_presets(), forced=find_preset("cpu"))
    assert result.preset.name == "cpu+half+te-reload" and not result.refusal
    gpu = plan(_flux_gpu("24GiB", "16GiB"), profiles.profile_builtin("flux"), 1024, 1024, 1, load_presets(),
               forced=find_preset("highvram"), quantize_forced=True)
    assert gpu.preset.memory.text_encoders == "reloaded" or gpu.refusal


def test_plan_json_has_the_encode_phase(capsys):
    from lowvram_gen.cli.main import main

    assert main(["plan", "--ram", "16GiB", "--model", "flux", "--cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    chosen = next(p for p in data["presets"] if p["name"] == data["preset"])
    assert data["preset"].endswith("+te-reload") and not data["refusal"]
    assert chosen["host"]["encode_bytes"] > 0 and chosen["host"]["phase"] in ("load", "run", "encode")


# ------------------------------------------------------------------------------ end to end


def _presets_with(tmp_path, text_encoders: str):
    """The shipped cpu preset with `text_encoders` set, in a presets folder of its own."""
    import shutil

    from lowvram_gen.presets import presets_dir

    folder = tmp_path / f"presets-{text_encoders}"
    folder.mkdir()
    text = (presets_dir() / "cpu.toml").read_text()
    text = text.replace("[memory]", f'[memory]\ntext_encoders = "{text_encoders}"')
    (folder / "cpu.toml").write_text(text)
    shutil.copy(presets_dir() / "highvram.toml", folder / "highvram.toml")  # a GPU preset: the loader wants one
    return folder


def _run(path, tmp_path, text_encoders: str, monkeypatch=None, watch=None, prompts=("a red boat",), **kw):
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    session = Session(device="cpu", preset="cpu", presets_dir=str(_presets_with(tmp_path, text_encoders)),
                      outdir=str(tmp_path / f"out-{text_encoders}"))
    results = []
    for prompt in prompts:
        request = GenerationRequest(prompt=prompt, model=str(path), steps=2, width=64, height=64, seed=7, **kw)
        results.append(session.generate(request, on_step=(lambda *_: watch(session)) if watch else None))
    return session, results


def _pixels(result):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(result.images[0]).convert("RGB"), dtype=int)


@pytest.fixture(scope="module")
def tiny_flux(tmp_path_factory):
    from tiny_transformers import build_tiny_flux

    folder = tmp_path_factory.mktemp("tiny-flux-te")
    build_tiny_flux().save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.mark.parametrize("which", ["sd", "flux"])
def test_reloaded_encoders_make_the_same_image_and_are_gone_while_the_denoiser_runs(which, tiny_path, tiny_flux,
                                                                                     tmp_path, monkeypatch):
    from lowvram_gen.models import loading

    path = tiny_path if which == "sd" else tiny_flux
    size = {}
    _, kept = _run(path, tmp_path, "kept", **size)
    loads = []
    real = loading.load_component
    monkeypatch.setattr(loading, "load_component", lambda folder, name, *a, **k: loads.append(name) or
                        real(folder, name, *a, **k))
    seen = []

    def watch(session):  # in a step callback: what the pipeline holds while the denoiser runs
        pipe = session.model.pipe
        seen.append([n for n in pipe.components if n.startswith("text_encoder") and getattr(pipe, n) is not None])

    session, reloaded = _run(path, tmp_path, "reloaded", watch=watch, prompts=("a red boat", "a blue house"), **size)
    assert (_pixels(kept[0]) == _pixels(reloaded[0])).all()
    assert seen and all(names == [] for names in seen)
    encoders = sorted(n for n in session.model.pipe.components if n.startswith("text_encoder"))
    assert encoders and sorted(loads) == sorted(encoders * 2)  # read from disk again for the second prompt
    assert not any(getattr(session.model.pipe, n) is not None for n in encoders)  # and gone after it


def test_a_job_with_loras_or_embeddings_is_not_planned_with_reloaded_encoders():
    from lowvram_gen.networks.job import uses_networks

    assert not uses_networks("a red boat", "blurry")
    assert uses_networks("a red boat <lora:ink:0.8>")
    assert uses_networks("a red boat", loras=["ink:0.5"])
    assert uses_networks("a red boat", "embedding:bad-hands")
