"""Qwen-Image-Edit's inpaint (issue 30): diffusers' QwenImageEditInpaintPipeline over the loaded components, on the
tiny Qwen-Image-Edit folder (tests/family_folders.py BUILDERS), compared with plain diffusers; our mask options; the
plan; a simulated out-of-memory; the CLI and the REST API.

Its call ignores width and height: it renders about 1024x1024 pixels at the init image's aspect (its module's
calculate_dimensions), its init image's latents beside the image tokens. The record says so (`rendered_sizes`): the
plan counts that size, no preset caps it, the ladder takes no resolution step, and the image is made at that size and
resized to the one asked, its PNG saying what was made ("Generated size"). The `small_refs` fixture makes that area
64x64 in diffusers' module (family_folders.small_references), for ours and plain diffusers' alike, as the other edit
tests do: what is compared is the same pipeline code, called by us and by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from family_checks import api_inpaint, inpaint_files, inpainted, mask_options_act
from family_folders import BUILDERS, SMALL_REFERENCE, small_references
from PIL import Image
from tiny_transformers import pixels

from lowvram_gen import GenerationRequest, families
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

TOLERANCE = 2  # of 255: the "equal to plain diffusers"
SIDE = int(SMALL_REFERENCE ** 0.5)  # the side the pipeline renders a square at, with small_refs: 64


@pytest.fixture
def small_refs(monkeypatch):
    small_references(monkeypatch)


@pytest.fixture(scope="module")
def qwen_edit(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-qwen-edit-inpaint")
    BUILDERS["qwen-image-edit"]().save_pretrained(path, safe_serialization=True)
    return str(path)


def job(folder, tmp_path, init, mask, **kw) -> GenerationRequest:
    base = dict(prompt="a castle", model=folder, width=SIDE, height=SIDE, steps=2, seed=4, cfg_scale=4.0,
                strength=0.5, init_image=str(init), mask=str(mask), mask_blur=0, outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


def plain(folder: str, init, mask, seed: int = 4, steps: int = 2) -> np.ndarray:
    """Plain diffusers' QwenImageEditInpaintPipeline from the folder, as its model card calls it (true CFG 4 with the
    blank negative " "). Our denoise 0.5 of 2 steps runs A1111's int(0.5 x 2) + 1 = 2 of 2 (lowvram_gen/img2img_steps.py):
    diffusers' strength 1.0."""
    import diffusers

    pipe = diffusers.QwenImageEditInpaintPipeline.from_pipe(diffusers.DiffusionPipeline.from_pretrained(folder))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a castle", negative_prompt=" ", image=Image.open(init).convert("RGB"),
               mask_image=Image.open(mask), strength=1.0, num_inference_steps=steps, true_cfg_scale=4.0,
               generator=torch.Generator().manual_seed(seed)).images[0]
    return np.asarray(out.convert("RGB"), dtype=int)


def test_the_record_names_the_pipeline_and_the_size_it_renders():
    """At real size (diffusers' own calculate_dimensions): about 1024x1024 pixels at the aspect, whatever the size."""
    record = families.by_key("qwen-image-edit")
    assert record.pipeline_for("inpaint") == "QwenImageEditInpaintPipeline"
    size = record.rendered_sizes["inpaint"]
    assert size(512, 512) == size(2048, 2048) == (1024, 1024)
    assert size(512, 768) == (832, 1248)
    assert not families.by_key("qwen-image-edit-plus").has_task("inpaint")  # diffusers has none for Edit-Plus


def test_cli_inpaint_equals_diffusers_and_takes_our_mask_options(small_refs, qwen_edit, tmp_path, capsys,
                                                                 posterior_mode):
    """A white mask repaints everything: equal to plain diffusers; a box repaints inside and keeps the outside."""
    init, white, boxed = inpaint_files(tmp_path)
    common = ["--init", str(init), "--model", qwen_edit, "--width", "64", "--height", "64", "--steps", "2", "--seed",
              "4", "--cfg", "4", "--strength", "0.5", "--mask-blur", "0", "--preset", "cpu", "--outdir",
              str(tmp_path), "--json"]
    assert np.abs(inpainted(capsys, white, common) - plain(qwen_edit, init, white)).max() <= TOLERANCE
    mask_options_act(capsys, init, boxed, (16, 16, 48, 48), common)


def test_another_size_is_made_at_its_own_planned_there_and_resized(small_refs, qwen_edit, tmp_path):
    """Asked 128x128, it renders 64x64 (the small area): the plan counts 64x64 for every candidate (none capped), the
    attempt ran there, the PNG and the result say so in one warning and "Generated size", and the image is the asked
    size with the init image kept outside the mask."""
    init, _white, boxed = inpaint_files(tmp_path, 128, 128, (32, 32, 96, 96))
    request = job(qwen_edit, tmp_path, init, boxed, width=128, height=128, masked_content="fill")
    the_plan = Session().plan(request.validated())
    assert {(e.width, e.height) for e in the_plan.estimates} == {(SIDE, SIDE)}
    result = Session(preset="cpu").generate(request)
    assert (result.generated_width, result.generated_height) == (SIDE, SIDE)
    assert [(a["width"], a["height"]) for a in result.attempts] == [(SIDE, SIDE)]
    assert result.warnings == [
        f"QwenImageEditInpaintPipeline renders {SIDE}x{SIDE} when given 128x128 (its call renders a size of its own at "
        "the image's aspect, whatever width and height it is given): the image is resized to 128x128"]
    params = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert (params["Size"], params["Generated size"]) == ("128x128", f"{SIDE}x{SIDE}")
    ours, original = pixels(result.images[0]), pixels(init)
    assert ours.shape == (128, 128, 3) and np.array_equal(ours[:24], original[:24])


def test_the_plan_counts_the_rendered_size_and_the_init_latents_beside_at_real_size(tmp_path):
    """`plan`'s real configs: an inpaint asked at 512x512 is planned as the pipeline runs it, 1024x1024 and its init
    image's 1024x1024 latents in every block: what an edit of a 1024x1024 reference at 1024x1024 costs (each candidate
    that edit does not cap), and the same for any size asked."""
    from lowvram_gen.hardware.device import simulated

    init, white, _ = inpaint_files(tmp_path, 512, 512)
    session = Session()
    profile = session.model_profile("qwen-image-edit")
    device = simulated("8GiB")

    def planned(**kw):
        request = GenerationRequest(prompt="a castle", model="qwen-image-edit", steps=50, cfg_scale=4.0, **kw)
        return {e.name: e for e in session.plan(request.validated(), device, profile=profile).estimates}

    inpaint = planned(width=512, height=512, init_image=str(init), mask=str(white))
    (tmp_path / "big").mkdir()
    big = inpaint_files(tmp_path / "big", 1024, 1024)[0]
    edit = planned(width=1024, height=1024, reference_images=(str(big),))
    assert {(e.width, e.height) for e in inpaint.values()} == {(1024, 1024)}
    same = [n for n, e in edit.items() if (e.width, e.height) == (1024, 1024) and n in inpaint]
    assert same and all(inpaint[n].estimate_bytes == edit[n].estimate_bytes for n in same)
    other = planned(width=768, height=768, init_image=str(init), mask=str(white))
    assert {n: e.estimate_bytes for n, e in other.items()} == {n: e.estimate_bytes for n, e in inpaint.items()}


def test_out_of_memory_steps_down_a_preset_without_reloading(small_refs, qwen_edit, tmp_path):
    """Simulated: the transformer raises torch.OutOfMemoryError at highvram; the job finishes at medvram on the same
    transformer, at the size the pipeline renders (no resolution step: it would render the same)."""
    from ladder_checks import out_of_memory_steps_down

    init, _white, boxed = inpaint_files(tmp_path, 128, 128, (32, 32, 96, 96))
    def request(**kw) -> GenerationRequest:
        return job(qwen_edit, tmp_path, init, boxed, **{"width": 128, "height": 128, **kw})

    result = out_of_memory_steps_down(request)
    assert [(a["width"], a["height"]) for a in result.attempts] == [(SIDE, SIDE)] * 2


def test_the_rest_apis_img2img_with_a_mask_inpaints(small_refs, qwen_edit, tmp_path, posterior_mode):
    """A1111's img2img body with a mask on Qwen-Image-Edit is an inpaint (not an edit of its init images): equal to
    plain diffusers with a white mask."""
    init, white, _ = inpaint_files(tmp_path)
    ours = pixels(Session(preset="cpu").generate(api_inpaint(tmp_path, qwen_edit, init, white, 2, 4)).images[0])
    assert np.abs(ours - plain(qwen_edit, init, white)).max() <= TOLERANCE
