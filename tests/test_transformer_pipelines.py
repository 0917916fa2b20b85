"""Transformer pipelines end to end: a tiny Stable Diffusion 3 and a tiny FLUX.1-dev, built offline
(tests/tiny_transformers.py) and run through the project's real code.

Both take the generic path, where the pipeline decodes itself. What both families must do is written
once and run for each (the `family` fixture); what differs between them is in the FAMILIES table
below. What only one family does has its own tests, at the end, on the `sd3` or `flux` fixture.
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
from PIL import Image
from ladder_checks import out_of_memory_steps_down
from tiny_transformers import build_tiny_flux, build_tiny_sd3, cli, pixels, t5_tokenizer

from lowvram_gen import GenerationRequest
from lowvram_gen.errors import Cancelled
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

PRESETS = ("highvram", "medvram", "lowvram", "novram", "cpu")


@dataclass(frozen=True)
class Family:
    """What a test expects of one family's tiny pipeline; `folder` is filled in by its fixture."""

    name: str
    pipeline: str  # the diffusers class, as the error messages name it
    img2img: str  # the image-to-image pipeline hires fix builds over the same components
    profile: dict  # the fields profiles.profile_from_folder must read from the folder
    cfg_scale: float  # the requests' CFG scale (Flux: its guidance)
    ignored_negative_prompt: str  # the warning where the pipeline ignores a negative prompt ("": it uses it)
    cli_size: tuple[int, int]  # generate --json end to end: width, height ...
    cli_cfg: str  # ... and --cfg
    img2img_size: tuple[int, int]  # img2img --json: width, height
    guidance_scales: tuple[float, float]  # two scales, each compared with plain diffusers
    negative_prompt: str  # passed to both sides in that comparison ("": none)
    load: dict = field(default_factory=dict)  # from_pretrained keyword arguments plain diffusers needs
    folder: str = ""


FAMILIES = {
    "sd3": Family(
        name="sd3", pipeline="StableDiffusion3Pipeline", img2img="StableDiffusion3Img2ImgPipeline",
        profile=dict(denoiser="transformer", transformer_hidden=16, latent_channels=16, transformer_patch=2,
                     joint_text_tokens=77 + 256,  # the two CLIPs' tokens and the T5 slot (zeros without T5)
                     text_tokens=(77, 77), cfg_batch=True, vae_scale_factor=8),
        cfg_scale=7.0, ignored_negative_prompt="", cli_size=(128, 96), cli_cfg="5", img2img_size=(64, 64),
        guidance_scales=(6.5, 2.0), negative_prompt="fog",
        load=dict(text_encoder_3=None, tokenizer_3=None),  # diffusers needs the absent T5 passed again
    ),
    "flux": Family(
        name="flux", pipeline="FluxPipeline", img2img="FluxImg2ImgPipeline",
        # 16 latent channels, which the pipeline packs 2x2 into the transformer's 64 input channels: one
        # image token covers 2x2 latent pixels (as SD3's patch_size 2); T5's 512 tokens ride along.
        # No CFG batch: guidance-distilled, the guidance is an input of the transformer.
        profile=dict(denoiser="transformer", transformer_hidden=32, latent_channels=16, transformer_patch=2,
                     joint_text_tokens=512, text_tokens=(77, 512), cfg_batch=False, vae_scale_factor=8),
        cfg_scale=3.5,
        ignored_negative_prompt="FluxPipeline does not use a negative prompt (it runs without CFG): it is ignored",
        cli_size=(128, 64), cli_cfg="3.5", img2img_size=(128, 64),
        guidance_scales=(3.5, 8.0), negative_prompt="",  # Flux ignores one (see the Flux tests below)
    ),
}

CANNOT = {  # generate arguments a transformer pipeline refuses -> the message; {pipeline}: Family.pipeline
    "width": (["--width", "72"], "{pipeline} needs multiples of 16: use 64 or 80"),
    "height": (["--height", "88"], "{pipeline} needs multiples of 16: use 80 or 96"),
    "hires-latent": (["--hires-scale", "2", "--hires-upscaler", "latent"],
                     "its latents cannot be upscaled: use Lanczos"),
    "hires-off-grid": (["--width", "80", "--height", "80", "--hires-scale", "1.5", "--hires-upscaler", "lanczos"],
                       "80x80 x1.5 is 120x120; {pipeline} needs multiples of 16"),
    "sampler": (["--sampler", "Euler a"], "flow-matching model (FlowMatchEulerDiscreteScheduler)"),
}


@pytest.fixture(scope="module")
def sd3(tmp_path_factory) -> Family:
    folder = tmp_path_factory.mktemp("tiny-sd3")
    build_tiny_sd3().save_pretrained(folder, safe_serialization=True)
    assert json.loads((folder / "model_index.json").read_text())["text_encoder_3"] == [None, None]
    assert list(folder.glob("transformer/*.safetensors"))
    return replace(FAMILIES["sd3"], folder=str(folder))


@pytest.fixture(scope="module")
def flux(tmp_path_factory) -> Family:
    folder = tmp_path_factory.mktemp("tiny-flux")
    build_tiny_flux().save_pretrained(folder, safe_serialization=True)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline" and index["text_encoder_2"] == ["transformers", "T5EncoderModel"]
    assert list(folder.glob("transformer/*.safetensors")) and list(folder.glob("text_encoder_2/*.safetensors"))
    return replace(FAMILIES["flux"], folder=str(folder))


@pytest.fixture(scope="module", params=["sd3", "flux"])
def family(request) -> Family:
    """Each family in turn, from its own fixture: every folder is built and saved once."""
    return request.getfixturevalue(request.param)


def generation(family: Family, tmp_path, **kw) -> GenerationRequest:
    base = dict(prompt="a lighthouse", model=family.folder, width=64, height=64, steps=2, seed=5,
                cfg_scale=family.cfg_scale, outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


# ================================================================================= both families
# --------------------------------------------------------------------------------- txt2img


def test_cli_generate_json_end_to_end_and_same_seed_same_pixels(family, tmp_path, capsys):
    width, height = family.cli_size
    args = ["generate", "a lighthouse at dusk", "--model", family.folder, "--width", str(width), "--height",
            str(height), "--steps", "2", "--seed", "7", "--cfg", family.cli_cfg, "--outdir", str(tmp_path), "--json"]
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    result = json.loads(out)
    assert result["seeds"] == [7] and (result["width"], result["height"]) == (width, height)
    assert result["preset"] == "cpu" and result["attempts"][-1]["outcome"] == "ok" and not result["upscaled"]
    assert len(result["images"]) == 1 and result["images"][0].endswith("-7-a-lighthouse-at-dusk.png")
    assert Image.open(result["images"][0]).size == (width, height)
    text, meta = read_png_metadata(result["images"][0])
    params = parse_a1111_parameters(text)
    assert params["prompt"] == "a lighthouse at dusk"
    assert (params["Steps"], params["Seed"], params["Size"], params["CFG scale"], params["Model"]) == (
        "2", "7", f"{width}x{height}", family.cli_cfg, family.folder)
    assert params["Sampler"] == "FlowMatchEulerDiscreteScheduler"  # 'default': the folder's own scheduler
    assert meta["seed"] == 7 and meta["attempts"][0]["stage"] == "denoise"

    code, out, _ = cli(capsys, *args)
    again = json.loads(out)
    assert code == 0 and again["images"] != result["images"]  # a second file, never overwritten
    assert np.array_equal(pixels(result["images"][0]), pixels(again["images"][0]))
    assert pixels(result["images"][0]).std() > 1  # an image, not a flat fill


def test_default_sampler_equals_plain_diffusers_at_two_guidance_scales_that_differ(family, tmp_path):
    """SD3's CFG scale doubles the batch; Flux's guidance is an input of the transformer. Either way the
    scale must reach the denoiser: the two scales give two images."""
    import diffusers

    pipe = getattr(diffusers, family.pipeline).from_pretrained(family.folder, **family.load)
    negative = {"negative_prompt": family.negative_prompt} if family.negative_prompt else {}
    session = Session()
    plain = {}
    for guidance in family.guidance_scales:
        plain[guidance] = np.asarray(pipe("a castle", **negative, width=128, height=64, num_inference_steps=3,
                                          guidance_scale=guidance, generator=torch.Generator().manual_seed(99),
                                          ).images[0].convert("RGB"), dtype=int)
        ours = session.generate(generation(family, tmp_path, prompt="a castle", **negative, width=128, height=64,
                                           steps=3, cfg_scale=guidance, seed=99))
        assert np.array_equal(pixels(ours.images[0]), plain[guidance]), guidance
        # a flow-matching family keeps its folder's scheduler for "default" (SD's is DPM++ 2M since issue 29), and
        # the PNG and the result name it
        own = type(pipe.scheduler).__name__
        assert own.startswith("FlowMatch") and type(session.model.pipe.scheduler).__name__ == own
        assert ours.sampler == own and f"Sampler: {own}," in read_png_metadata(ours.images[0])[0]
    first, second = plain.values()
    assert not np.array_equal(first, second)


def test_a_batch_splits_by_seed_and_the_negative_prompt_does_what_diffusers_does_with_it(family, tmp_path):
    """SD3 uses a negative prompt. FluxPipeline takes one only for true CFG (true_cfg_scale > 1, default
    1): called as a user would, with the negative prompt, diffusers ignores it, and so do we, saying so."""
    import diffusers

    session = Session()
    batch = session.generate(generation(family, tmp_path, negative_prompt="fog", batch_size=2, seed=10))
    assert batch.seeds == [10, 11] and len(batch.images) == 2
    first, second = (pixels(p) for p in batch.images)
    assert not np.array_equal(first, second)
    single = session.generate(generation(family, tmp_path, negative_prompt="fog", seed=11))
    assert np.abs(second - pixels(single.images[0])).max() <= 1  # image i depends on seed+i alone
    pipe = getattr(diffusers, family.pipeline).from_pretrained(family.folder, **family.load)
    plain = pipe("a lighthouse", negative_prompt="fog", width=64, height=64, num_inference_steps=2,
                 guidance_scale=family.cfg_scale, generator=torch.Generator().manual_seed(11)).images[0]
    assert np.array_equal(pixels(single.images[0]), np.asarray(plain.convert("RGB"), dtype=int))
    without = session.generate(generation(family, tmp_path, seed=11))
    ignored = bool(family.ignored_negative_prompt)
    assert np.array_equal(pixels(without.images[0]), pixels(single.images[0])) == ignored  # SD3: it is used
    text, _ = read_png_metadata(batch.images[1])
    assert parse_a1111_parameters(text)["negative_prompt"] == "fog"
    said = [family.ignored_negative_prompt] if ignored else []
    for result in (batch, single):  # said, not silently dropped
        assert [w for w in result.warnings if "negative prompt" in w] == said
    assert not any("negative prompt" in w for w in without.warnings)


# --------------------------------------------------------------------------------- memory presets


def test_every_preset_applies_to_the_transformer_and_generates(family, tmp_path):
    """One session goes through every preset: offload and fp8 storage land on `transformer` (there is
    no `unet`), and leaving novram's float8 weights reloads them from the folder."""
    session = Session()
    images = {}
    for name in PRESETS:
        result = session.generate(generation(family, tmp_path, preset=name))
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


def test_out_of_memory_at_the_first_preset_finishes_the_same_job_at_the_next(family, tmp_path):
    result = out_of_memory_steps_down(lambda **kw: generation(family, tmp_path, **kw))
    assert "out of memory at highvram" in result.summary and "finished at medvram" in result.summary
    assert Image.open(result.images[0]).size == (64, 64)
    _, meta = read_png_metadata(result.images[0])
    assert [a["outcome"] for a in meta["attempts"]] == ["oom", "ok"]


# --------------------------------------------------------------------------------- plan


def test_plan_json_reads_the_folder_as_its_family_and_estimates_every_preset(family, capsys):
    from lowvram_gen.models.profile import profile_from_folder
    from lowvram_gen.planning.estimate import estimate
    from lowvram_gen.presets import find_preset

    profile = profile_from_folder(family.folder)
    assert {k: getattr(profile, k) for k in family.profile} == family.profile
    assert set(profile.params) == {"transformer", "vae", "text_encoder", "text_encoder_2"}  # SD3: no T5, null
    assert profile.params["text_encoder_2"] > 0 and profile.denoiser_blocks
    memory = find_preset("highvram").memory
    with_cfg, without = (estimate(profile, 256, 256, 1, memory, cfg=c) for c in (True, False))
    doubled = estimate(replace(profile, cfg_batch=True), 256, 256, 1, memory, cfg=True)  # as SD3 runs
    assert doubled.unet_bytes > without.unet_bytes
    assert with_cfg == (doubled if profile.cfg_batch else without)  # Flux: no second batch, whatever the scale

    runs = {}
    for side in (128, 256):
        code, out, err = cli(capsys, "plan", "--model", family.folder, "--vram", "4GiB", "--width", str(side),
                             "--height", str(side), "--json")
        assert code == 0, err
        runs[side] = json.loads(out)
    small, large = runs[128], runs[256]
    bases = [p["name"].split("@")[0].split("+")[0] for p in large["presets"]]
    assert list(dict.fromkeys(bases)) == ["highvram", "medvram", "budget", "lowvram", "novram"]
    assert large["preset"] == "highvram"  # a tiny model fits a 4 GiB card whole
    for a, b in zip(small["presets"], large["presets"]):
        assert a["breakdown"]["weights_bytes"] > 0 and a["breakdown"]["unet_bytes"] > 0
        assert b["estimate_bytes"] > a["estimate_bytes"] > a["breakdown"]["overhead_bytes"]
        assert b["breakdown"]["unet_bytes"] > a["breakdown"]["unet_bytes"]
        assert b["breakdown"]["vae_bytes"] > a["breakdown"]["vae_bytes"]
    by_name = {p["name"]: p["estimate_bytes"] for p in large["presets"]}
    totals = [by_name[n] for n in large["ladder"] if n in by_name]
    assert len(totals) >= 2 and totals == sorted(totals, reverse=True)  # each rung down needs less memory


# --------------------------------------------------------------------------------- img2img, hires, errors


def test_img2img_cli_changes_the_init_image_and_strength_zero_keeps_it(family, tmp_path, capsys):
    width, height = family.img2img_size
    init = tmp_path / "init.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(init)  # resized to the request
    common = ["--init", str(init), "--model", family.folder, "--width", str(width), "--height", str(height),
              "--steps", "4", "--seed", "2", "--outdir", str(tmp_path / "out"), "--json"]
    code, out, err = cli(capsys, "img2img", "a harbour", "--strength", "0.5", *common)
    assert code == 0, err
    result = json.loads(out)
    made = pixels(result["images"][0])
    assert made.shape == (height, width, 3)
    text, _ = read_png_metadata(result["images"][0])
    assert parse_a1111_parameters(text)["Denoising strength"] == "0.5"
    resized = np.asarray(Image.open(init).convert("RGB").resize((width, height)), dtype=int)
    assert not np.array_equal(made, resized)

    code, out, err = cli(capsys, "img2img", "a harbour", "--strength", "0", *common)  # 0 keeps the image
    assert code == 0, err
    assert np.array_equal(pixels(json.loads(out)["images"][0]), resized)


def test_hires_fix_upscales_the_first_pass_in_pixels_and_runs_img2img_at_the_hires_size(family, tmp_path,
                                                                                       monkeypatch):
    """The pipeline decodes inside its own call: hires fix takes its first-pass images, upscales them and
    runs img2img at the hires size (A1111's hires fix with a pixel upscaler), with A1111's metadata."""
    from lowvram_gen.engines.sd import pipeline as sd

    calls = []
    real = sd.denoise

    def watched(pipe, chunk, *args, **kwargs):
        calls.append((chunk.width, chunk.height, chunk.init is not None, chunk.strength))
        return real(pipe, chunk, *args, **kwargs)

    monkeypatch.setattr(sd, "denoise", watched)
    session = Session()
    result = session.generate(generation(family, tmp_path, hires_scale=2, hires_upscaler="lanczos", hires_steps=2,
                                         hires_denoise=0.6))
    assert calls == [(64, 64, False, 1.0), (128, 128, True, 0.6)]  # first pass, then img2img at 2x
    assert Image.open(result.images[0]).size == (128, 128) and not result.upscaled
    assert type(session.model.pipe._lowvram_img2img).__name__ == family.img2img
    assert session.model.pipe._lowvram_img2img.transformer is session.model.pipe.transformer  # shared, not copied
    fields = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert (fields["Hires upscale"], fields["Hires upscaler"], fields["Denoising strength"]) == ("2", "Lanczos", "0.6")
    assert [a["stage"] for a in result.attempts] == ["denoise", "hires"]


@pytest.mark.parametrize("case", CANNOT)
def test_what_a_transformer_pipeline_cannot_do_is_a_clear_error(family, tmp_path, capsys, case):
    args, message = CANNOT[case]
    code, out, err = cli(capsys, "generate", "x", "--model", family.folder, "--width", "64", "--height", "64",
                         "--steps", "1", "--outdir", str(tmp_path), *args)
    assert code == 2 and out == ""
    assert err.startswith("error: invalid ") and message.format(pipeline=family.pipeline) in err
    assert "Traceback" not in err and not list(tmp_path.glob("*.png"))


# ================================================================================= SD3 only


def test_sd3_out_of_memory_in_the_pipelines_own_decode_retries_the_chunk_at_the_next_preset(sd3):
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import gpu_ladder, load_presets
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.request import GenerationRequest

    model = load(resolve(sd3.folder), "float32")
    runner = Runner(model, probe("cpu"))
    steps = []
    model.pipe.transformer.register_forward_pre_hook(lambda m, a: steps.append(runner.applied.offload))

    def oom(_module, _args):  # simulated: the VAE decode at highvram does not fit
        if runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    model.pipe.vae.decoder.register_forward_pre_hook(oom)
    done = []
    report = runner.run(GenerationRequest(prompt="a boat", width=64, height=64, steps=2), [1], gpu_ladder(load_presets()),
                        done.append)
    # the pipeline decodes inside its own call: the decode OOM retries the whole chunk, one preset down
    assert [(a.preset, a.stage, a.outcome) for a in report.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert steps == ["none", "none", "model", "model"]
    assert done[0].images[0].size == (64, 64)


def test_sd3_capped_size_keeps_sides_the_transformer_takes(sd3):
    """A preset's pixel cap shrinks the job; SD3 needs multiples of 16 where SD takes multiples of 8."""
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.planning.sizes import capped_size
    from lowvram_gen.request import GenerationRequest

    assert capped_size(112, 80, 4096) == (72, 64)  # fine for SD, refused by SD3
    assert capped_size(112, 80, 4096, 16) == (64, 64)
    assert capped_size(1024, 768, 589824, 16) == (880, 656)  # lowvram's 768x768 cap
    runner = Runner(load(resolve(sd3.folder), "float32"), probe("cpu"))
    small = replace(find_preset("cpu"), max_pixels=4096)
    done = []
    runner.run(GenerationRequest(prompt="a boat", width=112, height=80, steps=2), [1], [small], done.append)
    assert done[0].generated_size == (64, 64)  # capped, then upscaled to the request
    assert done[0].images[0].size == (112, 80)


def test_sd3_cancel_between_steps_keeps_the_finished_image_and_the_interrupted_one(sd3, tmp_path):
    """SD3 decodes inside its own call: an Interrupt ends its loop through diffusers' `interrupt`, and the call
    decodes the latents it has, which are kept beside the finished image."""
    session = Session(preset="novram")  # one image per pass: a batch of two is two chunks
    cancel, seen = threading.Event(), []

    def on_step(step, total):
        seen.append((step, total))
        if len(seen) == 4:  # the first step of the second image
            cancel.set()

    with pytest.raises(Cancelled) as err:
        session.generate(generation(sd3, tmp_path, steps=3, batch_size=2), on_step=on_step, cancel=cancel)
    assert seen == [(1, 3), (2, 3), (3, 3), (1, 3)]  # stopped at once
    assert len(err.value.images) == 2 and "cancelled at step 1 of 3; 2 image(s) kept" in str(err.value)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(i.split("/")[-1] for i in err.value.images)
    assert len(session.generate(generation(sd3, tmp_path)).images) == 1  # the session still works


def test_live_previews_and_skip_with_16_channel_and_packed_latents(family, tmp_path):
    """SD3's 16 latent channels and Flux's packed 2x2 patches: a preview of the latents' size x8 every step, and a
    Skip that ends the first batch through diffusers' `interrupt` (the call decodes what it has, kept) while the
    second batch runs to its end."""
    shown, skip = [], threading.Event()

    def on_step(step, total):
        if not shown:  # the first step of the first batch
            skip.set()

    result = Session().generate(generation(family, tmp_path, steps=3, batch_count=2), on_step=on_step, skip=skip,
                                on_preview=lambda image, step, total: shown.append((image.mode, image.size, step)),
                                preview_every=1)
    assert shown == [("RGB", (64, 64), 1), ("RGB", (64, 64), 1), ("RGB", (64, 64), 2), ("RGB", (64, 64), 3)]
    assert len(result.images) == 2 and any("1 image(s) skipped" in w for w in result.warnings)


def test_the_size_grid_of_each_pipeline_family(sd3, tiny_path):
    """Sides must be multiples of 8 for SD, 16 for SD3 (2x2 patches) and Flux (2x2 packed latents, which
    its image processor rounds to); built empty, as the grid is read from the pipeline, not the weights."""
    from diffusers import DiffusionPipeline, FluxPipeline

    from lowvram_gen.engines.sd.pipeline import size_multiple

    flux = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                        tokenizer_2=None, transformer=None)
    assert size_multiple(flux) == 16
    assert size_multiple(DiffusionPipeline.from_pretrained(tiny_path)) == 8
    assert size_multiple(DiffusionPipeline.from_pretrained(sd3.folder, **sd3.load)) == 16


# ================================================================================= Flux only


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


def test_flux_prompt_length_is_counted_in_t5_tokens(flux, tmp_path):
    """CLIP (77 tokens) only gives Flux a pooled vector: the prompt's tokens reach the transformer
    through T5, padded to 512. A prompt past CLIP's 77 but within 512 is not truncated."""
    session = Session()
    medium = session.generate(generation(flux, tmp_path, prompt="a lighthouse at dusk " * 8, steps=1))  # 137 tokens
    assert not any("tokens" in w for w in medium.warnings), medium.warnings
    long = session.generate(generation(flux, tmp_path, prompt="a lighthouse at dusk " * 40, steps=1))  # 681
    assert [w for w in long.warnings if "tokens" in w] == [
        "the prompt has 681 tokens; the text encoder takes 512, the rest is ignored"]


def test_prompt_token_count_uses_clip_where_there_is_no_t5(flux, tiny_path):
    from diffusers import DiffusionPipeline, FluxPipeline

    from lowvram_gen.engines.sd.pipeline import ignores_negative_prompt, prompt_token_count

    prompt = "a lighthouse at dusk " * 8
    sd = DiffusionPipeline.from_pretrained(tiny_path)
    assert prompt_token_count(sd, prompt) == (len(sd.tokenizer(prompt).input_ids), 77)
    assert not ignores_negative_prompt(sd)
    pipe = FluxPipeline.from_pretrained(flux.folder)
    assert prompt_token_count(pipe, prompt) == (137, 512) and prompt_token_count(pipe, "") == (0, 0)
    assert ignores_negative_prompt(pipe)


# ================================================================================= Flux only


def test_flux_budget_offload_takes_the_resident_part_off_the_device_before_its_own_decode(flux):
    """Flux decodes inside its own pipeline call, so the runner cannot step in between: the denoise's
    after-last-step hook moves the budget split's resident part off the device, and the in-call VAE
    decode runs without it (what planning/estimate.py plans); the next job's steps have it back."""
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset
    from lowvram_gen.request import GenerationRequest

    model = load(resolve(flux.folder), "float32")
    runner = Runner(model, probe("cpu"))
    seen = []
    model.pipe.transformer.register_forward_pre_hook(lambda *_: seen.append(("transformer", runner.resident_on_device)))
    model.pipe.vae.decoder.register_forward_pre_hook(lambda *_: seen.append(("vae", runner.resident_on_device)))
    budget = find_preset("budget")
    budget = replace(budget, memory=replace(budget.memory, dtype="float32"))
    for seed in (1, 2):
        done = []
        runner.run(GenerationRequest(prompt="a boat", width=64, height=64, steps=2), [seed], [budget], done.append)
        assert done[0].images[0].size == (64, 64)
    assert runner.residency is not None  # the budget split is what ran
    assert seen == [("transformer", True), ("transformer", True), ("vae", False)] * 2


def test_flux_says_clip_skip_is_not_used_and_its_png_leaves_it_out(flux, tmp_path):
    """Clip skip (issue 19) is for SD 1.x/2.x and SDXL, whose prompts we encode: a pipeline that encodes its own
    warns, makes the same image as without it, and its PNG does not claim it."""
    session = Session()
    skipped = session.generate(generation(flux, tmp_path, clip_skip=2))
    plain = session.generate(generation(flux, tmp_path))
    assert [w for w in skipped.warnings if "clip skip" in w] == [
        "clip skip 2 is not used: FluxPipeline encodes its prompts itself (clip skip is for SD 1.x/2.x and SDXL)"]
    assert not any("clip skip" in w for w in plain.warnings)
    assert np.array_equal(pixels(skipped.images[0]), pixels(plain.images[0]))
    assert "Clip skip" not in parse_a1111_parameters(read_png_metadata(skipped.images[0])[0])


def test_flux_says_variation_seeds_are_not_used_and_its_png_leaves_them_out(flux, tmp_path):
    """A1111's variation seeds are made for SD 1.x/2.x and SDXL, whose 4-D noise A1111's formula is for; Flux packs
    its own: it warns, makes the plain seed's image, and its PNG does not claim them."""
    session = Session()
    varied = session.generate(generation(flux, tmp_path, subseed=9, subseed_strength=0.5, seed_resize_from_w=32,
                                         seed_resize_from_h=32))
    plain = session.generate(generation(flux, tmp_path))
    assert [w for w in varied.warnings if "variation" in w] == [
        "variation seed and seed resize are not used: FluxPipeline draws its noise its own way (they are made for "
        "SD 1.x/2.x and SDXL)"]
    assert np.array_equal(pixels(varied.images[0]), pixels(plain.images[0]))
    params = parse_a1111_parameters(read_png_metadata(varied.images[0])[0])
    assert "Variation seed" not in params and "Seed resize from" not in params
