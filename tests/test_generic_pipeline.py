"""A pipeline other than SD 1.x/SDXL, end to end: a tiny Stable Diffusion 3 built offline.

SD 1.x and SDXL take the split path (denoise, then our own VAE decode); every other pipeline takes
the generic one, where the pipeline decodes itself (engines/sd.py, `splits_decode`). SD3 is a real
such pipeline: a transformer denoiser with 2x2 patches (sides in multiples of 16), a 16-channel VAE
with a shift factor, two CLIP encoders and no T5 (`text_encoder_3=None`, saved as null in
model_index.json), and a flow-matching scheduler. Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli import main
from lowvram_gen.errors import Cancelled
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

PRESETS = ("highvram", "medvram", "lowvram", "novram", "cpu")


def build_tiny_sd3():
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=2,
        caption_projection_dim=16,  # = heads x head dim: text and image tokens attend jointly
        joint_attention_dim=64,  # the two CLIP hidden states concatenated (32 + 32); the T5 slot is zeros
        pooled_projection_dim=64,  # the two CLIP projections concatenated (32 + 32)
        pos_embed_max_size=32,  # up to 512 px (32 patches a side)
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(  # SD3's VAE layout: 16 latent channels, no quant convs, a shift factor
        block_out_channels=(8, 16, 32, 32), in_channels=3, out_channels=3, latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=8, sample_size=128, use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=1.5305, shift_factor=0.0609,
    )
    return StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        text_encoder=_text_encoder(True, hidden=32, seed=1), tokenizer=_tokenizer(),
        text_encoder_2=_text_encoder(True, hidden=32, seed=2), tokenizer_2=_tokenizer(),
        text_encoder_3=None, tokenizer_3=None,
    )


@pytest.fixture(scope="module")
def sd3(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-sd3")
    build_tiny_sd3().save_pretrained(folder, safe_serialization=True)
    assert json.loads((folder / "model_index.json").read_text())["text_encoder_3"] == [None, None]
    assert list(folder.glob("transformer/*.safetensors"))
    return str(folder)


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def request(sd3, tmp_path, **kw) -> GenerationRequest:
    base = dict(prompt="a lighthouse", model=sd3, width=64, height=64, steps=2, seed=5, outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


def cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------------- txt2img


def test_cli_generate_json_end_to_end_and_same_seed_same_pixels(sd3, tmp_path, capsys):
    args = ["generate", "a lighthouse at dusk", "--model", sd3, "--width", "128", "--height", "96", "--steps", "2",
            "--seed", "7", "--cfg", "5", "--outdir", str(tmp_path), "--json"]
    code, out, _ = cli(capsys, *args)
    assert code == 0
    result = json.loads(out)
    assert result["seeds"] == [7] and (result["width"], result["height"]) == (128, 96)
    assert result["preset"] == "cpu" and result["attempts"][-1]["outcome"] == "ok" and not result["upscaled"]
    assert len(result["images"]) == 1 and result["images"][0].endswith("-7-a-lighthouse-at-dusk.png")
    assert Image.open(result["images"][0]).size == (128, 96)
    text, meta = read_png_metadata(result["images"][0])
    params = parse_a1111_parameters(text)
    assert params["prompt"] == "a lighthouse at dusk"
    assert (params["Steps"], params["Seed"], params["Size"], params["CFG scale"], params["Model"]) == (
        "2", "7", "128x96", "5", sd3)
    assert params["Sampler"] == "FlowMatchEulerDiscreteScheduler"  # 'default': the folder's own scheduler
    assert meta["seed"] == 7 and meta["attempts"][0]["stage"] == "denoise"

    code, out, _ = cli(capsys, *args)
    again = json.loads(out)
    assert code == 0 and again["images"] != result["images"]  # a second file, never overwritten
    assert np.array_equal(pixels(result["images"][0]), pixels(again["images"][0]))
    assert pixels(result["images"][0]).std() > 1  # an image, not a flat fill


def test_default_sampler_equals_plain_diffusers(sd3, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    ours = Session().generate(request(sd3, tmp_path, prompt="a castle", negative_prompt="fog", width=128, height=64,
                                      steps=3, cfg_scale=6.5, seed=99))
    # diffusers itself needs the absent T5 passed again for a folder saved without it
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3, text_encoder_3=None, tokenizer_3=None)
    plain = pipe("a castle", negative_prompt="fog", width=128, height=64, num_inference_steps=3, guidance_scale=6.5,
                 generator=torch.Generator().manual_seed(99)).images[0]
    assert np.array_equal(pixels(ours.images[0]), np.asarray(plain.convert("RGB"), dtype=int))


def test_negative_prompt_and_batch_of_two(sd3, tmp_path):
    session = Session()
    batch = session.generate(request(sd3, tmp_path, negative_prompt="fog", batch_size=2, seed=10))
    assert batch.seeds == [10, 11] and len(batch.images) == 2
    first, second = (pixels(p) for p in batch.images)
    assert not np.array_equal(first, second)
    single = session.generate(request(sd3, tmp_path, negative_prompt="fog", seed=11))
    assert np.abs(second - pixels(single.images[0])).max() <= 1  # image i depends on seed+i alone
    without = session.generate(request(sd3, tmp_path, seed=11))
    assert not np.array_equal(pixels(without.images[0]), pixels(single.images[0]))  # the negative prompt is used
    text, _ = read_png_metadata(batch.images[1])
    assert parse_a1111_parameters(text)["negative_prompt"] == "fog"


# --------------------------------------------------------------------------------- memory presets


def test_every_preset_applies_to_the_transformer_and_generates(sd3, tmp_path):
    """One session goes through every preset: offload and fp8 storage land on `transformer` (there is
    no `unet`), and leaving novram's float8 weights reloads them from the folder."""
    session = Session()
    images = {}
    for name in PRESETS:
        result = session.generate(request(sd3, tmp_path, preset=name))
        assert result.preset == name and [a["outcome"] for a in result.attempts] == ["ok"]
        assert Image.open(result.images[0]).size == (64, 64)
        images[name] = pixels(result.images[0])
        transformer = session.model.pipe.transformer
        weight = transformer.transformer_blocks[0].ff.net[0].proj.weight
        group_hooked = any(getattr(m, "_diffusers_hook", None) is not None  # block- or leaf-level groups
                           and m._diffusers_hook.get_hook("group_offloading") is not None
                           for m in transformer.modules())
        assert (weight.dtype == torch.float8_e4m3fn) == (name == "novram"), name
        assert group_hooked == (name in ("lowvram", "novram")), name
        assert (getattr(transformer, "_hf_hook", None) is not None) == (name == "medvram"), name
    # on a CPU every preset but novram computes in float32: offload must not change the pixels
    for name in ("highvram", "medvram", "lowvram"):
        assert np.abs(images[name] - images["cpu"]).max() <= 1, name
    assert not np.array_equal(images["novram"], images["cpu"])  # float8 weights: close, not equal
    assert session.model.pipe.transformer.dtype == torch.float32  # back to full precision after novram


def test_out_of_memory_at_the_first_preset_finishes_at_the_next(sd3, tmp_path):
    session = Session(preset="highvram")  # the GPU ladder, run on this CPU
    session.generate(request(sd3, tmp_path, steps=1))
    transformer = session.model.pipe.transformer

    def oom(_module, _args, _kwargs):  # simulated: highvram (no offload) runs out of memory in every step
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = transformer.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        result = session.generate(request(sd3, tmp_path, seed=3))
    finally:
        handle.remove()
    assert result.preset == "medvram"
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert "out of memory at highvram" in result.summary and "finished at medvram" in result.summary
    assert Image.open(result.images[0]).size == (64, 64)
    assert session.model.pipe.transformer is transformer  # reconfigured, not reloaded
    _, meta = read_png_metadata(result.images[0])
    assert [a["outcome"] for a in meta["attempts"]] == ["oom", "ok"]


def test_out_of_memory_in_the_pipelines_own_decode_retries_the_chunk_at_the_next_preset(sd3):
    from lowvram_gen.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import gpu_ladder, load_presets
    from lowvram_gen.runner import JobSpec, Runner

    model = load(resolve(sd3), "float32")
    runner = Runner(model, probe("cpu"))
    steps = []
    model.pipe.transformer.register_forward_pre_hook(lambda m, a: steps.append(runner.applied.offload))

    def oom(_module, _args):  # simulated: the VAE decode at highvram does not fit
        if runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    model.pipe.vae.decoder.register_forward_pre_hook(oom)
    done = []
    report = runner.run(JobSpec("a boat", "", 64, 64, 2, 7.0, [1]), gpu_ladder(load_presets()), done.append)
    # the pipeline decodes inside its own call: the decode OOM retries the whole chunk, one preset down
    assert [(a.preset, a.stage, a.outcome) for a in report.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert steps == ["none", "none", "model", "model"]
    assert done[0].images[0].size == (64, 64)


def test_a_capped_size_keeps_sides_the_transformer_takes(sd3):
    """A preset's pixel cap shrinks the job; SD3 needs multiples of 16 where SD takes multiples of 8."""
    from dataclasses import replace

    from lowvram_gen.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset
    from lowvram_gen.runner import JobSpec, Runner, capped_size

    assert capped_size(112, 80, 4096) == (72, 64)  # fine for SD, refused by SD3
    assert capped_size(112, 80, 4096, 16) == (64, 64)
    assert capped_size(1024, 768, 589824, 16) == (880, 656)  # lowvram's 768x768 cap
    runner = Runner(load(resolve(sd3), "float32"), probe("cpu"))
    small = replace(find_preset("cpu"), max_pixels=4096)
    done = []
    report = runner.run(JobSpec("a boat", "", 112, 80, 2, 7.0, [1]), [small], done.append)
    assert report.generated_size == (64, 64) and report.upscaled
    assert done[0].images[0].size == (112, 80)


# --------------------------------------------------------------------------------- plan


def test_plan_json_estimates_every_preset_for_the_folder(sd3, capsys):
    from lowvram_gen.memory import profile_from_folder

    profile = profile_from_folder(sd3)
    assert profile.denoiser == "transformer" and profile.transformer_hidden == 16 and profile.latent_channels == 16
    assert set(profile.params) == {"transformer", "vae", "text_encoder", "text_encoder_2"}  # no T5: null in the index
    assert profile.denoiser_blocks and profile.vae_scale_factor == 8

    runs = {}
    for side in (128, 256):
        code, out, _ = cli(capsys, "plan", "--model", sd3, "--vram", "4GiB", "--width", str(side), "--height",
                           str(side), "--json")
        assert code == 0
        runs[side] = json.loads(out)
    small, large = runs[128], runs[256]
    assert [p["name"] for p in large["presets"]] == ["highvram", "medvram", "lowvram", "novram"]
    assert large["preset"] == "highvram"  # a tiny model fits a 4 GiB card whole
    for a, b in zip(small["presets"], large["presets"]):
        assert a["breakdown"]["weights_bytes"] > 0 and a["breakdown"]["unet_bytes"] > 0
        assert b["estimate_bytes"] > a["estimate_bytes"] > a["breakdown"]["overhead_bytes"]
        assert b["breakdown"]["unet_bytes"] > a["breakdown"]["unet_bytes"]
        assert b["breakdown"]["vae_bytes"] > a["breakdown"]["vae_bytes"]
    totals = [p["estimate_bytes"] for p in large["presets"]]
    assert totals == sorted(totals, reverse=True)  # each cheaper preset needs no more memory


# --------------------------------------------------------------------------------- cancel, img2img, errors


def test_cancel_between_steps_keeps_the_finished_image(sd3, tmp_path):
    session = Session(preset="novram")  # one image per pass: a batch of two is two chunks
    cancel, seen = threading.Event(), []

    def on_step(step, total):
        seen.append((step, total))
        if len(seen) == 4:  # the first step of the second image
            cancel.set()

    with pytest.raises(Cancelled) as err:
        session.generate(request(sd3, tmp_path, steps=3, batch_size=2), on_step=on_step, cancel=cancel)
    assert seen == [(1, 3), (2, 3), (3, 3), (1, 3)]  # stopped at once
    assert len(err.value.images) == 1 and "1 finished image" in str(err.value)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [err.value.images[0].split("/")[-1]]
    assert len(session.generate(request(sd3, tmp_path)).images) == 1  # the session still works


def test_img2img_cli(sd3, tmp_path, capsys):
    init = tmp_path / "init.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(init)  # resized to the request
    common = ["--init", str(init), "--model", sd3, "--width", "64", "--height", "64", "--steps", "4", "--seed", "2",
              "--outdir", str(tmp_path / "out"), "--json"]
    code, out, err = cli(capsys, "img2img", "a harbour", "--strength", "0.5", *common)
    assert code == 0, err
    result = json.loads(out)
    made = pixels(result["images"][0])
    assert made.shape == (64, 64, 3)
    text, _ = read_png_metadata(result["images"][0])
    assert parse_a1111_parameters(text)["Denoising strength"] == "0.5"
    resized = np.asarray(Image.open(init).convert("RGB").resize((64, 64)), dtype=int)
    assert not np.array_equal(made, resized)

    code, out, err = cli(capsys, "img2img", "a harbour", "--strength", "0", *common)  # 0 keeps the image
    assert code == 0, err
    assert np.array_equal(pixels(json.loads(out)["images"][0]), resized)


def test_hires_fix_upscales_the_first_pass_in_pixels(sd3, tmp_path, monkeypatch):
    """SD3 decodes inside its own call: hires fix takes its first-pass images, upscales them and runs
    img2img at the hires size (A1111's hires fix with a pixel upscaler), with A1111's metadata."""
    from lowvram_gen.engines import sd

    calls = []
    real = sd.denoise

    def watched(pipe, chunk, *args, **kwargs):
        calls.append((chunk.width, chunk.height, chunk.init is not None, chunk.strength))
        return real(pipe, chunk, *args, **kwargs)

    monkeypatch.setattr(sd, "denoise", watched)
    result = Session().generate(request(sd3, tmp_path, hires_scale=2, hires_upscaler="lanczos", hires_steps=2,
                                        hires_denoise=0.6))
    assert calls == [(64, 64, False, 1.0), (128, 128, True, 0.6)]  # first pass, then img2img at 2x
    image = Image.open(result.images[0])
    assert image.size == (128, 128) and not result.upscaled
    fields = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert (fields["Hires upscale"], fields["Hires upscaler"], fields["Denoising strength"]) == ("2", "lanczos", "0.6")
    assert [a["stage"] for a in result.attempts] == ["denoise", "hires"]


@pytest.mark.parametrize("args,message", [
    (["--width", "72"], "StableDiffusion3Pipeline needs multiples of 16: use 64 or 80"),
    (["--hires-scale", "2", "--hires-upscaler", "latent"], "its latents cannot be upscaled: use lanczos"),
    (["--width", "80", "--height", "80", "--hires-scale", "1.5", "--hires-upscaler", "lanczos"],
     "80x80 x1.5 is 120x120; StableDiffusion3Pipeline needs multiples of 16"),
    (["--sampler", "Euler a"], "flow-matching model (FlowMatchEulerDiscreteScheduler)"),
], ids=["size", "hires-latent", "hires-off-grid", "sampler"])
def test_what_sd3_cannot_do_is_a_clear_error(sd3, tmp_path, capsys, args, message):
    code, out, err = cli(capsys, "generate", "x", "--model", sd3, "--width", "64", "--height", "64", "--steps", "1",
                         "--outdir", str(tmp_path), *args)
    assert code == 2 and out == ""
    assert err.startswith("error: invalid ") and message in err
    assert "Traceback" not in err and not list(tmp_path.glob("*.png"))


def test_the_size_grid_of_each_pipeline_family(sd3, tiny_path):
    """Sides must be multiples of 8 for SD, 16 for SD3 (2x2 patches) and Flux (2x2 packed latents, which
    its image processor rounds to); built empty, as the grid is read from the pipeline, not the weights."""
    from diffusers import DiffusionPipeline, FluxPipeline

    from lowvram_gen.engines.sd import size_multiple

    flux = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                        tokenizer_2=None, transformer=None)
    assert size_multiple(flux) == 16
    assert size_multiple(DiffusionPipeline.from_pretrained(tiny_path)) == 8
    assert size_multiple(DiffusionPipeline.from_pretrained(sd3, text_encoder_3=None, tokenizer_3=None)) == 16
