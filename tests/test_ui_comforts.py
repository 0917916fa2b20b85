"""Issue 32 item 7 in a browser (Debian's Chromium through Playwright, ui_helpers.py): the token counter under the
prompt moves as the user types (ui/token_counter.py), Generate forever runs job after job until Interrupt
(ui/forever.py), and the Settings tab's values (ui/tabs/settings.py) survive a reload in their browser, reach the
tabs and the saved file names, and are not seen by another browser."""

from __future__ import annotations

import re

from ui_helpers import _fill_job, _gallery_image, _set_slider, browser, open_tab, needs_browser, page, server  # noqa: F401

pytestmark = needs_browser


def _text_is(page, selector: str, expected: str) -> None:
    page.wait_for_function("([s, v]) => { const e = document.querySelector(s); return e && e.textContent.trim() === v; }",
                           arg=[selector, expected], timeout=30_000)


def test_the_token_counter_moves_as_you_type(page):
    _text_is(page, "#prompt-tokens", "0/75")
    box = page.locator("#prompt textarea")
    box.press_sequentially("a b c", delay=20)
    _text_is(page, "#prompt-tokens", "3/75")
    box.fill(" ".join(["a"] * 76))  # the tiny model's tokenizer: one token a letter
    _text_is(page, "#prompt-tokens", "76/150")
    page.locator("#negative textarea").fill("x BREAK y")
    _text_is(page, "#negative-tokens", "76/150")
    page.get_by_role("tab", name="img2img").click()
    page.locator("#i2i-prompt textarea").fill("a b")
    _text_is(page, "#i2i-prompt-tokens", "2/75")  # each box its own counter


def test_generate_forever_runs_job_after_job_until_interrupt(page, server):
    before = len(list(server.outdir.rglob("*.png")))
    _fill_job(page, "forever fox", 64, 64, 1)
    page.locator("#generate-forever input").check()
    page.click("#generate")
    page.wait_for_function(
        "() => document.querySelectorAll('#gallery img').length > 0", timeout=120_000)
    # a second job starts by itself once the first has made its image
    for _ in range(240):
        if len(list(server.outdir.rglob("*.png"))) >= before + 2:
            break
        page.wait_for_timeout(500)
    assert len(list(server.outdir.rglob("*.png"))) >= before + 2
    page.click("#cancel")
    page.wait_for_function("() => !document.querySelector('#generate-forever input').checked", timeout=30_000)
    at_interrupt = len(list(server.outdir.rglob("*.png")))
    page.wait_for_timeout(8000)
    # at most the job Interrupt met (it keeps its image), or the one its click had already started: then none
    assert len(list(server.outdir.rglob("*.png"))) <= at_interrupt + 1
    assert not page.locator("#generate-forever input").is_checked()


def _open_settings(page):
    open_tab(page, "Settings")
    page.wait_for_selector("#settings-steps input[type=number]", timeout=30_000)


def test_settings_survive_a_reload_reach_the_tabs_and_stay_in_their_browser(page, browser, server):
    _open_settings(page)
    _set_slider(page, "settings-steps", 3)
    pattern = page.locator("#settings-filename-pattern textarea")
    pattern.fill("[seed]-[what]")
    page.click("#settings-apply")
    page.wait_for_function("() => document.querySelector('#settings-said').innerText.includes('[what]')",
                           timeout=90_000)  # refused, naming the tag: nothing applied
    assert page.locator("#steps input[type=number]").first.input_value() == "20"
    pattern.fill("[seed]-[steps]-settings")
    page.click("#settings-apply")
    page.wait_for_function("() => document.querySelector('#settings-said').innerText.includes('Applied')",
                           timeout=30_000)
    for tab, elem_id in (("txt2img", "steps"), ("img2img", "i2i-steps"), ("Inpaint", "inp-steps")):
        page.get_by_role("tab", name=tab, exact=True).click()  # a tab's controls are drawn once it is opened
        assert page.locator(f"#{elem_id} input[type=number]").first.input_value() == "3"
    page.wait_for_timeout(1000)  # the BrowserState's write into localStorage
    page.reload()
    page.wait_for_selector("#prompt textarea", timeout=30_000)
    page.wait_for_function("() => document.querySelector('#steps input[type=number]').value === '3'",
                           timeout=30_000)
    _open_settings(page)
    assert page.locator("#settings-steps input[type=number]").first.input_value() == "3"
    assert page.locator("#settings-filename-pattern textarea").input_value() == "[seed]-[steps]-settings"
    # the reloaded page's jobs are named by the pattern
    page.get_by_role("tab", name="txt2img").click()
    page.locator("#prompt textarea").fill("named fox")
    page.locator("#width input").first.fill("64")
    page.locator("#height input").first.fill("64")
    page.locator("#seed input").first.fill("77")
    page.locator("#seed input").first.press("Tab")
    page.click("#generate")
    _gallery_image(page)
    assert any(re.fullmatch(r"\d{5}-77-3-settings\.png", p.name) for p in server.outdir.rglob("*.png"))

    other = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    try:
        other.goto(server.url)
        other.wait_for_selector("#prompt textarea", timeout=30_000)
        other.wait_for_timeout(1500)
        assert other.locator("#steps input[type=number]").first.input_value() == "20"
        _open_settings(other)
        assert other.locator("#settings-steps input[type=number]").first.input_value() == "0"
        assert other.locator("#settings-filename-pattern textarea").input_value() == ""
    finally:
        other.context.close()

    _open_settings(page)
    page.click("#settings-reset")
    page.wait_for_function("() => document.querySelector('#settings-said').innerText.includes('Reset')",
                           timeout=30_000)
    assert page.locator("#settings-steps input[type=number]").first.input_value() == "0"
    assert page.locator("#steps input[type=number]").first.input_value() == "20"
