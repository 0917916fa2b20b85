"""The web UI's Styles (issue 32 item 2) in a browser: pick a style under txt2img's prompts and Generate (the PNG has
the styled prompt, the box keeps the user's), 🖌 writes the styles into the boxes and clears the selection, 💾 saves
the prompts as a style that every tab's list then offers, and PNG Info's Send to takes the styles back out of the
prompt and selects them. The server runs where its styles.csv is, A1111's place (no --styles-file)."""

from __future__ import annotations

import os

import pytest

from lowvram_gen.prompting import styles as st
from servers import Server
# page: ui_helpers' own, on this module's `server` (pytest finds the fixture by its name here)
from ui_helpers import (_drop_on_png_info, _fill_job, _gallery_image, _value_is, browser,  # noqa: F401
                        needs_browser, page)

CSV = 'name,prompt,negative_prompt\nFilm,"{prompt}, film grain",blurry\nVivid,vivid colors,\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ui-styles")
    (folder / "styles.csv").write_text(CSV, encoding="utf-8")
    here = os.getcwd()
    os.chdir(folder)  # the Session reads styles.csv in the folder it starts in, as A1111 does
    try:
        srv = Server(folder)
    finally:
        os.chdir(here)
    yield srv
    srv.close()


def _pick(page, prefix: str, *names: str) -> None:
    """Open the tab's Styles list and click each of `names` among its options (the list stays open between)."""
    page.locator(f"#{prefix}styles input").first.click()
    for name in names:
        page.get_by_role("option", name=name, exact=True).click()
        page.wait_for_function("([id, n]) => [...document.querySelectorAll(`#${id} .token`)]"
                               ".some(t => t.innerText.trim() === n)", arg=[f"{prefix}styles", name], timeout=30_000)
    page.keyboard.press("Escape")


def _chosen(page, prefix: str) -> list[str]:
    return page.evaluate("(id) => [...document.querySelectorAll(`#${id} .token`)].map(t => t.innerText.trim())",
                         f"{prefix}styles")


@needs_browser
def test_a_picked_style_styles_the_job_and_png_info_takes_it_back_out(page, server):
    assert server.session.style_book().path == server.outdir.parent / "styles.csv"
    _fill_job(page, "a cat", 64, 64, 1)
    page.locator("#negative textarea").fill("ugly")
    _pick(page, "", "Film")
    assert _chosen(page, "") == ["Film"]
    page.click("#generate")
    _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.startsWith("
                           "'a cat, film grain\\nNegative prompt: ugly, blurry\\n')", timeout=60_000)
    assert page.locator("#prompt textarea").input_value() == "a cat"  # the box keeps the user's own text
    png = sorted(server.outdir.rglob("*.png"))[-1]
    page.locator("#prompt textarea").fill("something else")
    _drop_on_png_info(page, png, "a cat, film grain")
    page.click("#pnginfo-to-txt2img")
    _value_is(page, "#prompt textarea", "a cat")  # the style's text taken out of the prompt...
    _value_is(page, "#negative textarea", "ugly")
    page.wait_for_function("() => [...document.querySelectorAll('#styles .token')].map(t => t.innerText.trim())"
                           ".join() === 'Film'", timeout=30_000)  # ...and the style selected: a rerun is the same


@needs_browser
def test_apply_writes_the_styles_into_the_prompts_and_save_adds_one_every_tab_offers(page, server):
    page.locator("#prompt textarea").fill("a dog")
    page.locator("#negative textarea").fill("")
    _pick(page, "", "Vivid", "Film")
    assert _chosen(page, "") == ["Vivid", "Film"]
    page.click("#styles-apply")
    _value_is(page, "#prompt textarea", "a dog, vivid colors, film grain")
    _value_is(page, "#negative textarea", "blurry")
    page.wait_for_function("() => document.querySelectorAll('#styles .token').length === 0", timeout=30_000)
    page.locator("#style-name textarea, #style-name input").first.fill("Dog")
    page.click("#style-save")
    file = server.session.style_book().path
    page.wait_for_function("() => document.querySelector('#style-name input, #style-name textarea').value === ''",
                           timeout=30_000)
    assert st.read(file).styles["Dog"] == st.Style("Dog", "a dog, vivid colors, film grain", "blurry")
    assert st.read(file).names == ["Film", "Vivid", "Dog"] and (file.parent / "styles.csv.bak").is_file()
    page.get_by_role("tab", name="img2img").click()
    _pick(page, "i2i-", "Dog")  # img2img's list was refreshed by txt2img's save
    assert _chosen(page, "i2i-") == ["Dog"]
