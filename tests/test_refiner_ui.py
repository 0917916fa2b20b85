"""Issue 32 item 5 in the browser: txt2img's Refiner accordion (ui/form.py) picks the tiny SDXL refiner and its
switch, and Generate makes an image whose parameters say so (`Refiner`, `Refiner switch at`)."""

from __future__ import annotations

from tiny_refiner import save_tiny_refiner  # tests/tiny_refiner.py
from ui_helpers import _fill_job, _gallery_image, _set_slider, browser, needs_browser, page, server  # noqa: F401


@needs_browser
def test_the_accordion_sets_the_refiner_and_generate_runs_it(page, tmp_path):
    folder = save_tiny_refiner(tmp_path / "tiny-refiner")
    _fill_job(page, "a lighthouse", 64, 64, 3)
    model = page.locator("#model input").first
    model.fill("tiny-sdxl")
    model.press("Enter")
    page.get_by_text("Refiner", exact=True).first.click()  # the accordion opens
    box = page.locator("#refiner input").first
    box.fill(folder)
    box.press("Enter")
    _set_slider(page, "refiner-switch-at", 0.5)
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('Refiner switch at: 0.5')",
                           timeout=180_000)
    info = page.locator("#info textarea").input_value()
    assert "Refiner: tiny-refiner" in info and "Model: tiny-sdxl" in info
    _gallery_image(page)
