"""The extra-network cards and the Image Browser tab (issue 32 item 7) in a real headless Chromium
(tests/ui_helpers.py): a LoRA card's click puts its tag in the prompt and a second click takes it out, the search box
filters the cards, a checkpoint card sets the Model box; the browser tab shows an output image with its parameters,
sends it to txt2img, and deletes it to the trash."""

from __future__ import annotations

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from ui_helpers import _value_is, browser, needs_browser, page, server  # noqa: F401

pytestmark = needs_browser


def _models(tmp_path, monkeypatch):
    for sub in ("Lora", "Stable-diffusion"):
        (tmp_path / sub).mkdir()
    (tmp_path / "Lora" / "film grain.safetensors").write_bytes(b"listed, not loaded")
    Image.new("RGB", (64, 64), (200, 150, 20)).save(tmp_path / "Lora" / "film grain.preview.png")
    (tmp_path / "Lora" / "Pixel.safetensors").write_bytes(b"listed, not loaded")
    (tmp_path / "Stable-diffusion" / "dream.safetensors").write_bytes(b"listed, not loaded")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))  # the server runs in this process


def _cards(page, prefix: str, count: int):
    page.wait_for_function("([s, n]) => document.querySelectorAll(s).length === n",
                           arg=[f"#{prefix}cards-gallery img", count], timeout=30_000)
    return page.locator(f"#{prefix}cards-gallery img")


def test_a_lora_card_click_inserts_its_tag_and_a_second_takes_it_out(page, tmp_path, monkeypatch):
    _models(tmp_path, monkeypatch)
    page.locator("#prompt textarea").fill("a cat")
    page.locator("#cards").get_by_text("Extra networks").click()
    cards = _cards(page, "", 2)
    cards.first.click()  # film grain, sorted first
    _value_is(page, "#prompt textarea", "a cat <lora:film grain:1>")
    page.wait_for_function("() => document.querySelector('#cards-note').innerText.includes('film grain')",
                           timeout=30_000)
    cards.first.click()
    _value_is(page, "#prompt textarea", "a cat")
    page.locator("#cards-search input, #cards-search textarea").first.fill("pix")
    _cards(page, "", 1).first.click()
    _value_is(page, "#prompt textarea", "a cat <lora:Pixel:1>")


def test_a_checkpoint_card_sets_the_model_box_on_img2img(page, tmp_path, monkeypatch):
    _models(tmp_path, monkeypatch)
    page.get_by_role("tab", name="img2img").click()
    page.locator("#i2i-cards").get_by_text("Extra networks").click()
    page.locator("#i2i-cards-kind").get_by_text("Checkpoints").click()
    _cards(page, "i2i-", 1).first.click()
    _value_is(page, "#i2i-model input", str(tmp_path / "Stable-diffusion" / "dream.safetensors"))


def test_the_browser_tab_shows_an_image_sends_it_and_deletes_it_to_the_trash(page, server):
    info = PngInfo()
    info.add_text("parameters", "a browsed fox\nSteps: 3, Sampler: Euler, CFG scale: 7, Seed: 42, Size: 64x64")
    image = server.outdir / "00000-42-a-browsed-fox.png"
    Image.new("RGB", (64, 64), (20, 90, 200)).save(image, pnginfo=info)
    page.get_by_role("tab", name="Image Browser").click()
    page.locator("#browser-gallery img").first.wait_for(timeout=30_000)
    page.locator("#browser-gallery img").first.click()
    page.wait_for_function("() => document.querySelector('#browser-info textarea').value.includes('a browsed fox')",
                           timeout=30_000)
    page.click("#browser-to-txt2img")
    _value_is(page, "#prompt textarea", "a browsed fox")
    page.get_by_role("tab", name="Image Browser").click()
    page.click("#browser-delete")
    page.wait_for_function("() => document.querySelector('#browser-status').innerText.includes('Moved')",
                           timeout=30_000)
    assert not image.exists()
    assert (server.outdir / ".trash" / image.name).read_bytes()  # kept in the trash
    page.click("#browser-undo")
    page.wait_for_function("() => document.querySelector('#browser-status').innerText.includes('Restored')",
                           timeout=30_000)
    assert image.is_file()
