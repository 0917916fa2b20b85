"""FLUX.1 end to end: a tiny FluxPipeline built offline and run through the project's real code.

Flux is the other transformer family the app claims (engines/sd.py `size_multiple`, memory.py's
"Flux" family): a transformer over 2x2-packed 16-channel latents (sides in multiples of 16), guidance
as an input of the transformer (FLUX.1-dev is guidance-distilled: no CFG batch, no negative prompt
unless true CFG), a CLIP encoder for a pooled vector and a T5 encoder for the token stream, and a
flow-matching scheduler with a resolution-dependent shift. No T5 tokenizer is available offline, so
one is built here from a small vocabulary. Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli import main
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

PRESETS = ("highvram", "medvram", "lowvram", "novram", "cpu")
T5_DIM = 32  # T5 d_model: the width of the text tokens the transformer attends to


def t5_tokenizer():
    """A T5 tokenizer built offline: T5's special tokens (<pad> 0, </s> 1, <unk> 2) and a Unigram
    (sentencepiece) vocabulary of single characters, word-initial ones marked with '▁' as T5's are."""
    from transformers import T5TokenizerFast

    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [("▁" + c, -3.0) for c in chars] + [(c, -4.0) for c in chars]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=512)


def build_tiny_flux():
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer

    tokenizer_2 = t5_tokenizer()
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64,  # 16 latent channels packed 2x2 by the pipeline
        num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        axes_dims_rope=(4, 6, 6),  # sums to the head dim
        joint_attention_dim=T5_DIM,  # the T5 hidden states are the text tokens
        pooled_projection_dim=32,  # CLIP's pooled output (its hidden width)
        guidance_embeds=True,  # FLUX.1-dev: guidance is an input, not a doubled batch
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(  # Flux's VAE layout: 16 latent channels, no quant convs, a shift factor
        block_out_channels=(8, 16, 32, 32), in_channels=3, out_channels=3, latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=8, sample_size=128, use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=0.3611, shift_factor=0.1159,
    )
    torch.manual_seed(3)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer_2), d_model=T5_DIM, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",  # T5 v1.1, as FLUX's T5-XXL
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))
    scheduler = FlowMatchEulerDiscreteScheduler(  # FLUX.1-dev's scheduler config
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096,
    )
    return FluxPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler,
        text_encoder=_text_encoder(False, hidden=32, seed=1), tokenizer=_tokenizer(),
        text_encoder_2=t5, tokenizer_2=tokenizer_2,
    )


@pytest.fixture(scope="module")
def flux(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-flux")
    build_tiny_flux().save_pretrained(folder, safe_serialization=True)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline" and index["text_encoder_2"] == ["transformers", "T5EncoderModel"]
    assert list(folder.glob("transformer/*.safetensors")) and list(folder.glob("text_encoder_2/*.safetensors"))
    return str(folder)


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def request(flux, tmp_path, **kw) -> GenerationRequest:
    base = dict(prompt="a lighthouse", model=flux, width=64, height=64, steps=2, seed=5, cfg_scale=3.5,
                outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


def cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_offline_t5_tokenizer_round_trips(tmp_path):
    from transformers import AutoTokenizer

    tok = t5_tokenizer()
    ids = tok("a lighthouse, at dusk!").input_ids
    assert ids[-1] == tok.eos_token_id == 1 and tok.pad_token_id == 0 and tok.unk_token_id == 2
    assert tok.unk_token_id not in ids and tok.decode(ids, skip_special_tokens=True) == "a lighthouse, at dusk!"
    assert tok.unk_token_id in tok("€").input_ids  # outside the vocabulary
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert type(again).__name__ == "T5Tokenizer" and again("a lighthouse, at dusk!").input_ids == ids
    padded = again("a boat", padding="max_length", max_length=12).input_ids
    assert len(padded) == 12 and padded[-1] == 0


# --------------------------------------------------------------------------------- txt2img


def test_cli_generate_json_end_to_end_and_same_seed_same_pixels(flux, tmp_path, capsys):
    args = ["generate", "a lighthouse at dusk", "--model", flux, "--width", "128", "--height", "64", "--steps", "2",
            "--seed", "7", "--cfg", "3.5", "--outdir", str(tmp_path), "--json"]
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    result = json.loads(out)
    assert result["seeds"] == [7] and (result["width"], result["height"]) == (128, 64)
    assert result["preset"] == "cpu" and result["attempts"][-1]["outcome"] == "ok" and not result["upscaled"]
    assert len(result["images"]) == 1 and result["images"][0].endswith("-7-a-lighthouse-at-dusk.png")
    assert Image.open(result["images"][0]).size == (128, 64)
    text, meta = read_png_metadata(result["images"][0])
    params = parse_a1111_parameters(text)
    assert params["prompt"] == "a lighthouse at dusk"
    assert (params["Steps"], params["Seed"], params["Size"], params["CFG scale"], params["Model"]) == (
        "2", "7", "128x64", "3.5", flux)
    assert params["Sampler"] == "FlowMatchEulerDiscreteScheduler"  # 'default': the folder's own scheduler
    assert meta["seed"] == 7 and meta["attempts"][0]["stage"] == "denoise"

    code, out, _ = cli(capsys, *args)
    again = json.loads(out)
    assert code == 0 and again["images"] != result["images"]  # a second file, never overwritten
    assert np.array_equal(pixels(result["images"][0]), pixels(again["images"][0]))
    assert pixels(result["images"][0]).std() > 1  # an image, not a flat fill


def test_default_sampler_equals_plain_diffusers(flux, tmp_path):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(flux)
    plain = {}
    for guidance in (3.5, 8.0):
        plain[guidance] = np.asarray(pipe("a castle", width=128, height=64, num_inference_steps=3,
                                          guidance_scale=guidance, generator=torch.Generator().manual_seed(99),
                                          ).images[0].convert("RGB"), dtype=int)
    assert not np.array_equal(plain[3.5], plain[8.0])  # the guidance is an input of the transformer
    session = Session()
    for guidance in (3.5, 8.0):
        ours = session.generate(request(flux, tmp_path, prompt="a castle", width=128, height=64, steps=3,
                                        cfg_scale=guidance, seed=99))
        assert np.array_equal(pixels(ours.images[0]), plain[guidance]), guidance


def test_a_negative_prompt_is_what_diffusers_does_with_it_and_batches_split_by_seed(flux, tmp_path):
    """FluxPipeline takes a negative prompt only for true CFG (true_cfg_scale > 1, default 1): called
    as a user would, with the negative prompt, diffusers ignores it, and so the same pixels come out."""
    from diffusers import FluxPipeline

    session = Session()
    batch = session.generate(request(flux, tmp_path, negative_prompt="fog", batch_size=2, seed=10))
    assert batch.seeds == [10, 11] and len(batch.images) == 2
    first, second = (pixels(p) for p in batch.images)
    assert not np.array_equal(first, second)
    single = session.generate(request(flux, tmp_path, negative_prompt="fog", seed=11))
    assert np.abs(second - pixels(single.images[0])).max() <= 1  # image i depends on seed+i alone
    pipe = FluxPipeline.from_pretrained(flux)
    plain = pipe("a lighthouse", negative_prompt="fog", width=64, height=64, num_inference_steps=2,
                 guidance_scale=3.5, generator=torch.Generator().manual_seed(11)).images[0]
    assert np.array_equal(pixels(single.images[0]), np.asarray(plain.convert("RGB"), dtype=int))
    text, _ = read_png_metadata(batch.images[1])
    assert parse_a1111_parameters(text)["negative_prompt"] == "fog"
    ignored = "FluxPipeline does not use a negative prompt (it runs without CFG): it is ignored"
    assert ignored in batch.warnings and ignored in single.warnings  # said, not silently dropped
    assert not any("negative prompt" in w for w in session.generate(request(flux, tmp_path)).warnings)


def test_prompt_length_is_counted_in_t5_tokens(flux, tmp_path):
    """CLIP (77 tokens) only gives Flux a pooled vector: the prompt's tokens reach the transformer
    through T5, padded to 512. A prompt past CLIP's 77 but within 512 is not truncated."""
    session = Session()
    medium = session.generate(request(flux, tmp_path, prompt="a lighthouse at dusk " * 8, steps=1))  # 137 T5 tokens
    assert not any("tokens" in w for w in medium.warnings), medium.warnings
    long = session.generate(request(flux, tmp_path, prompt="a lighthouse at dusk " * 40, steps=1))  # 681
    assert [w for w in long.warnings if "tokens" in w] == [
        "the prompt has 681 tokens; the text encoder takes 512, the rest is ignored"]


# --------------------------------------------------------------------------------- memory presets


def test_every_preset_applies_to_the_transformer_and_generates(flux, tmp_path):
    session = Session()
    images = {}
    for name in PRESETS:
        result = session.generate(request(flux, tmp_path, preset=name))
        assert result.preset == name and [a["outcome"] for a in result.attempts] == ["ok"]
        assert Image.open(result.images[0]).size == (64, 64)
        images[name] = pixels(result.images[0])
        transformer = session.model.pipe.transformer
        weight = transformer.transformer_blocks[0].ff.net[0].proj.weight
        group_hooked = any(getattr(m, "_diffusers_hook", None) is not None
                           and m._diffusers_hook.get_hook("group_offloading") is not None
                           for m in transformer.modules())
        assert (weight.dtype == torch.float8_e4m3fn) == (name == "novram"), name
        assert group_hooked == (name in ("lowvram", "novram")), name
        assert (getattr(transformer, "_hf_hook", None) is not None) == (name == "medvram"), name
    for name in ("highvram", "medvram", "lowvram"):
        assert np.abs(images[name] - images["cpu"]).max() <= 1, name
    assert not np.array_equal(images["novram"], images["cpu"])  # float8 weights: close, not equal
    assert session.model.pipe.transformer.dtype == torch.float32  # back to full precision after novram


def test_out_of_memory_at_the_first_preset_finishes_at_the_next(flux, tmp_path):
    session = Session(preset="highvram")  # the GPU ladder, run on this CPU
    session.generate(request(flux, tmp_path, steps=1))
    transformer = session.model.pipe.transformer

    def oom(_module, _args, _kwargs):  # simulated: highvram (no offload) runs out of memory in every step
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = transformer.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        result = session.generate(request(flux, tmp_path, seed=3))
    finally:
        handle.remove()
    assert result.preset == "medvram"
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert "out of memory at highvram" in result.summary and "finished at medvram" in result.summary
    assert Image.open(result.images[0]).size == (64, 64)
    assert session.model.pipe.transformer is transformer  # reconfigured, not reloaded
    plain = Session().generate(request(flux, tmp_path, seed=3))
    assert np.abs(pixels(result.images[0]) - pixels(plain.images[0])).max() <= 1  # the retry is the same job


# --------------------------------------------------------------------------------- plan, errors, img2img


def test_plan_json_reads_the_folder_as_flux_without_a_cfg_batch(flux, capsys):
    from dataclasses import replace

    from lowvram_gen.memory import estimate, profile_from_folder
    from lowvram_gen.presets import find_preset

    profile = profile_from_folder(flux)
    assert profile.denoiser == "transformer" and profile.transformer_hidden == 32
    # 16 latent channels, which the pipeline packs 2x2 into the transformer's 64 input channels: one
    # image token covers 2x2 latent pixels (as SD3's patch_size 2); T5's 512 tokens ride along
    assert profile.latent_channels == 16 and profile.transformer_patch == 2
    assert profile.joint_text_tokens == 512 and profile.text_tokens == (77, 512)
    assert set(profile.params) == {"transformer", "vae", "text_encoder", "text_encoder_2"}
    assert profile.params["text_encoder_2"] > 0 and profile.vae_scale_factor == 8
    assert profile.cfg_batch is False  # guidance-distilled: guidance is an input, not a second batch
    memory = find_preset("highvram").memory
    with_cfg, without = (estimate(profile, 256, 256, 1, memory, cfg=c) for c in (True, False))
    assert with_cfg == without
    doubled = estimate(replace(profile, cfg_batch=True), 256, 256, 1, memory, cfg=True)  # as SD3 would run
    assert doubled.unet_bytes > with_cfg.unet_bytes

    runs = {}
    for side in (128, 256):
        code, out, err = cli(capsys, "plan", "--model", flux, "--vram", "4GiB", "--width", str(side), "--height",
                             str(side), "--json")
        assert code == 0, err
        runs[side] = json.loads(out)
    small, large = runs[128], runs[256]
    assert [p["name"] for p in large["presets"]] == ["highvram", "medvram", "lowvram", "novram"]
    assert large["preset"] == "highvram"
    for a, b in zip(small["presets"], large["presets"]):
        assert a["breakdown"]["weights_bytes"] > 0 and a["breakdown"]["unet_bytes"] > 0
        assert b["estimate_bytes"] > a["estimate_bytes"]
        assert b["breakdown"]["unet_bytes"] > a["breakdown"]["unet_bytes"]


@pytest.mark.parametrize("args,message", [
    (["--width", "72"], "FluxPipeline needs multiples of 16: use 64 or 80"),
    (["--height", "88"], "FluxPipeline needs multiples of 16: use 80 or 96"),
    (["--hires-scale", "2", "--hires-upscaler", "latent"], "its latents cannot be upscaled: use lanczos"),
    (["--sampler", "Euler a"], "flow-matching model (FlowMatchEulerDiscreteScheduler)"),
], ids=["width", "height", "hires-latent", "sampler"])
def test_what_flux_cannot_do_is_a_clear_error(flux, tmp_path, capsys, args, message):
    code, out, err = cli(capsys, "generate", "x", "--model", flux, "--width", "64", "--height", "64", "--steps", "1",
                         "--outdir", str(tmp_path), *args)
    assert code == 2 and out == ""
    assert err.startswith("error: invalid ") and message in err
    assert "Traceback" not in err and not list(tmp_path.glob("*.png"))


def test_img2img_cli(flux, tmp_path, capsys):
    init = tmp_path / "init.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(init)  # resized to the request
    common = ["--init", str(init), "--model", flux, "--width", "128", "--height", "64", "--steps", "4", "--seed",
              "2", "--outdir", str(tmp_path / "out"), "--json"]
    code, out, err = cli(capsys, "img2img", "a harbour", "--strength", "0.5", *common)
    assert code == 0, err
    result = json.loads(out)
    made = pixels(result["images"][0])
    assert made.shape == (64, 128, 3)
    text, _ = read_png_metadata(result["images"][0])
    assert parse_a1111_parameters(text)["Denoising strength"] == "0.5"
    resized = np.asarray(Image.open(init).convert("RGB").resize((128, 64)), dtype=int)
    assert not np.array_equal(made, resized)

    code, out, err = cli(capsys, "img2img", "a harbour", "--strength", "0", *common)  # 0 keeps the image
    assert code == 0, err
    assert np.array_equal(pixels(json.loads(out)["images"][0]), resized)


def test_hires_fix_runs_flux_img2img_at_the_hires_size(flux, tmp_path, monkeypatch):
    from lowvram_gen.engines import sd

    calls = []
    real = sd.denoise

    def watched(pipe, chunk, *args, **kwargs):
        calls.append((chunk.width, chunk.height, chunk.init is not None, chunk.strength))
        return real(pipe, chunk, *args, **kwargs)

    monkeypatch.setattr(sd, "denoise", watched)
    session = Session()
    result = session.generate(request(flux, tmp_path, hires_scale=2, hires_upscaler="lanczos", hires_steps=2,
                                      hires_denoise=0.6))
    assert calls == [(64, 64, False, 1.0), (128, 128, True, 0.6)]  # first pass, then img2img at 2x
    assert Image.open(result.images[0]).size == (128, 128) and not result.upscaled
    assert type(session.model.pipe._lowvram_img2img).__name__ == "FluxImg2ImgPipeline"
    assert session.model.pipe._lowvram_img2img.transformer is session.model.pipe.transformer  # shared, not copied
    assert [a["stage"] for a in result.attempts] == ["denoise", "hires"]


def test_prompt_token_count_uses_clip_where_there_is_no_t5(flux, tiny_path):
    from diffusers import DiffusionPipeline, FluxPipeline

    from lowvram_gen.engines.sd import ignores_negative_prompt, prompt_token_count

    prompt = "a lighthouse at dusk " * 8
    sd = DiffusionPipeline.from_pretrained(tiny_path)
    assert prompt_token_count(sd, prompt) == (len(sd.tokenizer(prompt).input_ids), 77)
    assert not ignores_negative_prompt(sd)
    pipe = FluxPipeline.from_pretrained(flux)
    assert prompt_token_count(pipe, prompt) == (137, 512) and prompt_token_count(pipe, "") == (0, 0)
    assert ignores_negative_prompt(pipe)
