"""Issue 32 item 3 in the web UI: the Script dropdown (None / X/Y/Z plot) of txt2img and img2img, its controls at the
end of Generate's positional inputs (before the ControlNet units), its values reaching the grid; and in a browser, a
2x2 grid shown first in the gallery with the grid's infotext."""

from __future__ import annotations

from lowvram_gen.session import Session
from lowvram_gen.ui import controlnet, xyz
from ui_helpers import _fill_job, _gallery_image, browser, needs_browser, page, server  # noqa: F401 (fixtures)


def test_the_script_controls_end_generates_inputs_and_reach_the_grid(tmp_path, monkeypatch):
    from lowvram_gen import GenerationRequest
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.context import TabContext

    asked = []
    monkeypatch.setattr(TabContext, "run_job", lambda self, tab, fields, *a, **k: iter([asked.append((fields, a))]))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    for api_name, prefix, given in (("generate", "", {}), ("img2img", "i2i-", {"init_image": "init.png"})):
        event = next(d for d in app.fns.values() if d.api_name == api_name)
        ours = event.inputs[len(event.inputs) - len(controlnet.KEYS) - len(xyz.INPUTS):][:len(xyz.INPUTS)]
        assert ours[0].elem_id == f"{prefix}script" and ours[0].value == "None"
        assert [b.elem_id for b in ours[1:3]] == [f"{prefix}xyz-x-type", f"{prefix}xyz-x-values"]
        list(event.fn(prompt="x", script="X/Y/Z plot", xyz_x_type="Steps", xyz_x_values="1-3",
                      xyz_y_type="CFG Scale", xyz_y_values="5, 7", **given))
        list(event.fn(prompt="x", **given))
    (fields, args), (_, plain) = asked[0], asked[1]
    grid = args[-1](GenerationRequest(prompt="x", seed=3))  # the tab's grid maker, on a request
    assert grid.shape == (3, 2, 1) and [c.request.steps for c in grid.cells[:3]] == [1, 2, 3]
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
