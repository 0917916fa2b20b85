"""SANA, Chroma and Lumina 2 end to end (issue 30): tiny seeded folders (tests/tiny_dit.py, diffusers' own test shapes)
run from the CLI and compared with plain diffusers at the same seed, steps and CFG; Chroma's img2img against
ChromaImg2ImgPipeline (its inpaint: tests/test_family_chroma_inpaint.py); the tasks diffusers has no pipeline for
refused in one sentence; `plan` at the real shapes of the shipped configs; int8 and a simulated out-of-memory that
steps down without reloading.
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_dit import BUILDERS
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

PIPELINES = {"sana": "SanaPipeline", "chroma": "ChromaPipeline", "lumina2": "Lumina2Pipeline"}
NAMES = {"sana": "SANA", "chroma": "Chroma", "lumina2": "Lumina 2"}
MAX_DIFF = 2  # of 255


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    out = {}
    for key, build in BUILDERS.items():
        folder = tmp_path_factory.mktemp(f"tiny-{key}")
        build().save_pretrained(folder, safe_serialization=True)
        assert json.loads((folder / "model_index.json").read_text())["_class_name"] == PIPELINES[key]
        out[key] = str(folder)
    return out


def _plain(key: str, folder: str, negative: str | None, cfg: float, seed: int, **kw) -> np.ndarray:
    import diffusers

    pipe = getattr(diffusers, kw.pop("pipeline", PIPELINES[key])).from_pretrained(folder)
    extra = {"negative_prompt": negative} if negative else {}  # as a user calls it: no negative, the default
    image = pipe("a lighthouse", **extra, num_inference_steps=2, guidance_scale=cfg,
                 generator=torch.Generator().manual_seed(seed), **kw).images[0]
    return np.asarray(image.convert("RGB"), dtype=int)


@pytest.mark.parametrize("negative", [None, "fog"])
@pytest.mark.parametrize("key", list(BUILDERS))
def test_txt2img_from_the_cli_equals_plain_diffusers(folders, key, negative, tmp_path, capsys):
    """SANA crashed without --negative ('NoneType' object has no attribute 'lower'): it is given "" as its own
    default. Chroma and Lumina 2 take the negative prompt into their real CFG."""
    args = ["generate", "a lighthouse", "--model", folders[key], "--width", "64", "--height", "64", "--steps", "2",
            "--seed", "7", "--cfg", "4.5", "--outdir", str(tmp_path), "--json"]
    code, out, err = cli(capsys, *args, *(["--negative", negative] if negative else []))
    assert code == 0, err
    result = json.loads(out)
    ours = pixels(result["images"][0])
    plain = _plain(key, folders[key], negative, 4.5, 7, width=64, height=64)
    assert ours.shape == plain.shape == (64, 64, 3)
    assert np.abs(ours - plain).max() <= MAX_DIFF
    assert ours.std() > 1  # an image, not a flat fill
    params = parse_a1111_parameters(read_png_metadata(result["images"][0])[0])
    assert params["CFG scale"] == "4.5" and params.get("negative_prompt", "") == (negative or "")
    assert not any("negative prompt" in w for w in result.get("warnings", []))  # each uses one: nothing ignored


@pytest.mark.parametrize("key", ["chroma", "lumina2"])
def test_the_negative_prompt_and_the_cfg_scale_act(folders, key, tmp_path):
    """Real CFG: a negative prompt changes the image, and so does the scale."""
    session = Session()

    def run(**kw):
        request = GenerationRequest(**{**dict(prompt="a lighthouse", model=folders[key], width=64, height=64, steps=2,
                                              seed=3, cfg_scale=4.0, outdir=str(tmp_path)), **kw})
        return pixels(session.generate(request).images[0])

    base = run()
    assert not np.array_equal(base, run(negative_prompt="fog"))
    assert not np.array_equal(base, run(cfg_scale=7.0))


def test_chroma_img2img_equals_chroma_img2img_pipeline(folders, tmp_path, capsys, posterior_mode):
    """AutoPipeline knows no img2img pipeline for Chroma; the record names ChromaImg2ImgPipeline, made over the
    loaded components."""
    init = tmp_path / "init.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(init)
    code, out, err = cli(capsys, "img2img", "a lighthouse", "--init", str(init), "--strength", "0.5", "--model",
                         folders["chroma"], "--width", "64", "--height", "64", "--steps", "4", "--seed", "2", "--cfg",
                         "4.5", "--outdir", str(tmp_path / "out"), "--json")
    assert code == 0, err
    ours = pixels(json.loads(out)["images"][0])
    import diffusers

    pipe = diffusers.ChromaImg2ImgPipeline.from_pretrained(folders["chroma"])
    # --strength 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4 (lowvram_gen/img2img_steps.py): diffusers' 0.75
    plain = pipe("a lighthouse", image=Image.open(init).convert("RGB"), strength=0.75, width=64, height=64,
                 num_inference_steps=4, guidance_scale=4.5, generator=torch.Generator().manual_seed(2)).images[0]
    plain = np.asarray(plain.convert("RGB"), dtype=int)
    assert np.abs(ours - plain).max() <= MAX_DIFF
    assert not np.array_equal(ours, pixels(init))


@pytest.mark.parametrize("key", ["sana", "lumina2"])
@pytest.mark.parametrize("task", ["img2img", "hires"])
def test_a_task_without_a_diffusers_pipeline_is_one_sentence_naming_family_and_task(folders, key, task, tmp_path,
                                                                                    capsys):
    init = tmp_path / "init.png"
    Image.new("RGB", (64, 64), "gray").save(init)
    common = ["--model", folders[key], "--width", "64", "--height", "64", "--steps", "1", "--outdir", str(tmp_path)]
    if task == "img2img":
        code, _, err = cli(capsys, "img2img", "a lighthouse", "--init", str(init), *common)
    else:
        code, _, err = cli(capsys, "generate", "a lighthouse", "--hires-scale", "2", "--hires-upscaler", "lanczos",
                           *common)
    assert code == 2
    assert f"{NAMES[key]} has no img2img pipeline in diffusers" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("key", ["sana", "lumina2"])
def test_inpainting_is_refused_in_one_sentence(folders, key, tmp_path, capsys):
    """No inpaint task: SANA and Lumina 2 have no inpaint pipeline in diffusers 0.42 (Chroma's runs:
    tests/test_family_chroma_inpaint.py)."""
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    Image.new("RGB", (64, 64), "gray").save(init)
    Image.new("L", (64, 64), 255).save(mask)
    code, _, err = cli(capsys, "inpaint", "a lighthouse", "--init", str(init), "--mask", str(mask), "--model",
                       folders[key], "--width", "64", "--height", "64", "--steps", "1", "--outdir", str(tmp_path))
    assert code == 2 and f"invalid task: 'inpaint'; {NAMES[key]} has no inpaint pipeline in diffusers: use txt2img" \
        in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("key,shape", [
    # (transformer width, image patch in latent pixels, latent channels, VAE factor, text tokens, joint, CFG batch)
    ("sana", (2240, 1, 32, 32, (300,), 0, True)),
    ("chroma", (3072, 2, 16, 8, (512,), 512, False)),  # 64 input channels: 16 latent ones packed 2x2
    ("lumina2", (2304, 2, 16, 8, (256,), 256, False)),  # the Gemma prompt joins the image tokens
])
def test_plan_reads_the_real_shapes_from_the_shipped_configs_offline(key, shape, capsys):
    from lowvram_gen.models.profile import native_side, profile_builtin

    profile = profile_builtin(key)
    assert (profile.transformer_hidden, profile.transformer_patch, profile.latent_channels, profile.vae_scale_factor,
            profile.text_tokens, profile.joint_text_tokens, profile.cfg_batch) == shape
    assert profile.text_hidden == ((4096,) if key == "chroma" else (2304,))  # T5-XXL, Gemma 2 2B
    assert native_side(profile) == 1024
    code, out, err = cli(capsys, "plan", "--model", key, "--vram", "4", "--ram", "16", "--json")
    assert code == 0, err
    planned = json.loads(out)
    assert (planned["width"], planned["height"]) == (1024, 1024) and planned["preset"] and not planned["refusal"]
    # +te-reload is offered where the plain candidate's host peak does not fit 16 GiB (Chroma's 9.5 GB T5-XXL): these
    # records encode their prompts apart from the call (test_te_reload_... below runs it)
    names = [p["name"] for p in planned["presets"]]
    assert names and (key != "chroma" or any("te-reload" in n for n in names))


@contextlib.contextmanager
def _out_of_memory_without_offload(session, module):
    """Simulated: every forward of `module` runs out of memory while the session's preset offloads nothing
    (highvram); an offloading preset runs it."""

    def raise_when_resident(*_):
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = module.register_forward_pre_hook(raise_when_resident)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("key", list(BUILDERS))
def test_int8_and_an_out_of_memory_that_steps_down_without_reloading(folders, key, tmp_path):
    from lowvram_gen.models.quantize import kinds

    int8 = Session()
    quantized = int8.generate(GenerationRequest(prompt="a lighthouse", model=folders[key], width=64, height=64,
                                                steps=2, seed=3, quantize="int8", outdir=str(tmp_path)))
    assert [a["outcome"] for a in quantized.attempts] == ["ok"] and pixels(quantized.images[0]).std() > 1
    # the denoiser and the text encoder are sdnq's int8 (the tiny layers are under sdnq's 16384-weight floor, so they
    # keep their floats: the pixels are not compared here)
    assert kinds(int8.model.pipe) == {"transformer": "int8", "text_encoder": "int8"}
    assert "Quantize: int8" in read_png_metadata(quantized.images[0])[0]

    session = Session(preset="highvram")  # the GPU ladder, run on this CPU
    request = GenerationRequest(prompt="a lighthouse", model=folders[key], width=64, height=64, steps=1, seed=3,
                                outdir=str(tmp_path))
    session.generate(request)
    transformer = session.model.pipe.transformer
    with _out_of_memory_without_offload(session, transformer):
        result = session.generate(request)
    assert [(a["preset"], a["outcome"]) for a in result.attempts] == [("highvram", "oom"), ("medvram", "ok")]
    assert session.model.pipe.transformer is transformer  # reconfigured, not reloaded
    plain = Session().generate(request)
    assert np.abs(pixels(result.images[0]) - pixels(plain.images[0])).max() <= 1  # the retry is the same job


@pytest.mark.parametrize("key", list(BUILDERS))
@pytest.mark.parametrize("negative", ["", "fog"])
def test_te_reload_encodes_apart_from_the_call_and_makes_the_same_image(folders, key, negative, tmp_path):
    """text_encoders = "reloaded" (+te-reload): the prompts are encoded by the pipeline's own encode_prompt, as its
    call would (SANA's complex human instruction included), the encoders leave, and the image is the same."""
    from test_text_encoder_reload import _pixels, _run

    _, kept = _run(folders[key], tmp_path, "kept", negative_prompt=negative, cfg_scale=4.5)
    seen = []

    def watch(session):  # in a step callback: the text encoder is gone while the denoiser runs
        seen.append(session.model.pipe.text_encoder)

    _, reloaded = _run(folders[key], tmp_path, "reloaded", watch=watch, negative_prompt=negative, cfg_scale=4.5)
    assert seen and all(encoder is None for encoder in seen)
    assert np.abs(_pixels(kept[0]) - _pixels(reloaded[0])).max() <= MAX_DIFF


@pytest.mark.parametrize("key", list(BUILDERS))
def test_a_vram_budget_splits_the_transformer_and_makes_the_same_image(folders, key, tmp_path):
    """The budget preset (part of the transformer resident, the rest streamed per step; its resident part off the
    device before the pipeline's own decode) runs each family's transformer, and the image is the plain one's."""
    from dataclasses import replace

    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset

    model = load(resolve(folders[key]), "float32")
    runner = Runner(model, probe("cpu"))
    budget = find_preset("budget")
    budget = replace(budget, memory=replace(budget.memory, dtype="float32"))
    request = GenerationRequest(prompt="a lighthouse", width=64, height=64, steps=2, cfg_scale=4.5)
    done = []
    runner.run(request, [4], [budget], done.append)
    assert runner.residency is not None  # the budget split is what ran
    plain = Session().generate(replace(request, model=folders[key], seed=4, outdir=str(tmp_path)))
    assert np.abs(pixels(plain.images[0]) - np.asarray(done[0].images[0].convert("RGB"), dtype=int)).max() <= 1
