"""Bria (BriaPipeline, a cheap record: no shipped configs) through the project's real code, on a tiny seeded folder
built with diffusers' own test shapes (tests/tiny_bria.py), compared with plain diffusers. Seeded random weights: the
images are noise.
"""

from __future__ import annotations

import numpy as np
import pytest
from family_checks import (MAX_DIFF, cli_image, int8_quantizes_the_transformer, job, plain, refused, saved,
                           te_reload_equal)
from ladder_checks import out_of_memory_steps_down
from tiny_bria import build_tiny_bria

from lowvram_gen import GenerationRequest, families


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return saved(tmp_path_factory, "tiny-bria", build_tiny_bria(), "BriaPipeline")


def request(folder, tmp_path, **kw) -> GenerationRequest:
    return job(folder, tmp_path, **{"negative_prompt": "fog", "cfg_scale": 5.0, **kw})


def test_bria_is_its_own_family():
    record = families.by_pipeline("BriaPipeline")
    assert record.key == "bria" and record.cfg_batch and record.lora is None and record.builtin == "bria"
    assert record.pipeline_for("img2img") is None and record.pipeline_for("inpaint") is None


@pytest.mark.parametrize("cfg, negative", [("5", "fog"), ("5", ""), ("1", "fog")])
def test_txt2img_from_the_cli_equals_plain_diffusers(folder, tmp_path, capsys, cfg, negative):
    """CFG as a doubled batch above 1, against the negative prompt (or the pipeline's zeros without one); the
    folder loads although the auto-pipelines do not map its class."""
    ours = cli_image(capsys, folder, tmp_path, "--negative", negative, "--cfg", cfg)
    theirs = plain(folder, prompt="a castle", negative_prompt=negative or None, width=64, height=64,
                   num_inference_steps=2, guidance_scale=float(cfg), seed=7)
    assert ours.std() > 1 and np.abs(ours - theirs).max() <= MAX_DIFF, (cfg, negative)


def test_img2img_is_refused_in_one_sentence(folder, tmp_path, capsys):
    refused(capsys, folder, tmp_path, ["img2img", "a castle", "--init", "{init}"],
            "invalid task: 'img2img'; Bria has no img2img pipeline in diffusers: use txt2img")


def test_int8_runs_with_the_transformer_in_8_bits(tmp_path_factory, tmp_path):
    wide = saved(tmp_path_factory, "tiny-bria-wide", build_tiny_bria(wide=True), "BriaPipeline")
    int8_quantizes_the_transformer(lambda **kw: request(wide, tmp_path, **kw))


@pytest.mark.parametrize("negative", ["fog", ""])
def test_te_reload_makes_the_same_images_with_the_encoder_gone_while_the_denoiser_runs(folder, tmp_path, negative):
    te_reload_equal(lambda **kw: request(folder, tmp_path, negative_prompt=negative, **kw), tmp_path)


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(folder, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: request(folder, tmp_path, **kw))
    assert "finished at medvram" in result.summary


def test_the_folder_is_planned_at_its_own_shapes(folder):
    from lowvram_gen.models.profile import profile_from_folder

    tiny = profile_from_folder(folder)
    # 4 latent channels packed 2x2 into the transformer's 16 inputs: one token covers 2x2 latent pixels
    assert (tiny.transformer_hidden, tiny.transformer_patch, tiny.latent_channels) == (16, 2, 4)
    assert tiny.text_tokens == (128,) and tiny.joint_text_tokens == 128 and tiny.cfg_batch
