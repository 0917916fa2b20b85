"""Issue 31 item 5, the RNG source on every front: the request field, `--rng`, the PNG's `RNG: CPU`/`RNG: NV` (written
as A1111 writes it, read back and used), the API's `override_settings.randn_source` and /options' `randn_source`, and
a batch line's `--randn_source` / `rng`."""

from __future__ import annotations

import json

import pytest

from a1111_png import rerun_with_no_unused_note  # tests/a1111_png.py
from lowvram_gen import GenerationRequest
from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.a1111.infotext import a1111_fields, request_fields
from lowvram_gen.api.state import ApiState
from lowvram_gen.batch.files import expand, read_entries, request_hash
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata


def test_the_request_takes_ours_and_a1111s_words_and_names_a_bad_value():
    assert GenerationRequest().validated().rng == "gpu"
    assert [GenerationRequest(rng=v).validated().rng for v in ("cpu", "NV", "GPU")] == ["cpu", "nv", "gpu"]
    with pytest.raises(InvalidRequest) as bad:
        GenerationRequest(rng="tpu").validated()
    assert str(bad.value) == "invalid rng: 'tpu'; one of gpu, cpu, nv (A1111's GPU, CPU, NV)"
    assert GenerationRequest.from_mapping({"randn_source": "CPU"}).rng == "cpu"  # A1111's name of it


def _fields(request):
    return a1111_fields(request.validated(), "Euler", 5, "p", (64, 64))


def test_the_png_says_rng_only_when_not_gpu_as_a1111_writes_it_and_reads_it_back():
    assert "RNG" not in _fields(GenerationRequest(prompt="a"))
    for ours, word in (("cpu", "CPU"), ("nv", "NV")):
        fields = _fields(GenerationRequest(prompt="a", rng=ours, clip_skip=2))
        assert fields["RNG"] == word
        keys = list(fields)
        assert keys.index("RNG") == keys.index("Clip skip") + 1  # after Clip skip, as in A1111's infotext
        read = request_fields({"Steps": "20", "RNG": word})
        assert read.fields["rng"] == ours and "RNG" not in read.ignored
    with pytest.raises(InvalidRequest) as bad:
        request_fields({"RNG": "TPU"})
    assert "'RNG' in the image's parameters" in str(bad.value) and "gpu, cpu, nv" in str(bad.value)


def test_an_a1111_png_with_rng_nv_reruns_with_no_unused_note(tmp_path, capsys):
    text = "a fox\nSteps: 1, Sampler: Euler, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, RNG: NV"
    out = rerun_with_no_unused_note(text, (64, 64), tmp_path, capsys)
    written = parse_a1111_parameters(read_png_metadata(out["images"][0])[0])
    assert written["RNG"] == "NV"


def test_cli_flag_reaches_the_png_and_a_bad_one_exits_2(tmp_path, capsys):
    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5",
            "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--rng", "cpu"]) == 0
    made = json.loads(capsys.readouterr().out)["images"][0]
    text, ours = read_png_metadata(made)
    assert parse_a1111_parameters(text)["RNG"] == "CPU" and ours["request"]["rng"] == "cpu"
    assert main([*args, "--rng", "tpu"]) == 2
    assert "invalid rng: 'tpu'; one of gpu, cpu, nv" in capsys.readouterr().err


def _body(body, rng="gpu"):
    return map_body(body, "txt2img", "tiny", 1, "out", lambda name: name, rng=rng)


def test_api_override_settings_randn_source_sets_the_job_and_can_be_kept():
    assert _body({"prompt": "x"}).request.rng == "gpu"
    assert _body({"prompt": "x"}, rng="nv").request.rng == "nv"  # /options' current one
    mapped = _body({"prompt": "x", "override_settings": {"randn_source": "NV"}})
    assert mapped.request.rng == "nv" and not mapped.warnings and mapped.keep_settings == ()
    kept = _body({"prompt": "x", "override_settings": {"randn_source": "CPU"},
                  "override_settings_restore_afterwards": False})
    assert kept.request.rng == "cpu" and kept.keep_settings == ("rng",)
    with pytest.raises(InvalidRequest) as bad:
        _body({"prompt": "x", "override_settings": {"randn_source": "TPU"}})
    assert bad.value.field == "override_settings.randn_source" and "gpu, cpu, nv" in bad.value.allowed


def test_api_options_read_and_set_randn_source_in_a1111s_words():
    state = ApiState(model="tiny", outdir="out")
    assert state.options()["randn_source"] == "GPU"
    assert state.set_options({"randn_source": "NV"}) == [] and state.current_rng() == "nv"
    assert state.options()["randn_source"] == "NV"
    with pytest.raises(InvalidRequest) as bad:
        state.set_options({"randn_source": "quantum"})
    assert bad.value.field == "randn_source" and state.current_rng() == "nv"
    state.keep({"rng": "cpu"})  # override_settings not restored
    assert state.options()["randn_source"] == "CPU"


def test_batch_lines_and_the_default_take_it_and_old_job_hashes_stay(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("--prompt a --randn_source NV\n--prompt b\n--prompt c --rng cpu\n--prompt d --rng tpu\n")
    jobs = expand(read_entries(path), {"width": "64", "height": "64", "steps": "1", "model": "tiny", "rng": "cpu"})
    assert [j.request.rng for j in jobs.jobs] == ["nv", "cpu", "cpu"]
    assert [b.line for b in jobs.bad] == [4] and "invalid rng: 'tpu'" in jobs.bad[0].error
    # a job at the default keeps its hash (tests/test_batch.py rebuilds the old one); another source is another job
    plain = GenerationRequest(prompt="a cat", seed=5).validated()
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5, rng="nv").validated()) != \
        request_hash("sd", plain)
