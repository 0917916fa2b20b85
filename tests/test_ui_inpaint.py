"""The Inpaint tab in a real headless Chromium (Debian's, driven by Playwright; the fixtures are tests/ui_helpers.py's):
draw a mask with the brush on the image, generate, and the masked area changed while the rest did not. Through the
API's positional order (gradio_client): the inputs added later (Quantize, Schedule type, Clip skip, the Extra seed
options, Batch count, the ControlNet units) come last and reach the request."""

from __future__ import annotations

import numpy as np
from PIL import Image

import inpaint_files as files  # tests/inpaint_files.py
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from ui_helpers import _fill_number, _set_slider, browser, needs_browser, page, server  # noqa: F401 (fixtures)


def _stroke(page, dx: int = 60) -> None:
    """A horizontal brush stroke through the middle of the editor's canvas (the image is centred on it), with the
    Brush picked first as a user picks it (an upload leaves the editor on its brush or on its crop tool, depending on
    which of gradio's two upload paths took the file)."""
    page.locator("#inp-editor").get_by_role("button", name="Brush").first.click()
    box = page.locator("#inp-editor canvas").first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x - dx, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=12)
    page.mouse.up()


def _upload_into_editor(page, path) -> None:
    """The file given to the editor's upload input once its canvas is there, and the editor showing it (its "Upload
    an image" prompt gone). Given before the canvas is up, gradio's ImageEditor throws ("reading 'reset_layers'" of
    its not-yet-made editor) and then ignores every later upload: on a loaded machine the tab's other controls were
    there well before the canvas."""
    page.locator("#inp-editor canvas").first.wait_for(timeout=120_000)
    page.locator("#inp-editor input[type=file]").first.set_input_files(str(path))
    page.locator("#inp-editor").get_by_text("Upload an image").wait_for(state="hidden", timeout=120_000)


@needs_browser
def test_draw_a_mask_with_the_brush_generate_and_only_the_masked_area_changes(page, server, tmp_path,  # noqa: F811
                                                                               monkeypatch):
    from lowvram_gen.ui.tabs import inpaint

    import threading

    removed, gone = [], threading.Event()  # the drawn mask's file is removed when its job ends: kept here instead

    def forget(path):
        removed.append(path)
        gone.set()

    monkeypatch.setattr(inpaint, "forget", forget)
    init = files.init_image(tmp_path / "init.png", side=128)
    page.get_by_role("tab", name="Inpaint").click()
    # the img2img tab's extras and ControlNet accordion are there too (their values: the API test below)
    for elem_id in ("inp-controlnet", "inp-batch-count", "inp-clip-skip", "inp-seed-extra", "inp-quantize"):
        page.locator(f"#{elem_id}").first.wait_for(timeout=30_000)
    _upload_into_editor(page, init)
    # the upload sets the size from the image (editor_size), and the 📐 button sets it again after a change
    width_is = "document.querySelector('#inp-width input').value == '128' && " \
               "document.querySelector('#inp-height input').value == '128'"
    page.wait_for_function(width_is, timeout=60_000)
    _fill_number(page, "inp-width", 64)
    page.click("#inp-size-from-image")
    page.wait_for_function(width_is, timeout=60_000)
    _stroke(page, dx=40)
    page.locator("#inp-prompt textarea").fill("a red line")
    _set_slider(page, "inp-steps", 2)
    _set_slider(page, "inp-strength", 1)
    _set_slider(page, "inp-mask-blur", 0)
    before = set(server.outdir.rglob("*.png"))
    page.click("#inp-generate")
    page.locator("#inp-gallery img").first.wait_for(timeout=120_000)
    made = sorted(set(server.outdir.rglob("*.png")) - before)
    assert len(made) == 1
    text, ours = read_png_metadata(made[0])
    assert gone.wait(60) and removed == [ours["request"]["mask"]]
    assert float(parse_a1111_parameters(text)["Denoising strength"]) == 1
    mask = np.asarray(Image.open(ours["request"]["mask"]).convert("L")) > 127  # what the brush drew, as the job read it
    assert 0 < mask.sum() < mask.size / 2 and mask[64].any()  # a stroke across the middle, not the whole image
    out = np.asarray(Image.open(made[0]).convert("RGB")).astype(int)
    original = np.asarray(Image.open(init).convert("RGB")).astype(int)
    assert np.array_equal(out[~mask], original[~mask])
    assert np.abs(out[mask] - original[mask]).mean() > 10


def test_send_to_inpaint_fills_the_inpaint_settings_and_says_the_mask_is_not_in_a_png(tmp_path):
    """PNG Info's and the galleries' Send to Inpaint: an inpainted PNG's A1111 fields fill the tab's controls (those
    A1111 leaves out at their off values), and the note says the mask must be drawn again."""
    from lowvram_gen.ui.sendto import INPAINT, values_for

    png = tmp_path / "inpainted.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=_info("a boat\nSteps: 3, Sampler: Euler, CFG scale: 7, Seed: 9, "
                                                      "Size: 64x64, Denoising strength: 0.6, Mask blur: 6, "
                                                      "Inpaint area: Only masked, Masked area padding: 48"))
    values, said = values_for(INPAINT, str(png))
    got = dict(zip(INPAINT, values))
    assert (got["mask_blur"], got["inpaint_area"], got["mask_padding"], got["masked_content"], got["invert_mask"],
            got["strength"], got["init_image"]) == (6, "masked", 48, "original", False, 0.6, str(png))
    assert any("mask is not in a PNG" in line for line in said)


def _info(text: str):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", text)
    return info


def test_the_api_takes_the_img2img_extras_and_a_controlnet_unit_last(server, tmp_path, tiny_path):
    """/inpaint: an older client's positional call (up to the live preview's settings) still runs; one that sends the
    newer inputs gets them in the request: Batch count 2 makes 2 images, Clip skip 2 and the variation seed land in the
    infotext, and an enabled ControlNet unit (the accordion's fields, last) inpaints with that ControlNet."""
    from diffusers import UNet2DConditionModel
    from gradio_client import Client, handle_file

    import controlnet_files as cn_files  # tests/controlnet_files.py

    net = cn_files.save_folder(cn_files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"),
                                              seed=1), tmp_path / "tiny-cn")
    init = files.init_image(tmp_path / "init.png")
    mask = files.mask_image(tmp_path / "mask.png", (16, 16, 48, 40))
    editor = {"background": handle_file(str(init)), "layers": [], "composite": None}
    older = ["a boat", "", 1.0, 64, 64, 2, 7, 3, 1, "default", "tiny", 0, False, "original", "whole", 32,
             handle_file(str(mask)), 0, "auto"]
    client = Client(server.url, verbose=False)
    before = set(server.outdir.rglob("*.png"))
    plain = client.predict(editor, *older, api_name="/inpaint")[1]
    assert "Clip skip" not in plain and "ControlNet" not in plain
    unit = [True, handle_file(str(init)), "canny", 90, 180, str(net), 0.5, 0, 1]
    off = [False, None, "none", 100, 200, None, 1, 0, 1]
    fix_steps = False  # A1111's img2img_fix_steps (issue 31), the resize mode, the styles: the last before the units
    gallery, info = client.predict(editor, *older, "as the preset says", "automatic", 2, 11, 0.3, 0, 0, 2, fix_steps,
                                   "resize", [], *unit, *off, "balanced", api_name="/inpaint")[:2]
    assert "Clip skip: 2" in info and "Variation seed: 11" in info and "Variation seed strength: 0.3" in info
    assert 'ControlNet 0: "Module: canny, Model: tiny-cn, Weight: 0.5' in info and "Mask blur" not in info
    assert len(gallery) == 2  # batch count 2, batch size 1
    made = sorted(set(server.outdir.rglob("*.png")) - before)
    original = np.asarray(Image.open(init).convert("RGB")).astype(int)
    keep = np.ones((64, 64), dtype=bool)
    keep[16:40, 16:48] = False
    assert len(made) == 3 and all(np.array_equal(np.asarray(Image.open(p).convert("RGB")).astype(int)[keep],
                                                 original[keep]) for p in made)


def test_send_to_inpaint_fills_the_extras_and_a_pngs_controlnet_units(tmp_path):
    """Send to Inpaint fills the tab's Clip skip, Extra seed and ControlNet unit controls from a PNG, as img2img's."""
    from lowvram_gen.ui.sendto import INPAINT, values_for

    png = tmp_path / "made.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=_info(
        'a boat\nSteps: 3, Sampler: Euler, CFG scale: 7, Seed: 9, Size: 64x64, Variation seed: 4, Variation seed '
        'strength: 0.2, Denoising strength: 0.6, Mask blur: 6, Clip skip: 2, ControlNet 0: "Module: canny, Model: '
        'tiny-cn, Weight: 0.6, Threshold A: 50, Threshold B: 150, Guidance Start: 0.1, Guidance End: 0.9"'))
    values, said = values_for(INPAINT, str(png))
    got = dict(zip(INPAINT, values))
    assert (got["clip_skip"], got["seed_extra"], got["subseed"], got["subseed_strength"]) == (2, True, 4, 0.2)
    assert (got["cn0_enabled"], got["cn0_model"], got["cn0_weight"], got["cn0_preprocessor"], got["cn1_enabled"]) == \
        (True, "tiny-cn", 0.6, "canny", False)
    assert any("ControlNet Unit 0: its control image is not in the PNG" in line for line in said)
    assert not any("ControlNet" in line and "not built" in line for line in said)
