"""The web UI's remembered values (ui/remembered.py): each browser's own, under its login, back after a reload
or a restart; never another user's, never an API client's defaults; a value the request would refuse is not
restored."""

from __future__ import annotations

import pytest

from lowvram_gen.ui import remembered
from servers import Server
from ui_helpers import _fill_job, _gallery_image, browser, needs_browser  # noqa: F401 (browser: the fixture)


def _component(app, elem_id):
    return next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == elem_id)


@pytest.mark.parametrize("name, value, ok", [
    ("prompt", "a fox", True), ("width", 640, True), ("width", 65, False), ("width", "wide", False),
    ("steps", 30, True), ("steps", 9999, False), ("steps", 0, False), ("cfg_scale", float("nan"), False),
    ("seed", -1, True), ("seed", 2 ** 40, False), ("batch_size", 0, False), ("sampler", "Euler a", True),
    ("sampler", "no such sampler", False), ("quantize", "int8", True), ("quantize", "as the preset says", True),
    ("quantize", "int3", False), ("negative_prompt", None, True), ("strength", 1.5, False),
    ("schedule_type", "karras", True), ("schedule_type", "sgm-uniform", True), ("schedule_type", "wobbly", False),
    ("sampler", "DPM++ SDE", True), ("clip_skip", 2, True), ("clip_skip", 2.0, True), ("clip_skip", 0, False),
    ("clip_skip", 13, False), ("batch_count", 4, True), ("batch_count", 0, False), ("batch_count", 101, False),
    ("preview_every", 0, True), ("preview_every", 5, True), ("preview_every", -1, False),
    ("preview_every", 151, False), ("preview_method", "taesd", True), ("preview_method", "full", False)])
def test_a_remembered_value_is_restored_only_if_the_request_takes_it(name, value, ok):
    """The issue's case: width 65 or steps 9999 in the stored values opened the UI with values the first
    Generate refused; now each value is checked as the request checks it before it goes back."""
    import gradio as gr

    from lowvram_gen.ui.widgets import ScheduleType

    boxes = {"sampler": lambda: gr.Dropdown(["default", "Euler a", "DPM++ SDE"], value="default"),
             "schedule_type": lambda: ScheduleType("schedule-type")}
    box = boxes.get(name, gr.Textbox)()
    assert remembered.valid(name, value, box) is ok


def test_the_page_every_client_loads_carries_the_documented_defaults(tmp_path):
    """What the API schema and the initial page publish: the built-in defaults, never a last job's values."""
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session
    from lowvram_gen.ui.app import UiOptions, build_app

    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    defaults = GenerationRequest()
    assert _component(app, "prompt").value == "" and _component(app, "seed").value == -1
    # the request leaves steps and CFG to the model family (None); the sliders start at the UI model's (tiny: SD's)
    assert (_component(app, "width").value, _component(app, "steps").value) == (defaults.width, 20)
    assert _component(app, "cfg").value == 7 and defaults.steps is None
    steps, batch = _component(app, "steps"), _component(app, "batch")
    assert steps.minimum == 1 and batch.minimum == 1  # the sliders no longer go down to 0


def test_clip_skip_is_a_control_of_both_tabs_starting_off_and_remembered(tmp_path, monkeypatch):
    """Issue 19: txt2img's and img2img's Clip skip box starts at 1 (off) and is among the values each browser gets
    back (remembered.wire's controls), as the sampler and CFG are."""
    from lowvram_gen.session import Session
    from lowvram_gen.ui.app import UiOptions, build_app

    wired = {}
    real = remembered.wire
    monkeypatch.setattr(remembered, "wire", lambda app, controls, jobs, **kw: wired.update(controls) or real(app, controls, jobs, **kw))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    for tab, elem_id in (("txt2img", "clip-skip"), ("img2img", "i2i-clip-skip")):
        box = _component(app, elem_id)
        assert (box.value, box.minimum, box.maximum, box.step) == (1, 1, 12, 1)
        assert wired[tab]["clip_skip"] is box and "clip_skip" not in remembered.NOT_REMEMBERED
        assert wired[tab]["cfg_scale"] is not None  # remembered the same way


def test_batch_count_and_the_live_preview_settings_are_remembered_in_both_tabs(tmp_path, monkeypatch):
    """Issue 19 item 6: Batch count starts at 1, the live preview at A1111's every 10 steps, auto; each browser gets
    them back as it gets the sampler back."""
    from lowvram_gen.session import Session
    from lowvram_gen.ui.app import UiOptions, build_app

    wired = {}
    real = remembered.wire
    monkeypatch.setattr(remembered, "wire", lambda app, controls, jobs, **kw: wired.update(controls) or real(app, controls, jobs, **kw))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    for tab, prefix in (("txt2img", ""), ("img2img", "i2i-")):
        count, every, method = (_component(app, f"{prefix}{name}") for name in ("batch-count", "preview-every",
                                                                                 "preview-method"))
        assert (count.value, count.minimum, count.maximum) == (1, 1, 100)
        assert (every.value, every.minimum, every.maximum, method.value) == (10, 0, 150, "auto")
        assert (wired[tab]["batch_count"], wired[tab]["preview_every"], wired[tab]["preview_method"]) == (
            count, every, method)


def test_an_api_call_without_a_seed_gets_a_random_one_each_time_and_remembers_nothing(tmp_path):
    from gradio_client import Client

    srv = Server(tmp_path)
    try:
        client = Client(srv.url, verbose=False)
        client.predict(prompt="first", width=64, height=64, steps=1, seed=1234, api_name="/generate")
        seeds = [client.predict(prompt="no seed", width=64, height=64, steps=1, api_name="/generate")[3]
                 for _ in range(2)]
        assert seeds[0] != seeds[1] and 1234 not in seeds
        schema = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]
        defaults = {p["parameter_name"]: p.get("parameter_default") for p in schema["parameters"]}
        assert defaults["seed"] == -1 and defaults["prompt"] in ("", None) and defaults["width"] == 512
    finally:
        srv.close()
    assert not (tmp_path / "ui-settings.json").exists()


@needs_browser
def test_two_logins_see_only_their_own_remembered_values_and_a_reload_brings_them_back(browser, tmp_path):
    """Two browsers, two --gradio-auth users: each one's last job comes back after F5 in its own browser, and
    the other one's page shows the defaults."""
    srv = Server(tmp_path, auth="alice:wonderland,bob:builder")
    try:
        pages = {}
        for user, password in (("alice", "wonderland"), ("bob", "builder")):
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.goto(srv.url)
            page.get_by_label("username").fill(user)
            page.get_by_label("password").fill(password)
            page.get_by_role("button", name="Login").click()
            page.wait_for_selector("#prompt textarea", timeout=30_000)
            pages[user] = page
        alice, bob = pages["alice"], pages["bob"]
        _fill_job(alice, "alice's secret fox", 64, 72, 2)
        alice.click("#generate")
        _gallery_image(alice)
        alice.wait_for_timeout(1000)  # the chained save into alice's localStorage
        alice.reload()  # F5; then a new page of the same browser, which no form restoring could fill
        alice.wait_for_selector("#prompt textarea", timeout=30_000)
        alice = alice.context.new_page()
        alice.goto(srv.url)
        alice.wait_for_function("() => { const box = document.querySelector('#prompt textarea');"
                                " return box !== null && box.value === \"alice's secret fox\"; }", timeout=30_000)
        assert alice.locator("#width input").first.input_value() == "64"
        assert alice.locator("#height input").first.input_value() == "72"
        bob.reload()
        bob.wait_for_selector("#prompt textarea", timeout=30_000)
        bob.wait_for_timeout(1500)
        assert bob.locator("#prompt textarea").input_value() == ""
        assert bob.locator("#width input").first.input_value() == "512"
        assert "alice" not in bob.content()
        for page in pages.values():
            page.context.close()
    finally:
        srv.close()


def test_an_unwritable_home_costs_the_values_on_restart_not_the_ui(isolated_home, monkeypatch, caplog):
    import logging

    blocker = isolated_home / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("LOWVRAM_GEN_HOME", str(blocker))  # a file where the folder should be
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.ui.remembered"):
        state = remembered.browser_state()
    assert state.storage_key == remembered.STORAGE_KEY and len(state.secret) >= 16
    assert "browsers forget their values when the server restarts" in caplog.text


def test_the_storage_key_survives_a_restart():
    assert remembered.browser_state().secret == remembered.browser_state().secret
