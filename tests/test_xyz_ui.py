"""Issue 32 item 3 in the web UI: the Script dropdown (None / X/Y/Z plot) of txt2img and img2img, its controls at the
end of Generate's positional inputs (before the ControlNet units), its values reaching the grid; and in a browser, a
2x2 grid shown first in the gallery with the grid's infotext."""

from __future__ import annotations

from lowvram_gen import GenerationRequest
from lowvram_gen.session import Session
from lowvram_gen.ui import controlnet, xyz
from ui_helpers import _fill_job, _gallery_image, _set_slider, browser, needs_browser, page, server  # noqa: F401


def test_the_script_controls_end_generates_inputs_and_reach_the_grid(tmp_path, monkeypatch):
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.context import TabContext

    asked = []
    monkeypatch.setattr(TabContext, "run_job", lambda self, tab, fields, *a, **k: iter([asked.append((fields, a))]))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    for api_name, prefix, given, tab in (("generate", "", {}, "txt2img"),
                                         ("img2img", "i2i-", {"init_image": "init.png"}, "img2img")):
        event = next(d for d in app.fns.values() if d.api_name == api_name)
        ours = event.inputs[len(event.inputs) - len(controlnet.KEYS) - len(xyz.inputs(tab)):][:len(xyz.INPUTS)]
        assert ours[0].elem_id == f"{prefix}script" and ours[0].value == "None"
        assert [b.elem_id for b in ours[1:3]] == [f"{prefix}xyz-x-type", f"{prefix}xyz-x-values"]
        list(event.fn(prompt="x", script="X/Y/Z plot", xyz_x_type="Steps", xyz_x_values="1-3",
                      xyz_y_type="CFG Scale", xyz_y_values="5, 7", **given))
        list(event.fn(prompt="x", **given))
    (fields, args), (_, plain) = asked[0], asked[1]
    several = args[-1](GenerationRequest(prompt="x", seed=3))  # the tab's grid maker, on a request
    assert several.parts == 6 and several.seed(None) == 3
    assert plain[-1] is None  # Script None: a plain job


@needs_browser
def test_a_2x2_grid_is_shown_first_in_the_gallery(page, server):
    _fill_job(page, "a lighthouse", 64, 64, 2)
    page.locator("#script input").first.click()
    page.get_by_role("option", name="X/Y/Z plot", exact=True).click()
    page.locator("#xyz-x-values textarea").fill("1, 2")
    page.locator("#xyz-y-type input").first.click()
    page.get_by_role("option", name="CFG Scale", exact=True).click()
    page.locator("#xyz-y-values textarea").fill("5, 7")
    page.click("#generate")
    image = _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('Script: X/Y/Z plot')",
                           timeout=120_000)
    width, height = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert width > 2 * 64 and height > 2 * 64  # the grid and its legends, not a 64 px cell
    assert "4 of 4 cells made" in page.locator("#summary textarea").input_value()
    assert len(list(server.outdir.rglob("*xyz-grid*.png"))) == 1


def test_img2img_offers_loopback_and_sd_upscale_with_a1111s_controls_at_the_end(tmp_path, monkeypatch):
    from lowvram_gen.img2img_scripts.base import ScriptResult
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.context import TabContext

    asked = []
    monkeypatch.setattr(TabContext, "run_job", lambda self, tab, fields, *a, **k: iter([asked.append((fields, a))]))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    event = next(d for d in app.fns.values() if d.api_name == "img2img")
    script = next(i for i in event.inputs if i.elem_id == "i2i-script")
    assert [c for c, _ in script.choices] == ["None", "X/Y/Z plot", "Loopback", "SD upscale"]
    ours = event.inputs[len(event.inputs) - len(controlnet.KEYS) - len(xyz.IMG2IMG_INPUTS):][:len(xyz.IMG2IMG_INPUTS)]
    assert [(b.label, b.value) for b in ours] == [
        ("Loops", 4), ("Final denoising strength", 0.5), ("Denoising strength curve", "Linear"),
        ("Append interrogated prompt at each iteration", "None"), ("Tile overlap", 64), ("Upscaler", "None"),
        ("Scale Factor", 2.0)]
    list(event.fn(prompt="x", init_image="init.png", script="Loopback", loopback_loops=2))
    several = asked[0][1][-1](GenerationRequest(prompt="x", seed=3))
    ran = {}

    def fake_run(descriptor, request, session, **kw):
        ran.update(kw, title=descriptor.title)
        return ScriptResult("Loopback", ["a.png", "b.png"], ["b.png"], [3, 4], "done", "grid.png")

    monkeypatch.setattr("lowvram_gen.img2img_scripts.scripts.run", fake_run)
    from lowvram_gen.jobs.progress import PartProgress

    progress = PartProgress()
    result = several.run(None, progress, {})
    assert ran["title"] == "Loopback" and ran["loops"] == 2 and ran["denoising_curve"] == "Linear"
    assert ran["on_part"] == progress.part
    assert several.shown(result) == ["grid.png", "a.png", "b.png"] and several.seed(result) == 3


@needs_browser
def test_loopback_with_two_loops_shows_its_grid_then_both_loops(page, server, tmp_path):
    from PIL import Image

    source = tmp_path / "init.png"
    Image.new("RGB", (64, 64), (90, 120, 160)).save(source)
    page.get_by_role("tab", name="img2img").click()
    page.locator("#i2i-init input[type=file]").first.set_input_files(str(source))
    page.locator("#i2i-init img").first.wait_for(timeout=30_000)
    page.locator("#i2i-prompt textarea").fill("a harbour")
    _set_slider(page, "i2i-steps", 2)
    assert not page.locator("#i2i-loopback-loops").is_visible()  # shown only when chosen
    page.locator("#i2i-script input").first.click()
    page.get_by_role("option", name="Loopback", exact=True).click()
    page.locator("#i2i-loopback-loops").wait_for(state="visible", timeout=30_000)
    _set_slider(page, "i2i-loopback-loops", 2)
    page.click("#i2i-generate")
    page.wait_for_function("() => document.querySelectorAll('#i2i-gallery img').length >= 3 &&"
                           " document.querySelector('#i2i-summary textarea').value.includes('Loopback: 2 loop(s)')",
                           timeout=180_000)
    first = page.locator("#i2i-gallery img").first
    page.wait_for_function("() => { const img = document.querySelector('#i2i-gallery img');"
                           " return img.complete && img.naturalWidth > 0; }", timeout=60_000)
    assert first.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [2 * 64, 64]  # the grid of the two
    assert len(list(server.outdir.rglob("*grid*.png"))) >= 1
