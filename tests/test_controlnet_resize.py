"""A1111's resize modes by pixels (issue 31 item 6): a ControlNet unit's "Crop and Resize" and "Resize and Fill" as
sd-webui-controlnet brings a control image of another aspect to the job's size, and img2img's "Resize mode" for the
init image; how a unit's mode is given (CLI, the extension's API, a PNG's text) and written back.

The images are 80x40 (2:1) for a 64x64 job: a blue ground, a red block in the middle (x 30-49, y 10-29) and a green
stripe down the left edge (x 0-7).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen.control import resize
from lowvram_gen.control.preprocess import control_map
from lowvram_gen.control.units import ControlNetUnit, unit_from_text, unit_text, units_from_flags, with_flags
from lowvram_gen.errors import InvalidRequest

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


@pytest.fixture()
def wide(tmp_path):
    a = np.zeros((40, 80, 3), dtype=np.uint8)
    a[:, :] = BLUE
    a[10:30, 30:50] = RED
    a[:, 0:8] = GREEN
    path = tmp_path / "wide.png"
    Image.fromarray(a).save(path)
    return str(path)


def _near(pixel, colour, tol=40):
    return all(abs(int(p) - c) <= tol for p, c in zip(pixel, colour))


def test_just_resize_stretches_the_whole_image(wide):
    out = np.asarray(control_map(wide, 64, 64, resize="resize"))
    assert _near(out[32, 2], GREEN) and _near(out[32, 32], RED) and _near(out[2, 32], BLUE)


def test_crop_and_resize_scales_to_cover_and_keeps_the_centre(wide):
    """k = max(64/80, 64/40) = 1.6: 128x64, the centre 64 columns kept (offset (128 - 64) // 2 = 32): the stripe
    (scaled x 0-12.8) is cut off, the red block (scaled x 48-80, y 16-48) is at x 16-48."""
    out = np.asarray(control_map(wide, 64, 64, resize="crop"))
    assert out.shape == (64, 64, 3)
    assert not any(_near(p, GREEN, 100) for p in out[:, 0])  # no stripe
    assert _near(out[32, 32], RED) and _near(out[32, 18], RED) and _near(out[32, 46], RED)
    assert _near(out[32, 12], BLUE) and _near(out[32, 52], BLUE) and _near(out[8, 32], BLUE)
    scaled = Image.open(wide).convert("RGB").resize((128, 64), Image.LANCZOS)
    assert np.array_equal(out, np.asarray(scaled.crop((32, 0, 96, 64))))


def test_resize_and_fill_scales_to_fit_and_fills_with_the_maps_border_median(wide):
    """k = min = 0.8: 64x32 at y (64 - 32) // 2 = 16; the rest is the per-channel median of the scaled map's first
    and last rows and columns: blue (the stripe is a minority of those 192 pixels)."""
    out = np.asarray(control_map(wide, 64, 64, resize="fill"))
    assert (out[:16] == BLUE).all() and (out[48:] == BLUE).all()
    assert _near(out[32, 2], GREEN) and _near(out[32, 32], RED)
    scaled = np.asarray(Image.open(wide).convert("RGB").resize((64, 32), Image.LANCZOS))
    assert np.array_equal(out[16:48], scaled)


def test_fill_makes_the_map_before_it_fills(wide):
    """The extension pads the detected map, not the image: a canny map of a filled image has no edge along the fill
    (y 16 and 47); the image's own edges (the block's, the stripe's) are there."""
    out = np.asarray(control_map(wide, 64, 64, "canny", resize="fill"))
    assert not out[:15].any() and not out[49:].any()  # black (canny's border median) and no edge at the seams
    assert out[16:48].any()


def test_the_border_median_is_per_channel_and_whole():
    a = np.zeros((10, 20, 3), dtype=np.uint8)
    a[:, :] = (10, 20, 30)
    a[0, :] = (200, 0, 0)  # one border row of 4 in another colour: a minority
    image = Image.fromarray(a)
    out = np.asarray(resize.control_map(image, 20, 20, "fill", lambda im: im))
    assert tuple(out[0, 0]) == (10, 20, 30) and tuple(out[19, 19]) == (10, 20, 30)


# ------------------------------------------------------------------------------------------ img2img's resize mode


def test_img2img_crop_and_resize_cuts_the_overflow(wide):
    """A1111: ratio 1 < 2: the scaled width is 80 * 64 // 40 = 128, pasted at 64 // 2 - 128 // 2 = -32."""
    image = Image.open(wide).convert("RGB")
    out = np.asarray(resize.init_resized(image, 64, 64, "crop"))
    assert np.array_equal(out, np.asarray(image.resize((128, 64), Image.LANCZOS).crop((32, 0, 96, 64))))


def test_img2img_resize_and_fill_stretches_the_edge_rows_over_the_bands(wide):
    """Scaled to 64x32 (40 * 64 // 80), pasted at y 16; the 16-row bands above and below are its first and last rows
    stretched."""
    image = Image.open(wide).convert("RGB")
    out = np.asarray(resize.init_resized(image, 64, 64, "fill")).astype(int)
    scaled = np.asarray(image.resize((64, 32), Image.LANCZOS)).astype(int)
    assert np.array_equal(out[16:48], scaled)
    assert all(np.array_equal(out[y], out[0]) for y in range(16)) and all(np.array_equal(out[y], out[63])
                                                                          for y in range(48, 64))
    assert _near(out[0, 2], GREEN) and _near(out[0, 40], BLUE) and np.abs(out[0] - scaled[0]).max() <= 8


def test_img2img_resize_modes_by_name_and_number():
    assert [resize.check_init_resize(v) for v in (0, 1, 2, "Crop and resize", "fill", None)] == \
        ["resize", "crop", "fill", "crop", "fill", "resize"]
    with pytest.raises(InvalidRequest, match="use resize, crop, fill or latent"):
        resize.check_init_resize(4)
    assert [resize.check_init_resize(v, masked=True) for v in (1, 2)] == ["crop", "fill"]  # the mask with it
    with pytest.raises(InvalidRequest, match="latent upscale.* with a mask .*is not built here"):
        resize.check_init_resize(3, masked=True)  # built without a mask: tests/test_img2img_resize_modes.py


@pytest.mark.parametrize("mode", ["crop", "fill"])
def test_an_img2img_job_starts_from_the_init_image_its_resize_mode_makes(mode, wide, tmp_path, monkeypatch, capsys):
    """The CLI's --resize-mode reaches the pass: the init image it denoises is init_resized's."""
    from lowvram_gen.cli.main import main
    from lowvram_gen.engines.sd import pipeline as sd

    seen = []
    real = sd.denoise
    monkeypatch.setattr(sd, "denoise", lambda pipe, step, *a, **k: seen.append(step.init) or real(pipe, step, *a, **k))
    code = main(["img2img", "a boat", "--init", wide, "--resize-mode", mode, "--strength", "0.5", "--steps", "2",
                 "--width", "64", "--height", "64", "--outdir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    expected = resize.init_resized(Image.open(wide).convert("RGB"), 64, 64, mode)
    assert np.array_equal(np.asarray(seen[0][0]), np.asarray(expected))


# ------------------------------------------------------------------------------------------ giving a unit's mode


def test_a_units_resize_mode_from_the_cli_the_api_and_a_png(wide):
    from lowvram_gen.a1111.controlnet_units import with_units
    from lowvram_gen.control.units import check_unit
    from lowvram_gen.request import GenerationRequest, check_image_path

    assert [u.resize_mode for u in units_from_flags(["a", "b"], [wide, wide], [], ["fill"])] == ["fill", "fill"]
    assert [u.resize_mode for u in units_from_flags(["a", "b"], [wide, wide], [], ["crop", "resize"])] == \
        ["crop", "resize"]
    with pytest.raises(InvalidRequest, match="--control-resize"):
        units_from_flags(["a", "b", "c"], [], [], ["crop", "fill"])
    assert with_flags((ControlNetUnit("a"),), [wide], [], ["crop"])[0].resize_mode == "crop"
    modes = [0, 1, 2, 3, "Crop and Resize", "Resize and Fill", "Just Resize", "ResizeMode.INNER_FIT",
             "Envelope (Outer Fit)"]
    units = with_units({"controlnets": [{"model": "m", "input_image": wide, "resize_mode": m} for m in modes]})
    checked = [check_unit(i, u, check_image_path) for i, u in enumerate(units["controlnets"])]
    assert [u.resize_mode for u in checked] == ["resize", "crop", "fill", "resize", "crop", "fill", "resize", "crop",
                                                "fill"]
    with pytest.raises(InvalidRequest, match="ControlNet unit 0 resize mode: 'Stretch'.*use resize, crop or fill"):
        GenerationRequest(prompt="x", controlnets=({"model": "m", "image": wide, "resize_mode": "Stretch"},)
                          ).validated()
    unit = ControlNetUnit("m", wide, resize_mode="fill")
    text = unit_text(unit, "m", "balanced", 64)
    assert "Resize Mode: Resize and Fill" in text
    notes: list = []
    assert unit_from_text("ControlNet 0", text, notes)[0].resize_mode == "fill" and not notes
