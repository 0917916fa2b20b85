"""Editing models (issue 30): Qwen-Image-Edit, Qwen-Image-Edit-Plus, FLUX.1 Kontext and Flux.2 Klein's reference
images, end to end on tiny seeded folders in diffusers' own test shapes (tests/tiny_edit.py, tests/tiny_flux2.py),
each compared with plain diffusers' pipeline loaded from the same folder, at the same seed, steps and CFG.

The pipelines resize every reference image to about 1024x1024 pixels before their VAE encodes it (Kontext to its
preferred resolutions): on this CPU that is a minute a call for Qwen-Image-Edit's video-style VAE. The `small_refs`
fixture makes those sizes 64x64 in diffusers' modules for both sides of every comparison (ours and plain
diffusers'), so what is compared is unchanged: the same pipeline code, called by us and by hand.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_checks import inpaint_files, inpainted, mask_options_act
from family_folders import small_references
from PIL import Image
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest, families
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

TOLERANCE = 2  # of 255: the "equal to plain diffusers"


@pytest.fixture(autouse=True)
def small_refs(monkeypatch):
    """The pipelines' reference-image sizes made 64x64 (see the module doc), for ours and diffusers' alike."""
    small_references(monkeypatch)


def _save(pipe, path) -> str:
    pipe.save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.fixture(scope="module")
def qwen_edit(tmp_path_factory) -> str:
    from tiny_edit import build_tiny_qwen_image_edit

    return _save(build_tiny_qwen_image_edit(), tmp_path_factory.mktemp("tiny-qwen-edit"))


@pytest.fixture(scope="module")
def qwen_edit_plus(tmp_path_factory) -> str:
    from tiny_edit import build_tiny_qwen_image_edit

    return _save(build_tiny_qwen_image_edit(plus=True), tmp_path_factory.mktemp("tiny-qwen-edit-plus"))


@pytest.fixture(scope="module")
def kontext(tmp_path_factory) -> str:
    from tiny_edit import build_tiny_kontext

    return _save(build_tiny_kontext(), tmp_path_factory.mktemp("tiny-kontext"))


@pytest.fixture(scope="module")
def klein(tmp_path_factory) -> str:
    from tiny_flux2 import build_tiny_flux2_klein

    return _save(build_tiny_flux2_klein(), tmp_path_factory.mktemp("tiny-klein"))


@pytest.fixture(scope="module")
def flux2_dev(tmp_path_factory) -> str:
    from tiny_flux2_dev import build_tiny_flux2_dev

    return _save(build_tiny_flux2_dev(), tmp_path_factory.mktemp("tiny-flux2-dev"))


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> list[str]:
    """Three seeded reference images: 64x64, 96x64 and 64x64."""
    path = tmp_path_factory.mktemp("refs")
    rng = np.random.default_rng(0)
    out = []
    for i, (w, h) in enumerate([(64, 64), (96, 64), (64, 64)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path / f"ref{i}.png")
        out.append(str(path / f"ref{i}.png"))
    return out


def plain(folder: str, seed: int, **kw) -> np.ndarray:
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    kw = {"width": 64, "height": 64, "num_inference_steps": 2, **kw}
    return np.asarray(pipe(generator=torch.Generator().manual_seed(seed), **kw).images[0].convert("RGB"), dtype=int)


def edit(folder, tmp_path, images, **kw) -> GenerationRequest:
    base = dict(prompt="make it blue", model=folder, width=64, height=64, steps=2, seed=5, cfg_scale=4.0,
                outdir=str(tmp_path), reference_images=tuple(images))
    return GenerationRequest(**{**base, **kw})


def opened(paths) -> list:
    return [Image.open(p).convert("RGB") for p in paths]


# ------------------------------------------------------------------------------------------------ records

def test_each_edit_pipeline_is_its_records_edit_task():
    for pipeline, key, most in [("QwenImageEditPipeline", "qwen-image-edit", 1),
                                ("QwenImageEditPlusPipeline", "qwen-image-edit-plus", 3),
                                ("FluxKontextPipeline", "flux-kontext", 1), ("Flux2KleinPipeline", "flux2-klein", 4),
                                ("Flux2Pipeline", "flux2-dev", 10)]:
        record = families.by_pipeline(pipeline)
        assert record.key == key and record.pipeline_for("edit") == pipeline
        assert record.edit.argument == "image" and record.edit.max_images == most
    assert families.by_pipeline("QwenImageEditPipeline").call.cfg_argument == "true_cfg_scale"
    kontext = families.by_pipeline("FluxKontextPipeline")
    assert kontext.call.guidance is families.Guidance.DISTILLED and kontext.default_sampling().cfg == 2.5
    assert families.by_pipeline("FluxPipeline").edit is None and families.by_pipeline("QwenImagePipeline").edit is None


# ------------------------------------------------------------------------------------------------ equal to diffusers

def test_qwen_image_edit_equals_diffusers_with_cfg_as_true_cfg_scale(qwen_edit, refs, tmp_path):
    result = Session().generate(edit(qwen_edit, tmp_path, refs[:1]))
    theirs = plain(qwen_edit, 5, prompt="make it blue", image=opened(refs[:1])[0], true_cfg_scale=4.0,
                   negative_prompt=" ")  # the model card's blank negative, as for Qwen-Image
    assert np.abs(pixels(result.images[0]) - theirs).max() <= TOLERANCE
    params = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert params["CFG scale"] == "4" and params["Reference images"] == "ref0.png"


def test_qwen_image_edit_plus_takes_several_images_one_prompt_a_call(qwen_edit_plus, refs, tmp_path):
    result = Session().generate(edit(qwen_edit_plus, tmp_path, refs[:2], batch_size=2))
    assert result.seeds == [5, 6] and len(result.images) == 2
    for seed, path in zip(result.seeds, result.images):
        theirs = plain(qwen_edit_plus, seed, prompt="make it blue", image=opened(refs[:2]), true_cfg_scale=4.0,
                       negative_prompt=" ")
        assert np.abs(pixels(path) - theirs).max() <= TOLERANCE, seed
    assert parse_a1111_parameters(read_png_metadata(result.images[0])[0])["Reference images"] == "ref0.png, ref1.png"


def test_kontext_edit_and_txt2img_equal_diffusers_at_the_asked_size(kontext, refs, tmp_path):
    session = Session()
    result = session.generate(edit(kontext, tmp_path, refs[1:2], cfg_scale=2.5, width=96))
    theirs = plain(kontext, 5, prompt="make it blue", image=opened(refs[1:2])[0], guidance_scale=2.5, width=96,
                   max_area=96 * 64)  # Kontext's call rescales the asked size to max_area: the asked one here
    assert pixels(result.images[0]).shape == (64, 96, 3)
    assert np.abs(pixels(result.images[0]) - theirs).max() <= TOLERANCE
    txt2img = session.generate(edit(kontext, tmp_path, (), cfg_scale=2.5))
    theirs = plain(kontext, 5, prompt="make it blue", guidance_scale=2.5, max_area=64 * 64)
    assert np.abs(pixels(txt2img.images[0]) - theirs).max() <= TOLERANCE


def test_kontext_inpaint_equals_diffusers_at_the_asked_size_and_takes_our_mask_options(kontext, tmp_path, capsys):
    """FluxKontextInpaintPipeline over the loaded components, with `_auto_resize` off (the record's task_arguments):
    the size asked, not the nearest of Kontext's trained resolutions (1024x1024 for a square, the call's default).
    A white mask repaints everything: equal to plain diffusers; a box repaints inside it and keeps the outside."""
    import diffusers

    box = (24, 16, 72, 48)
    init, white, boxed = inpaint_files(tmp_path, 96, 64, box)
    common = ["--init", str(init), "--model", kontext, "--width", "96", "--height", "64", "--steps", "4", "--seed", "4",
              "--cfg", "2.5", "--strength", "0.5", "--mask-blur", "0", "--preset", "cpu", "--outdir", str(tmp_path),
              "--json"]
    ours = inpainted(capsys, white, common)
    pipe = diffusers.FluxKontextInpaintPipeline.from_pipe(diffusers.DiffusionPipeline.from_pretrained(kontext))
    pipe.set_progress_bar_config(disable=True)
    # --strength 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4 (lowvram_gen/img2img_steps.py): diffusers' 0.75
    theirs = pipe(prompt="a castle", image=Image.open(init).convert("RGB"), mask_image=Image.open(white), strength=0.75,
                  width=96, height=64, num_inference_steps=4, guidance_scale=2.5, _auto_resize=False,
                  generator=torch.Generator().manual_seed(4)).images[0]
    assert ours.shape == (64, 96, 3) and np.abs(ours - np.asarray(theirs.convert("RGB"), dtype=int)).max() <= TOLERANCE
    mask_options_act(capsys, init, boxed, box, common)


def test_flux2_klein_with_reference_images_equals_diffusers(klein, refs, tmp_path):
    result = Session().generate(edit(klein, tmp_path, [refs[0], refs[2]]))
    theirs = plain(klein, 5, prompt="make it blue", image=opened([refs[0], refs[2]]), guidance_scale=4.0)
    assert np.abs(pixels(result.images[0]) - theirs).max() <= TOLERANCE
    no_refs = Session().generate(edit(klein, tmp_path, ()))
    assert not np.array_equal(pixels(no_refs.images[0]), pixels(result.images[0]))  # the references are used


def test_flux2_dev_with_reference_images_equals_diffusers(flux2_dev, refs, tmp_path):
    result = Session().generate(edit(flux2_dev, tmp_path, [refs[0], refs[1]]))
    theirs = plain(flux2_dev, 5, prompt="make it blue", image=opened([refs[0], refs[1]]), guidance_scale=4.0)
    assert np.abs(pixels(result.images[0]) - theirs).max() <= TOLERANCE
    no_refs = Session().generate(edit(flux2_dev, tmp_path, ()))
    assert not np.array_equal(pixels(no_refs.images[0]), pixels(result.images[0]))  # the references are used


# ------------------------------------------------------------------------------------------------ refusals

def test_a_model_without_an_edit_pipeline_is_refused_in_one_sentence_naming_its_family(refs, tmp_path):
    with pytest.raises(InvalidRequest) as caught:
        Session().generate(edit("tiny", tmp_path, refs[:1]))
    assert str(caught.value) == (
        "invalid task: 'edit'; SD 1.x/2.x has no edit pipeline in diffusers: edit with an editing model (Flux.2 Klein, "
        "Qwen-Image-Edit, Qwen-Image-Edit-Plus, FLUX.1 Kontext and Flux.2 dev)")


def test_an_edit_only_model_without_an_image_and_too_many_images_are_refused(qwen_edit, kontext, refs, tmp_path):
    with pytest.raises(InvalidRequest) as caught:
        Session().generate(edit(qwen_edit, tmp_path, ()))
    assert str(caught.value) == ("invalid task: 'txt2img'; Qwen-Image-Edit edits images and needs a reference image: "
                                 "use lowvram-gen edit PROMPT --image IMAGE")
    with pytest.raises(InvalidRequest) as caught:
        Session().generate(edit(kontext, tmp_path, refs[:2]))
    assert str(caught.value) == "invalid reference images: 2; FLUX.1 Kontext takes at most 1 reference image"


@pytest.mark.parametrize("kw, said", [
    (dict(reference_images=("missing.png",)), "invalid reference image: 'missing.png'; no such file"),
    (dict(init_image="{ref}"), "invalid init image: '{ref}'; an edit (reference images) takes no init image: the "
                                "reference images are what it edits"),
    (dict(reference_images=("{small}",)), "invalid reference image: '{small}'; is 32x64: a reference image needs at "
                                          "least 64 px a side"),
    (dict(resize_mode="crop"), "invalid resize mode: 'crop'; an edit (reference images) takes no resize mode: the "
                               "reference images are what it edits"),
])
def test_the_request_checks_its_reference_images(kw, said, refs, tmp_path):
    small = tmp_path / "small.png"
    Image.new("RGB", (32, 64)).save(small)
    kw = {k: tuple(x.format(ref=refs[0], small=small) for x in v) if isinstance(v, tuple) else
          v.format(ref=refs[0], small=small) for k, v in kw.items()}
    with pytest.raises(InvalidRequest) as caught:
        edit("tiny", tmp_path, refs[:1], **kw).validated()
    assert str(caught.value) == said.format(ref=refs[0], small=small)


# ------------------------------------------------------------------------------------------------ front ends

def test_cli_edit_takes_the_size_from_the_image_and_the_familys_cfg(kontext, refs, tmp_path, capsys):
    """`lowvram-gen edit` without --width/--height/--cfg: the first image's size (96x64) and Kontext's 2.5."""
    code, out, err = cli(capsys, "edit", "make it blue", "--image", refs[1], "--model", kontext, "--steps", "2",
                         "--seed", "7", "--outdir", str(tmp_path), "--json")
    assert code == 0, err
    result = json.loads(out)
    ours = pixels(result["images"][0])
    theirs = plain(kontext, 7, prompt="make it blue", image=opened(refs[1:2])[0], guidance_scale=2.5, width=96,
                   height=64, max_area=96 * 64)
    assert ours.shape == (64, 96, 3) and np.abs(ours - theirs).max() <= TOLERANCE
    params = parse_a1111_parameters(read_png_metadata(result["images"][0])[0])
    assert (params["CFG scale"], params["Size"], params["Reference images"]) == ("2.5", "96x64", "ref1.png")


def test_cli_edit_on_a_model_that_does_not_edit_is_one_line(refs, tmp_path, capsys):
    code, out, err = cli(capsys, "edit", "make it blue", "--image", refs[0], "--steps", "1", "--outdir",
                         str(tmp_path))
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: invalid task: 'edit'; SD 1.x/2.x has no edit pipeline")


def test_a_batch_line_with_images_is_an_edit(klein, refs, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f'--prompt "make it blue" --image {refs[0]} --image {refs[2]} --model {klein} --steps 2 '
                       f'--seed 5 --width 64 --height 64 --cfg_scale 4\n')
    code, out, err = cli(capsys, "batch", str(prompts), "--outdir", str(tmp_path / "out"))
    assert code == 0, err
    made = sorted((tmp_path / "out").rglob("*.png"))
    assert len(made) == 1
    theirs = plain(klein, 5, prompt="make it blue", image=opened([refs[0], refs[2]]), guidance_scale=4.0)
    assert np.abs(pixels(made[0]) - theirs).max() <= TOLERANCE
    assert parse_a1111_parameters(read_png_metadata(made[0])[0])["Reference images"] == "ref0.png, ref2.png"


def test_the_rest_apis_img2img_with_an_editing_model_edits_its_init_images(qwen_edit, refs, tmp_path):
    """A1111's img2img body, with an editing model: init_images are the reference images (the strength unused)."""
    import base64

    from lowvram_gen.a1111.api_body import map_body

    def stored(value, name="init_images"):
        path = tmp_path / f"{name}-{len(list(tmp_path.glob('*.png')))}.png"
        path.write_bytes(base64.b64decode(value))
        return str(path)

    body = {"prompt": "make it blue", "init_images": [base64.b64encode(open(refs[0], "rb").read()).decode()],
            "width": 64, "height": 64, "steps": 2, "seed": 5, "cfg_scale": 4, "denoising_strength": 0.5,
            "sampler_name": "default"}  # the folder's own flow-matching scheduler
    mapped = map_body(body, "img2img", qwen_edit, 1, str(tmp_path / "out"), lambda _: None, stored)
    assert mapped.request.init_image is None and len(mapped.request.reference_images) == 1
    assert any("reference images" in w for w in mapped.warnings)
    assert not any("resize_mode" in w for w in mapped.warnings)  # A1111's default 0: nothing to say
    cropped = map_body({**body, "resize_mode": 1}, "img2img", qwen_edit, 1, str(tmp_path / "out"), lambda _: None,
                       stored)
    assert cropped.request.resize_mode == "resize" and "resize_mode 1 is not used: an editing model's pipeline " \
        "sizes its reference images itself" in cropped.warnings
    result = Session().generate(mapped.request)
    theirs = plain(qwen_edit, 5, prompt="make it blue", image=opened(refs[:1])[0], true_cfg_scale=4.0,
                   negative_prompt=" ")
    assert np.abs(pixels(result.images[0]) - theirs).max() <= TOLERANCE
    # a model that does not edit keeps A1111's img2img: the first image is the init image
    kept = map_body(body, "img2img", "tiny", 1, str(tmp_path / "out"), lambda _: None, stored)
    assert kept.request.init_image and not kept.request.reference_images


def test_the_ui_img2img_tab_edits_with_an_editing_model(qwen_edit, refs):
    """The img2img tab's fields (ui/tabs/img2img.py) with an editing model: the init image is the reference image."""
    from lowvram_gen.engines.sd.edit import img2img_as_edit

    fields = dict(prompt="make it blue", model=qwen_edit, init_image=refs[0], strength=0.6, resize_mode="crop")
    assert img2img_as_edit(fields) == dict(prompt="make it blue", model=qwen_edit, reference_images=(refs[0],))
    for kept in (dict(fields, model="tiny"), dict(fields, mask=refs[1])):  # another model; an inpaint job
        assert img2img_as_edit(kept) == kept


# ------------------------------------------------------------------------------------------------ plan and memory

def test_more_reference_images_raise_the_plan(klein, refs, tmp_path):
    """Each reference image's latent tokens join the image stream (Flux.2: in every block): the plan counts them."""
    from lowvram_gen.planning.estimate import transformer_tokens

    session = Session()
    plans = {n: session.plan(edit(klein, tmp_path, refs[:n]).validated()) for n in (0, 1, 3)}
    peak = {n: {e.name: e.estimate_bytes for e in p.estimates} for n, p in plans.items()}
    assert peak[0] and all(peak[0][name] < peak[1][name] < peak[3][name] for name in peak[0])
    from lowvram_gen.engines.sd.edit import planned
    from lowvram_gen.models.profile import profile_from_folder

    profile = profile_from_folder(klein)
    one = planned(profile, families.by_key("flux2-klein"), edit(klein, tmp_path, refs[:1]).validated())
    # a 64x64 reference stays 64x64 (Flux.2 makes only bigger ones smaller): as many tokens as a 64x64 image's own
    hw = (64 // profile.vae_scale_factor) ** 2  # latent pixels of a 64x64 image
    assert transformer_tokens(one, hw) - transformer_tokens(profile, hw) == hw / profile.transformer_patch ** 2


def test_int8_a_budget_and_out_of_memory_on_an_edit(kontext, refs, tmp_path):
    from dataclasses import replace

    from ladder_checks import out_of_memory_steps_down

    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset

    job = dict(cfg_scale=2.5)
    quantized = Session().generate(edit(kontext, tmp_path, refs[:1], preset="cpu", quantize="int8", **job))
    assert [a["outcome"] for a in quantized.attempts] == ["ok"] and pixels(quantized.images[0]).std() > 1

    runner = Runner(load(resolve(kontext), "float32"), probe("cpu"))
    images = {}
    for name in ("highvram", "budget"):
        preset = find_preset(name)
        preset = replace(preset, memory=replace(preset.memory, dtype="float32"))
        done = []
        runner.run(edit(kontext, tmp_path, refs[:1], **job).validated(), [3], [preset], done.append)
        images[name] = np.asarray(done[0].images[0].convert("RGB"), dtype=int)
    assert runner.residency is not None  # the budget split is what ran
    assert np.abs(images["budget"] - images["highvram"]).max() <= 1

    result = out_of_memory_steps_down(lambda **kw: edit(kontext, tmp_path, refs[:1], **{**job, **kw}))
    assert "finished at medvram" in result.summary
