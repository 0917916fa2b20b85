"""The web UI's ControlNet units (issue 20): in a real headless Chromium (tests/ui_helpers.py's fixtures), through the
API's positional order, in Send to and in the browser's remembered values.

The ControlNet is a tiny one made from the tiny model's UNet (tests/controlnet_files.py), put in a models/ControlNet
folder as a user keeps it; the server runs in this process, so $LOWVRAM_GEN_MODELS set here is the one it scans.
"""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from PIL import Image

from lowvram_gen.ui.xyz import DEFAULTS as XYZ_DEFAULTS, IMG2IMG_DEFAULTS, IMG2IMG_INPUTS, INPUTS as XYZ_INPUTS

import controlnet_files as files  # tests/controlnet_files.py
from ui_helpers import _fill_job, _gallery_image, browser, needs_browser, page, server  # noqa: F401

SCRIPT_OFF = tuple(XYZ_DEFAULTS[name] for name in XYZ_INPUTS)  # the Script controls' values when no script runs
# img2img's: the X/Y/Z ones, then Loopback's and SD upscale's (ui/xyz.py IMG2IMG_INPUTS)
IMG2IMG_SCRIPT_OFF = SCRIPT_OFF + tuple(IMG2IMG_DEFAULTS[name] for name in IMG2IMG_INPUTS)

SIDE = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_path):
    """A models folder with models/ControlNet/tiny-cn (a diffusers folder) and a control image (a noisy square)."""
    from diffusers import UNet2DConditionModel

    root = tmp_path_factory.mktemp("models")
    (root / "ControlNet").mkdir()
    files.save_folder(files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=1),
                      root / "ControlNet" / "tiny-cn")
    rng = np.random.RandomState(0)
    image = np.zeros((96, 96, 3), dtype=np.uint8)
    image[24:72, 24:72] = 255
    image = np.clip(image.astype(int) + rng.randint(-20, 20, image.shape), 0, 255).astype(np.uint8)
    Image.fromarray(image).save(root / "control.png")
    return root


def _pick(page, elem_id: str, name: str) -> None:
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=name, exact=True).click()


@needs_browser
def test_a_canny_unit_shows_its_preview_map_and_generates_with_controlnet_in_the_png(page, server, models,
                                                                                       monkeypatch):
    from lowvram_gen.control.preprocess import control_map

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    _fill_job(page, "edges steer", SIDE, SIDE, 2)
    page.locator("#controlnet").get_by_text("ControlNet", exact=True).first.click()  # open the accordion
    page.locator("#cn0-image input[type=file]").set_input_files(str(models / "control.png"))
    page.locator("#cn0-image img").first.wait_for(timeout=30_000)
    _pick(page, "cn0-preprocessor", "canny")
    page.locator("#cn0-canny-low input[type=number]").first.wait_for(timeout=30_000)  # shown for canny
    page.click("#cn0-preview-button")
    page.wait_for_function("() => { const img = document.querySelector('#cn0-preview img');"
                           " return img !== null && img.complete && img.naturalWidth > 0; }", timeout=60_000)
    src = page.locator("#cn0-preview img").first.get_attribute("src")
    with urllib.request.urlopen(src) as answer:  # the map shown is the job's map at the tab's size
        shown = np.asarray(Image.open(answer).convert("RGB"))
    expected = np.asarray(control_map(str(models / "control.png"), SIDE, SIDE, "canny", 100, 200))
    assert shown.shape == (SIDE, SIDE, 3) and (shown == expected).all() and 0 < (shown > 0).mean() < 0.5

    page.click("#cn0-model-refresh")  # the folder was set after the page loaded: Refresh lists it
    _pick(page, "cn0-model", "tiny-cn")
    page.locator("#cn0-enabled input").check()
    page.click("#generate")
    _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('ControlNet 0')",
                           timeout=120_000)
    info = page.locator("#info textarea").input_value()
    assert 'ControlNet 0: "Module: canny, Model: tiny-cn' in info and "Threshold A: 100" in info


@needs_browser
def test_uploading_a_control_image_ticks_enable_and_an_unticked_unit_with_one_is_named_in_what_ran(page, server,
                                                                                                  models):
    """Issue 29 item 12: as the extension does, an upload ticks the unit's Enable (it did not: the job then ran
    without the unit, silently). Unticked again by the user, the unit is left out, and "What ran" says so."""
    _fill_job(page, "a unit switched off", SIDE, SIDE, 1)
    page.locator("#controlnet").get_by_text("ControlNet", exact=True).first.click()  # open the accordion
    enable = page.locator("#cn0-enabled input")
    assert not enable.is_checked()
    page.locator("#cn0-image input[type=file]").set_input_files(str(models / "control.png"))
    page.locator("#cn0-image img").first.wait_for(timeout=30_000)
    page.wait_for_function("() => document.querySelector('#cn0-enabled input').checked", timeout=30_000)
    enable.uncheck()
    page.click("#generate")
    _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#summary textarea').value.includes('Enable is off')",
                           timeout=120_000)
    summary = page.locator("#summary textarea").input_value()
    assert "ControlNet Unit 0 has a control image but Enable is off: not used" in summary
    assert "ControlNet" not in page.locator("#info textarea").input_value()  # it did not run


def test_an_unticked_unit_with_an_image_is_named_in_what_ran_through_the_api_too(server, models):
    """The same note for a gradio client's call (the UI's /generate); a unit without an image, or an enabled one,
    gives none. (A1111's REST API leaves a disabled unit out silently, as the extension's API does.)"""
    from gradio_client import Client, handle_file

    client = Client(server.url, verbose=False)
    older = ("a boat", "", SIDE, SIDE, 1, 7, 3, 1, "default", "tiny", 1, "Latent", 0, 0.7, "as the preset says",
             "automatic", 1, -1, 0, 0, 0, 0, 0, "Use same sampler", "Use same scheduler", 0, "", "", 1, 0, "auto",
             False, [], "", 0.8, *SCRIPT_OFF)  # tiling, styles, the refiner's two, the Script controls: the tab's own
    # last inputs
    unit = ("none", 100, 200, "tiny-controlnet", 1, 0, 1)
    image = handle_file(str(models / "control.png"))
    summary = client.predict(*older, False, image, *unit, False, None, *unit, "balanced", api_name="/generate")[2]
    assert "ControlNet Unit 0 has a control image but Enable is off: not used (tick Enable to use it)" in summary
    assert "Unit 1" not in summary
    summary = client.predict(*older, True, image, *unit, False, None, *unit, "balanced", api_name="/generate")[2]
    assert "Enable is off" not in summary


def test_the_api_takes_the_units_after_the_older_inputs(server, models, monkeypatch):
    """The units are the last inputs of /generate: an older client's positional call still runs without them, and
    one that sends them gets a ControlNet job (its image refused by the request's own check when unreadable)."""
    from gradio_client import Client, handle_file

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    client = Client(server.url, verbose=False)
    plain = client.predict("no units", "", SIDE, SIDE, 1, 7, 3, 1, api_name="/generate")
    assert "ControlNet" not in plain[1]
    info = client.predict(
        "with a unit", "", SIDE, SIDE, 1, 7, 3, 1, "Euler a", "tiny", 1, "Latent", 0, 0.7,
        "as the preset says", "automatic", 1, -1, 0, 0, 0, 0, 0, "Use same sampler", "Use same scheduler", 0, "",
        "", 1, 0, "auto", False, [], "", 0.8, *SCRIPT_OFF,  # tiling, styles, the refiner's two, the Script controls
        True, handle_file(str(models / "control.png")), "none", 100, 200, "tiny-cn", 0.5, 0, 0.8,
        False, None, "none", 100, 200, None, 1, 0, 1, "controlnet", api_name="/generate")[1]
    assert 'ControlNet 0: "Module: none, Model: tiny-cn, Weight: 0.5' in info
    assert "Guidance End: 0.8" in info and "Control Mode: ControlNet is more important" in info
    assert "ControlNet 1" not in info


def test_an_enabled_unit_without_a_model_or_with_a_bad_value_is_refused_by_the_requests_words(models):
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.ui import controlnet, messages

    image = str(models / "control.png")
    values = [True, image, "none", 100, 200, None, 1, 0, 1]
    with pytest.raises(InvalidRequest, match="ControlNet unit 0 model"):
        GenerationRequest(prompt="x", **controlnet.request_fields(values)).validated()
    with pytest.raises(InvalidRequest, match="needs a control image") as refused:
        GenerationRequest(prompt="x", **controlnet.request_fields([True, None, "none", 100, 200, "m"])).validated()
    assert "--control-image" not in messages.for_ui(str(refused.value))  # the UI names its own control
    values = [False] + values[1:] + [True, image, "none", 100, 200, "m", 1, 0.9, 0.5]
    with pytest.raises(InvalidRequest, match="ControlNet unit 0 guidance start"):  # the first enabled one
        GenerationRequest(prompt="x", **controlnet.request_fields(values)).validated()
    assert controlnet.request_fields([]) == {"controlnets": (), "control_mode": "balanced"}
    with pytest.raises(Exception, match="upload a control image first"):  # Preview with no image: a gr.Error
        controlnet.preview(None, "canny", 100, 200, SIDE, SIDE)
    with pytest.raises(Exception, match="canny low threshold"):
        controlnet.preview(image, "canny", 250, 200, SIDE, SIDE)


def test_send_to_fills_a_pngs_units_but_their_images_and_switches_the_others_off(tmp_path):
    from PIL.PngImagePlugin import PngInfo

    from lowvram_gen.ui import sendto

    info = PngInfo()
    info.add_text("parameters", 'a boat\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 64x64, '
                                'ControlNet 0: "Module: canny, Model: control_v11p_sd15_canny [d14c016b], Weight: 0.6, '
                                'Threshold A: 50, Threshold B: 150, Guidance Start: 0.1, Guidance End: 0.9, '
                                'Control Mode: ControlNet is more important"')
    png = tmp_path / "a1111.png"
    Image.new("RGB", (8, 8)).save(png, pnginfo=info)
    values, said = sendto.values_for(sendto.TXT2IMG, str(png))
    got = dict(zip(sendto.TXT2IMG, values))
    assert (got["cn0_enabled"], got["cn0_model"], got["cn0_weight"], got["cn0_guidance_start"],
            got["cn0_guidance_end"], got["cn0_preprocessor"], got["cn0_canny_low"], got["cn0_canny_high"]) == \
        (True, "control_v11p_sd15_canny", 0.6, 0.1, 0.9, "canny", 50, 150)
    assert got["cn1_enabled"] is False and got["control_mode"] == "controlnet"
    assert "cn0_image" not in sendto.TXT2IMG
    assert any("ControlNet Unit 0: its control image is not in the PNG" in line for line in said)
    plain = tmp_path / "plain.png"
    info = PngInfo()
    info.add_text("parameters", "a boat\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 64x64")
    Image.new("RGB", (8, 8)).save(plain, pnginfo=info)
    got = dict(zip(sendto.IMG2IMG, sendto.values_for(sendto.IMG2IMG, str(plain))[0]))
    assert got["cn0_enabled"] is False and got["control_mode"] == "balanced"  # made without units: off


def test_remembered_unit_values_are_checked_as_the_request_checks_them():
    import gradio as gr

    from lowvram_gen.ui import remembered

    box = gr.Number()
    assert remembered.valid("cn0_weight", 1.5, box) and not remembered.valid("cn0_weight", 3, box)
    assert remembered.valid("cn1_preprocessor", "canny", box) and not remembered.valid("cn1_preprocessor", "depth_zoe", box)
    assert remembered.valid("cn0_canny_low", 220, box) and not remembered.valid("cn0_canny_high", 256, box)
    assert remembered.valid("control_mode", "prompt", box) and not remembered.valid("control_mode", "guess", box)
    assert "cn0_image" in remembered.NOT_REMEMBERED and "cn0_enabled" in remembered.NOT_REMEMBERED


def test_img2img_takes_the_units_last_too(server, models):
    from gradio_client import Client, handle_file

    client = Client(server.url, verbose=False)
    init = handle_file(str(models / "control.png"))
    info = client.predict(
        init, "img2img with a unit", "", 0.6, SIDE, SIDE, 2, 7, 3, 1, "default", "tiny", "as the preset says",
        "automatic", 1, -1, 0, 0, 0, 1, 0, "auto", False, "resize", False, [], "", 0.8, *IMG2IMG_SCRIPT_OFF,  # fix steps,
        # resize mode, tiling, styles, the refiner's checkpoint and switch, the Script controls: before the units
        True, handle_file(str(models / "control.png")), "canny", 90, 180, str(models / "ControlNet" / "tiny-cn"), 1,
        0, 1, api_name="/img2img")[1]
    assert 'ControlNet 0: "Module: canny' in info and "Threshold A: 90, Threshold B: 180" in info
    assert "Denoising strength: 0.6" in info


@needs_browser
def test_png_info_fills_the_units_fields_and_says_to_upload_the_image(page, tmp_path):
    from PIL.PngImagePlugin import PngInfo

    from ui_helpers import _drop_on_png_info, _value_is

    info = PngInfo()
    info.add_text("parameters", 'a boat\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 64x64, '
                                'ControlNet 0: "Module: canny, Model: tiny-cn, Weight: 0.6, Threshold A: 50, '
                                'Threshold B: 150, Guidance Start: 0.1, Guidance End: 0.9"')
    png = tmp_path / "a1111.png"
    Image.new("RGB", (64, 64)).save(png, pnginfo=info)
    _drop_on_png_info(page, png, "ControlNet 0")
    page.click("#pnginfo-to-txt2img")
    _value_is(page, "#prompt textarea", "a boat")
    page.locator("#controlnet").get_by_text("ControlNet", exact=True).first.click()  # open the accordion
    assert page.locator("#cn0-enabled input").is_checked()
    assert page.locator("#cn0-model input").first.input_value() == "tiny-cn"
    assert page.locator("#cn0-weight input[type=number]").first.input_value() == "0.6"
    assert page.locator("#cn0-canny-low input[type=number]").first.input_value() == "50"
    page.locator("#cn1").get_by_text("ControlNet Unit 1", exact=True).first.click()  # open its accordion
    assert not page.locator("#cn1-enabled input").is_checked()
    page.get_by_text("ControlNet Unit 0: its control image is not in the PNG", exact=False).first.wait_for(
        timeout=30_000)


def test_every_tab_wires_the_units_for_send_to_and_remembering(tmp_path, monkeypatch):
    """The unit controls are registered under their KEYS in txt2img, img2img and Inpaint (what Send to fills and the
    browser remembers), start at the extension's defaults, and the model list is the CLI's models/ControlNet
    discovery."""
    from lowvram_gen.session import Session
    from lowvram_gen.ui import remembered
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.controlnet import KEYS

    models_root = tmp_path / "models"
    (models_root / "ControlNet").mkdir(parents=True)
    (models_root / "ControlNet" / "control_v11p_sd15_canny.pth").write_bytes(b"listed, not loaded")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models_root))
    wired = {}
    real = remembered.wire
    monkeypatch.setattr(remembered, "wire", lambda app, controls, jobs, **kw: wired.update(controls) or real(app, controls, jobs, **kw))
    build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    for tab in ("txt2img", "img2img", "inpaint"):
        assert set(KEYS) <= set(wired[tab])
        unit = {k: wired[tab][k] for k in KEYS}
        assert (unit["cn0_enabled"].value, unit["cn0_weight"].value, unit["cn0_guidance_end"].value,
                unit["cn0_preprocessor"].value, unit["control_mode"].value) == (False, 1, 1, "none", "balanced")
        # and the embedded one for the tiny model (issue 29: the list was empty out of the box)
        assert [c[0] for c in unit["cn1_model"].choices] == ["control_v11p_sd15_canny", "tiny-controlnet"]


def test_the_system_tabs_estimate_counts_txt2imgs_enabled_units_and_names_them(tmp_path, models, monkeypatch):
    """The System tab's Estimate plans txt2img's inputs and, last, its unit controls (as Generate takes them): an
    enabled unit's ControlNet joins the plan (its weights in every candidate's estimate, as `plan --controlnet`
    counts them) and the plan says which, even before the unit has its image; a disabled one is not counted."""
    from lowvram_gen.session import Session
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.controlnet import key
    from lowvram_gen.ui.widgets import AS_PRESET

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path)))
    plan_table = next(f.fn for f in app.fns.values() if getattr(f.fn, "__name__", "") == "plan_table")
    job = ("a boat", "", 512, 512, 20, 7, -1, 1, "default", "tiny", AS_PRESET)

    def estimates(**units):
        rows, text = plan_table(*job, **units)
        return {row[0]: row[1] for row in rows}, text

    plain, plain_text = estimates()
    off, _ = estimates(**{key(0, "enabled"): False, key(0, "model"): "tiny-cn"})
    counted, text = estimates(**{key(0, "enabled"): True, key(0, "model"): "tiny-cn"})
    assert off == plain and "ControlNet" not in plain_text
    assert "**ControlNet** counted with the denoiser: `tiny-cn`" in text and "streamed a step" in text
    assert set(counted) == set(plain) and all(counted[name] != plain[name] for name in plain if name != "cpu")
    with_image, _ = estimates(**{key(0, "enabled"): True, key(0, "model"): "tiny-cn",
                                 key(0, "image"): str(models / "control.png")})
    assert with_image == counted
