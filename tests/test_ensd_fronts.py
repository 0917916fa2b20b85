"""Issue 31, A1111's "Eta noise seed delta" (ENSD) on every front: the request field `ensd`, `--ensd`, the PNG's
`ENSD: 31337` (written when not 0, read back and used: no "not used" note), the API's
`override_settings.eta_noise_seed_delta` and /options' `eta_noise_seed_delta`, and batch lines (a job without it
keeps its hash). What it does to the noise: tests/test_samplers_a1111_images.py."""

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


def test_the_request_takes_a_whole_number_and_names_a_bad_value():
    assert GenerationRequest().validated().ensd == 0
    assert GenerationRequest(ensd="31337").validated().ensd == 31337
    assert GenerationRequest.from_mapping({"eta_noise_seed_delta": "31337"}).ensd == 31337  # A1111's name of it
    with pytest.raises(InvalidRequest) as bad:
        GenerationRequest(ensd=-1).validated()
    assert "ENSD" in str(bad.value) and "-1" in str(bad.value)


def test_the_png_says_ensd_when_not_0_and_reads_it_back():
    assert "ENSD" not in a1111_fields(GenerationRequest(prompt="a").validated(), "Euler a", 5, "p", (64, 64))
    fields = a1111_fields(GenerationRequest(prompt="a", ensd=31337, clip_skip=2, rng="nv").validated(), "Euler a", 5,
                          "p", (64, 64))
    keys = list(fields)
    assert fields["ENSD"] == 31337 and keys.index("Clip skip") < keys.index("ENSD") < keys.index("RNG")
    read = request_fields({"Steps": "20", "ENSD": "31337"})
    assert read.fields["ensd"] == 31337 and "ENSD" not in read.ignored
    with pytest.raises(InvalidRequest) as bad:
        request_fields({"ENSD": "lots"})
    assert "'ENSD' in the image's parameters" in str(bad.value)


def test_an_a1111_png_with_ensd_reruns_with_it_and_no_unused_note(tmp_path, capsys):
    text = "a fox\nSteps: 1, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, ENSD: 31337"
    out = rerun_with_no_unused_note(text, (64, 64), tmp_path, capsys)
    written, ours = read_png_metadata(out["images"][0])
    assert parse_a1111_parameters(written)["ENSD"] == "31337" and ours["request"]["ensd"] == 31337


def test_cli_flag_reaches_the_png_and_a_bad_one_exits_2(tmp_path, capsys):
    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5", "--sampler",
            "Euler a", "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--ensd", "31337"]) == 0
    made = json.loads(capsys.readouterr().out)["images"][0]
    assert parse_a1111_parameters(read_png_metadata(made)[0])["ENSD"] == "31337"
    assert main([*args, "--ensd", "x"]) == 2
    assert "invalid ENSD: 'x'" in capsys.readouterr().err


def _body(body, ensd=0):
    return map_body(body, "txt2img", "tiny", 1, "out", lambda name: name, ensd=ensd)


def test_api_override_settings_and_options_set_it():
    assert _body({"prompt": "x"}).request.ensd == 0
    assert _body({"prompt": "x"}, ensd=7).request.ensd == 7  # /options' current one
    mapped = _body({"prompt": "x", "override_settings": {"eta_noise_seed_delta": 31337}})
    assert mapped.request.ensd == 31337 and not mapped.warnings and mapped.keep_settings == ()
    kept = _body({"prompt": "x", "override_settings": {"eta_noise_seed_delta": 31337},
                  "override_settings_restore_afterwards": False})
    assert kept.keep_settings == ("ensd",)
    state = ApiState(model="tiny", outdir="out")
    assert state.options()["eta_noise_seed_delta"] == 0
    assert state.set_options({"eta_noise_seed_delta": 31337}) == [] and state.current_ensd() == 31337
    with pytest.raises(InvalidRequest) as bad:
        state.set_options({"eta_noise_seed_delta": -5})
    assert bad.value.field == "eta_noise_seed_delta" and state.current_ensd() == 31337


def test_batch_lines_take_it_and_a_job_without_it_keeps_its_hash(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("--prompt a --eta_noise_seed_delta 31337\n--prompt b\n--prompt c --ensd 5\n")
    jobs = expand(read_entries(path), {"width": "64", "height": "64", "steps": "1", "model": "tiny"})
    assert [j.request.ensd for j in jobs.jobs] == [31337, 0, 5]
    # at 0 it is left out of the hash (tests/test_batch.py rebuilds an old job's hash without it)
    plain = GenerationRequest(prompt="a cat", seed=5).validated()
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5, ensd=31337).validated()) != \
        request_hash("sd", plain)
