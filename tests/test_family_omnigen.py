"""OmniGen (OmniGenPipeline, a cheap record: no shipped configs, no text encoder) through the project's real code, on
a tiny seeded folder built with diffusers' own test shapes (tests/tiny_omnigen.py), compared with plain diffusers.
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_checks import MAX_DIFF, int8_quantizes_the_transformer, job, plain, refused, saved
from ladder_checks import out_of_memory_steps_down
from tiny_omnigen import build_tiny_omnigen
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest, families


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return saved(tmp_path_factory, "tiny-omnigen", build_tiny_omnigen(), "OmniGenPipeline")


def request(folder, tmp_path, **kw) -> GenerationRequest:
    return job(folder, tmp_path, **{"cfg_scale": 3.0, **kw})


def test_omnigen_is_its_own_family_without_a_text_encoder():
    record = families.by_pipeline("OmniGenPipeline")
    assert record.key == "omnigen" and record.text_encode_apart is None and not record.takes_negative_prompt()
    assert record.pipeline_for("img2img") is None and record.pipeline_for("inpaint") is None


@pytest.mark.parametrize("cfg", ["3", "1"])
def test_txt2img_from_the_cli_equals_plain_diffusers(folder, tmp_path, capsys, cfg):
    """CFG as guidance_scale (the pipeline makes its own unconditional prompt); the folder loads although the
    auto-pipelines do not map its class."""
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", "64", "--height", "64",
                         "--steps", "2", "--seed", "7", "--cfg", cfg, "--preset", "cpu", "--outdir", str(tmp_path),
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["warnings"] == [] and result["attempts"][-1]["outcome"] == "ok"
    ours = pixels(result["images"][0])
    theirs = plain(folder, prompt="a castle", width=64, height=64, num_inference_steps=2, guidance_scale=float(cfg),
                   seed=7)
    assert ours.std() > 1 and np.abs(ours - theirs).max() <= MAX_DIFF, cfg


def test_a_negative_prompt_is_ignored_with_one_warning(folder, tmp_path, capsys):
    code, out, err = cli(capsys, "generate", "a castle", "--negative", "fog", "--model", folder, "--width", "64",
                         "--height", "64", "--steps", "2", "--seed", "7", "--cfg", "3", "--preset", "cpu",
                         "--outdir", str(tmp_path), "--json")
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == 1 and "OmniGen" in warnings[0] and "negative" in warnings[0], warnings


def test_img2img_is_refused_in_one_sentence(folder, tmp_path, capsys):
    refused(capsys, folder, tmp_path, ["img2img", "a castle", "--init", "{init}"],
            "invalid task: 'img2img'; OmniGen has no img2img pipeline in diffusers: use txt2img")


def test_int8_runs_with_the_transformer_in_8_bits(tmp_path_factory, tmp_path):
    wide = saved(tmp_path_factory, "tiny-omnigen-wide", build_tiny_omnigen(wide=True), "OmniGenPipeline")
    int8_quantizes_the_transformer(lambda **kw: request(wide, tmp_path, **kw))


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(folder, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: request(folder, tmp_path, **kw))
    assert "finished at medvram" in result.summary


def test_the_folder_is_planned_with_no_text_encoder(folder):
    from lowvram_gen.models.profile import profile_from_folder

    tiny = profile_from_folder(folder)
    assert (tiny.transformer_hidden, tiny.latent_channels) == (16, 4) and tiny.cfg_batch
