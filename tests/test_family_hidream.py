"""HiDream-I1 (HiDreamImagePipeline) through the project's real code, on a tiny seeded folder built with diffusers' own
test shapes (tests/tiny_hidream.py), compared with plain diffusers; and planned at real size from the configs the
package ships (configs/hidream). Its pipeline scales every size to its native area: the tiny folder's is 128x128.
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_checks import (MAX_DIFF, job, budget_equals_no_offload, int8_quantizes_the_transformer, plain, refused,
                           saved, te_reload_equal)
from ladder_checks import out_of_memory_steps_down
from tiny_hidream import build_tiny_hidream
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest, families

SIDE = 128  # the tiny folder's native area (default_sample_size 128 x the VAE's scale factor 1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return saved(tmp_path_factory, "tiny-hidream", build_tiny_hidream(), "HiDreamImagePipeline")


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory) -> str:
    """The same with a transformer wide enough for sdnq's int8 to quantize its layers."""
    return saved(tmp_path_factory, "tiny-hidream-wide", build_tiny_hidream(wide=True), "HiDreamImagePipeline")


def generate(capsys, folder, tmp_path, *args, side: int = SIDE) -> dict:
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", str(side), "--height",
                         str(side), "--steps", "2", "--seed", "7", "--preset", "cpu", "--outdir", str(tmp_path),
                         "--json", *args)
    assert code == 0, err
    return json.loads(out)


def request(folder, tmp_path, **kw) -> GenerationRequest:
    return job(folder, tmp_path, **{"negative_prompt": "fog", "width": SIDE, "height": SIDE, "cfg_scale": 5.0, **kw})


def test_hidream_is_its_own_family():
    record = families.by_pipeline("HiDreamImagePipeline")
    assert record.key == "hidream" and record.call.cfg_argument == "guidance_scale" and record.cfg_batch
    assert record.call.takes_negative_prompt and record.call.negative_prompt
    assert record.pipeline_for("img2img") is None and record.pipeline_for("inpaint") is None
    for name in ("hidream", "hidream-i1", "hidream-i1-full", "HiDream-ai/HiDream-I1-Full", "HiDream-ai/HiDream-I1-Dev"):
        assert families.by_name(name) is record, name
    # a short name loads the record's hub id: none for Dev or Fast, which are other repos
    assert families.by_name("hidream-i1-dev") is None and families.by_name("hidream-i1-fast") is None
    assert families.by_denoiser_class("HiDreamImageTransformer2DModel") is record


@pytest.mark.parametrize("cfg", ["5", "1"])
def test_txt2img_from_the_cli_equals_plain_diffusers_with_real_cfg_and_a_negative(folder, tmp_path, capsys, cfg):
    """Real CFG (a doubled batch against the negative prompt, which every one of its four encoders gets) at 5, its
    model card's; 1 turns it off. The diffusers folder loads although the auto-pipelines do not map its class."""
    result = generate(capsys, folder, tmp_path, "--cfg", cfg, "--negative", "fog")
    assert result["warnings"] == [] and result["attempts"][-1]["outcome"] == "ok"
    ours = pixels(result["images"][0])
    theirs = plain(folder, prompt="a castle", negative_prompt="fog", width=SIDE, height=SIDE,
                   num_inference_steps=2, guidance_scale=float(cfg), seed=7)
    assert ours.shape == (SIDE, SIDE, 3) and ours.std() > 1
    assert np.abs(ours - theirs).max() <= MAX_DIFF, cfg


def test_the_negative_prompt_acts(folder, tmp_path, capsys):
    fog = pixels(generate(capsys, folder, tmp_path, "--cfg", "5", "--negative", "fog")["images"][0])
    rain = pixels(generate(capsys, folder, tmp_path, "--cfg", "5", "--negative", "rain")["images"][0])
    assert not np.array_equal(fog, rain)


def test_another_size_is_rendered_at_its_native_area_and_said_in_one_line(folder, tmp_path, capsys):
    result = generate(capsys, folder, tmp_path, "--cfg", "5", "--negative", "fog", side=64)
    assert result["warnings"] == ["HiDreamImagePipeline renders 128x128 when asked for 64x64 (it scales every size "
                                  "to its native area, keeping the aspect)"]
    assert pixels(result["images"][0]).shape == (SIDE, SIDE, 3)


@pytest.mark.parametrize("args, said", [
    (["img2img", "a castle", "--init", "{init}"],
     "invalid task: 'img2img'; HiDream-I1 has no img2img pipeline in diffusers: use txt2img"),
    (["inpaint", "a castle", "--init", "{init}", "--mask", "{mask}"],
     "invalid task: 'inpaint'; HiDream-I1 has no inpaint pipeline in diffusers: use txt2img"),
])
def test_img2img_and_inpaint_are_refused_in_one_sentence(folder, tmp_path, capsys, args, said):
    refused(capsys, folder, tmp_path, args, said, side=SIDE)


# ------------------------------------------------------------------------------------------------ memory

def test_int8_runs_with_the_transformer_in_8_bits(wide_folder, tmp_path):
    int8_quantizes_the_transformer(lambda **kw: request(wide_folder, tmp_path, **kw))


def test_budget_gives_the_pixels_of_no_offload(folder):
    budget_equals_no_offload(folder, GenerationRequest(prompt="a boat", negative_prompt="fog", width=SIDE,
                                                       height=SIDE, steps=2, cfg_scale=5.0))


def test_te_reload_makes_the_same_images_with_the_encoders_gone_while_the_denoiser_runs(folder, tmp_path):
    """Two images: Llama's embeddings, (layers, batch, tokens, width), are repeated along their batch axis."""
    te_reload_equal(lambda **kw: request(folder, tmp_path, **kw), tmp_path,
                    ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"))


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(folder, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: request(folder, tmp_path, **kw))
    assert "finished at medvram" in result.summary


# ------------------------------------------------------------------------------------------------ plan

def test_the_tiny_folder_is_read_at_its_own_shapes(folder):
    from lowvram_gen.models.profile import profile_from_folder

    tiny = profile_from_folder(folder)
    assert (tiny.transformer_hidden, tiny.transformer_patch, tiny.latent_channels) == (32, 2, 4)
    assert tiny.text_tokens == (128, 128, 128, 128) and tiny.joint_text_tokens == 384 and tiny.cfg_batch


def test_the_planner_reads_the_real_configs():
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.estimate import transformer_tokens

    real = profile_builtin("hidream")
    assert real.arch == "hidream" and real.denoiser_class == "HiDreamImageTransformer2DModel"
    assert round(real.params["transformer"] / 1e9, 1) == 17.1  # HiDream-I1's 17B sparse transformer
    assert round(real.params["text_encoder_4"] / 1e9, 2) == 8.03  # Llama 3.1 8B
    assert round(real.params["text_encoder_3"] / 1e9, 2) == 4.76  # T5-XXL's encoder
    assert (real.transformer_hidden, real.transformer_patch, real.latent_channels) == (20 * 128, 2, 16)
    assert real.text_hidden == (768, 1280, 4096, 4096) and real.text_tokens[2:] == (128, 128)
    assert real.joint_text_tokens == 384 and real.cfg_batch and real.vae_scale_factor == 8
    assert transformer_tokens(real, (1024 // 8) ** 2) == (1024 // 16) ** 2 + 384  # 4096 image tokens, the text beside


def test_plan_the_real_model_offline(capsys):
    code, out, err = cli(capsys, "plan", "--model", "hidream", "--vram", "12", "--ram", "32", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["model"], result["width"], result["height"]) == ("hidream", 1024, 1024)
    whole = next(p for p in result["presets"] if p["name"] == "highvram")
    assert not whole["fits"] and whole["breakdown"]["denoiser_bytes"] == 2 * 17105733184  # bfloat16, as published
    assert result["preset"] and not result["refusal"]
    chosen = next(p for p in result["presets"] if p["name"] == result["preset"])
    assert chosen["fits"] and chosen["fits_host"] and (chosen["width"], chosen["height"]) == (1024, 1024)


def test_a_job_of_another_size_is_planned_at_the_native_area_it_renders(capsys):
    """HiDreamImagePipeline renders every size at its native area (1024x1024 at real size, keeping the aspect): a
    512 px plan estimates the 4096 image tokens that run, as a 1024 px one does (it counted a quarter of them), and
    a 768x512 one the 1248x832 it renders; another family's plan keeps the size asked."""
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.estimate import rendered_size

    def plan(side_w: int, side_h: int) -> dict:
        code, out, err = cli(capsys, "plan", "--model", "hidream", "--vram", "12", "--ram", "32", "--width",
                             str(side_w), "--height", str(side_h), "--json")
        assert code == 0, err
        return {p["name"]: p for p in json.loads(out)["presets"]}

    small, native = plan(512, 512), plan(1024, 1024)
    assert small.keys() == native.keys()
    for name, row in small.items():
        assert (row["width"], row["height"]) == (1024, 1024), name
        assert row["estimate_bytes"] == native[name]["estimate_bytes"], name
        assert row["host_peak_bytes"] == native[name]["host_peak_bytes"], name
    assert {(r["width"], r["height"]) for r in plan(768, 512).values()} == {(1248, 832)}
    assert rendered_size(profile_builtin("hidream"), 512, 512) == (1024, 1024)
    assert rendered_size(profile_builtin("flux"), 512, 512) == (512, 512)
