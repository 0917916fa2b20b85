"""What the web UI's browser tests share: Debian's Chromium driven by Playwright for Python with no browser download
(`needs_browser` skips a test without it, saying why), the `server` (the web UI in this process: servers.py),
`browser` and `page` fixtures, and the steps a person takes on the page (fill a job, set a slider, wait for the
gallery's image, drop a PNG on PNG Info).

Not a test module (pytest collects test_*.py only): a test module imports its fixtures from here
(`from ui_helpers import browser, page, server  # noqa: F401`), never from another test module.
"""

from __future__ import annotations

import shutil

import pytest

from servers import module_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None,
                                   reason="Debian's chromium is not installed (apt-get install chromium)")

server = module_server("ui")  # the web UI alone, one for each test module that imports it


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


@pytest.fixture()
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.goto(server.url)
    pg.wait_for_selector("#prompt textarea", timeout=30_000)
    yield pg
    context.close()


def _fill_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input").first
    box.fill(str(value))
    box.press("Tab")


def _set_slider(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def _fill_job(page, prompt: str, width: int, height: int, steps: int) -> None:
    page.locator("#prompt textarea").fill(prompt)
    _fill_number(page, "width", width)
    _fill_number(page, "height", height)
    _set_slider(page, "steps", steps)


def _gallery_image(page):
    """The gallery's first image once its file has loaded: the element is there before (naturalWidth 0 on a
    busy machine)."""
    image = page.locator("#gallery img").first
    image.wait_for(timeout=120_000)
    page.wait_for_function("() => { const img = document.querySelector('#gallery img');"
                           " return img !== null && img.complete && img.naturalWidth > 0; }", timeout=120_000)
    return image


def _value_is(page, selector: str, expected: str) -> None:
    page.wait_for_function("([s, v]) => document.querySelector(s) && document.querySelector(s).value === v",
                           arg=[selector, expected], timeout=30_000)


def _drop_on_png_info(page, png, shows: str) -> None:
    """Open PNG Info, drop `png` on it and wait until its parameters show `shows`."""
    page.get_by_role("tab", name="PNG Info").click()
    page.locator("#pnginfo-image input[type=file]").set_input_files(str(png))
    page.wait_for_function("(s) => document.querySelector('#pnginfo-parameters textarea').value.includes(s)",
                           arg=shows, timeout=30_000)


def _pick_a_lora_and_an_embedding(page, tmp_path, monkeypatch, prefix: str = "") -> None:
    """Put a LoRA and an embedding in a models folder (`tmp_path`), type "a cat" in the `prefix` tab's prompt, rescan
    with its pickers' Refresh, pick both, and wait for the prompt to have their tags. The tab must be showing."""
    (tmp_path / "Lora").mkdir()
    (tmp_path / "Lora" / "film grain.safetensors").write_bytes(b"listed, not loaded")
    (tmp_path / "embeddings").mkdir()
    (tmp_path / "embeddings" / "EasyNegative.pt").write_bytes(b"listed, not loaded")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))  # the server runs in this process
    page.locator(f"#{prefix}prompt textarea").fill("a cat")
    page.click(f"#{prefix}refresh")
    for picker, name in ((f"#{prefix}lora-picker", "film grain"), (f"#{prefix}embedding-picker", "EasyNegative")):
        page.locator(f"{picker} input").first.click()
        page.get_by_role("option", name=name).click()
    _value_is(page, f"#{prefix}prompt textarea", "a cat <lora:film grain:1> EasyNegative")


def open_tab(page, name: str) -> None:
    """Open the tab `name`. With more tabs than the bar's width holds, gradio moves the last ones into its overflow
    menu (a second, hidden button of the same name stays in the bar for measuring): click the one on screen, opening
    the overflow menu first when the tab is in it."""
    tabs = page.get_by_role("tab", name=name, exact=True)
    if not tabs.locator("visible=true").count():
        page.locator(".overflow-menu button, button.overflow-menu").locator("visible=true").first.click()
    tabs.locator("visible=true").first.click()
