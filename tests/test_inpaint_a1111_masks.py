"""Issue 31 item 7: A1111 1.10's inpaint details, with numbers.

- Grey masks: A1111 keeps a grey (L/RGB) mask grey and cuts an alpha layer at 128; its latent mask is the pass's
  mask resized to the latent size (Pillow's bicubic) over 255, rounded with `mask_round` on (its default) and kept
  grey with it off; the paste back composites the original over the generated image with alpha 255 - mask.
- Only masked: the box grown as `expand_crop_region` grows it; where the canvas's edge stops it, the cut is brought
  to the job's size with "resize and fill" and brought back with "crop and resize" (not stretched).
- "fill": masking.fill's steps, written here from the published description in numpy (premultiply, blur, un-
  premultiply, alpha over), our pixels within 1/255 of it.
- `mask_round` reaches the request from every front that has it (CLI, API body, batch line), keeps a batch line's
  hash at its default, and its bad values are refused in one sentence.

The engine checks run the tiny SD model (4 channels) on the CPU at 64 px, 2 steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import Image, ImageFilter

from lowvram_gen import GenerationRequest
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.inpaint import masks
from lowvram_gen.inpaint.area import Area

SIDE = 64


def _grey(path, value: int, size=(SIDE, SIDE)):
    Image.new("L", size, value).save(path)
    return str(path)


def _init(path, size=(SIDE, SIDE)):
    x = np.linspace(0, 255, size[0], dtype=np.float32)
    y = np.linspace(0, 255, size[1], dtype=np.float32)
    pixels = np.stack([np.tile(x, (size[1], 1)), np.tile(y[:, None], (1, size[0])),
                       np.full((size[1], size[0]), 90.0)], -1)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return str(path)


# ------------------------------------------------------------------------------------------- reading the mask


def _values(image):
    return np.asarray(image).ravel().tolist()


def test_a_grey_mask_stays_grey_and_an_alpha_layer_is_cut_at_128():
    grey = Image.new("L", (4, 1))
    grey.putdata([0, 100, 128, 200])
    assert _values(masks.mask_of(grey)) == [0, 100, 128, 200]  # A1111: convert('L'), no cut
    assert _values(masks.mask_of(grey.convert("RGB"), invert=True)) == [255, 155, 127, 55]
    layer = Image.new("RGBA", (4, 1))
    layer.putdata([(9, 9, 9, a) for a in (0, 128, 129, 255)])
    assert _values(masks.mask_of(layer)) == [0, 0, 255, 255]  # above 128: white
    assert _values(masks.mask_of(layer, rounded=False)) == [0, 128, 129, 255]


def test_the_blur_is_opencvs_8_bit_gaussian():
    """A1111 blurs with cv2.GaussianBlur across then down (sigma = mask blur, 2 x int(2.5 sigma + 0.5) + 1 taps):
    OpenCV's 8-bit kernel in 256ths, and a white dot's blur the rounded product of two passes."""
    assert masks.gaussian_taps(1) == [1, 14, 62, 102, 62, 14, 1]
    assert masks.gaussian_taps(2) == [2, 7, 17, 31, 45, 52, 45, 31, 17, 7, 2]
    assert len(masks.gaussian_taps(4)) == 21 and sum(masks.gaussian_taps(4)) == 256
    dot = Image.new("L", (15, 15))
    dot.putpixel((7, 7), 255)
    taps = np.array(masks.gaussian_taps(1))
    across = (255 * taps + 128) // 256  # the first pass, 8-bit
    expected = (np.outer(taps, across) + 128) // 256
    got = np.asarray(masks.blurred(dot, 1)).astype(int)
    assert np.array_equal(got[4:11, 4:11], expected) and got.sum() == expected.sum()


def test_the_blur_equals_opencvs_where_it_is_installed():
    cv2 = pytest.importorskip("cv2")  # an optional dependency (the ControlNet extras)
    rng = np.random.default_rng(0)
    for shape in ((64, 64), (37, 100), (300, 7)):
        pixels = np.zeros(shape, np.uint8)
        pixels[2:30, 3:25] = 255
        pixels[-3:] = rng.integers(0, 256, (3, shape[1]))
        for sigma in (1, 4, 7, 16, 64):
            size = 2 * int(2.5 * sigma + 0.5) + 1
            theirs = cv2.GaussianBlur(cv2.GaussianBlur(pixels, (size, 1), sigma), (1, size), sigma)
            assert np.array_equal(np.asarray(masks.blurred(Image.fromarray(pixels), sigma)), theirs), (shape, sigma)


def test_latent_weights_are_the_bicubic_mask_over_255_rounded_or_not():
    """A uniform grey v: v/255 everywhere (rounded: 0 or 1); a ramp of 4 levels a pixel: bicubic keeps a linear ramp
    where its support (16 px each side at this scale) stays inside the image, so latent column i (pixels 8i..8i+7,
    centre 8i+3.5) holds 4 x (8i + 3.5) = 32i + 14 for i 2..5."""
    for value, rounded in ((200, 1.0), (100, 0.0)):
        mask = Image.new("L", (SIDE, SIDE), value)
        assert np.allclose(masks.latent_weights(mask, (8, 8), rounded=False), value / 255)
        assert np.array_equal(masks.latent_weights(mask, (8, 8)), np.full((8, 8), rounded))
    ramp = Image.fromarray(np.tile(np.arange(SIDE, dtype=np.uint8) * 4, (SIDE, 1)))
    soft = masks.latent_weights(ramp, (8, 8), rounded=False)
    assert np.array_equal(np.round(soft[:, 2:6] * 255), np.tile([78, 110, 142, 174], (8, 1)))
    assert np.array_equal(masks.latent_weights(ramp, (8, 8))[:, 2:6], np.tile([0, 0, 1, 1], (8, 1)))  # 110 < 127.5


def test_the_pipeline_masks_follow_a1111s_rule():
    """latent_mask_tensor: an ordinary UNet's blend weights (latent_weights, expanded to the pipeline's batch); an
    inpainting UNet's input the pixel mask sampled nearest, rounded only with mask_round on."""
    import torch

    from lowvram_gen.engines.sd.inpaint import latent_mask_tensor

    like = torch.zeros(2, 1, 8, 8)
    mask = Image.new("L", (SIDE, SIDE), 200)
    assert torch.allclose(latent_mask_tensor(mask, like, False, False), torch.full((2, 1, 8, 8), 200 / 255))
    assert torch.equal(latent_mask_tensor(mask, like, False, True), torch.ones(2, 1, 8, 8))
    half = np.zeros((SIDE, SIDE), np.uint8)
    half[:, 32:] = 100
    half = Image.fromarray(half)
    nine = latent_mask_tensor(half, like, True, False)
    assert torch.allclose(nine[..., :4], torch.zeros(1)) and torch.allclose(nine[..., 4:], torch.tensor(100 / 255))
    assert torch.equal(latent_mask_tensor(half, like, True, True), torch.zeros(2, 1, 8, 8))


# ---------------------------------------------------------------------------------------------- paste back


def test_the_paste_back_weighs_by_the_grey_mask():
    """The original over the generated image with alpha 255 - mask: white generated, black original, mask v gives v
    (within 8-bit rounding); the whole picture's overlay mask is doubled (100 -> 200), only masked's is not."""
    white, black = Image.new("RGB", (8, 8), "white"), Image.new("RGB", (8, 8), "black")
    for v in (0, 1, 64, 100, 128, 200, 254, 255):
        out = np.asarray(masks.overlay(white, black, Image.new("L", (8, 8), v))).astype(int)
        assert np.abs(out - v).max() <= 1, v
    prepared = masks.Prepared(Image.new("L", (8, 8), 100), Image.new("L", (8, 8), 100), None)
    whole = Area(black, prepared, False, 0, "original", (8, 8)).finish([white])[0]
    assert np.abs(np.asarray(whole).astype(int) - 200).max() <= 1


def test_grey_mask_round_changes_the_latents_not_the_paste_back(tmp_path, tiny_path, monkeypatch):
    """The tiny 4-channel model with a uniform grey mask of 200: with mask_round on the pipeline blends with 1.0
    everywhere, off with 200/255; the two images differ."""
    from lowvram_gen.engines.sd import inpaint
    from lowvram_gen.session import Session

    seen = []
    real = inpaint.latent_mask_tensor

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(inpaint, "latent_mask_tensor", spy)
    base = dict(prompt="a boat", width=SIDE, height=SIDE, steps=2, seed=3, model="tiny", mask_blur=0, strength=0.6,
                init_image=_init(tmp_path / "init.png"), mask=_grey(tmp_path / "m.png", 200))
    session = Session(device="cpu")
    images = []
    for rounded in (True, False):
        request = GenerationRequest(**base, mask_round=rounded, outdir=str(tmp_path / str(rounded))).validated()
        images.append(np.asarray(Image.open(session.generate(request).images[0])).astype(int))
    assert len(seen) == 2
    assert float(seen[0].min()) == float(seen[0].max()) == 1.0
    assert np.allclose(seen[1].float().numpy(), 200 / 255, atol=1e-3)  # the pipeline's dtype
    assert not np.array_equal(images[0], images[1])


# -------------------------------------------------------------------------------------------- only masked


@pytest.mark.parametrize("box, job, canvas, grown", [
    ((10, 10, 31, 20), (64, 64), (100, 100), (10, 5, 31, 26)),  # 21 wide: int(21 - 10) = 11 more, 5 above
    ((90, 20, 100, 80), (64, 64), (100, 100), (40, 20, 100, 80)),  # tall, at the right edge: shifted back in
    ((86, 36, 114, 54), (64, 48), (200, 100), (86, 35, 114, 56)),  # 28 / (4/3) = 21.000000000000004: 3 more
    ((0, 10, 10, 90), (128, 64), (100, 100), (0, 10, 100, 90)),  # needs 160 wide: cut at the canvas, 100 x 80
    ((5, 0, 95, 8), (64, 128), (100, 40), (5, 0, 95, 40)),  # needs 180 high: the canvas's 40
])
def test_the_box_grows_as_expand_crop_region(box, job, canvas, grown):
    assert masks.to_aspect(box, *job, canvas) == grown


def _edge_area(tmp_path, content="original"):
    """A 100x100 canvas, a tall mask at its left edge, a 128x64 job: the box cannot reach 2:1 (100x80)."""
    init = Image.open(_init(tmp_path / "canvas.png", (100, 100))).convert("RGB")
    mask = Image.new("L", (100, 100))
    mask.paste(255, (0, 10, 10, 90))
    return Area(init, masks.Prepared(mask, mask, None), True, 0, content, (128, 64))


def test_a_box_short_of_the_aspect_is_resized_and_filled_not_stretched(tmp_path):
    """The 100x80 cut is scaled to fit 128x64 (80x64, Lanczos) at x 24, and the 24 columns each side are its edge
    columns stretched (A1111's resize_image mode 2), the mask the same way."""
    area = _edge_area(tmp_path)
    assert area.box == (0, 10, 100, 90)
    init, mask = area.for_pass((128, 64))
    assert init.size == mask.size == (128, 64) and mask.mode == "L"
    got = np.asarray(init).astype(int)
    scaled = np.asarray(area.init.crop(area.box).resize((80, 64), Image.LANCZOS)).astype(int)
    assert np.array_equal(got[:, 24:104], scaled)
    assert np.abs(got[:, :24] - scaled[:, :1]).max() <= 1 and np.abs(got[:, 104:] - scaled[:, -1:]).max() <= 1
    cut = np.asarray(mask).astype(int)
    assert np.array_equal(cut[:, 24:104], np.asarray(area.prepared.mask.crop(area.box).resize(
        (80, 64), Image.LANCZOS)).astype(int))


def test_the_filled_cut_goes_back_with_crop_and_resize(tmp_path):
    """What the pass made from the filled cut goes back into the 100x80 box undistorted (A1111's resize_image mode
    1: scaled to cover, the bands cut off): the cut itself comes back within a few levels, where stretching it
    would have squeezed it 1.6 times across; inside the mask the result is that, outside it the canvas."""
    from lowvram_gen.control.resize import init_resized

    area = _edge_area(tmp_path)
    made, _ = area.for_pass((128, 64))
    x0, y0, x1, y1 = area.box
    original = np.asarray(area.init).astype(int)
    cut = original[y0:y1, x0:x1]
    returned = np.asarray(init_resized(made, x1 - x0, y1 - y0, "crop")).astype(int)
    assert np.abs(returned - cut).max() <= 1
    stretched = np.asarray(made.resize((x1 - x0, y1 - y0), Image.LANCZOS)).astype(int)
    assert np.abs(stretched - cut).max() > 40  # what stretching did: the red ramp across is 47 levels off
    back = np.asarray(area.finish([made])[0]).astype(int)
    inside = np.asarray(area.prepared.soft) > 0
    assert np.array_equal(back[inside], returned[inside[y0:y1, x0:x1]])
    assert np.array_equal(back[~inside], original[~inside])


def _fill_reference(image, mask):
    """masking.fill as published: the image premultiplied by alpha 255 - mask; for each (radius, times) of
    (256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1) that layer Gaussian-blurred (all four channels), its colour
    divided back by its alpha, and composited `times` over the result (alpha over, Porter-Duff), from transparent;
    8-bit values kept between the steps."""
    colour = np.asarray(image.convert("RGB"), dtype=np.float64)
    alpha = 255.0 - np.asarray(mask.convert("L"), dtype=np.float64)
    kept = np.dstack([np.round(colour * alpha[..., None] / 255.0), alpha]).astype(np.uint8)
    kept = Image.frombytes("RGBa", image.size, kept.tobytes())
    out_c, out_a = np.zeros(colour.shape), np.zeros(alpha.shape)
    for radius, times in ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1)):
        layer = np.asarray(kept.filter(ImageFilter.GaussianBlur(radius)), dtype=np.float64)
        la = layer[..., 3]
        lc = np.where(la[..., None] > 0, np.clip(np.round(layer[..., :3] * 255 / np.maximum(la, 1)[..., None]),
                                                 0, 255), 0)
        for _ in range(times):
            sa, da = la / 255, out_a / 255
            na = sa + da * (1 - sa)
            nc = (lc * sa[..., None] + out_c * (da * (1 - sa))[..., None]) / np.maximum(na, 1e-9)[..., None]
            out_c, out_a = np.round(np.where(na[..., None] > 0, nc, 0)), np.round(na * 255)
    return out_c


def test_fill_is_a1111s_within_one_level():
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
    mask = np.zeros((24, 32), np.uint8)
    mask[6:18, 8:22] = 255
    mask[4:6, 8:22] = 120  # a grey band: weighed, not cut
    mask = Image.fromarray(mask)
    ours = np.asarray(masks.fill(image, mask)).astype(int)
    assert np.abs(ours - _fill_reference(image, mask)).max() <= 1
    outside = np.asarray(mask) == 0
    assert np.array_equal(ours[outside], np.asarray(image).astype(int)[outside])


def test_latent_contents_start_from_the_filled_image_as_a1111s(tmp_path):
    """A1111 fills the masked area for latent noise and latent nothing too (their latents then replace it inside
    the rounded mask); original alone is the image as it is."""
    area = _edge_area(tmp_path)
    plain, _ = area.for_pass((128, 64))
    for content in ("fill", "latent-noise", "latent-nothing"):
        filled, mask = dataclasses.replace(area, content=content).for_pass((128, 64))
        assert np.array_equal(np.asarray(filled), np.asarray(masks.fill(plain, mask))), content


# ------------------------------------------------------------------------------------------ the fronts


def test_mask_round_reaches_the_request_from_each_front(tmp_path):
    from lowvram_gen.a1111.api_body import map_body
    from lowvram_gen.batch.files import request_hash
    from lowvram_gen.cli.main import build_parser

    init, mask = _init(tmp_path / "i.png"), _grey(tmp_path / "m.png", 200)
    base = GenerationRequest(prompt="x", init_image=init, mask=mask).validated()
    assert base.mask_round is True
    args = build_parser().parse_args(["inpaint", "x", "--init", init, "--mask", mask, "--no-mask-round"])
    assert args.mask_round is False
    body = dict(prompt="x", steps=1, width=64, height=64, init_images=["<b64>"], mask="<b64>")
    stored = iter([init, mask, init, mask])
    for sent, want in ((False, False), (None, True)):
        mapped = map_body({**body, "mask_round": sent}, "img2img", "tiny", 1, str(tmp_path), lambda t: None,
                          init_image=lambda value, *where: next(stored))
        assert mapped.request.mask_round is want and not any("mask_round" in w for w in mapped.warnings)
    # a batch line's job keeps the hash it had before mask_round (this one's, pinned at db7723d) while it is on
    line = GenerationRequest(prompt="x", seed=5, init_image="i.png", mask="m.png")
    assert request_hash("sd", line) == "1afb448b7ad94e0f"
    assert request_hash("sd", dataclasses.replace(line, mask_round=False)) != "1afb448b7ad94e0f"


@pytest.mark.parametrize("bad", ["maybe", 2, "0.5"])
def test_a_bad_mask_round_is_refused_naming_it(tmp_path, bad):
    from lowvram_gen.a1111.api_body import map_body

    init, mask = _init(tmp_path / "i.png"), _grey(tmp_path / "m.png", 200)
    with pytest.raises(InvalidRequest) as caught:
        GenerationRequest(prompt="x", init_image=init, mask=mask, mask_round=bad).validated()
    text = str(caught.value)
    assert "mask round" in text and repr(bad) in text and "true" in text.lower()
    with pytest.raises(InvalidRequest) as caught:
        map_body(dict(prompt="x", steps=1, width=64, height=64, init_images=["<b64>"], mask="<b64>", mask_round=bad),
                 "img2img", "tiny", 1, str(tmp_path), lambda t: None, init_image=lambda value, *where: mask)
    assert "mask_round" in str(caught.value)


def test_mask_round_off_on_a_family_without_a_unet_is_refused_in_one_sentence(tmp_path):
    """The grey latent mask is built for the UNet families' pipelines; a transformer family's rounds the mask itself:
    refused before a step runs, naming the value."""
    import diffusers

    from lowvram_gen.engines.sd.inpaint import check

    init, mask = _init(tmp_path / "i.png"), _grey(tmp_path / "m.png", 200)
    request = GenerationRequest(prompt="x", init_image=init, mask=mask, mask_round=False).validated()
    pipe = diffusers.ZImagePipeline.__new__(diffusers.ZImagePipeline)  # a transformer family with an inpaint pipeline
    with pytest.raises(InvalidRequest, match="mask round") as caught:
        check(pipe, request)
    assert "leave mask_round on" in str(caught.value) and "\n" not in str(caught.value)
    check(pipe, dataclasses.replace(request, mask_round=True))  # on: as before
