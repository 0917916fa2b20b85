"""HiDream-I1 (HiDreamImagePipeline) through the project's real code, on a tiny seeded folder built with diffusers' own
test shapes (tests/tiny_hidream.py), compared with plain diffusers; and planned at real size from the configs the
package ships (configs/hidream). Its pipeline scales every size to its native area: the tiny folder's is 128x128.
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ladder_checks import out_of_memory_steps_down
from PIL import Image
from tiny_hidream import build_tiny_hidream
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest, families
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"
SIDE = 128  # the tiny folder's native area (default_sample_size 128 x the VAE's scale factor 1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-hidream")
    build_tiny_hidream().save_pretrained(path, safe_serialization=True)
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == "HiDreamImagePipeline"
    return str(path)


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory) -> str:
    """The same with a transformer wide enough for sdnq's int8 to quantize its layers."""
    path = tmp_path_factory.mktemp("tiny-hidream-wide")
    build_tiny_hidream(wide=True).save_pretrained(path, safe_serialization=True)
    return str(path)


def plain(folder: str, **kw) -> np.ndarray:
    import diffusers
    import torch

    pipe = diffusers.HiDreamImagePipeline.from_pretrained(folder)
    seed = kw.pop("seed")
    return np.asarray(pipe(**kw, generator=torch.Generator().manual_seed(seed)).images[0].convert("RGB"), dtype=int)


def generate(capsys, folder, tmp_path, *args, side: int = SIDE) -> dict:
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", str(side), "--height",
                         str(side), "--steps", "2", "--seed", "7", "--preset", "cpu", "--outdir", str(tmp_path),
                         "--json", *args)
    assert code == 0, err
    return json.loads(out)


def request(folder, tmp_path, **kw) -> GenerationRequest:
    job = dict(prompt="a castle", negative_prompt="fog", model=folder, width=SIDE, height=SIDE, steps=2, seed=7,
               cfg_scale=5.0, outdir=str(tmp_path))
    return GenerationRequest(**{**job, **kw})


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
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    Image.new("RGB", (SIDE, SIDE), (90, 120, 150)).save(init)
    Image.new("L", (SIDE, SIDE), 255).save(mask)
    args = [a.format(init=init, mask=mask) for a in args]
    code, _, err = cli(capsys, *args, "--model", folder, "--width", str(SIDE), "--height", str(SIDE), "--steps", "2",
                       "--preset", "cpu", "--outdir", str(tmp_path))
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["error: " + said]


# ------------------------------------------------------------------------------------------------ memory

def test_int8_runs_with_the_transformer_in_8_bits(wide_folder, tmp_path):
    import torch

    session = Session()
    full = pixels(session.generate(request(wide_folder, tmp_path, preset="cpu")).images[0])
    result = session.generate(request(wide_folder, tmp_path, preset="cpu", quantize="int8"))
    assert [a["outcome"] for a in result.attempts] == ["ok"]
    assert any(t.dtype in (torch.int8, torch.uint8) for t in session.model.pipe.transformer.state_dict().values())
    quantized = pixels(result.images[0])
    assert quantized.shape == full.shape and quantized.std() > 1
    assert np.abs(quantized - full).mean() < 40  # close to float32, not the same


def test_budget_gives_the_pixels_of_no_offload(folder):
    from dataclasses import replace

    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset

    runner = Runner(load(resolve(folder), "float32"), probe("cpu"))
    images = {}
    for name in ("highvram", "budget"):
        preset = find_preset(name)
        preset = replace(preset, memory=replace(preset.memory, dtype="float32"))
        done = []
        runner.run(GenerationRequest(prompt="a boat", negative_prompt="fog", width=SIDE, height=SIDE, steps=2,
                                     cfg_scale=5.0), [3], [preset], done.append)
        images[name] = np.asarray(done[0].images[0].convert("RGB"), dtype=int)
    assert runner.residency is not None  # the budget split is what ran
    assert np.abs(images["budget"] - images["highvram"]).max() <= 1


def test_te_reload_makes_the_same_images_with_the_encoders_gone_while_the_denoiser_runs(folder, tmp_path):
    """Two images: Llama's embeddings, (layers, batch, tokens, width), are repeated along their batch axis."""
    from test_text_encoder_reload import _presets_with

    images, seen = {}, []
    for text_encoders in ("kept", "reloaded"):
        session = Session(device="cpu", preset="cpu", presets_dir=str(_presets_with(tmp_path, text_encoders)),
                          outdir=str(tmp_path / text_encoders))

        def watch(*_):  # in a step callback: the encoders the pipeline holds while the denoiser runs
            pipe = session.model.pipe
            seen.append((text_encoders, pipe.text_encoder is not None or pipe.text_encoder_4 is not None))

        result = session.generate(request(folder, tmp_path, batch_size=2), on_step=watch)
        images[text_encoders] = [pixels(p) for p in result.images]
    assert len(images["reloaded"]) == 2
    assert all(np.abs(a - b).max() <= 1 for a, b in zip(images["kept"], images["reloaded"]))
    assert ("kept", True) in seen and ("reloaded", True) not in seen and ("reloaded", False) in seen


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
