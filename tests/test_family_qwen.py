"""Qwen-Image (issue 30): its record (families/records_qwen.py) end to end on a tiny seeded folder built in diffusers'
own test shapes (tests/tiny_qwen.py), each result compared with plain diffusers on the same folder, seed and steps.

What is checked: `--cfg` is the call's `true_cfg_scale` (with a negative prompt, and with none: the model card's
blank one), `--cfg 1` turns CFG off, and the PNG says what ran; the planner reads the real Qwen/Qwen-Image configs
shipped in the package (2x2-packed latents counted once: 4096 image tokens at 1024x1024); int8, a VRAM budget and a
simulated out-of-memory that steps down without reloading; img2img and inpaint through diffusers' Qwen pipelines.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from ladder_checks import out_of_memory_steps_down
from tiny_qwen import build_tiny_qwen_image
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

TOLERANCE = 2  # of 255: the "equal to plain diffusers"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-qwen")
    build_tiny_qwen_image().save_pretrained(path, safe_serialization=True)
    index = json.loads((path / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    return str(path)


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory) -> str:
    """The same with a transformer wide enough for sdnq's int8 to quantize its layers (diffusers' 48 is skipped)."""
    path = tmp_path_factory.mktemp("tiny-qwen-wide")
    build_tiny_qwen_image(wide=True).save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.fixture(scope="module")
def plain(folder):
    """Plain diffusers' pipeline from the same folder: the folder works without us."""
    import diffusers

    pipe = diffusers.QwenImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def request(folder, tmp_path, **kw) -> GenerationRequest:
    base = dict(prompt="a lighthouse", model=folder, width=64, height=64, steps=2, seed=5, cfg_scale=4.0,
                outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


def diffusers_image(pipe, seed: int, **kw) -> np.ndarray:
    kw = {"width": 64, "height": 64, "num_inference_steps": 2, **kw}
    image = pipe(generator=torch.Generator().manual_seed(seed), **kw).images[0]
    return np.asarray(image.convert("RGB"), dtype=int)


# ------------------------------------------------------------------------------------------------ txt2img and CFG

# (--cfg, --negative or None) -> what plain diffusers is called with for the same image
CASES = {
    "cfg-with-negative": ("4", "fog", dict(true_cfg_scale=4.0, negative_prompt="fog")),
    "cfg-without-negative": ("4", None, dict(true_cfg_scale=4.0, negative_prompt=" ")),  # the model card's blank
    "cfg-off": ("1", None, dict(true_cfg_scale=1.0)),
}


def test_the_tiny_folder_is_read_as_qwen_image(folder):
    from lowvram_gen import families

    record = families.by_pipeline("QwenImagePipeline")
    assert record.key == "qwen-image" and record.call.cfg_argument == "true_cfg_scale"
    assert families.by_name("qwen-image") is record and families.by_name("Qwen/Qwen-Image") is record


@pytest.mark.parametrize("case", list(CASES))
def test_cli_txt2img_equals_plain_diffusers_with_cfg_as_true_cfg_scale(case, folder, plain, tmp_path, capsys):
    cfg, negative, theirs = CASES[case]
    args = ["generate", "a lighthouse at dusk", "--model", folder, "--width", "96", "--height", "64", "--steps", "2",
            "--seed", "7", "--cfg", cfg, "--outdir", str(tmp_path), "--json"]
    code, out, err = cli(capsys, *args, *(["--negative", negative] if negative else []))
    assert code == 0, err
    result = json.loads(out)
    ours = pixels(result["images"][0])
    expected = diffusers_image(plain, 7, prompt="a lighthouse at dusk", width=96, height=64, **theirs)
    assert ours.shape == expected.shape == (64, 96, 3)
    assert np.abs(ours - expected).max() <= TOLERANCE, case
    params = parse_a1111_parameters(read_png_metadata(result["images"][0])[0])
    assert params["CFG scale"] == cfg  # what ran, as the call's true_cfg_scale
    assert params.get("negative_prompt", "") == (negative or "")
    assert params["Sampler"] == "FlowMatchEulerDiscreteScheduler"
    assert not any("negative prompt" in w for w in result.get("warnings", []))


def test_cfg_changes_the_image(folder, tmp_path):
    session = Session()
    images = {}
    for cfg in (1.0, 2.5, 4.0):
        images[cfg] = pixels(session.generate(request(folder, tmp_path, cfg_scale=cfg)).images[0])
    with_negative = pixels(session.generate(request(folder, tmp_path, negative_prompt="fog")).images[0])
    assert not np.array_equal(images[1.0], images[2.5]) and not np.array_equal(images[2.5], images[4.0])
    assert not np.array_equal(images[4.0], with_negative)  # the negative prompt is used


def test_a_negative_prompt_without_cfg_is_said_to_be_ignored(folder, tmp_path):
    session = Session()
    off = session.generate(request(folder, tmp_path, cfg_scale=1.0, negative_prompt="fog"))
    assert [w for w in off.warnings if "negative" in w] == [
        "CFG scale 1 turns QwenImagePipeline's true CFG off: the negative prompt is ignored (give a CFG scale above "
        "1 to use it)"]
    plain_off = session.generate(request(folder, tmp_path, cfg_scale=1.0))
    assert np.array_equal(pixels(off.images[0]), pixels(plain_off.images[0]))  # ignored indeed
    assert not session.generate(request(folder, tmp_path, negative_prompt="fog")).warnings


def test_a_batch_splits_by_seed(folder, tmp_path):
    session = Session()
    batch = session.generate(request(folder, tmp_path, batch_size=2, seed=10))
    assert batch.seeds == [10, 11]
    single = session.generate(request(folder, tmp_path, seed=11))
    assert np.abs(pixels(batch.images[1]) - pixels(single.images[0])).max() <= 1


# ------------------------------------------------------------------------------------------------ plan

def test_the_planner_reads_the_real_configs_and_counts_the_packing_once(folder):
    from lowvram_gen.models.profile import profile_builtin, profile_from_folder
    from lowvram_gen.planning.estimate import transformer_tokens

    real = profile_builtin("qwen-image")
    assert real.denoiser == "transformer" and real.denoiser_class == "QwenImageTransformer2DModel"
    assert round(real.params["transformer"] / 1e9, 2) == 20.43  # Qwen-Image's 20B MMDiT
    assert round(real.params["text_encoder"] / 1e9, 1) == 8.3  # Qwen2.5-VL 7B with its vision tower
    assert (real.transformer_hidden, real.transformer_patch, real.latent_channels) == (3072, 2, 16)
    assert (real.vae_scale_factor, real.vae_channels) == (8, (96, 192, 384, 384))
    assert (real.text_hidden, real.text_layers, real.text_tokens) == ((3584,), (28,), (512,))
    assert real.joint_text_tokens == 512 and not real.cfg_batch  # true CFG: a second forward, not a batch
    latent = (1024 // 8) ** 2
    assert transformer_tokens(real, latent) == (1024 // 16) ** 2 + 512  # 4096 image tokens, the text beside

    tiny = profile_from_folder(folder)  # 16 input channels = 4 latent channels x 2x2: patch 2, once
    assert (tiny.transformer_patch, tiny.latent_channels, tiny.vae_scale_factor) == (2, 4, 4)


def test_plan_the_real_model_offline(capsys):
    code, out, err = cli(capsys, "plan", "--model", "qwen-image", "--vram", "8GiB", "--ram", "32GiB", "--width",
                         "1024", "--height", "1024", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["model"], result["width"], result["height"]) == ("qwen-image", 1024, 1024)
    assert result["preset"] and not result["refusal"]
    whole = next(p for p in result["presets"] if p["name"] == "highvram")
    assert not whole["fits"]  # 20B parameters do not fit an 8 GiB card whole
    assert whole["breakdown"]["denoiser_bytes"] == 2 * 20430401088  # bfloat16, as published
    # the target: 8 GiB VRAM + 32 GiB RAM at 1024x1024, streamed under a budget at full size
    chosen = next(p for p in result["presets"] if p["name"] == result["preset"])
    assert result["preset"].startswith("budget+int8") and chosen["fits"] and chosen["fits_host"]
    assert (chosen["width"], chosen["height"], chosen["capped"]) == (1024, 1024, False)


def test_the_budget_streams_every_transformer_block_in_pieces():
    """Each of its 60 blocks is streamed, in pieces of at most PIECE elements (or one layer: its modulation and MLP
    projections, up to 56.6 M elements) as its forward calls them: its small modulation Sequentials (img_mod, txt_mod) do not make
    the block's attention and MLPs the always-resident part (models/blocks.py)."""
    from lowvram_gen.models.blocks import PIECE
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.residency import roots

    real = profile_builtin("qwen-image")
    blocks = roots(real.residency_blocks)  # the pieces, without the finer ones a split may cut them into
    names = [name for name, _ in blocks]
    assert {name.split(".")[1] for name in names} == {str(i) for i in range(60)}
    assert all(f"transformer_blocks.{i}.attn.to_q" in names and f"transformer_blocks.{i}.img_mlp.net.2" in names
               for i in range(60))
    layers = ("img_mod.1", "txt_mod.1", "mlp.net.0.proj", "mlp.net.2")  # single Linear layers larger than PIECE
    assert all(size <= PIECE or name.endswith(layers) for name, size in blocks)
    assert real.residency_fixed < 0.01 * sum(b for _, b in blocks)


# ------------------------------------------------------------------------------------------------ memory

def test_int8_runs_with_the_transformer_in_8_bits(wide_folder, tmp_path):
    session = Session()
    full = pixels(session.generate(request(wide_folder, tmp_path)).images[0])
    result = session.generate(request(wide_folder, tmp_path, quantize="int8"))
    transformer = session.model.pipe.transformer
    assert any(t.dtype in (torch.int8, torch.uint8) for t in transformer.state_dict().values())
    quantized = pixels(result.images[0])
    assert quantized.shape == full.shape and quantized.std() > 1
    assert np.abs(quantized - full).mean() < 40  # close to float32, not the same


def test_budget_gives_the_pixels_of_no_offload(folder, tmp_path):
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset

    model = load(resolve(folder), "float32")
    runner = Runner(model, probe("cpu"))
    images = {}
    for name in ("highvram", "budget"):
        preset = find_preset(name)
        preset = replace(preset, memory=replace(preset.memory, dtype="float32"))
        done = []
        runner.run(GenerationRequest(prompt="a boat", width=64, height=64, steps=2, cfg_scale=4.0), [3], [preset],
                   done.append)
        images[name] = np.asarray(done[0].images[0].convert("RGB"), dtype=int)
    assert runner.residency is not None  # the budget split is what ran
    assert np.abs(images["budget"] - images["highvram"]).max() <= 1


@pytest.mark.parametrize("negative, cfg", [("fog", 4.0), ("", 4.0), ("", 1.0)])
def test_text_encoders_reloaded_per_job_give_the_same_image(folder, negative, cfg):
    """+te-reload: the prompts encoded apart from the call (embeddings and masks, the negative's under CFG), the
    encoders gone while the transformer runs; the same pixels as with the encoders kept."""
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset

    runner = Runner(load(resolve(folder), "float32"), probe("cpu"))
    held = []
    runner.model.pipe.transformer.register_forward_pre_hook(
        lambda *_: held.append(runner.model.pipe.text_encoder is not None))
    images = {}
    for mode in ("kept", "reloaded"):
        preset = find_preset("cpu")
        preset = replace(preset, memory=replace(preset.memory, dtype="float32", text_encoders=mode))
        done = []
        runner.run(GenerationRequest(prompt="a boat", negative_prompt=negative, width=64, height=64, steps=2,
                                     cfg_scale=cfg, batch_size=2), [3, 4], [preset], done.append)
        images[mode] = [np.asarray(i.convert("RGB"), dtype=int) for i in done[0].images]
        if mode == "kept":
            assert all(held) and held
            held.clear()
    assert held and not any(held)  # reloaded: no text encoder while the transformer runs
    for kept, reloaded in zip(images["kept"], images["reloaded"]):
        assert np.abs(kept - reloaded).max() <= 1


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(folder, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: request(folder, tmp_path, **kw))
    assert "finished at medvram" in result.summary


# ------------------------------------------------------------------------------------------------ img2img, inpaint

@pytest.fixture(scope="module")
def init_and_mask(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen-init")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path / "init.png")
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255  # white: repainted
    Image.fromarray(mask).save(path / "mask.png")
    return str(path / "init.png"), str(path / "mask.png")


def test_img2img_cli_equals_diffusers_qwen_img2img(folder, plain, init_and_mask, tmp_path, capsys, posterior_mode):
    import diffusers

    init, _ = init_and_mask
    code, out, err = cli(capsys, "img2img", "a harbour", "--init", init, "--strength", "0.5", "--model", folder,
                         "--width", "64", "--height", "64", "--steps", "4", "--seed", "2", "--cfg", "4",
                         "--outdir", str(tmp_path), "--json")
    assert code == 0, err
    ours = pixels(json.loads(out)["images"][0])
    img2img = diffusers.QwenImageImg2ImgPipeline.from_pipe(plain)
    # --strength 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4 (lowvram_gen/img2img_steps.py): diffusers' 0.75
    expected = diffusers_image(img2img, 2, prompt="a harbour", negative_prompt=" ", true_cfg_scale=4.0,
                               image=Image.open(init).convert("RGB"), strength=0.75, num_inference_steps=4)
    assert np.abs(ours - expected).max() <= TOLERANCE


def test_inpaint_repaints_the_mask_as_diffusers_and_keeps_the_rest(folder, plain, init_and_mask, tmp_path,
                                                                 posterior_mode):
    """Inside the mask: diffusers' QwenImageInpaintPipeline's pixels; outside: the init image's own (A1111 pastes the
    original back over what the VAE would give, as for SD)."""
    import diffusers

    init, mask = init_and_mask
    session = Session()
    result = session.generate(request(folder, tmp_path, init_image=init, mask=mask, mask_blur=0, strength=0.8,
                                      steps=4))
    ours = pixels(result.images[0])
    inpaint = diffusers.QwenImageInpaintPipeline.from_pipe(plain)
    # 0.8 of 4 steps runs A1111's int(0.8 x 4) + 1 = 4 of 4 (lowvram_gen/img2img_steps.py): diffusers' 1.0
    expected = diffusers_image(inpaint, 5, prompt="a lighthouse", negative_prompt=" ", true_cfg_scale=4.0,
                               image=Image.open(init).convert("RGB"), mask_image=Image.open(mask), strength=1.0,
                               num_inference_steps=4)
    inside, outside = np.s_[16:48, 16:48], np.s_[:16]
    assert np.abs(ours[inside] - expected[inside]).max() <= TOLERANCE
    assert np.abs(ours[outside] - pixels(init)[outside]).max() <= 1
    assert np.abs(ours[inside] - pixels(init)[inside]).mean() > 10  # repainted
    # A1111's "latent nothing" on Qwen-Image's 5-D latents (B, C, frame, h, w), a batch of two; at a strength whose
    # first step keeps some of the init latents (at 0.8 this tiny folder's first sigma is 1: pure noise)
    half = dict(init_image=init, mask=mask, mask_blur=0, strength=0.4, steps=4)
    original = session.generate(request(folder, tmp_path, **half))
    nothing = session.generate(request(folder, tmp_path, **half, masked_content="latent-nothing", batch_size=2))
    assert len(nothing.images) == 2
    assert not np.array_equal(pixels(nothing.images[0])[inside], pixels(original.images[0])[inside])
