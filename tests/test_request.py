"""Request validation (docs/FAULTS.md 8-11): the same clear error from the API and the CLI, before any model work."""

from __future__ import annotations

import pytest

from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_SEED, GenerationRequest

BAD = [
    ("width", 500, "multiple of 8"),
    ("width", 0, "from 64 to 4096"),
    ("height", -64, "from 64 to 4096"),
    ("height", 8192, "from 64 to 4096"),
    ("width", "abc", "whole number"),
    ("width", 512.5, "whole number"),
    ("width", True, "whole number"),
    ("steps", 0, "from 1 to 150"),
    ("steps", 151, "from 1 to 150"),
    ("cfg_scale", float("nan"), "number from 0 to 30"),
    ("cfg_scale", float("inf"), "number from 0 to 30"),
    ("cfg_scale", -1, "number from 0 to 30"),
    ("cfg_scale", "seven", "number from 0 to 30"),
    ("batch_size", 0, "from 1 to 16"),
    ("batch_size", 17, "from 1 to 16"),
    ("seed", -2, "-1 means random"),
    ("seed", MAX_SEED + 1, "-1 means random"),
    ("sampler", "Euler z", "Euler a"),
    ("sampler", "Euler a CFG++", "the nearest offered is 'Euler a'"),
    ("schedule_type", "wobbly", "karras, exponential"),
    ("prompt", "x" * 20_001, "at most 20000 characters"),
    ("prompt", 42, "must be text"),
    ("model", "", "embedded name"),
]


@pytest.mark.parametrize("field,value,allowed", BAD)
def test_api_rejects_bad_values_naming_them(field, value, allowed):
    with pytest.raises(InvalidRequest) as err:
        GenerationRequest(**{field: value}).validated()
    message = str(err.value)
    assert allowed in message
    assert field.split("_")[0] in message


CLI_BAD = [
    (["--width", "500"], "width"),
    (["--height", "abc"], "height"),
    (["--steps", "0"], "steps"),
    (["--cfg", "nan"], "cfg"),
    (["--batch", "0"], "batch"),
    (["--seed", "4294967296"], "seed"),
    (["--sampler", "nope"], "sampler"),
    (["--schedule-type", "wobbly"], "invalid schedule type: 'wobbly'; use one of: automatic, uniform, karras"),
    (["--sampler", "Euler a CFG++"], "Euler a CFG++ has no diffusers scheduler; the nearest offered is 'Euler a'"),
]


@pytest.mark.parametrize("args,word", CLI_BAD)
def test_cli_exits_2_before_loading_a_model(args, word, capsys, monkeypatch):
    import lowvram_gen.models.loading as loading

    def no_loading(*a, **k):  # a bad request must be refused before any model is touched
        raise AssertionError("a model was loaded for an invalid request")

    monkeypatch.setattr(loading, "load", no_loading)
    code = main(["generate", "a cat", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: invalid") and word in err


def test_control_characters_and_nul_are_normalised_everywhere():
    req = GenerationRequest(prompt="a\x00cat\x07 on\ta mat\n", negative_prompt="\x1bblurry").validated()
    assert req.prompt == "a cat  on\ta mat"
    assert req.negative_prompt == "blurry"


def test_empty_and_long_prompts_are_accepted():
    assert GenerationRequest(prompt="").validated().prompt == ""
    assert len(GenerationRequest(prompt="word " * 2000).validated().prompt) == 9999


def test_seeds_random_and_consecutive():
    fixed = GenerationRequest(seed=MAX_SEED, batch_size=3).validated().resolved_seeds()
    assert fixed == [MAX_SEED, 0, 1]  # wrap at 2^32 like A1111's 32-bit seeds
    random_seeds = GenerationRequest(seed=-1, batch_size=2).validated().resolved_seeds()
    assert 0 <= random_seeds[0] <= MAX_SEED and random_seeds[1] == (random_seeds[0] + 1) % (MAX_SEED + 1)


def test_from_mapping_coerces_text_and_rejects_unknown_fields():
    req = GenerationRequest.from_mapping({"prompt": "x", "width": "256", "cfg": "5.5", "n": "2"})
    assert (req.width, req.cfg_scale, req.batch_size) == (256, 5.5, 2)
    with pytest.raises(InvalidRequest, match="allowed fields"):
        GenerationRequest.from_mapping({"prompt": "x", "widht": 256})


def test_sampler_names_are_case_and_space_insensitive():
    assert GenerationRequest(sampler="dpm++ 2m").validated().sampler == "DPM++ 2M"
    assert GenerationRequest(sampler="").validated().sampler == "default"


@pytest.mark.parametrize("name, sampler, schedule", [
    ("DPM++ 2M Karras", "DPM++ 2M", "karras"), ("dpm++ sde karras", "DPM++ SDE", "karras"),
    ("LMS Karras", "LMS", "karras"), ("DPM++ 2M SDE Exponential", "DPM++ 2M SDE", "exponential"),
    ("DPM++ 3M SDE Karras", "DPM++ 3M SDE", "karras"), ("Euler SGM Uniform", "Euler", "sgm-uniform"),
    ("DPM++ 2M SDE Heun", "DPM++ 2M SDE Heun", "automatic"),
])
def test_old_combined_sampler_names_split_into_sampler_and_schedule_type(name, sampler, schedule):
    """Issue 19: A1111 1.9+ splits "DPM++ 2M Karras" into a sampler and a schedule type; the old names still work."""
    request = GenerationRequest(sampler=name).validated()
    assert (request.sampler, request.schedule_type) == (sampler, schedule)
    same = GenerationRequest(sampler=name, schedule_type=schedule).validated()  # saying it twice is fine
    assert (same.sampler, same.schedule_type) == (sampler, schedule)


def test_schedule_type_names_and_a_contradiction():
    for text in ("SGM Uniform", "sgm_uniform", "SGMUniform", "sgm-uniform"):  # A1111's label, name, alias; ours
        assert GenerationRequest(schedule_type=text).validated().schedule_type == "sgm-uniform"
    assert GenerationRequest(schedule_type="").validated().schedule_type == "automatic"
    with pytest.raises(InvalidRequest) as err:
        GenerationRequest(sampler="DPM++ 2M Karras", schedule_type="exponential").validated()
    assert "'DPM++ 2M Karras' says 'Karras'" in str(err.value)


def test_a_missing_torchsde_is_named_before_any_model_work(monkeypatch, capsys):
    """DPM++ SDE's diffusers scheduler needs torchsde: without it the request is refused naming the package (diffusers
    itself would fail at the first step with an ImportError traceback)."""
    import importlib.util

    import lowvram_gen.models.loading as loading

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded for a sampler that cannot run")

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchsde" else real(name, *a))
    monkeypatch.setattr(loading, "load", no_loading)
    assert main(["generate", "a cat", "--sampler", "DPM++ SDE Karras", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "invalid sampler: 'DPM++ SDE'" in err and "needs the torchsde package" in err
    assert "pip install torchsde" in err
