"""The crash matrix of the 2026 families (issue 30: "nothing crashes with a traceback for any family, task or flag
combination; what is not built is refused in one sentence naming the family").

Every family with a record and a tiny folder (tests/family_folders.py) meets every task (txt2img, img2img, inpaint
with A1111's mask options, hires fix with a latent and a pixel upscaler, ControlNet, an edit with a reference image)
and the flags users combine
(A1111 and ComfyUI sampler names, schedule types, clip skip, variation seeds, batch size 2, a missing LoRA, a VAE,
presets and precision flags). Each either runs (and makes its images) or is refused with the app's own error
(`LowVramError`, InvalidRequest for a request) in one line that names the family or its pipeline class (or, for a
file that is not there, the file) - never an AttributeError/TypeError traceback.

`RUNS` says which families run a case today; a case that starts to run (or stops) fails here, so the table stays
true. The ControlNet rows give the embedded SD ControlNet, one made for another family: refused for every family here
(their own ControlNets run in tests/test_controlnet_families.py, their LoRAs in tests/test_lora_families.py).
The editing models that need a reference image (Qwen-Image-Edit and Edit-Plus) meet every case that has no init
image with a reference image added: the flags on an edit. Tiny sizes (64x64), 2 steps, the editing pipelines'
reference sizes made 64x64 (family_folders.small_references); one Session per family, so a folder loads once per
family. Seeded random weights.
"""

from __future__ import annotations

import pytest
from family_folders import BUILDERS, EDIT_ONLY, family_folders, record_of, small_references
from inpaint_files import init_image, mask_image
from tiny_transformers import cli

from lowvram_gen import GenerationRequest
from lowvram_gen.errors import LowVramError
from lowvram_gen.session import Session

folders = family_folders("matrix-models")

ALL = frozenset(BUILDERS)
NONE: frozenset = frozenset()
IMG2IMG = frozenset({"qwen-image", "z-image", "chroma"})  # diffusers has an img2img pipeline of the family
# ... an inpaint pipeline that runs (Qwen-Image-Edit-Plus has none)
INPAINT = frozenset({"qwen-image", "z-image", "flux2-klein", "flux2-klein-9b", "flux-kontext", "qwen-image-edit",
                     "chroma"})
EDIT = frozenset({"flux2-klein", "flux2-klein-9b", "flux2-dev", "flux-kontext", *EDIT_ONLY})  # reference images
# Z-Image's inpaint pipeline encodes the init image inside its latents step: the latent masked contents are refused
LATENT_CONTENT = INPAINT - {"z-image"}

INIT = dict(init_image="{init}", strength=0.6)
MASKED = dict(init_image="{init}", mask="{mask}", strength=0.8)
REFERENCE = dict(reference_images=("{init}",))
CONTROL = "tiny-controlnet"  # the embedded SD ControlNet: the only ControlNet at hand, made for another family

# case -> (request fields, the families it runs for, why it is refused elsewhere when it is not about the family)
CASES: dict[str, tuple[dict, frozenset, str]] = {
    "txt2img": ({}, ALL, ""),
    "negative-prompt": (dict(negative_prompt="fog"), ALL, ""),
    "cfg-1": (dict(cfg_scale=1.0), ALL, ""),
    "batch-size-2": (dict(batch_size=2), ALL, ""),
    "batch-count-2": (dict(batch_count=2), ALL, ""),
    "sampler-default": (dict(sampler="default"), ALL, ""),
    # A1111's Euler (its API's default) on a flow-matching model is the flow's Euler: the folder's own scheduler
    "sampler-a1111-euler": (dict(sampler="Euler"), ALL, ""),
    "sampler-comfyui-euler": (dict(sampler="euler"), ALL, ""),  # ComfyUI's name of the same
    "sampler-a1111-ancestral": (dict(sampler="Euler a"), NONE, ""),  # the other A1111 samplers: refused
    "sampler-a1111-karras": (dict(sampler="DPM++ 2M Karras"), NONE, ""),
    "schedule-karras": (dict(schedule_type="karras"), ALL, ""),
    "schedule-sgm-uniform": (dict(schedule_type="sgm_uniform"), ALL, ""),  # runs its own, with a warning
    "schedule-beta": (dict(schedule_type="beta"), ALL, ""),
    "clip-skip-2": (dict(clip_skip=2), ALL, ""),  # a warning: not used by these families
    "variation-seed": (dict(subseed=3, subseed_strength=0.5), ALL, ""),  # a warning
    "seed-resize": (dict(seed_resize_from_w=32, seed_resize_from_h=32), ALL, ""),
    "vae-none": (dict(vae="None"), ALL, ""),
    "vae-missing": (dict(vae="no-such-vae.safetensors"), NONE, "no-such-vae"),
    "lora-missing": (dict(loras=("no-such-lora:1",)), NONE, "no-such-lora"),
    "lora-tag-missing": (dict(prompt="a cat <lora:no-such-lora:0.5>"), NONE, "no-such-lora"),
    "preset-lowvram": (dict(preset="lowvram"), ALL, ""),
    "preset-medvram": (dict(preset="medvram"), ALL, ""),
    "hires-latent": (dict(hires_scale=2.0, hires_upscaler="Latent", hires_steps=1), NONE, ""),
    "hires-latent-bicubic": (dict(hires_scale=2.0, hires_upscaler="Latent (bicubic)", hires_steps=1), NONE, ""),
    "hires-lanczos": (dict(hires_scale=2.0, hires_upscaler="Lanczos", hires_steps=1), IMG2IMG, ""),
    "hires-resize-lanczos": (dict(hires_resize_w=96, hires_resize_h=96, hires_upscaler="Lanczos", hires_steps=1),
                             IMG2IMG, ""),
    "img2img": (INIT, IMG2IMG, ""),
    "img2img-batch-size-2": (dict(INIT, batch_size=2), IMG2IMG, ""),
    # A1111's Just resize (latent upscale): the 64x64 init encoded at its size, its latents stretched to 96x64
    "img2img-latent-resize": (dict(INIT, resize_mode="latent", width=96), IMG2IMG, ""),
    "inpaint": (MASKED, INPAINT, ""),
    "inpaint-only-masked": (dict(MASKED, inpaint_area="masked", mask_padding=8), INPAINT, ""),
    "inpaint-blur": (dict(MASKED, mask_blur=4), INPAINT, ""),
    "inpaint-invert": (dict(MASKED, invert_mask=True), INPAINT, ""),
    "inpaint-fill": (dict(MASKED, masked_content="fill"), INPAINT, ""),
    "inpaint-latent-noise": (dict(MASKED, masked_content="latent-noise"), LATENT_CONTENT, ""),
    "inpaint-latent-nothing": (dict(MASKED, masked_content="latent-nothing", batch_size=2), LATENT_CONTENT, ""),
    # an edit (ids apart from the edit models' own: 'qwen-image-reference-...' is not 'qwen-image-edit-...')
    "reference-image": (REFERENCE, EDIT, ""),
    "reference-negative-prompt": (dict(REFERENCE, negative_prompt="fog"), EDIT, ""),
    "reference-batch-size-2": (dict(REFERENCE, batch_size=2), EDIT, ""),
    "two-reference-images": (dict(reference_images=("{init}", "{init}")), EDIT - {"flux-kontext", "qwen-image-edit"},
                             ""),
    "controlnet": (dict(controlnets=CONTROL), NONE, ""),
    "controlnet-img2img": (dict(INIT, controlnets=CONTROL), NONE, ""),
    "controlnet-hires": (dict(controlnets=CONTROL, hires_scale=2.0, hires_upscaler="Lanczos", hires_steps=1), NONE,
                         ""),
}
HEAVY = {"preset-lowvram", "preset-medvram", "hires-lanczos", "hires-resize-lanczos", "batch-count-2",
         "inpaint-latent-nothing", "img2img-batch-size-2"}


@pytest.fixture(autouse=True)
def _small_references(monkeypatch):
    small_references(monkeypatch)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """An init image and a mask of its middle (tests/inpaint_files.py)."""
    path = tmp_path_factory.mktemp("matrix-images")
    return {"init": str(init_image(path / "init.png")), "mask": str(mask_image(path / "mask.png", (16, 16, 48, 48)))}


@pytest.fixture(scope="module")
def sessions():
    """One Session per family: each folder loads once for all its cases."""
    made: dict[str, Session] = {}
    yield made
    made.clear()


def _request(folder: str, fields: dict, images: dict, outdir) -> GenerationRequest:
    from lowvram_gen.control.units import ControlNetUnit

    fields = {k: v.format(**images) if isinstance(v, str) and "{" in v and k != "prompt" else v
              for k, v in fields.items()}
    if "reference_images" in fields:
        fields["reference_images"] = tuple(p.format(**images) for p in fields["reference_images"])
    if "controlnets" in fields:
        fields["controlnets"] = (ControlNetUnit(fields["controlnets"], images["init"]),)
    base = dict(prompt="a lighthouse", model=folder, width=64, height=64, steps=2, seed=5, cfg_scale=4.0,
                outdir=str(outdir))
    return GenerationRequest(**{**base, **fields})


def assert_one_sentence_naming(error: BaseException, record, about: str = "") -> str:
    """The app's own error, on one line, naming the family (its name or a pipeline class of it) or `about`."""
    assert isinstance(error, LowVramError), f"{type(error).__name__} is a crash, not a refusal: {error}"
    text = str(error)
    assert text.strip() and "\n" not in text.strip() and "Traceback" not in text, text
    names = (record.name, *record.pipelines) + ((about,) if about else ())
    assert any(name in text for name in names), f"names neither {record.name} nor {about or 'its pipeline'}: {text}"
    return text


def _params():
    """Every family x every case; a case that runs is run by one family in turn (and txt2img by all) unless `slow`
    is selected: the refusals are cheap (checked before the first step), the runs are what costs."""
    keys = list(BUILDERS)
    for i, (case, (_, runs, _)) in enumerate(CASES.items()):
        running = [k for k in keys if k in runs]
        quick = {running[i % len(running)]} if running and case not in HEAVY else set()
        for key in keys:
            slow = key in runs and key not in quick and case != "txt2img"
            yield pytest.param(key, case, id=f"{key}-{case}", marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("key, case", list(_params()))
def test_every_family_runs_or_refuses_each_case_in_one_sentence(key, case, folders, sessions, images, tmp_path):
    fields, runs, about = CASES[case]
    if key in EDIT_ONLY and "init_image" not in fields and "reference_images" not in fields:
        fields = {**fields, **REFERENCE}  # the case on an edit (see the module doc)
        about = about or "an edit (reference images)"  # what takes no hires fix or ControlNet: the request's sentence
    record = record_of(folders[key])
    session = sessions.setdefault(key, Session(outdir=str(tmp_path)))
    try:
        result = session.generate(_request(folders[key], fields, images, tmp_path))
    except Exception as error:  # noqa: BLE001 - a crash is what this test reports, by its type
        text = assert_one_sentence_naming(error, record, about)
        assert key not in runs, f"{record.name} should run {case} today, and was refused: {text}"
        return
    assert key in runs, f"{record.name} ran {case}, which the table says is refused: update RUNS"
    expected = int(fields.get("batch_size", 1)) * int(fields.get("batch_count", 1))
    assert len(result.images) == expected
    assert all("\n" not in w for w in result.warnings)  # each warning is one line


# ------------------------------------------------------------------------------------------------ the CLI's flags

# precision flags, presets and a VAE of another family through the CLI (what `generate` makes of them): each flag runs
# on two families in turn, so every family meets several of them and the matrix stays short
FLAGS = {
    "--no-half": ["--no-half"],
    "--no-half-vae": ["--no-half-vae"],
    "--upcast-sampling": ["--upcast-sampling"],
    "--precision-full": ["--precision", "full"],
    "--lowvram": ["--lowvram"],
    "--medvram": ["--medvram"],
    "--novram": ["--novram"],
    "--xformers": ["--xformers"],
    "--vram-budget": ["--vram-budget", "1GB"],
    "--quantize-int4": ["--quantize", "int4"],
    "--cpu": ["--cpu"],
    "--sampler-flow-name": ["--sampler", "FlowMatchEuler"],  # diffusers' class name: not a sampler name we offer
}
KEYS = list(BUILDERS)


def _flag_params():
    for i, flag in enumerate(FLAGS):
        for key in (KEYS[i % len(KEYS)], KEYS[(i + 3) % len(KEYS)]):
            yield pytest.param(key, flag, id=f"{key}{flag}", marks=[pytest.mark.slow] if flag == "--novram" else [])


@pytest.mark.parametrize("key, flag", list(_flag_params()))
def test_cli_flags_run_or_exit_2_with_one_line(key, flag, folders, images, tmp_path, capsys):
    # an edit-only model is run as its users run it: `lowvram-gen edit PROMPT --image IMG`
    command = ["edit", "a lighthouse", "--image", images["init"]] if key in EDIT_ONLY else ["generate", "a lighthouse"]
    code, out, err = cli(capsys, *command, "--model", folders[key], "--width", "64", "--height", "64", "--steps", "2",
                         "--seed", "3", "--outdir", str(tmp_path), *FLAGS[flag])
    assert "Traceback" not in err
    if flag == "--sampler-flow-name":
        assert code == 2 and "invalid sampler: 'FlowMatchEuler'; use 'default'" in err
        return
    assert code == 0, err
    assert out.strip().endswith(".png")


def test_hidream_renders_a_non_square_size_at_its_native_area(folders, sessions, images, tmp_path):
    """HiDream's pipeline scales every size to its native area (the tiny folder's: 128x128) and pads a non-square
    latent to its transformer's max_resolution: 96x64 runs, at 156x104, and says so in one line."""
    session = sessions.setdefault("hidream", Session(outdir=str(tmp_path)))
    result = session.generate(_request(folders["hidream"], dict(width=96, height=64), images, tmp_path))
    from PIL import Image

    assert Image.open(result.images[0]).size == (156, 104)
    assert "HiDreamImagePipeline renders 156x104 when asked for 96x64" in " ".join(result.warnings)


def test_a_vae_of_another_family_is_refused_in_one_line_naming_it(folders, tmp_path, capsys, monkeypatch):
    """An SD VAE file given to Qwen-Image (a Wan-style VAE): refused before the job, naming the file."""
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    from lowvram_gen.models.tiny import ensure_tiny

    (tmp_path / "VAE").mkdir()
    vae = AutoencoderKL.from_pretrained(f"{ensure_tiny('tiny')}/vae")
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(tmp_path / "VAE" / "sd.safetensors"))
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))
    for key in ("qwen-image", "chroma"):
        code, _, err = cli(capsys, "generate", "a lighthouse", "--model", folders[key], "--width", "64", "--height",
                           "64", "--steps", "1", "--vae", "sd.safetensors", "--outdir", str(tmp_path))
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "VAE sd.safetensors does not fit this model's VAE" in err


# ------------------------------------------------------------------------------------------------ LoRA (being built)

@pytest.fixture(scope="module")
def sd_lora(tmp_path_factory):
    """A kohya LoRA of the tiny SD model (tests/lora_files.py) in a models folder: a file people have, for another
    family."""
    import diffusers
    import lora_files

    from lowvram_gen.models.tiny import ensure_tiny

    root = tmp_path_factory.mktemp("matrix-loras")
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(ensure_tiny("tiny"))
    lora_files.save(lora_files.kohya_state(pipe), root / "Lora" / "sd-style.safetensors")
    return root


@pytest.mark.parametrize("key", ["qwen-image", "sana"])
def test_a_lora_of_another_family_is_refused_in_one_sentence_naming_the_family(key, folders, sd_lora, sessions,
                                                                               monkeypatch, tmp_path):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(sd_lora))
    session = sessions.setdefault(key, Session(outdir=str(tmp_path)))
    with pytest.raises(LowVramError) as refused:
        session.generate(_request(folders[key], dict(loras=("sd-style:1",)), {}, tmp_path))
    assert_one_sentence_naming(refused.value, record_of(folders[key]))


def test_a_hires_resize_refused_for_a_family_names_the_resize_it_was_given(folders, tmp_path, capsys):
    """The refusal named `hires scale: 1.0` (a field the user did not give) for --hires-resize."""
    code, _, err = cli(capsys, "generate", "a lighthouse", "--model", folders["sana"], "--width", "64", "--height",
                       "64", "--steps", "1", "--hires-resize", "96x96", "--hires-upscaler", "Lanczos", "--outdir",
                       str(tmp_path))
    assert code == 2 and err.strip().splitlines() == [
        "error: invalid hires resize: '96x96'; SANA has no img2img pipeline in diffusers for hires fix's second pass "
        "(an img2img pass): leave hires fix off and upscale after"]
