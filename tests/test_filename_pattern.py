"""Issue 32 item 7: A1111's "Images filename pattern" (lowvram_gen/filename_pattern.py): the tags' values and rules,
unknown tags and unsafe characters refused, the numbering and no-overwrite rules of outputs.next_image_path kept,
and the fronts: the request field, `--filename-pattern`, batch lines (a job without it keeps its hash), the API's
`samples_filename_pattern` (override_settings and /options)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.api.state import ApiState
from lowvram_gen.batch.files import expand, read_entries, request_hash
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.filename_pattern import TAGS, check_pattern, decoration, values
from lowvram_gen.outputs import next_image_path

NOW = datetime(2026, 11, 27, 18, 5, 9)


def named(pattern: str, seed: int = 42, index: int = 0, **fields) -> str:
    request = GenerationRequest(**{"prompt": "A red fox, in (snow:1.2)/../ at dusk", "steps": 20, "cfg_scale": 7.5,
                                   "width": 512, "height": 768, **fields}).validated()
    return decoration(pattern, values(request, seed, sampler="DPM++ 2M", model_path="/m/dreamshaper_8.safetensors",
                                      index=index, now=NOW))


def test_each_tag_gives_a1111s_value():
    assert named("[seed]-[steps]-[cfg]-[width]x[height]") == "42-20-7.5-512x768"
    assert named("[model_name] [sampler]") == "dreamshaper_8 DPM++ 2M"  # "+" is allowed: the sampler keeps it
    assert named("[prompt_spaces]") == "a red fox in snow 1 2 at dusk"
    assert named("[prompt]") == "a_red_fox_in_snow_1_2_at_dusk"
    assert named("[date] [datetime] [datetime<%Y%m%d-%H%M>]") == "2026-11-27 20261127180509 20261127-1805"
    assert len(named("[prompt_hash]")) == 8
    long = " ".join(f"w{i}" for i in range(40))
    assert named("[prompt_words]", prompt=long).split() == [f"w{i}" for i in range(30)]  # A1111's 30 words


def test_batch_and_generation_numbers_are_empty_for_one_image():
    assert named("[seed][batch_number][generation_number]") == "42"
    assert named("[batch_number]-[generation_number]", index=3, batch_size=2, batch_count=2) == "2-4"


def test_an_unknown_tag_is_refused_naming_it_and_the_allowed_ones():
    with pytest.raises(InvalidRequest) as bad:
        GenerationRequest(filename_pattern="[seed]-[colour]").validated()
    text = str(bad.value)
    assert "[colour]" in text and all(f"[{tag}]" in text for tag in TAGS)
    for pattern in ("../[seed]", "a/b", "[seed]:x", "[datetime<%Y/%m>]", "[seed<x>]"):
        with pytest.raises(InvalidRequest):
            check_pattern(pattern)
    assert check_pattern("[SEED]-(x)") == "[SEED]-(x)"  # tags in any case, as A1111 reads them


def test_names_keep_the_counter_and_never_overwrite(tmp_path):
    first = next_image_path(tmp_path, 42, "a fox", decoration=named("[seed]-[model_name]"))
    assert first.name == "00000-42-dreamshaper_8.png"
    first.write_bytes(b"x")
    second = next_image_path(tmp_path, 42, "a fox", decoration=named("[seed]-[model_name]"))
    assert second.name == "00001-42-dreamshaper_8.png"
    second.write_bytes(b"x")
    assert next_image_path(tmp_path, 7, "a fox").name == "00002-7-a-fox.png"  # no pattern: today's names
    cut = next_image_path(tmp_path, 1, "", decoration="x" * 400)
    assert len(cut.name.encode()) <= 255 and cut.name.startswith("00002-")  # 00002 was planned, not written
    assert named("[none]") == "" and named("...-") == ""  # nothing left: the caller keeps today's name


def test_batch_lines_take_it_and_a_job_without_it_keeps_its_hash(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("--prompt a --filename_pattern [seed]-[steps]\n--prompt b\n")
    jobs = expand(read_entries(path), {"width": "64", "height": "64", "steps": "1", "model": "tiny"})
    assert [j.request.filename_pattern for j in jobs.jobs] == ["[seed]-[steps]", ""]
    plain = GenerationRequest(prompt="a", seed=5).validated()
    assert request_hash("sd", plain) == request_hash("sd", GenerationRequest(prompt="a", seed=5,
                                                                              filename_pattern="").validated())


def test_the_api_takes_it_in_override_settings_and_options():
    body = {"prompt": "x", "override_settings": {"samples_filename_pattern": "[seed]"}}
    assert map_body(body, "txt2img", "tiny", 1, "out", lambda name: name).request.filename_pattern == "[seed]"
    state = ApiState(model="tiny", outdir="out")
    assert state.options()["samples_filename_pattern"] == ""
    assert state.set_options({"samples_filename_pattern": "[model_name]-[seed]"}) == []
    assert state.current_pattern() == "[model_name]-[seed]"
    with pytest.raises(InvalidRequest) as bad:
        state.set_options({"samples_filename_pattern": "[nope]"})
    assert "samples_filename_pattern" in str(bad.value) and "[nope]" in str(bad.value)


def test_the_cli_flag_names_the_saved_image(tmp_path, capsys):
    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5", "--sampler",
            "Euler a", "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--filename-pattern", "[seed]-[steps]-[model_name]-[prompt_spaces]"]) == 0
    made = Path(json.loads(capsys.readouterr().out)["images"][0])
    assert made.name == "00000-5-1-tiny-a fox.png"
    assert main([*args, "--filename-pattern", "[seed]-[what]"]) == 2
    assert "[what]" in capsys.readouterr().err
