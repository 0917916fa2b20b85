"""Inpainting (issue 20 item 1): the request's mask fields, the CLI, the denoise call, the geometry, the PNG text, the
ladder.

The inpainting model is the tiny SD model with a 9-channel UNet (tests/inpaint_files.py), saved as a diffusers folder
and as one original-layout .safetensors; the plain tiny model (4 channels) is the ordinary checkpoint. Out-of-memory
is simulated as the ladder tests do it: the VAE's decode monkeypatched to raise torch.OutOfMemoryError once.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

import inpaint_files as files  # tests/inpaint_files.py
from folder_sampler import own_sampler  # tests/folder_sampler.py

STEPS, SIDE, SEED, CFG = 3, 64, 5, 7.0
BOX = (16, 16, 48, 40)  # the mask's white part: x0, y0, x1, y1
# denoise 0.8 of 3 steps runs A1111's int(0.8 x 3) + 1 = 3 of 3 (lowvram_gen/img2img_steps.py): diffusers' strength
# for that count is 1.0 (its 0.8 runs int(2.4) = 2)
A1111_RUN = 1.0


@pytest.fixture(scope="module")
def inp(tmp_path_factory, tiny_path):
    root = tmp_path_factory.mktemp("inpaint")
    pipe = files.build(tiny_path)
    return {"folder": files.save_folder(pipe, root / "tiny-inpainting"),
            "file": files.save_single_file(pipe, root / "tiny-inpainting.safetensors"),
            "init": files.init_image(root / "init.png"),
            "mask": files.mask_image(root / "mask.png", BOX),
            "root": root}


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def request(inp, tmp_path, **fields):
    base = dict(prompt="a boat", width=SIDE, height=SIDE, steps=STEPS, seed=SEED, cfg_scale=CFG, outdir=str(tmp_path),
                init_image=str(inp["init"]), mask=str(inp["mask"]), model=str(inp["folder"]), mask_blur=0)
    return GenerationRequest(**{**base, **fields}).validated()


def _out_of_memory_once(monkeypatch, cls, name: str) -> None:
    """Simulated OOM (the ladder tests' way): `cls.name` raises torch.OutOfMemoryError on its first call, then runs."""
    real, calls = getattr(cls, name), []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, failing)


def inside(mask_box=BOX, side=SIDE):
    x0, y0, x1, y1 = mask_box
    m = np.zeros((side, side), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def test_inpainting_model_equals_plain_diffusers(inp, session, tmp_path, posterior_mode):
    """Same seed: our job with the 9-channel model is diffusers' StableDiffusionInpaintPipeline's image inside the
    mask, and the init image outside it (A1111's overlay, which the plain pipeline does not do): pixel-exact, both
    on the CPU in float32 with the same generator and the same embeddings."""
    from diffusers import StableDiffusionInpaintPipeline

    ours = pixels(session.generate(request(inp, tmp_path, strength=0.8, sampler=own_sampler(inp["folder"]))).images[0])
    pipe = StableDiffusionInpaintPipeline.from_pretrained(str(inp["folder"]))
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a boat", image=Image.open(inp["init"]).convert("RGB"), mask_image=Image.open(inp["mask"]).convert("L"),
               num_inference_steps=STEPS, guidance_scale=CFG, strength=A1111_RUN, width=SIDE, height=SIDE,
               generator=torch.Generator("cpu").manual_seed(SEED)).images[0]
    plain = np.asarray(out).astype(int)
    m = inside()
    assert np.array_equal(ours[m], plain[m])
    assert np.array_equal(ours[~m], pixels(inp["init"])[~m])
    assert not np.array_equal(plain[m], pixels(inp["init"])[m])  # it did repaint


def test_single_file_inpainting_model_equals_folder(inp, session, tmp_path, tiny_path):
    """An inpainting .safetensors (original layout, 9-channel UNet) loaded with its base model's configs (the tiny's,
    4 channels) makes the folder's image."""
    folder = pixels(session.generate(request(inp, tmp_path / "a")).images[0])
    single = pixels(session.generate(request(inp, tmp_path / "b", model=str(inp["file"]),
                                             config=str(tiny_path))).images[0])
    assert np.array_equal(folder, single)


@pytest.mark.parametrize("model", ["folder", "tiny"])
def test_outside_the_blurred_mask_stays_the_init_image(inp, session, tmp_path, model):
    """With the 9-channel model and with an ordinary one (its latents blended outside the mask each step): every
    pixel the blurred mask does not reach is the init image's; the masked area changed."""
    from lowvram_gen.inpaint.masks import blurred, read

    spec = str(inp["folder"]) if model == "folder" else "tiny"
    out = pixels(session.generate(request(inp, tmp_path, model=spec, mask_blur=4, strength=1.0)).images[0])
    soft = np.asarray(blurred(read(str(inp["mask"])), 4))
    init = pixels(inp["init"])
    assert np.array_equal(out[soft == 0], init[soft == 0])
    assert np.abs(out[inside()] - init[inside()]).mean() > 10


def test_invert_mask_repaints_the_black_part(inp, session, tmp_path):
    out = pixels(session.generate(request(inp, tmp_path, invert_mask=True, strength=1.0)).images[0])
    init = pixels(inp["init"])
    assert np.array_equal(out[inside()], init[inside()])
    assert np.abs(out[~inside()] - init[~inside()]).mean() > 10


def test_only_masked_denoises_the_crop_at_the_job_size_and_pastes_it_back(inp, session, tmp_path, monkeypatch):
    """A 128x128 canvas, a 64x64 job: the UNet sees 8x8 latents (64 px: the crop resized to the job), never the
    canvas's 16x16; the image is the canvas's size, the init image's outside the mask's box."""
    from diffusers import UNet2DConditionModel

    canvas = files.init_image(tmp_path / "big.png", side=128)
    mask = files.mask_image(tmp_path / "bigmask.png", (40, 40, 72, 64), size=(128, 128))
    seen = []
    forward = UNet2DConditionModel.forward

    def spy(self, sample, *args, **kwargs):
        seen.append(tuple(sample.shape[-2:]))
        return forward(self, sample, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "forward", spy)
    result = session.generate(request(inp, tmp_path, init_image=str(canvas), mask=str(mask), inpaint_area="masked",
                                      mask_padding=8, strength=1.0))
    out = pixels(result.images[0])
    assert out.shape[:2] == (128, 128)
    assert set(seen) == {(SIDE // 8, SIDE // 8)}
    m = inside((40, 40, 72, 64), 128)
    assert np.array_equal(out[~m], pixels(canvas)[~m])
    assert np.abs(out[m] - pixels(canvas)[m]).mean() > 10
    text, _ = read_png_metadata(result.images[0])
    params = parse_a1111_parameters(text)
    assert params["Inpaint area"] == "Only masked" and params["Masked area padding"] == "8"


def test_only_masked_box_is_grown_to_the_jobs_aspect():
    from lowvram_gen.inpaint.masks import crop_box, to_aspect

    mask = Image.new("L", (200, 100))
    mask.paste(255, (90, 40, 110, 50))
    box = crop_box(mask, 4)
    assert box == (86, 36, 114, 54)
    x0, y0, x1, y1 = to_aspect(box, 64, 32, mask.size)  # 2:1
    assert (x1 - x0) == 2 * (y1 - y0) and x0 <= 86 and x1 >= 114


def test_each_masked_content_runs_and_differs(inp, session, tmp_path):
    """original, fill, latent noise and latent nothing each make another image inside the mask (an ordinary model,
    strength below 1, where what the masked area starts from shows), the same outside it."""
    made = {}
    for content in ("original", "fill", "latent-noise", "latent-nothing"):
        result = session.generate(request(inp, tmp_path / content, model="tiny", masked_content=content, strength=0.6))
        made[content] = pixels(result.images[0])
        params = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
        assert params.get("Masked content") == (None if content == "original" else content.replace("-", " "))
    names = list(made)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not np.array_equal(made[a][inside()], made[b][inside()]), (a, b)
            assert np.array_equal(made[a][~inside()], made[b][~inside()])


def test_fill_paints_the_masked_area_from_around_it():
    from lowvram_gen.inpaint.masks import fill

    image = Image.new("RGB", (32, 32), (200, 40, 40))
    image.paste((0, 255, 0), (8, 8, 24, 24))
    mask = Image.new("L", (32, 32))
    mask.paste(255, (8, 8, 24, 24))
    filled = np.asarray(fill(image, mask)).astype(int)
    # the green square is gone, the red around it instead (within 8 levels: the blurs are of 8-bit images)
    assert np.abs(filled[8:24, 8:24] - [200, 40, 40]).max() <= 8
    assert np.array_equal(filled[:8], np.asarray(image)[:8])


def test_bad_masks_get_one_sentence(inp, tmp_path, capsys):
    black = tmp_path / "black.png"
    Image.new("L", (SIDE, SIDE)).save(black)
    white = tmp_path / "white.png"
    Image.new("L", (SIDE, SIDE), 255).save(white)
    text = tmp_path / "mask.txt"
    text.write_text("not an image")
    base = ["inpaint", "a boat", "--init", str(inp["init"]), "--steps", "1", "--outdir", str(tmp_path)]
    for mask, extra, said in ((text, [], "not a readable image"), (black, [], "nothing to repaint"),
                              (white, ["--invert-mask"], "nothing to repaint"),
                              (tmp_path / "nope.png", [], "no such file")):
        assert main([*base, "--mask", str(mask), *extra]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    with pytest.raises(InvalidRequest, match="goes with an init image"):
        GenerationRequest(mask=str(inp["mask"])).validated()
    with pytest.raises(InvalidRequest, match="inpaint area"):
        request(inp, tmp_path, inpaint_area="everywhere")
    with pytest.raises(InvalidRequest, match="masked content"):
        request(inp, tmp_path, masked_content="latent")


def test_a_mask_of_another_size_is_resized_with_a_warning(inp, session, tmp_path):
    small = files.mask_image(tmp_path / "small.png", (8, 8, 24, 20), size=(32, 32))
    result = session.generate(request(inp, tmp_path, mask=str(small), strength=1.0))
    assert any("mask is 32x32" in w and "resized" in w for w in result.warnings)
    out, init = pixels(result.images[0]), pixels(inp["init"])
    assert np.array_equal(out[~inside()], init[~inside()])  # the 32 px mask's box, doubled, is BOX


def test_an_inpainting_model_without_a_mask_is_refused(inp, session, tmp_path):
    plain = dataclasses.replace(request(inp, tmp_path), mask=None, init_image=None)
    with pytest.raises(InvalidRequest, match="inpainting model"):
        session.generate(plain)


def test_out_of_memory_in_an_inpaint_decode_recovers(inp, session, tmp_path, monkeypatch):
    """Simulated OOM (the ladder tests' way): the VAE decode raises torch.OutOfMemoryError once; the decode is done
    again tiled, the latents kept, and the image is the one an untroubled job makes."""
    from diffusers import AutoencoderKL

    clean = pixels(session.generate(request(inp, tmp_path / "clean")).images[0])
    _out_of_memory_once(monkeypatch, AutoencoderKL, "decode")
    result = session.generate(request(inp, tmp_path / "oom"))
    stages = [(a["stage"], a["outcome"]) for a in result.attempts]
    assert ("decode", "oom") in stages and stages[-1] == ("decode", "ok")
    out = pixels(result.images[0])
    assert np.array_equal(out[~inside()], pixels(inp["init"])[~inside()])
    assert np.abs(out - clean).max() <= 2  # tiled decode of a 64 px image: one tile, the same pixels within rounding


def test_infotext_is_written_and_read_back_with_the_mask_given_again(inp, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["inpaint", "a boat", "--init", str(inp["init"]), "--mask", str(inp["mask"]), "--model", str(inp["folder"]),
            "--steps", str(STEPS), "--seed", str(SEED), "--width", str(SIDE), "--height", str(SIDE), "--strength",
            "0.6", "--mask-blur", "2", "--inpaint-area", "masked", "--mask-padding", "16", "--masked-content", "fill",
            "--invert-mask", "--outdir", str(out), "--json", "--cpu"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    params = parse_a1111_parameters(read_png_metadata(first)[0])
    assert {k: params[k] for k in ("Denoising strength", "Mask blur", "Mask mode", "Inpaint area",
                                   "Masked area padding", "Masked content")} == {
        "Denoising strength": "0.6", "Mask blur": "2", "Mask mode": "Inpaint not masked", "Inpaint area": "Only masked",
        "Masked area padding": "16", "Masked content": "fill"}
    # the mask is not in the PNG: generate/img2img --from-png of it says so, exit 2
    assert main(["img2img", "--from-png", first, "--init", str(inp["init"]), "--outdir", str(out), "--cpu"]) == 2
    assert "its mask is not in a PNG" in capsys.readouterr().err
    # inpaint --from-png with the mask again: the same settings, the same image
    assert main(["inpaint", "--from-png", first, "--init", str(inp["init"]), "--mask", str(inp["mask"]), "--model",
                 str(inp["folder"]), "--outdir", str(out), "--json", "--cpu"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert parse_a1111_parameters(read_png_metadata(again)[0]) == params
    assert np.array_equal(pixels(again), pixels(first))


def test_a1111_infotext_inpaint_fields_read_back():
    from lowvram_gen.a1111.infotext import request_fields

    text = ("a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 512x512, Denoising strength: 0.5, "
            "Mask blur: 6, Inpaint area: Only masked, Masked area padding: 48, Masked content: latent noise")
    info = request_fields(parse_a1111_parameters(text))
    f = info.fields
    assert (f["mask_blur"], f["inpaint_area"], f["mask_padding"], f["masked_content"], f["strength"]) == \
        (6, "masked", 48, "latent-noise", 0.5)
    assert not info.ignored


def test_plan_counts_the_inpainting_unets_extra_inputs(inp, tiny_path):
    """The 9-channel UNet's step counts its mask and masked-image latents (held, and in the concatenated input)
    beyond the 4-channel model's, at the job's size."""
    from lowvram_gen.planning import estimate as memory
    from lowvram_gen.models import profile as profiles

    nine, four = profiles.profile_from_folder(inp["folder"]), profiles.profile_from_folder(tiny_path)
    assert nine.unet_in_channels == 9 and four.unet_in_channels == 4
    hw = (512 // 8) * (512 // 8)
    kind, _ = memory._denoiser_elements(nine, hw)
    more = memory.unet_activation_bytes(nine, 512, 512, 1, 2) - memory.unet_activation_bytes(four, 512, 512, 1, 2)
    assert more == memory.inpaint_input_bytes(nine, hw, 1 + memory._per_call(kind), 2) > 0
    assert memory.inpaint_input_bytes(four, hw, 1, 2) == 0


def test_batch_lines_inpaint_with_our_fields_and_a1111_api_names(inp, tmp_path, capsys):
    """A prompt file's lines take the mask fields, and A1111's API names for them (inpainting_fill 0-3,
    inpaint_full_res, inpaint_full_res_padding, inpainting_mask_invert); the batch makes the inpainted images."""
    from lowvram_gen.batch.files import expand, read_entries

    lines = [{"prompt": "a boat", "init_image": str(inp["init"]), "mask": str(inp["mask"]), "mask_blur": 0,
              "masked_content": "latent-nothing"},
             {"prompt": "a boat", "init_image": str(inp["init"]), "mask": str(inp["mask"]), "mask_blur": 0,
              "inpainting_fill": 2, "inpaint_full_res": True, "inpaint_full_res_padding": 8,
              "inpainting_mask_invert": 1}]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    first, second = (j.request for j in expand(read_entries(path), {"model": str(inp["folder"])}).jobs)
    assert (first.masked_content, first.inpaint_area) == ("latent-nothing", "whole")
    assert (second.masked_content, second.inpaint_area, second.mask_padding, second.invert_mask) == \
        ("latent-noise", "masked", 8, True)
    assert main(["batch", str(path), "--model", str(inp["folder"]), "--steps", "2", "--width", str(SIDE), "--height",
                 str(SIDE), "--outdir", str(tmp_path / "o"), "--cpu", "--json"]) == 0
    capsys.readouterr()
    made = sorted((tmp_path / "o").rglob("*.png"))
    assert len(made) == 2
    init = pixels(inp["init"])
    outside = {pixels(p)[~inside()].tolist() == init[~inside()].tolist() for p in made}
    assert outside == {True, False}  # the inverted line repainted outside the mask


def test_python_api_takes_the_mask(inp, tmp_path):
    """The Python API without a session: lowvram_gen.generate(GenerationRequest(mask=...))."""
    import lowvram_gen

    result = lowvram_gen.generate(request(inp, tmp_path, strength=1.0))
    out = pixels(result.images[0])
    assert np.array_equal(out[~inside()], pixels(inp["init"])[~inside()])
    assert np.abs(out[inside()] - pixels(inp["init"])[inside()]).mean() > 10


def test_sdxl_inpaints_with_an_ordinary_checkpoint(inp, session, tmp_path):
    """tiny-sdxl (4 channels) through StableDiffusionXLInpaintPipeline: the original outside the mask, repainted in."""
    out = pixels(session.generate(request(inp, tmp_path, model="tiny-sdxl", strength=1.0)).images[0])
    init = pixels(inp["init"])
    assert np.array_equal(out[~inside()], init[~inside()])
    assert np.abs(out[inside()] - init[inside()]).mean() > 10


def test_out_of_memory_in_an_inpaint_step_steps_down_and_finishes(inp, tmp_path, monkeypatch):
    """Simulated OOM (the ladder tests' way): the UNet's forward raises torch.OutOfMemoryError once (at highvram, the
    GPU ladder run on this CPU); the job finishes one rung down and keeps the init image outside the mask."""
    from diffusers import UNet2DConditionModel

    _out_of_memory_once(monkeypatch, UNet2DConditionModel, "forward")
    result = Session(preset="highvram").generate(request(inp, tmp_path, strength=1.0))
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    out = pixels(result.images[0])
    assert out.shape[:2] == (SIDE, SIDE)
    assert np.array_equal(out[~inside()], pixels(inp["init"])[~inside()])


def test_out_of_memory_on_a_big_canvas_goes_on_as_only_masked_before_any_cheaper_preset(inp, tmp_path, monkeypatch):
    """Simulated OOM (the ladder tests' way): a card on which a 1024 px step does not fit and a 512 px one does (the
    UNet's forward raises torch.OutOfMemoryError on latents above 64x64). A whole-picture inpaint of a 1024 px canvas
    with a small mask goes on as only masked, the mask's box at the tiny model's native 512 px, at the same preset;
    the image keeps the canvas's size and every pixel outside the mask, and its PNG says Only masked."""
    from diffusers import UNet2DConditionModel

    side, box = 1024, (100, 120, 220, 200)
    canvas = files.init_image(tmp_path / "canvas.png", side=side)
    mask = files.mask_image(tmp_path / "canvas-mask.png", box, size=(side, side))
    forward, seen = UNet2DConditionModel.forward, []

    def small_card(self, sample, *args, **kwargs):
        seen.append(tuple(sample.shape[-2:]))
        if max(sample.shape[-2:]) > 64:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated: above 512 px)")
        return forward(self, sample, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "forward", small_card)
    result = Session(preset="highvram").generate(request(inp, tmp_path, init_image=str(canvas), mask=str(mask),
                                                         width=side, height=side, steps=2, strength=1.0))
    steps = [(a["preset"], a["stage"], a["outcome"], a["width"]) for a in result.attempts]
    assert steps[:2] == [("highvram", "denoise", "oom", side), ("highvram", "denoise", "ok", 512)]
    assert seen[0] == (128, 128) and set(seen[1:]) == {(64, 64)}
    out = pixels(result.images[0])
    assert out.shape[:2] == (side, side)
    m = inside(box, side)
    assert np.array_equal(out[~m], pixels(canvas)[~m])
    assert np.abs(out[m] - pixels(canvas)[m]).mean() > 10
    params = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert params["Inpaint area"] == "Only masked" and "Generated size" not in params
    assert params["Size"] == f"{side}x{side}"


def test_the_only_masked_step_is_taken_only_where_it_saves_memory(tmp_path):
    """masked_rung: the box at the whole picture's scale, its shorter side at least the model's native side (or the
    pass's); None for a box near the canvas's size and for a job that is only masked already."""
    from lowvram_gen.inpaint.area import Area
    from lowvram_gen.inpaint.masks import Prepared

    canvas = Image.new("RGB", (2048, 1024))

    def area(box, only_masked=False):
        mask = Image.new("L", canvas.size)
        mask.paste(255, box)
        return Area(canvas, Prepared(mask, mask, None), only_masked, 32, "original", (2048, 1024))

    small = area((1000, 500, 1100, 560))
    rung = small.masked_rung((2048, 1024), 8, 512)
    assert rung is not None and rung[1] == (1024, 512) and rung[0].only_masked and rung[0].out_size == (2048, 1024)
    # the pass already capped to 1024x512: the box at that scale, floored to the pass's shorter side (512)
    assert small.masked_rung((1024, 512), 8, 1024) is None
    big = area((0, 0, 1800, 1000))
    assert big.masked_rung((2048, 1024), 8, 512) is None
    assert area((1000, 500, 1100, 560), only_masked=True).masked_rung((2048, 1024), 8, 512) is None
    # a native side of 256 lets the box be smaller: 164x82 at scale 1 grows to 512x256
    assert small.masked_rung((2048, 1024), 8, 256)[1] == (512, 256)


def test_plan_of_a_single_file_inpainting_model_counts_nine_inputs(inp, tiny_path):
    """A single-file inpainting checkpoint with its base model's configs (4 channels) is planned with the 9 inputs
    its own header says."""
    from lowvram_gen.models.profile import source_profile
    from lowvram_gen.models.resolve import resolve

    assert source_profile(resolve(str(inp["file"]), str(tiny_path))).unet_in_channels == 9
    assert source_profile(resolve(str(tiny_path))).unet_in_channels == 4


def test_sdxl_inpainting_model_equals_plain_diffusers(inp, session, tmp_path, tiny_sdxl_path, posterior_mode):
    """A 9-channel SDXL UNet (tiny-sdxl's, in_channels 9) as a folder: our job is diffusers'
    StableDiffusionXLInpaintPipeline's image inside the mask and the init image outside it, pixel-exact (CPU,
    float32, the same generator)."""
    from diffusers import StableDiffusionXLInpaintPipeline

    folder = files.save_folder(files.build_xl(tiny_sdxl_path), tmp_path / "tiny-xl-inpainting")
    ours = pixels(session.generate(request(inp, tmp_path, model=str(folder), strength=0.8,
                                           sampler=own_sampler(folder))).images[0])
    pipe = StableDiffusionXLInpaintPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a boat", image=Image.open(inp["init"]).convert("RGB"), mask_image=Image.open(inp["mask"]).convert("L"),
               num_inference_steps=STEPS, guidance_scale=CFG, strength=A1111_RUN, width=SIDE, height=SIDE,
               generator=torch.Generator("cpu").manual_seed(SEED)).images[0]
    m = inside()
    assert np.array_equal(ours[m], np.asarray(out).astype(int)[m])
    assert np.array_equal(ours[~m], pixels(inp["init"])[~m])
