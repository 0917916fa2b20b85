"""Resolution caps with upscaling afterwards, img2img, hires fix and the upscalers."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest, OutOfMemoryEverywhere, UnsafeCheckpoint
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session
from lowvram_gen.upscale.command import run_upscale
from lowvram_gen.upscale.upscalers import UpscaleReport, load_model, run_tiled, upscale_images


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


@pytest.fixture()
def init_png(tmp_path):
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8))
    path = tmp_path / "init.png"
    image.save(path)
    return path


@pytest.fixture(scope="module")
def esrgan(tmp_path_factory):
    """A small random-weight ESRGAN (RRDBNet, x2), saved as users download them."""
    from spandrel.architectures.ESRGAN import ESRGAN

    torch.manual_seed(0)
    state = ESRGAN(num_filters=8, num_blocks=1, scale=2).state_dict()
    folder = tmp_path_factory.mktemp("esrgan")
    torch.save(state, folder / "tiny-x2.pth")
    from safetensors.torch import save_file

    save_file(state, str(folder / "tiny-x2.safetensors"))
    return folder


def test_over_the_cap_generates_at_the_cap_and_upscales_to_the_request(tmp_path):
    result = Session(preset="lowvram").generate(GenerationRequest(
        prompt="a lighthouse", width=1024, height=1024, steps=1, seed=4, outdir=str(tmp_path)))
    assert (result.width, result.height) == (1024, 1024) and result.upscaled
    assert (result.generated_width, result.generated_height) == (768, 768)  # lowvram's cap: 768x768
    assert Image.open(result.images[0]).size == (1024, 1024)
    params, meta = read_png_metadata(result.images[0])
    fields = parse_a1111_parameters(params)
    assert fields["Size"] == "1024x1024" and fields["Generated size"] == "768x768"
    assert meta["generated_size"] == [768, 768] and meta["preset"] == "lowvram"
    assert "generated at 768x768, upscaled" in result.summary


def test_cap_keeps_the_aspect_ratio_in_multiples_of_8(tmp_path):
    result = Session(preset="novram").generate(GenerationRequest(
        prompt="x", width=1024, height=512, steps=1, outdir=str(tmp_path)))
    w, h = result.generated_width, result.generated_height
    assert w % 8 == 0 and h % 8 == 0 and w * h <= 512 * 512 and abs(w / h - 2) < 0.05
    assert Image.open(result.images[0]).size == (1024, 512)


def test_img2img_strength_0_returns_the_init_image_through_the_vae(init_png, tmp_path, tiny_path):
    from diffusers import AutoPipelineForImage2Image

    session = Session()
    result = session.generate(GenerationRequest(prompt="x", width=96, height=64, steps=4, init_image=str(init_png),
                                                strength=0.0, outdir=str(tmp_path)))
    pipe = AutoPipelineForImage2Image.from_pretrained(str(tiny_path))
    with torch.inference_mode():
        x = pipe.image_processor.preprocess(Image.open(init_png))
        round_trip = pipe.vae.decode(pipe.vae.encode(x).latent_dist.mode()).sample
    expected = np.asarray(pipe.image_processor.postprocess(round_trip, output_type="pil")[0], dtype=int)
    assert np.abs(pixels(result.images[0]) - expected).max() <= 1  # the init, within the VAE's round trip
    changed = session.generate(GenerationRequest(prompt="x", width=96, height=64, steps=4,
                                                 init_image=str(init_png), strength=1.0, outdir=str(tmp_path)))
    assert np.abs(pixels(changed.images[0]) - expected).mean() > 5
    assert parse_a1111_parameters(read_png_metadata(changed.images[0])[0])["Denoising strength"] == "1"


def test_img2img_cli(init_png, tmp_path, capsys):
    code = main(["img2img", "a boat", "--init", str(init_png), "--strength", "0.5", "--width", "96", "--height",
                 "64", "--steps", "4", "--seed", "3", "--outdir", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and Image.open(result["images"][0]).size == (96, 64)


@pytest.mark.parametrize("upscaler, written", [("latent", "Latent"), ("lanczos", "Lanczos")])
def test_hires_fix_second_pass_with_a1111_metadata(upscaler, written, tmp_path):
    """Our old lower-case names still run; the PNG says A1111's."""
    result = Session().generate(GenerationRequest(
        prompt="x", width=64, height=64, steps=2, seed=1, hires_scale=2, hires_upscaler=upscaler, hires_steps=2,
        hires_denoise=0.5, outdir=str(tmp_path)))
    assert (result.width, result.height) == (128, 128) and not result.upscaled
    assert Image.open(result.images[0]).size == (128, 128)
    assert [a["stage"] for a in result.attempts if a["stage"] == "hires"] == ["hires"]
    fields = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert (fields["Hires upscale"], fields["Hires upscaler"], fields["Hires steps"], fields["Denoising strength"]) == (
        "2", written, "2", "0.5")


def test_hires_second_pass_oom_steps_down_without_redoing_the_first(tmp_path):
    session = Session(preset="highvram")
    session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=1, outdir=str(tmp_path)))
    calls = []

    def hook(_module, args):
        calls.append(args[0].shape[-1])
        # simulated: the 128 px second pass (16x16 latents) does not fit without offload
        if args[0].shape[-1] == 16 and session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    session.model.pipe.unet.register_forward_pre_hook(hook)
    result = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, hires_scale=2,
                                                hires_steps=2, hires_denoise=0.5, outdir=str(tmp_path),
                                                sampler="PLMS"))  # the calls counted below are PLMS's
    stages = [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts]
    assert ("highvram", "hires", "oom") in stages and ("medvram", "hires", "ok") in stages
    assert calls.count(8) == len([c for c in calls if c == 8]) and calls[:1] == [8]
    first_pass_calls = [c for c in calls if c == 8]
    assert len(first_pass_calls) == 2  # A1111's PLMS at 2 steps (one step and its warm-up), run once: not redone


def test_esrgan_through_spandrel_pth_and_safetensors(esrgan, tmp_path, capsys):
    source = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(source)
    for name in ("tiny-x2.pth", "tiny-x2.safetensors"):
        code = main(["upscale", str(source), "--scale", "2", "--upscaler", str(esrgan / name), "--outdir",
                     str(tmp_path / "out"), "--json", "--cpu"])
        result = json.loads(capsys.readouterr().out)
        assert code == 0 and Image.open(result["images"][0]).size == (112, 80)
        params, meta = read_png_metadata(result["images"][0])
        assert "Postprocess upscale by: 2" in params and meta["upscaler"].endswith(name)


def test_an_upscaled_png_has_no_seed_in_its_name_one_size_and_the_source_by_name(tmp_path, capsys):
    """Rough edges: the name carried a meaningless seed 0, the text two `Size:` fields (the source's and
    ours) and the metadata the server's temporary path of an upload."""
    session = Session(device="cpu", outdir=str(tmp_path / "gen"))
    made = session.generate(GenerationRequest(prompt="a red fox", width=64, height=64, steps=1, seed=7))
    result = session.upscale(made.images[0], 2, outdir=str(tmp_path / "up"))
    saved = Path(result["images"][0])
    assert saved.name == "00000-7-a-red-fox-upscaled.png"  # counter, then the source's name without its counter
    params, meta = read_png_metadata(saved)
    assert params.count("Size:") == 1 and "Size: 64x64" in params  # the generation size, as A1111 keeps it
    assert "Postprocess upscale by: 2, Postprocess upscaler: Lanczos" in params  # A1111's name for it
    assert meta["source"] == Path(made.images[0]).name and "/" not in meta["source"]
    plain = tmp_path / "plain.png"
    Image.new("RGB", (20, 10)).save(plain)  # no parameters of its own: our fields and the new size
    params, _ = read_png_metadata(session.upscale(str(plain), 3, outdir=str(tmp_path / "up"))["images"][0])
    assert params.count("Size:") == 1 and "Size: 60x30" in params


def test_an_upscale_takes_the_next_number_and_the_sources_name_without_its_number(tmp_path):
    """Issue 18: `00010-00009-...`: the source's counter doubled up behind the new one."""
    folder = tmp_path / "out"
    folder.mkdir()
    for name in ("00007-1-a-cat.png", "00008-2-a-cat.png"):  # earlier images in the folder
        Image.new("RGB", (8, 8)).save(folder / name)
    source = folder / "00009-7-a-red-fox.png"
    Image.new("RGB", (16, 8)).save(source)
    first = Path(run_upscale(str(source), 2, outdir=str(folder), device="cpu")["images"][0])
    assert first.name == "00010-7-a-red-fox-upscaled.png"
    again = Path(run_upscale(str(first), 2, outdir=str(folder), device="cpu")["images"][0])
    assert again.name == "00011-7-a-red-fox-upscaled.png"  # not ...-upscaled-upscaled
    photo = tmp_path / "holiday photo.jpg"  # not one of ours: its whole name, made safe
    Image.new("RGB", (8, 8)).save(photo)
    assert Path(run_upscale(str(photo), 2, outdir=str(folder), device="cpu")["images"][0]).name == \
        "00012-holiday-photo-upscaled.png"
    assert Image.open(first).size == (32, 16) and source.is_file()  # nothing overwritten


def test_a_scale_beyond_the_model_factor_runs_the_model_again_as_a1111(esrgan, tmp_path, capsys):
    source = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(source)
    for scale, passes in (("1.5", 1), ("2", 1), ("3", 2), ("4", 2), ("8", 3)):
        code = main(["upscale", str(source), "--scale", scale, "--upscaler", str(esrgan / "tiny-x2.pth"), "--outdir",
                     str(tmp_path / "out"), "--json", "--cpu"])
        result = json.loads(capsys.readouterr().out)
        factor = float(scale)
        assert code == 0 and Image.open(result["images"][0]).size == (round(32 * factor), round(24 * factor))
        assert result["model_passes"] == passes, scale  # x8 from an x2 model: 3 passes, no Lanczos from x2
        assert read_png_metadata(result["images"][0])[1]["model_passes"] == passes
    descriptor = load_model(str(esrgan / "tiny-x2.pth"))
    twice = run_tiled(descriptor, run_tiled(descriptor, Image.open(source), "cpu", 64, UpscaleReport("x")), "cpu", 64,
                      UpscaleReport("x"))
    x4 = upscale_images([Image.open(source)], (128, 96), str(esrgan / "tiny-x2.pth"))[0]
    assert np.array_equal(np.asarray(x4), np.asarray(twice))  # exactly two model passes, nothing resized


def test_esrgan_tiles_halve_on_out_of_memory_and_give_the_same_image(esrgan):
    descriptor = load_model(str(esrgan / "tiny-x2.pth"))
    image = Image.fromarray(np.random.default_rng(2).integers(0, 255, (160, 160, 3), dtype=np.uint8))
    reference = np.asarray(run_tiled(descriptor, image, "cpu", 64, UpscaleReport("x")), dtype=int)
    real_call = type(descriptor).__call__

    def small_tiles_only(self, x):
        # simulated: a tile bigger than 64 px (plus its 16 px margins) does not fit
        if x.shape[-1] > 64 + 2 * 16:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_call(self, x)

    report = UpscaleReport("tiny")
    mp = pytest.MonkeyPatch()
    mp.setattr(type(descriptor), "__call__", small_tiles_only)
    try:
        halved = np.asarray(run_tiled(descriptor, image, "cpu", 128, report), dtype=int)
        assert report.tiles == [128, 64]
        assert [a["tile"] for a in report.attempts] == [128]
        assert np.abs(halved - reference).max() <= 2  # tiles with margins: seams do not show
        mp.setattr(type(descriptor), "__call__", lambda self, x: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
        with pytest.raises(OutOfMemoryEverywhere, match="px tiles"):
            run_tiled(descriptor, image, "cpu", 128, UpscaleReport("tiny"))
    finally:
        mp.undo()


def test_a_pickle_that_runs_code_is_refused_as_an_upscaler(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps({"model.0.weight": Evil()}))
    with pytest.raises(UnsafeCheckpoint):
        load_model(str(path))
    assert not marker.exists()


@pytest.mark.parametrize("args,word", [
    (["--scale", "0"], "scale"), (["--scale", "abc"], "scale"), (["--scale", "9"], "scale"),
    (["--upscaler", "latent"], "hires pass"), (["--upscaler", "nope"], "Lanczos"), (["--upscaler", "None"], "hires pass"),
])
def test_upscale_rejects_bad_values(args, word, init_png, capsys):
    assert main(["upscale", str(init_png), *args]) == 2
    assert word in capsys.readouterr().err


@pytest.mark.parametrize("field,value,word", [
    ("strength", -0.1, "0 to 1"), ("strength", 1.5, "0 to 1"), ("strength", "x", "0 to 1"),
    ("init_image", "/no/such.png", "no such file"), ("hires_scale", 0.5, "1 to 4"),
    ("hires_upscaler", "bogus", "Lanczos"), ("hires_denoise", 2, "0 to 1"),
])
def test_bad_img2img_and_hires_values(field, value, word, init_png):
    kwargs = {"init_image": str(init_png)} if field != "init_image" else {}
    with pytest.raises(InvalidRequest, match=word):
        GenerationRequest(**{**kwargs, field: value}).validated()


def test_a_file_that_is_not_an_image_is_refused(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    with pytest.raises(InvalidRequest, match="not a readable image"):
        GenerationRequest(init_image=str(text)).validated()


def test_hires_over_the_side_limit(capsys):
    assert main(["generate", "x", "--width", "2048", "--hires-scale", "4"]) == 2
    assert "at most 4096" in capsys.readouterr().err


def test_sd_x4_without_the_model_says_how_to_get_it(init_png):
    from lowvram_gen.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="hf download stabilityai/stable-diffusion-x4-upscaler"):
        upscale_images([Image.open(init_png)], (256, 384), "sd-x4")


def test_low_strength_still_runs_at_least_one_step(init_png, tmp_path):
    result = Session().generate(GenerationRequest(prompt="x", width=96, height=64, steps=2, strength=0.1,
                                                  init_image=str(init_png), outdir=str(tmp_path)))
    assert Image.open(result.images[0]).size == (96, 64)


def _tiny_sd_x4(folder):
    """diffusers' SD x4 upscaler in miniature (the shapes of its pipeline tests), random weights."""
    from diffusers import AutoencoderKL, DDIMScheduler, DDPMScheduler, StableDiffusionUpscalePipeline, \
        UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from lowvram_gen.models.tiny import _tokenizer

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=32, in_channels=7, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, use_linear_projection=True, num_class_embeds=100,
        norm_num_groups=8)
    vae = AutoencoderKL(block_out_channels=[16, 16, 32], in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=["DownEncoderBlock2D"] * 3, up_block_types=["UpDecoderBlock2D"] * 3,
                        norm_num_groups=8, scaling_factor=0.08333)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=1000, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=77, bos_token_id=512,
                                        eos_token_id=513, pad_token_id=513, hidden_act="gelu"))
    pipe = StableDiffusionUpscalePipeline(vae=vae, text_encoder=text, tokenizer=_tokenizer(), unet=unet,
                                          low_res_scheduler=DDPMScheduler(),
                                          scheduler=DDIMScheduler(prediction_type="v_prediction"),
                                          max_noise_level=350)
    pipe.save_pretrained(folder)


def test_sd_x4_upscaler_when_the_user_has_it(tmp_path, monkeypatch):
    _tiny_sd_x4(tmp_path / "x4")
    monkeypatch.setenv("LOWVRAM_GEN_SD_X4", str(tmp_path / "x4"))
    source = Image.fromarray(np.random.default_rng(3).integers(0, 255, (24, 32, 3), dtype=np.uint8))
    out = upscale_images([source], (128, 96), "sd-x4", steps=4)[0]
    assert out.size == (128, 96)
    assert np.asarray(out).std() > 0  # an image came out, not a blank canvas
