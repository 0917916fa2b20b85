"""FLUX.2 [dev] (Flux2Pipeline) through the project's real code, on a tiny seeded folder built with diffusers' own test
shapes (tests/tiny_flux2_dev.py), compared with plain diffusers; and planned at real size from the configs the package
ships (configs/flux2-dev). Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_checks import (MAX_DIFF, job, budget_equals_no_offload, int8_quantizes_the_transformer, plain, refused,
                           saved, te_reload_equal)
from ladder_checks import out_of_memory_steps_down
from tiny_flux2_dev import MISTRAL_WIDTH, OUT_LAYERS, build_tiny_flux2_dev
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest, families


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return saved(tmp_path_factory, "tiny-flux2-dev", build_tiny_flux2_dev(), "Flux2Pipeline")


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory) -> str:
    """The same with a transformer wide enough for sdnq's int8 to quantize its layers."""
    return saved(tmp_path_factory, "tiny-flux2-dev-wide", build_tiny_flux2_dev(wide=True), "Flux2Pipeline")


def generate(capsys, folder, tmp_path, *args) -> dict:
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", "64", "--height", "64",
                         "--steps", "2", "--seed", "7", "--preset", "cpu", "--outdir", str(tmp_path), "--json", *args)
    assert code == 0, err
    return json.loads(out)


def request(folder, tmp_path, **kw) -> GenerationRequest:
    return job(folder, tmp_path, **{"cfg_scale": 4.0, **kw})


def test_flux2_dev_is_its_own_family():
    record = families.by_pipeline("Flux2Pipeline")
    assert record.key == "flux2-dev" and record not in (families.FLUX1, families.by_key("flux2-klein"))
    assert record.call.cfg_argument == "guidance_scale" and not record.cfg_batch  # distilled: an input, no batch
    assert not record.call.takes_negative_prompt
    assert record.pipeline_for("img2img") is None and record.pipeline_for("inpaint") is None
    for name in ("flux2", "flux2-dev", "FLUX.2-dev", "black-forest-labs/FLUX.2-dev"):
        assert families.by_name(name) is record, name
    # Klein keeps the shared transformer class (single files of it are Klein's until a file tells them apart)
    assert families.by_denoiser_class("Flux2Transformer2DModel").key == "flux2-klein"


def test_txt2img_from_the_cli_equals_plain_diffusers_with_its_distilled_guidance(folder, tmp_path, capsys):
    """`--cfg` is the transformer's guidance input (4: its model card's): a different scale, a different image."""
    images = {}
    for cfg in ("4", "2"):
        result = generate(capsys, folder, tmp_path, "--cfg", cfg)
        assert result["warnings"] == [] and result["attempts"][-1]["outcome"] == "ok"
        ours = images[cfg] = pixels(result["images"][0])
        theirs = plain(folder, prompt="a castle", width=64, height=64, num_inference_steps=2,
                       guidance_scale=float(cfg), seed=7)
        assert np.abs(ours - theirs).max() <= MAX_DIFF, cfg
        assert ours.std() > 1
    assert not np.array_equal(images["4"], images["2"])


def test_a_negative_prompt_is_ignored_with_a_one_line_warning(folder, tmp_path, capsys):
    with_negative = generate(capsys, folder, tmp_path, "--cfg", "4", "--negative", "fog")
    without = generate(capsys, folder, tmp_path, "--cfg", "4")
    assert with_negative["warnings"] == [
        "Flux2Pipeline does not use a negative prompt (Flux.2 dev has none): it is ignored"]
    assert np.array_equal(pixels(with_negative["images"][0]), pixels(without["images"][0]))


@pytest.mark.parametrize("args, said", [
    (["img2img", "a castle", "--init", "{init}"],
     "invalid task: 'img2img'; Flux.2 dev has no img2img pipeline in diffusers: use txt2img"),
    (["inpaint", "a castle", "--init", "{init}", "--mask", "{mask}"],
     "invalid task: 'inpaint'; Flux.2 dev has no inpaint pipeline in diffusers: use txt2img"),
    (["generate", "a castle", "--hires-scale", "2", "--hires-upscaler", "lanczos"],
     "invalid hires scale: 2.0; Flux.2 dev has no img2img pipeline in diffusers for hires fix's second pass (an "
     "img2img pass): leave hires fix off and upscale after"),
])
def test_what_diffusers_has_no_pipeline_for_is_refused_in_one_sentence(folder, tmp_path, capsys, args, said):
    refused(capsys, folder, tmp_path, args, said)


# ------------------------------------------------------------------------------------------------ memory

def test_int8_runs_with_the_transformer_in_8_bits(wide_folder, tmp_path):
    int8_quantizes_the_transformer(lambda **kw: request(wide_folder, tmp_path, **kw))


def test_budget_gives_the_pixels_of_no_offload(folder):
    budget_equals_no_offload(folder, GenerationRequest(prompt="a boat", width=64, height=64, steps=2, cfg_scale=4.0))


def test_te_reload_makes_the_same_image_with_the_encoder_gone_while_the_denoiser_runs(folder, tmp_path):
    te_reload_equal(lambda **kw: request(folder, tmp_path, **kw), tmp_path)


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(folder, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: request(folder, tmp_path, **kw))
    assert "finished at medvram" in result.summary


# ------------------------------------------------------------------------------------------------ plan

def test_the_tiny_folder_is_read_at_its_own_shapes(folder):
    from lowvram_gen.models.profile import profile_from_folder

    tiny = profile_from_folder(folder)
    # 1 latent channel packed 2x2 into the transformer's 4 inputs: one token covers 2x2 latent pixels
    assert (tiny.transformer_hidden, tiny.transformer_patch, tiny.text_tokens, tiny.joint_text_tokens) == \
        (32, 2, (512,), 512)
    assert tiny.text_hidden == (MISTRAL_WIDTH,) and not tiny.cfg_batch
    assert OUT_LAYERS * MISTRAL_WIDTH == 48  # the transformer's joint_attention_dim: three layers side by side


def test_the_planner_reads_the_real_configs():
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.estimate import transformer_tokens

    real = profile_builtin("flux2-dev")
    assert real.arch == "flux2-dev" and real.denoiser_class == "Flux2Transformer2DModel"
    assert round(real.params["transformer"] / 1e9, 1) == 32.2  # FLUX.2 [dev]'s 32B transformer
    assert round(real.params["text_encoder"] / 1e9, 1) == 24.0  # Mistral Small 3.1 24B with its vision tower
    assert (real.transformer_hidden, real.transformer_patch, real.latent_channels) == (48 * 128, 2, 32)
    assert (real.text_hidden, real.text_layers, real.text_tokens) == ((5120,), (40,), (512,))
    assert real.joint_text_tokens == 512 and not real.cfg_batch and real.vae_scale_factor == 8
    assert transformer_tokens(real, (1024 // 8) ** 2) == (1024 // 16) ** 2 + 512  # 4096 image tokens, the text beside


def test_plan_at_12_gib_and_32_gib_of_ram_offline(capsys):
    """The issue's target: FLUX.2 [dev] (32B + its 24B text encoder) at 1024x1024 on a 12 GiB card with 32 GiB RAM."""
    code, out, err = cli(capsys, "plan", "--model", "flux2-dev", "--vram", "12", "--ram", "32", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["model"], result["width"], result["height"]) == ("flux2-dev", 1024, 1024)
    assert result["preset"] and not result["refusal"]
    whole = next(p for p in result["presets"] if p["name"] == "highvram")
    assert not whole["fits"] and whole["breakdown"]["denoiser_bytes"] == 2 * 32223281152  # bfloat16, as published
    chosen = next(p for p in result["presets"] if p["name"] == result["preset"])
    assert chosen["fits"] and chosen["fits_host"] and (chosen["width"], chosen["height"]) == (1024, 1024)
    assert "te-reload" in chosen["name"]  # the 24B text encoder cannot stay beside the transformer in 32 GiB


# ------------------------------------------------------------------------------------------------ Klein 9B

def test_klein_9b_plans_its_own_shapes_and_runs_as_klein(capsys):
    """`plan --model flux2-klein-9b`: Klein's record at 9B (configs/flux2-klein-9b), not the 4B's shapes."""
    from lowvram_gen.models.profile import profile_builtin

    record, klein = families.by_name("flux2-klein-9b"), families.by_key("flux2-klein")
    assert record.key == "flux2-klein-9b" and record.hub_id == "black-forest-labs/FLUX.2-klein-9B"
    assert families.by_name("black-forest-labs/FLUX.2-klein-9B") is record and families.by_name("klein") is klein
    assert (record.call, record.tasks, record.text_encode_apart) == (klein.call, klein.tasks, klein.text_encode_apart)
    assert families.by_pipeline("Flux2KleinPipeline") is klein  # a loaded Klein pipeline: the same execution facts
    real = profile_builtin("flux2-klein-9b")
    assert round(real.params["transformer"] / 1e9, 2) == 9.08 and round(real.params["text_encoder"] / 1e9, 2) == 8.19
    assert (real.transformer_hidden, real.transformer_patch, real.text_hidden, real.text_tokens) == \
        (32 * 128, 2, (4096,), (512,))
    assert profile_builtin("flux2-klein").transformer_hidden == 24 * 128  # the 4B's stay its own
    code, out, err = cli(capsys, "plan", "--model", "flux2-klein-9b", "--vram", "8", "--ram", "24", "--json")
    assert code == 0, err
    result = json.loads(out)
    chosen = next(p for p in result["presets"] if p["name"] == result["preset"])
    assert (result["width"], result["height"]) == (1024, 1024) and not result["refusal"]
    assert chosen["fits"] and chosen["fits_host"]
    whole = next(p for p in result["presets"] if p["name"] == "highvram")
    assert whole["breakdown"]["denoiser_bytes"] == 2 * 9078581248
