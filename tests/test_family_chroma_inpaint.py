"""Chroma's inpaint (issue 30): diffusers' ChromaInpaintPipeline over the loaded components, on the tiny Chroma folder
(tests/tiny_dit.py), compared with plain diffusers; our mask options; the plan at real size; a simulated
out-of-memory; the CLI and the REST API.

In diffusers 0.42 the pipeline reads `transformer.config.guidance_embeds` (FLUX.1's entry), which Chroma's transformer
config has not: plain diffusers fails with an AttributeError. The record sets it False on the loaded transformer
(`task_configs`) as the inpaint pipeline is made; plain diffusers here is given the same workaround. The call is
given max_sequence_length=512 (the record's `task_arguments`: what ChromaPipeline, ChromaImg2ImgPipeline, +te-reload
and the plan read; the inpaint call's own default is 256), so plain diffusers is called with it too.
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from family_checks import api_inpaint, inpaint_files, inpainted, mask_options_act
from PIL import Image
from tiny_dit import build_tiny_chroma
from tiny_transformers import pixels

from lowvram_gen import GenerationRequest, families
from lowvram_gen.session import Session

TOLERANCE = 2  # of 255: the "equal to plain diffusers"


@pytest.fixture(scope="module")
def chroma(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-chroma-inpaint")
    build_tiny_chroma().save_pretrained(path, safe_serialization=True)
    return str(path)


def job(folder, tmp_path, init, mask, **kw) -> GenerationRequest:
    base = dict(prompt="a castle", model=folder, width=64, height=64, steps=4, seed=4, cfg_scale=4.0, strength=0.5,
                init_image=str(init), mask=str(mask), mask_blur=0, outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


def plain(folder: str, init, mask, seed: int = 4) -> np.ndarray:
    """Plain diffusers' ChromaInpaintPipeline from the folder, with the workaround (guidance_embeds=False on the
    transformer's config) and 512 prompt tokens. Our denoise 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4
    (lowvram_gen/img2img_steps.py): diffusers' strength 0.75."""
    import diffusers

    pipe = diffusers.ChromaInpaintPipeline.from_pretrained(folder)
    pipe.transformer.register_to_config(guidance_embeds=False)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a castle", image=Image.open(init).convert("RGB"), mask_image=Image.open(mask), strength=0.75,
               width=64, height=64, num_inference_steps=4, guidance_scale=4.0, max_sequence_length=512,
               generator=torch.Generator().manual_seed(seed)).images[0]
    return np.asarray(out.convert("RGB"), dtype=int)


def test_the_record_names_the_pipeline_and_plain_diffusers_needs_the_workaround(chroma, tmp_path):
    """The record's inpaint task; without the config entry plain diffusers 0.42 fails (when a diffusers release reads
    the entry safely this fails, and the record's task_configs can go)."""
    import diffusers

    record = families.by_key("chroma")
    assert record.pipeline_for("inpaint") == "ChromaInpaintPipeline"
    assert record.task_configs["inpaint"] == {"transformer": {"guidance_embeds": False}}
    init, white, _ = inpaint_files(tmp_path)
    pipe = diffusers.ChromaInpaintPipeline.from_pretrained(chroma)
    assert "guidance_embeds" not in pipe.transformer.config
    with pytest.raises(AttributeError, match="guidance_embeds"):
        pipe(prompt="a castle", image=Image.open(init).convert("RGB"), mask_image=Image.open(white), width=64,
             height=64, num_inference_steps=1, strength=1.0)


def test_cli_inpaint_equals_diffusers_and_takes_our_mask_options(chroma, tmp_path, capsys, posterior_mode):
    """A white mask repaints everything: equal to plain diffusers; a box repaints inside and keeps the outside, with
    no mask option, latent noise and only masked (mask_options_act)."""
    init, white, boxed = inpaint_files(tmp_path)
    common = ["--init", str(init), "--model", chroma, "--width", "64", "--height", "64", "--steps", "4", "--seed", "4",
              "--cfg", "4", "--strength", "0.5", "--mask-blur", "0", "--preset", "cpu", "--outdir", str(tmp_path),
              "--json"]
    assert np.abs(inpainted(capsys, white, common) - plain(chroma, init, white)).max() <= TOLERANCE
    mask_options_act(capsys, init, boxed, (16, 16, 48, 48), common)


def test_the_workaround_leaves_txt2img_and_img2img_as_they_were_on_the_same_transformer(chroma, tmp_path):
    """The entry is set on the loaded transformer, which txt2img and img2img share: their images before and after an
    inpaint on the same session are the same pixels (ChromaPipeline and ChromaImg2ImgPipeline never read it)."""
    init, _white, boxed = inpaint_files(tmp_path)
    session = Session(preset="cpu")
    txt2img = dict(prompt="a castle", model=chroma, width=64, height=64, steps=2, seed=7, cfg_scale=4.0,
                   outdir=str(tmp_path))
    img2img = dict(txt2img, init_image=str(init), strength=0.6)
    before = [pixels(session.generate(GenerationRequest(**kw)).images[0]) for kw in (txt2img, img2img)]
    transformer = session.model.pipe.transformer
    assert "guidance_embeds" not in transformer.config
    session.generate(job(chroma, tmp_path, init, boxed))
    assert session.model.pipe.transformer is transformer and transformer.config["guidance_embeds"] is False
    after = [pixels(session.generate(GenerationRequest(**kw)).images[0]) for kw in (txt2img, img2img)]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_the_masked_contents_act(chroma, tmp_path):
    """The init latents the pipeline encodes (its `_encode_vae_image`) are replaced inside the mask by latent noise /
    latent nothing: each makes another image than original, which fill (pixels) changes too. (At the job's denoise
    0.5, 3 of 4 steps: at a full denoise the first step's latents are all noise, and the contents cannot differ.)"""
    init, _white, boxed = inpaint_files(tmp_path)
    session = Session(preset="cpu")
    made = {c: pixels(session.generate(job(chroma, tmp_path, init, boxed, masked_content=c)).images[0])
            for c in ("original", "latent-noise", "latent-nothing", "fill")}
    for content in ("latent-noise", "latent-nothing", "fill"):
        assert not np.array_equal(made[content], made["original"]), content
        assert np.abs(made[content][:8] - pixels(init)[:8]).max() <= TOLERANCE, content  # the outside kept


def test_the_plan_counts_an_inpaint_as_txt2img_at_real_size(tmp_path):
    """`plan`'s real configs: ChromaInpaintPipeline puts its init latents back outside the mask after each step (a
    64-channel transformer, not an inpainting one): they are not joined to the image tokens, so every candidate of a
    1024x1024 inpaint costs what txt2img's does (the init, noise and mask latents it holds: 16 x 128 x 128 each,
    about 0.5 MiB in bfloat16, inside the plan's overhead). An inpaint job's steps are A1111's img2img count."""
    from lowvram_gen import img2img_steps
    from lowvram_gen.hardware.device import simulated

    init, white, _ = inpaint_files(tmp_path, 1024, 1024, (256, 256, 768, 768))
    session = Session()
    profile = session.model_profile("chroma")
    device = simulated("8GiB")

    def planned(**kw):
        request = GenerationRequest(prompt="a castle", model="chroma", width=1024, height=1024, steps=40,
                                    cfg_scale=3.0, **kw).validated()
        return request, {e.name: e.estimate_bytes for e in session.plan(request, device, profile=profile).estimates}

    request, inpaint = planned(init_image=str(init), mask=str(white), strength=0.5)
    _, txt2img = planned()
    assert inpaint and inpaint == txt2img
    assert profile[0].reference_tokens == 0
    assert img2img_steps.job_steps(request) == 21  # int(0.5 x 40) + 1 of A1111's img2img


def test_out_of_memory_steps_down_a_preset_without_reloading(chroma, tmp_path):
    """Simulated: the transformer raises torch.OutOfMemoryError at highvram in an inpaint; the job finishes at medvram
    on the same transformer, with the pixels of the job run without the fault."""
    from ladder_checks import out_of_memory_steps_down

    init, _white, boxed = inpaint_files(tmp_path)
    result = out_of_memory_steps_down(lambda **kw: job(chroma, tmp_path, init, boxed, **kw))
    assert [(a["width"], a["height"]) for a in result.attempts] == [(64, 64)] * 2


def test_te_reload_encodes_apart_and_makes_the_same_inpaint(chroma, tmp_path):
    """+te-reload: the prompts encoded apart (512 tokens, as the record's inpaint call reads them), the text encoder
    gone while the transformer runs, and a batch of two the same pixels as with the encoder kept."""
    from family_checks import te_reload_equal

    init, _white, boxed = inpaint_files(tmp_path)
    te_reload_equal(lambda **kw: job(chroma, tmp_path, init, boxed, negative_prompt="fog", **kw), tmp_path)


def test_the_rest_apis_img2img_with_a_mask_inpaints(chroma, tmp_path, posterior_mode):
    """A1111's img2img body with a mask on Chroma: equal to plain diffusers with a white mask."""
    init, white, _ = inpaint_files(tmp_path)
    ours = pixels(Session(preset="cpu").generate(api_inpaint(tmp_path, chroma, init, white, 4, 4)).images[0])
    assert np.abs(ours - plain(chroma, init, white)).max() <= TOLERANCE
