"""CogView4 (CogView4Pipeline) through the project's real code, on a tiny seeded folder built with diffusers' own test
shapes (tests/tiny_cogview4.py), compared with plain diffusers; and planned at real size from the configs the package
ships (configs/cogview4). Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_checks import (MAX_DIFF, cli_image, int8_quantizes_the_transformer, job, plain, refused, saved,
                           te_reload_equal)
from ladder_checks import out_of_memory_steps_down
from tiny_cogview4 import build_tiny_cogview4
from tiny_transformers import cli

from lowvram_gen import GenerationRequest, families


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return saved(tmp_path_factory, "tiny-cogview4", build_tiny_cogview4(), "CogView4Pipeline")


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory) -> str:
    return saved(tmp_path_factory, "tiny-cogview4-wide", build_tiny_cogview4(wide=True), "CogView4Pipeline")


def request(folder, tmp_path, **kw) -> GenerationRequest:
    return job(folder, tmp_path, **{"negative_prompt": "fog", "cfg_scale": 3.5, **kw})


def test_cogview4_is_its_own_family():
    record = families.by_pipeline("CogView4Pipeline")
    assert record.key == "cogview4" and record.call.cfg_argument == "guidance_scale" and not record.cfg_batch
    assert record.pipeline_for("img2img") is None and record.pipeline_for("inpaint") is None
    assert families.by_name("THUDM/CogView4-6B") is record and families.by_name("cogview4") is record


@pytest.mark.parametrize("cfg", ["3.5", "1"])
def test_txt2img_from_the_cli_equals_plain_diffusers(folder, tmp_path, capsys, cfg):
    """CFG (two forwards against the negative prompt) above 1; 1 turns it off."""
    ours = cli_image(capsys, folder, tmp_path, "--negative", "fog", "--cfg", cfg)
    theirs = plain(folder, prompt="a castle", negative_prompt="fog", width=64, height=64, num_inference_steps=2,
                   guidance_scale=float(cfg), seed=7)
    assert ours.std() > 1 and np.abs(ours - theirs).max() <= MAX_DIFF, cfg


@pytest.mark.parametrize("args, said", [
    (["img2img", "a castle", "--init", "{init}"],
     "invalid task: 'img2img'; CogView4 has no img2img pipeline in diffusers: use txt2img"),
    (["inpaint", "a castle", "--init", "{init}", "--mask", "{mask}"],
     "invalid task: 'inpaint'; CogView4 has no inpaint pipeline in diffusers: use txt2img"),
])
def test_img2img_and_inpaint_are_refused_in_one_sentence(folder, tmp_path, capsys, args, said):
    refused(capsys, folder, tmp_path, args, said)


def test_int8_runs_with_the_transformer_in_8_bits(wide_folder, tmp_path):
    int8_quantizes_the_transformer(lambda **kw: request(wide_folder, tmp_path, **kw))


def test_te_reload_makes_the_same_images_with_the_encoder_gone_while_the_denoiser_runs(folder, tmp_path):
    te_reload_equal(lambda **kw: request(folder, tmp_path, **kw), tmp_path)


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(folder, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: request(folder, tmp_path, **kw))
    assert "finished at medvram" in result.summary


def test_the_planner_reads_the_real_configs(capsys):
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.estimate import transformer_tokens

    real = profile_builtin("cogview4")
    assert real.denoiser_class == "CogView4Transformer2DModel"
    assert round(real.params["transformer"] / 1e9, 2) == 6.37  # CogView4's 6B transformer
    assert round(real.params["text_encoder"] / 1e9, 2) == 8.78  # GLM-4 9B's model without its head
    assert (real.transformer_hidden, real.transformer_patch, real.latent_channels) == (4096, 2, 16)
    assert (real.text_hidden, real.text_layers, real.text_tokens) == ((4096,), (40,), (1024,))
    assert real.joint_text_tokens == 1024 and not real.cfg_batch
    assert transformer_tokens(real, (1024 // 8) ** 2) == (1024 // 16) ** 2 + 1024
    code, out, err = cli(capsys, "plan", "--model", "cogview4", "--vram", "8", "--ram", "24", "--json")
    assert code == 0, err
    result = json.loads(out)
    chosen = next(p for p in result["presets"] if p["name"] == result["preset"])
    assert (result["width"], result["height"]) == (1024, 1024) and chosen["fits"] and chosen["fits_host"]
