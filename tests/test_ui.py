"""The web UI as a person and an API client use it: a real headless Chromium, and gradio_client.

Chromium is Debian's (`apt-get install chromium`; ./test.sh installs it when run as root) driven
by Playwright for Python with no browser download. Without it the browser tests skip, saying why.
The server, the browser and the page's steps are tests/ui_helpers.py's (and servers.py's).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from lowvram_gen.session import Session
from servers import Server, _free_port
from ui_helpers import (_drop_on_png_info, _fill_job, _fill_number, _gallery_image,  # noqa: F401
                        _pick_a_lora_and_an_embedding, _set_slider,
                        _value_is, browser, needs_browser, page, server)  # (browser, page, server: fixtures)


def _generate_and_match(page, server, original, seed: int) -> None:
    """Generate on the txt2img tab (filled from `original`'s PNG info): one new image of `seed`, with `original`'s
    parameters and pixels."""
    from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata

    page.click("#generate")
    page.wait_for_function(f"() => document.querySelector('#info textarea').value.includes('Seed: {seed}')",
                           timeout=120_000)
    made = list(server.outdir.rglob(f"*-{seed}-*.png"))
    assert len(made) == 1
    assert parse_a1111_parameters(read_png_metadata(made[0])[0]) == parse_a1111_parameters(read_png_metadata(original)[0])
    assert (_pixels(made[0]) == _pixels(original)).all()


@needs_browser
def test_type_a_prompt_generate_and_see_the_image_and_its_metadata(page, server):
    _fill_job(page, "a lighthouse at dusk", 192, 128, 3)
    page.click("#generate")
    image = _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('Steps: 3')",
                           timeout=60_000)
    size = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert size == [192, 128]
    info = page.locator("#info textarea").input_value()
    assert info.startswith("a lighthouse at dusk") and "Size: 192x128" in info and "Model: tiny" in info
    assert "finished at cpu" in page.locator("#summary textarea").input_value()
    target = server.outdir.parent / "screenshot.png"  # the README's is made by scripts/screenshot.py
    _screenshot_every_tab(page, server.app, target)
    assert target.stat().st_size > 10_000


def _screenshot_every_tab(page, app, target: Path) -> None:
    """The README's picture, as scripts/screenshot.py makes it: every tab of the running app."""
    import importlib.util

    from lowvram_gen.ui.layout import signature, tabs

    spec = importlib.util.spec_from_file_location("screenshot", Path(__file__).resolve().parents[1] / "scripts" /
                                                  "screenshot.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.photograph_tabs(page, tabs(app), target, signature(app))


@needs_browser
def test_cancel_a_long_job_and_the_ui_is_ready_again(page, server):
    started = threading.Event()
    real = server.session.generate

    def watched(request, on_step=None, cancel=None, **kw):
        def step(i, total):
            started.set()
            if on_step:
                on_step(i, total)
            if request.prompt == "a long job":
                cancel.wait(60)  # each step waits for the Cancel button, so the job cannot finish before it
        return real(request, on_step=step, cancel=cancel, **kw)

    server.session.generate = watched
    try:
        _fill_job(page, "a long job", 256, 256, 20)
        page.click("#generate")
        assert started.wait(60)  # the job is denoising
        page.click("#cancel")
        page.wait_for_function("() => document.querySelector('#summary textarea').value.includes('cancelled at step')",
                               timeout=60_000)  # the job itself reports where it stopped
        _fill_job(page, "after the cancel", 64, 64, 2)
        page.click("#generate")
        page.wait_for_function("() => document.querySelector('#info textarea').value.startsWith('after the cancel')",
                               timeout=120_000)
    finally:
        server.session.generate = real


def test_an_api_clients_cancel_stops_the_job_at_the_next_step_and_the_next_job_runs(server):
    """Issue 18: gradio_client's job.cancel() returned True while the server computed the cancelled job to its
    end, and every job behind it waited. Each step here waits (bounded) for the cancel, so the job cannot finish
    before it: it ends Cancelled at the step where the cancel arrived, and the next API job runs."""
    from gradio_client import Client

    stepping, ended, steps_seen = threading.Event(), [], []
    real = server.session.generate

    def watched(request, on_step=None, cancel=None, **kw):
        def step(i, total):
            steps_seen.append(i)
            stepping.set()
            on_step(i, total)
            if request.prompt == "cancel me":
                cancel.wait(90)
        try:
            return real(request, on_step=step, cancel=cancel, **kw)
        except Exception as exc:
            ended.append(exc)
            raise

    server.session.generate = watched
    try:
        client = Client(server.url, verbose=False)
        job = client.submit(prompt="cancel me", width=64, height=64, steps=150, batch_size=4, api_name="/generate")
        assert stepping.wait(60)
        assert job.cancel()
        deadline = time.monotonic() + 90
        while not ended and time.monotonic() < deadline:  # bounded wait for the job to notice
            time.sleep(0.2)
        assert ended and type(ended[0]).__name__ == "Cancelled", ended
        assert max(steps_seen) < 150  # stopped where the cancel arrived, not at the end
        images, info, summary, seed = client.predict(prompt="the next one", width=64, height=64, steps=2, seed=5,
                                                     api_name="/generate")
        assert info.startswith("the next one") and seed == 5
    finally:
        server.session.generate = real


@needs_browser
def test_closing_the_tab_mid_run_stops_the_job_and_the_next_one_runs(browser, server):
    stepping, ended = threading.Event(), []
    real = server.session.generate

    def watched(request, on_step=None, cancel=None, **kw):
        def step(i, total):
            stepping.set()
            on_step(i, total)
            cancel.wait(90)  # each step waits for the disconnect to cancel the job, so it cannot finish first
        try:
            return real(request, on_step=step, cancel=cancel, **kw)
        except Exception as exc:
            ended.append(exc)
            raise

    server.session.generate = watched
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(server.url)
        page.wait_for_selector("#prompt textarea", timeout=30_000)
        page.locator("#prompt textarea").fill("a job nobody waits for")
        _set_slider(page, "steps", 20)
        page.click("#generate")
        assert stepping.wait(60)
        context.close()  # the browser goes away mid-run
        deadline = time.monotonic() + 90
        while not ended and time.monotonic() < deadline:  # bounded wait for the job to notice
            time.sleep(0.2)
    finally:
        server.session.generate = real
    assert ended and type(ended[0]).__name__ == "Cancelled" and "cancelled at step" in str(ended[0])
    from gradio_client import Client

    _, info, _, _ = Client(server.url, verbose=False).predict(prompt="next", width=64, height=64, steps=1,
                                                              api_name="/generate")
    assert info.startswith("next")


def test_cancel_answers_what_the_stopped_job_says_so_a_late_answer_cannot_overwrite_it():
    """The Cancel button's answer and the job's own last output race to the browser: they must agree."""
    from lowvram_gen.errors import Cancelled
    from lowvram_gen.jobs.registry import Job, Registry

    def work(on_step, cancel):
        for i in range(1, 1000):
            on_step(i, 999)
            if cancel.wait(60):  # a step that lasts until Cancel
                raise Cancelled(f"cancelled at step {i} of 999 <b>")
        raise AssertionError("the job was never cancelled")

    jobs = Registry()
    job = jobs.start("tab", Job(work))
    progress = job.progress()
    assert next(progress) == (1, 999)
    answer = jobs.answer_cancel("tab", "cancelling…")  # waits (up to CANCEL_WAIT_S) for the job to stop
    # a Textbox shows text, never HTML: the summary is not escaped (an API client would get "&lt;b&gt;")
    assert job.done.is_set() and answer == job.summary() == "cancelled at step 1 of 999 <b>"
    assert list(progress) == []  # the job's own stream ends: it has stopped
    jobs.finish("tab", job)
    assert jobs.answer_cancel("tab", "cancelling…") is None  # nothing runs: the UI leaves the summary alone


def test_a_full_queue_says_so(tmp_path):
    from gradio_client import Client

    srv = Server(tmp_path, queue_size=1)
    gate, running = threading.Event(), threading.Event()
    real = srv.session.generate

    def held(request, **kw):
        running.set()
        gate.wait(120)  # the first job holds the GPU until the test lets it go
        return real(request, **kw)

    srv.session.generate = held
    try:
        client = Client(srv.url, verbose=False)
        first = client.submit(prompt="first", width=64, height=64, steps=1, api_name="/generate")
        assert running.wait(60)
        second = client.submit(prompt="second", width=64, height=64, steps=1, api_name="/generate")
        deadline = time.monotonic() + 30
        while second.status().code.name not in ("IN_QUEUE", "QUEUE_FULL") and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(Exception, match="(?i)queue is full"):
            Client(srv.url, verbose=False).predict(prompt="third", width=64, height=64, steps=1, api_name="/generate")
        gate.set()
        assert first.result(timeout=120)[1].startswith("first")
        assert second.result(timeout=120)[1].startswith("second")
    finally:
        gate.set()
        srv.close()


@needs_browser
def test_invalid_width_shows_a_clear_error(page):
    page.locator("#prompt textarea").fill("x")
    _fill_number(page, "width", 500)
    page.click("#generate")
    toast = page.get_by_text("invalid width: 500", exact=False).first
    toast.wait_for(timeout=30_000)
    assert "multiple of 8" in toast.inner_text()


@needs_browser
def test_html_in_user_text_is_shown_as_text_not_markup(page):
    page.locator("#prompt textarea").fill("x")
    page.locator("#model input").first.fill("<img src=x id=injected onerror=\"document.title='pwned'\">")
    page.locator("#model input").first.press("Enter")
    page.click("#generate")
    shown = page.get_by_text("model not found", exact=False).first
    shown.wait_for(timeout=60_000)
    assert "<img src=x id=injected" in shown.inner_text()  # the user's text, shown as text
    assert page.locator("#injected").count() == 0 and page.title() != "pwned"


@needs_browser
def test_with_gradio_auth_nobody_gets_in_without_the_password(browser, tmp_path):
    srv = Server(tmp_path, auth="alice:wonderland")
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(srv.url)
        user, password = page.get_by_label("username"), page.get_by_label("password")
        password.wait_for(timeout=30_000)
        assert page.locator("#prompt").count() == 0
        user.fill("alice")
        password.fill("wrong")
        page.get_by_role("button", name="Login").click()
        page.get_by_text("Incorrect", exact=False).first.wait_for(timeout=30_000)
        assert page.locator("#prompt").count() == 0
        user.fill("alice")
        password.fill("wonderland")
        page.get_by_role("button", name="Login").click()
        page.wait_for_selector("#prompt textarea", timeout=30_000)
        context.close()
        with pytest.raises(Exception):  # and the API is closed too
            from gradio_client import Client

            Client(srv.url, verbose=False).predict(prompt="x", api_name="/generate")
    finally:
        srv.close()


def test_gradio_client_generate_with_only_a_prompt(server):
    from gradio_client import Client

    gallery, info, summary, seed = Client(server.url, verbose=False).predict(prompt="a red fox", api_name="/generate")
    assert len(gallery) == 1 and info.startswith("a red fox") and "Size: 512x512" in info
    assert isinstance(seed, (int, float)) and "finished at" in summary
    # the tiny model's note speaks of the UI's Model box, not of the CLI's --model
    assert "pick a real model in the Model box" in summary and "--model" not in summary


def test_a_job_that_does_not_fit_the_ram_is_refused_and_the_ui_keeps_serving(server):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(server.url, verbose=False)
    server.session.ram_budget = 64 * 1024**2  # as if the machine had 64 MiB free
    try:
        with pytest.raises(AppError, match="of system RAM.*this machine has 64 MiB usable"):
            client.predict(prompt="too big", width=64, height=64, steps=1, api_name="/generate")
    finally:
        server.session.ram_budget = None
    _, info, _, _ = client.predict(prompt="fits", width=64, height=64, steps=1, api_name="/generate")
    assert info.startswith("fits")


def test_two_clients_at_once_both_finish_one_after_the_other(server):
    from gradio_client import Client

    spans, real = [], server.session.generate

    def timed(request, **kw):
        start = time.monotonic()
        try:
            return real(request, **kw)
        finally:
            spans.append((start, time.monotonic()))

    server.session.generate = timed
    try:
        results = {}

        def call(name):
            results[name] = Client(server.url, verbose=False).predict(
                prompt=name, width=64, height=64, steps=2, api_name="/generate")

        threads = [threading.Thread(target=call, args=(n,)) for n in ("first", "second")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        server.session.generate = real
    assert set(results) == {"first", "second"}
    assert all(r[1].startswith(name) for name, r in results.items())
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0  # one GPU, one job at a time: the second started after the first ended


def test_file_routes_serve_only_the_output_folder(server, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the browser")
    for target in (secret, Path("/etc/passwd"), server.outdir / ".." / ".." / "secret.txt"):
        url = f"{server.url}gradio_api/file={target}"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=30)
        assert err.value.code in (403, 404)
    inside = next(server.outdir.rglob("*.png"), None)
    if inside is not None:
        with urllib.request.urlopen(f"{server.url}gradio_api/file={inside}", timeout=30) as response:
            assert response.status == 200


def test_listen_or_share_without_auth_warns_loudly():
    from lowvram_gen.server import exposure_warning, parse_auth

    assert "WITHOUT a password" in exposure_warning(True, False, None)
    assert "gradio.live" in exposure_warning(False, True, None)
    assert exposure_warning(True, False, [("a", "b")]) is None and exposure_warning(False, False, None) is None
    assert parse_auth("a:b,c:d") == [("a", "b"), ("c", "d")]
    with pytest.raises(Exception, match="user:password"):
        parse_auth("nocolon")


def test_img2img_and_upscale_endpoints(server, tmp_path):
    from gradio_client import Client, handle_file
    from PIL import Image

    source = tmp_path / "init.png"
    Image.new("RGB", (96, 64), (200, 40, 40)).save(source)
    client = Client(server.url, verbose=False)
    gallery, info, summary, _ = client.predict(init_image=handle_file(str(source)), prompt="a boat", strength=0.5,
                                               width=96, height=64, steps=2, api_name="/img2img")
    assert info.startswith("a boat") and "Denoising strength: 0.5" in info and len(gallery) == 1
    upscaled, what = client.predict(image=handle_file(str(source)), scale=2, upscaler="lanczos", api_name="/upscale")
    assert Image.open(upscaled).size == (192, 128) and "x2" in what


def test_hires_fix_from_the_api(server):
    from gradio_client import Client

    _, info, summary, _ = Client(server.url, verbose=False).predict(
        prompt="hires", width=64, height=64, steps=2, hires_scale=2, hires_steps=1, api_name="/generate")
    assert "Size: 64x64" in info and "Hires upscale: 2" in info


# -- what a new user hit in the browser: each test failed before its fix ------------------------------------


@needs_browser
def test_gallery_shows_the_whole_non_square_image(page):
    _fill_job(page, "wide", 128, 64, 1)
    page.click("#generate")
    image = _gallery_image(page)
    assert image.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [128, 64]
    assert image.evaluate("img => getComputedStyle(img).objectFit") == "contain"  # not cropped to a square


def _cli_message(**fields) -> str:
    """What `lowvram-gen generate` says for these values: GenerationRequest.validated() makes the message."""
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.request import GenerationRequest

    with pytest.raises(InvalidRequest) as err:
        GenerationRequest(prompt="x", **fields).validated()
    return str(err.value)


@pytest.mark.parametrize("fields", [{"steps": 0}, {"width": 512.5}, {"steps": 151}, {"seed": -2}])
def test_api_refuses_what_the_cli_refuses_with_the_cli_message(server, fields):
    """Gradio's Slider refused steps 0 with its own words, its Number(precision=0) made 512.5 into 512."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as err:
        Client(server.url, verbose=False).predict(prompt="x", **fields, api_name="/generate")
    assert err.value.message == _cli_message(**fields)


@needs_browser
def test_browser_refuses_width_512_5_with_the_cli_message_and_its_sliders_start_at_1(page):
    """512.5 reaches our validation (not rounded to 512) and is refused with the CLI's message. The steps and
    batch sliders start at 1, as A1111's (issue 18: they went down to 0); the API's steps 0 is refused by name
    (test_api_refuses_what_the_cli_refuses_with_the_cli_message)."""
    assert page.locator("#steps input[type=range]").first.get_attribute("min") == "1"
    assert page.locator("#batch input[type=range]").first.get_attribute("min") == "1"
    page.locator("#prompt textarea").fill("x")
    _fill_number(page, "width", 512.5)
    page.click("#generate")
    page.get_by_text(_cli_message(width=512.5), exact=False).first.wait_for(timeout=30_000)
    page.locator("[data-testid=toast-close]").first.click()
    _fill_number(page, "width", 512)


def test_api_errors_are_verbatim_not_html_escaped(server):
    """The browser's toast renders HTML, so it gets escaped text (test_html_in_user_text_...); an API client
    gets the message itself."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as err:
        Client(server.url, verbose=False).predict(prompt="x", model="no/such<model>'s", api_name="/generate")
    message = err.value.message
    assert "no/such<model>'s" in message and "&lt;" not in message and "&#x27;" not in message


def test_messages_name_the_ui_controls_not_the_cli_flags(server):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from lowvram_gen.engines.sd.stepdown import ADVICE
    from lowvram_gen.ladder import Ladder

    real = server.session.generate

    def oom(request, **kw):
        raise Ladder([]).exhausted(ADVICE)  # what the SD engine raises when every step ran out of memory

    server.session.generate = oom
    try:
        with pytest.raises(AppError) as err:
            Client(server.url, verbose=False).predict(prompt="x", width=64, height=64, steps=1, api_name="/generate")
    finally:
        server.session.generate = real
    message = err.value.message
    assert "--vram-budget" not in message and "the VRAM budget and reserve sliders (System tab)" in message
    assert "run with the CPU (restart the web UI with `lowvram-gen ui --cpu`)" in message


def test_flag_table_rewrites_whole_flags_only():
    from lowvram_gen.ui.messages import for_ui

    assert for_ui("pass --model for real images") == "pick a real model in the Model box for real images"
    assert for_ui("a file to --model") == "a file to the Model box"
    assert for_ui("pass --vqgan x and --clip y") == "fill in the VQGAN box x and the CLIP box y"
    assert for_ui("fewer cutouts (--cutn)") == "fewer cutouts (the Cutouts slider)"
    assert for_ui("lower --reserve-vram") == "lower the reserve slider (System tab)"
    assert "--vqgan-config" in for_ui("--vqgan-config") and "no box" in for_ui("--vqgan-config")  # CLI only
    assert for_ui("hf download r --include x, --modelish") == "hf download r --include x, --modelish"


def test_last_seed_is_per_client_not_shared(server):
    """API level: the 4th output of /generate is the hidden number the browser's ♻ button reads. A second
    client whose job is cancelled (no image kept) used to get the first client's seed there."""
    from gradio_client import Client

    from lowvram_gen.errors import Cancelled

    first = Client(server.url, verbose=False).predict(prompt="first", width=64, height=64, steps=1, seed=1234,
                                                      api_name="/generate")
    assert first[3] == 1234
    real = server.session.generate

    def cancelled(request, **kw):
        raise Cancelled("cancelled at step 1 of 1; 0 finished image(s) kept")

    server.session.generate = cancelled
    try:
        second = Client(server.url, verbose=False).predict(prompt="second", width=64, height=64, steps=1,
                                                           api_name="/generate")
    finally:
        server.session.generate = real
    assert "cancelled at step 1" in second[2]
    assert second[3] != 1234  # not the other client's seed: this client has none yet


PLANNED = "() => document.querySelector('#plan-table').innerText.includes('system RAM')"  # the cpu row is there


@needs_browser
def test_system_tab_on_a_cpu_estimates_the_cpu_preset(page, server):
    page.get_by_role("tab", name="System").click()
    page.click("#estimate")
    page.wait_for_function("() => document.querySelector('#plan').innerText.includes('Would run')", timeout=60_000)
    assert "Would run: cpu" in page.locator("#plan").inner_text()
    page.wait_for_function(PLANNED, timeout=30_000)
    table = page.locator("#plan-table").first.inner_text()
    # the picked row first: the VRAM estimate as the GPU rows have it, the RAM estimate the planner picked it
    # by, then its step time and whether that was measured or assumed
    chosen = page.locator("#plan").inner_text().split("Would run: ", 1)[1].split()[0]
    rows = table.split("batch", 1)[1].split("skipped", 1)[1].split()
    assert rows[0] == chosen and chosen.split("+")[0] == "cpu", table
    assert re.search(re.escape(chosen) + r"\s+\d+(\.\d)? [MG]iB\s+system RAM\s+\d+(\.\d)? [MG]iB\s+yes\s+"
                     r"[\d.e-]+\s+(assumed|measured \(\d+\))\s+512x512\s+1\b", table), table


@needs_browser
def test_system_tab_sliders_on_a_cpu_are_shown_disabled_with_the_session_values(page, server):
    """On a CPU the VRAM budget and reserve mean nothing: the sliders say so and cannot be dragged, yet they
    still show the values in force (set from the command line or the API) whenever the page loads."""
    from lowvram_gen.hardware.device import GiB

    saved = server.session.vram_limits()
    try:
        server.session.set_vram_limits(6 * GiB, int(1.5 * GiB))  # changed elsewhere (another tab, the API)
        page.reload()
        page.get_by_role("tab", name="System").click()
        page.wait_for_function("() => document.querySelector('#budget input[type=number]').value === '6'",
                               timeout=30_000)
        assert page.locator("#reserve input[type=number]").first.input_value() == "1.5"
        for slider in ("budget", "reserve"):
            assert page.locator(f"#{slider} input[type=range]").first.is_disabled()
        assert "no GPU here" in page.locator("#budget").first.inner_text()
        assert page.locator("#free").first.inner_text().strip() == "Free memory (unload the model)"
    finally:
        server.session.set_vram_limits(*saved)


def test_free_memory_says_what_it_unloaded_and_what_came_back(monkeypatch):
    """'Free VRAM' used to answer with the device line only: now it names the model it unloaded and the memory
    given back (system RAM on a CPU)."""
    import itertools

    from lowvram_gen.ui.tabs import system

    class FakeSession:
        loaded = "tiny"

        def device(self):
            return type("D", (), {"kind": "cpu", "is_accelerator": False})()

        def loaded_model_name(self):
            return self.loaded

        def free(self):
            self.loaded = None

    rss = itertools.cycle([900 * 2**20, 300 * 2**20])
    monkeypatch.setattr("lowvram_gen.hardware.hostmem.process_rss", lambda: next(rss))
    session = FakeSession()
    text = system.free_memory_text(session, lambda: "device line")
    assert text.startswith("device line") and "unloaded `tiny`" in text and "600 MiB of system RAM" in text
    assert "no model was loaded" in system.free_memory_text(session, lambda: "device line").split("Freed", 1)[1]


def test_failures_on_the_cpu_are_neither_remembered_nor_shown():
    import json

    from lowvram_gen import failures
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.ui.tabs.system import failures_table

    cpu = probe("cpu").name
    failures.record(cpu, "tiny", "highvram", 64 * 64, 1)  # a simulated OOM on this CPU
    failures.record("Some GPU", "tiny", "highvram", 64 * 64, 1, kind="cpu")
    assert failures.load() == []
    failures.record("NVIDIA GeForce RTX 3060", "tiny", "highvram", 64 * 64, 1)
    # a CPU entry remembered by an older version is not shown as a GPU failure
    records = failures.load() + [{"device": cpu, "model": "tiny", "preset": "medvram", "pixels": 4096, "batch": 1,
                                  "work": 4096}]
    failures._path().write_text(json.dumps(records), encoding="utf-8")
    assert failures_table() == [["NVIDIA GeForce RTX 3060", "tiny", "highvram", 4096, 1]]


def test_every_tab_is_built_by_one_signature():
    import inspect

    from lowvram_gen.ui.app import TABS

    names = [t.__name__.rsplit(".", 1)[1] for t in TABS]
    assert names == ["txt2img", "img2img", "inpaint", "video", "upscale", "pnginfo", "browser", "vqgan", "system",
                     "settings"]
    for tab in TABS:
        assert str(inspect.signature(tab.build)) == "(ctx: lowvram_gen.ui.context.TabContext) -> None"


def test_the_ui_uses_session_methods_not_its_fields_or_lock():
    import re

    ui = Path(__file__).resolve().parent.parent / "lowvram_gen" / "ui"
    field = re.compile(r"session\.(model|runner|lock|vram_budget|reserve_vram|outdir|_device|device_pref|"
                       r"preset_spec|presets_dir)\b")
    found = [f"{p.name}: {m.group(0)}" for p in ui.rglob("*.py") for m in field.finditer(p.read_text())]
    assert found == []


# -- what A1111 and Forge users type and click (issue 11) ---------------------------------------------------


def _pixels(path):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


@needs_browser
def test_a_png_dropped_on_png_info_fills_txt2img_and_regenerates_the_same_image(page, server, tmp_path):
    from lowvram_gen import GenerationRequest

    original = server.session.generate(GenerationRequest(
        prompt="a lighthouse, <b>dusk</b>", negative_prompt="fog", width=64, height=72, steps=2, seed=4242,
        cfg_scale=5.5, sampler="Euler a", outdir=str(tmp_path))).images[0]
    _drop_on_png_info(page, original, "Seed: 4242")
    page.click("#pnginfo-to-txt2img")
    _value_is(page, "#prompt textarea", "a lighthouse, <b>dusk</b>")  # the txt2img tab is showing, filled
    assert page.locator("#negative textarea").input_value() == "fog"
    assert page.locator("#width input").first.input_value() == "64"
    assert page.locator("#steps input[type=number]").first.input_value() == "2"
    _generate_and_match(page, server, original, 4242)


@needs_browser
def test_a_png_without_parameters_says_so(page, tmp_path):
    from PIL import Image

    plain = tmp_path / "plain.png"
    Image.new("RGB", (32, 32), (1, 2, 3)).save(plain)
    page.get_by_role("tab", name="PNG Info").click()
    page.locator("#pnginfo-image input[type=file]").set_input_files(str(plain))
    page.get_by_text("No generation parameters", exact=False).first.wait_for(timeout=30_000)
    page.click("#pnginfo-to-txt2img")
    page.get_by_text("holds no generation parameters", exact=False).first.wait_for(timeout=30_000)  # a toast


@needs_browser
def test_ctrl_enter_generates_and_the_gallery_sends_on_to_img2img_and_upscale(page):
    _fill_job(page, "sent on", 64, 64, 1)
    page.locator("#prompt textarea").press("Control+Enter")
    page.wait_for_function("() => document.querySelector('#info textarea').value.startsWith('sent on')",
                           timeout=120_000)
    page.click("#txt2img-to-img2img")
    page.locator("#i2i-init img").first.wait_for(timeout=30_000)  # the image, in the img2img tab now showing
    _value_is(page, "#i2i-prompt textarea", "sent on")
    page.locator("#i2i-prompt textarea").fill("then img2img")
    page.locator("#i2i-prompt textarea").press("Control+Enter")
    page.locator("#i2i-gallery img").first.wait_for(timeout=120_000)
    page.click("#img2img-to-upscale")
    page.locator("#upscale-image img").first.wait_for(timeout=30_000)


@needs_browser
def test_lora_and_embedding_pickers_add_to_the_prompt_after_a_refresh(page, tmp_path, monkeypatch):
    _pick_a_lora_and_an_embedding(page, tmp_path, monkeypatch)


# -- the Quantize box (issue 10, "weights that fit") ----------------------------------------------------------


def _png_with(path: Path, parameters: str) -> str:
    """A PNG whose A1111 `parameters` text is `parameters` (what PNG Info reads)."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", parameters)
    Image.new("RGB", (64, 64), (9, 9, 9)).save(path, pnginfo=info)
    return str(path)


def test_quantize_int8_from_the_api_runs_int8_and_the_png_says_so(server):
    from gradio_client import Client

    from lowvram_gen.models.quantize import is_quantized
    from lowvram_gen.outputs import read_png_metadata

    gallery, info, summary, _ = Client(server.url, verbose=False).predict(
        prompt="int8 fox", width=64, height=64, steps=1, seed=8, quantize="int8", api_name="/generate")
    assert "Quantize: int8" in info
    made = next(server.outdir.rglob("*-8-*.png"))
    assert "Quantize: int8" in read_png_metadata(made)[0]  # the file itself, not only the info box
    assert any(is_quantized(m) for m in server.session.model.pipe.unet.modules())  # the weights really are int8


def test_as_the_preset_says_leaves_quantize_to_the_preset_and_a_bad_value_is_refused_by_name(server):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from lowvram_gen.ui.widgets import AS_PRESET

    seen, real = [], server.session.generate

    def spy(request, **kw):
        seen.append(request.quantize)
        return real(request, **kw)

    server.session.generate = spy
    client = Client(server.url, verbose=False)
    try:
        for quantize in ({"quantize": AS_PRESET}, {}):  # chosen, and an older client that does not send it
            _, info, _, _ = client.predict(prompt="as the preset", width=64, height=64, steps=1, **quantize,
                                           api_name="/generate")
            assert "Quantize:" not in info  # the CPU preset stores no int8/int4 weights
        with pytest.raises(AppError) as err:
            client.predict(prompt="x", width=64, height=64, steps=1, quantize="int3", api_name="/generate")
        # and the UI still works after the refusal
        assert client.predict(prompt="after", width=64, height=64, steps=1, quantize="none",
                              api_name="/generate")[1].startswith("after")
    finally:
        server.session.generate = real
    assert seen == [None, None, "none"]  # the refused one never reached the session
    message = err.value.message  # our validation's words (not Gradio's "not in the list of choices")
    assert message.startswith("invalid quantize: 'int3'") and "none, int8, int4" in message
    assert AS_PRESET in message and "leave it out" not in message  # the UI's choice, not the CLI's advice


def test_send_to_sets_quantize_from_the_png_and_resets_it_without_one(tmp_path):
    from lowvram_gen.ui import sendto
    from lowvram_gen.ui.widgets import AS_PRESET

    text = "a fox\nSteps: 2, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny"
    int4 = _png_with(tmp_path / "int4.png", text + ", Quantize: int4")
    plain = _png_with(tmp_path / "plain.png", text)
    for keys in (sendto.TXT2IMG, sendto.IMG2IMG):
        at = keys.index("quantize")
        assert sendto.values_for(keys, int4)[0][at] == "int4"
        assert sendto.values_for(keys, plain)[0][at] == AS_PRESET  # weights as the preset stores them


def test_send_to_fills_the_schedule_type_from_either_form_and_automatic_without_one(tmp_path):
    """Issue 19: a PNG's `Schedule type` (A1111 1.9+) or combined name (`DPM++ 2M Karras`) fills the Schedule type box
    beside the Sampler; a PNG whose sampler says none ran Automatic, so the box goes back to it."""
    from lowvram_gen.ui import sendto

    rest = ", CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny"
    new = _png_with(tmp_path / "new.png", "a fox\nSteps: 2, Sampler: DPM++ SDE, Schedule type: Karras" + rest)
    old = _png_with(tmp_path / "old.png", "a fox\nSteps: 2, Sampler: DPM++ 2M Karras" + rest)
    plain = _png_with(tmp_path / "plain.png", "a fox\nSteps: 2, Sampler: Euler" + rest)
    for keys in (sendto.TXT2IMG, sendto.IMG2IMG):
        filled = {png: dict(zip(keys, sendto.values_for(keys, png)[0])) for png in (new, old, plain)}
        assert (filled[new]["sampler"], filled[new]["schedule_type"]) == ("DPM++ SDE", "karras")
        assert (filled[old]["sampler"], filled[old]["schedule_type"]) == ("DPM++ 2M", "karras")
        assert (filled[plain]["sampler"], filled[plain]["schedule_type"]) == ("Euler", "automatic")
        assert not sendto.values_for(keys, new)[1]  # nothing "not used"


def test_the_schedule_type_box_runs_it_and_refuses_what_the_sampler_cannot_take(server):
    """The Schedule type from the API (the box beside the Sampler) reaches the job and the PNG says it, Euler a with
    Karras too (issue 31: A1111's levels, no fallback); DDIM, which steps through timesteps of its own, refuses one
    in one sentence."""
    from gradio_client import Client

    client = Client(server.url, verbose=False)
    _, info, summary, _ = client.predict(prompt="karras fox", width=64, height=64, steps=2, seed=9, sampler="Euler",
                                         schedule_type="karras", api_name="/generate")
    assert "Sampler: Euler, Schedule type: Karras," in info and "schedule" not in summary
    _, info, summary, _ = client.predict(prompt="ancestral fox", width=64, height=64, steps=2, seed=9,
                                         sampler="Euler a", schedule_type="karras", api_name="/generate")
    assert "Sampler: Euler a, Schedule type: Karras," in info and "schedule" not in summary
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="sampler 'DDIM' steps through timesteps of its own"):
        client.predict(prompt="ddim fox", width=64, height=64, steps=2, seed=9, sampler="DDIM",
                       schedule_type="karras", api_name="/generate")


def test_send_to_sets_clip_skip_from_the_png_and_resets_it_without_one(tmp_path):
    """A1111 writes `Clip skip:` only above 1: a PNG without it was made with 1, so a send puts the box back to 1."""
    from lowvram_gen.ui import sendto

    text = "a fox\nSteps: 2, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny"
    two = _png_with(tmp_path / "two.png", text + ", Clip skip: 2")
    plain = _png_with(tmp_path / "plain.png", text)
    for keys in (sendto.TXT2IMG, sendto.IMG2IMG):
        at = keys.index("clip_skip")
        values, said = sendto.values_for(keys, two)
        assert values[at] == 2 and not any("Clip skip" in line for line in said)
        assert sendto.values_for(keys, plain)[0][at] == 1


def test_clip_skip_from_the_api_reaches_the_png(server):
    from gradio_client import Client

    from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata

    client = Client(server.url, verbose=False)
    _, info, _, _ = client.predict(prompt="clip fox", width=64, height=64, steps=1, seed=19, clip_skip=2,
                                   api_name="/generate")
    assert "Clip skip: 2" in info
    made = next(server.outdir.rglob("*-19-*.png"))
    assert parse_a1111_parameters(read_png_metadata(made)[0])["Clip skip"] == "2"
    _, info, _, _ = client.predict(prompt="clip fox", width=64, height=64, steps=1, seed=20, api_name="/generate")
    assert "Clip skip" not in info  # an older client that does not send it: 1, off


def test_estimate_plans_the_quantize_choice(tmp_path):
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.widgets import AS_PRESET

    session = Session(outdir=str(tmp_path))
    planned, real = [], session.plan
    session.plan = lambda request, *a, **kw: planned.append(request.quantize) or real(request, *a, **kw)
    app = build_app(session, UiOptions(outdir=str(tmp_path)))
    plan_table = next(f.fn for f in app.fns.values() if getattr(f.fn, "__name__", "") == "plan_table")
    for choice in ("int4", AS_PRESET):
        plan_table("x", "", 64, 64, 2, 7, -1, 1, "default", "tiny", choice)
    assert planned == ["int4", None]


@needs_browser
def test_png_info_sends_quantize_to_img2img_and_a_png_without_it_resets_it(page, tmp_path):
    from lowvram_gen.ui.widgets import AS_PRESET

    text = "a fox\nSteps: 2, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny"
    page.get_by_role("tab", name="PNG Info").click()
    for name, extra, expected in (("int4.png", ", Quantize: int4", "int4"), ("plain.png", "", AS_PRESET)):
        page.locator("#pnginfo-image input[type=file]").set_input_files(_png_with(tmp_path / name, text + extra))
        page.wait_for_function("([t]) => document.querySelector('#pnginfo-parameters textarea').value.endsWith(t)",
                               arg=[(text + extra)[-12:]], timeout=30_000)
        page.click("#pnginfo-to-img2img")
        _value_is(page, "#i2i-quantize input", expected)
        page.get_by_role("tab", name="PNG Info").click()


def test_preset_pixel_caps_read_as_sizes():
    """The Presets table showed `max pixels 1048576`; people say 1024x1024."""
    from lowvram_gen.ui.tabs.system import _pixels

    assert _pixels(1024 * 1024) == "1024x1024"
    assert _pixels(512 * 768) == "393,216 px"


# -- issue 18, the UI's rough edges: each test failed before its fix ------------------------------------------

VQGAN_TEXT = ("a lighthouse at dusk\nSteps: 5, Sampler: Adam, Seed: 77, Size: 64x48, Model: tiny, CLIP: tiny, "
              "Engine: VQGAN-CLIP, Cutouts: 8, Cut power: 1.0, Learning rate: 0.1")  # what vqgan/job.py writes


def test_send_to_fills_what_it_can_from_a_vqgan_png_and_lists_what_it_did_not_use(tmp_path):
    """A VQGAN-CLIP image's `Sampler: Adam` refused the whole send (and the user saw nothing): now the prompt,
    seed, size and steps are filled, and the note names what was not used, with why."""
    from lowvram_gen.ui import sendto

    png = _png_with(tmp_path / "vqgan.png", VQGAN_TEXT)
    values, said = sendto.values_for(sendto.TXT2IMG, png)
    filled = dict(zip(sendto.TXT2IMG, values))
    assert (filled["prompt"], filled["seed"], filled["width"], filled["height"], filled["steps"]) == (
        "a lighthouse at dusk", 77, 64, 48, 5)
    assert not isinstance(filled["sampler"], str)  # gr.update(): the Sampler box stays as it is
    assert any("Sampler 'Adam'" in line and "Euler a" in line for line in said), said
    assert any(line.startswith("not used (no such setting here): CLIP, Engine, Cutouts") for line in said), said
    note = sendto.note_text(png, said)
    assert note.startswith("**Filled from vqgan.png**") and "Sampler &#x27;Adam&#x27;" in note


def test_every_unqueued_handler_is_one_that_raises_nothing_for_the_user(tmp_path):
    """gradio shows neither the error nor the warning of an event run with queue=False (checked in Chromium:
    the toast never comes). Only these handlers stay unqueued, each for a reason: a string edit of the
    prompt, the gallery's selected index, Interrupt, Skip and the page's restore (they must get through a full
    queue), ♻ last seed and 🎲 (they set a number: the VQGAN tab's ♻ reads a file, so it is queued), ⇅ (swaps two
    numbers), the init image's size (img2img's and the Inpaint editor's: it catches what Pillow raises), the
    System tab's 3 s timer, the Extra
    seed checkbox (it only shows its row, or hides it and sets numbers to 0: nothing to raise), the live preview's
    show, refresh and hide (they set visibility, or read the job's latest preview and progress line), a ControlNet unit's canny thresholds
    shown for canny only (visibility), a ControlNet upload ticking its Enable (sets a checkbox), the SD VAE box and
    its Refresh (keep a name, list a folder: an unknown VAE is refused by the job), the RNG source radio (it keeps one
    of the three values it offers), the remembered values (they validate, and log what they drop), the token counter
    (it catches everything: a count never stops the page), Generate forever's next-job check and Interrupt's untick
    (read a flag, set a checkbox) and the Settings tab's Apply, Reset and restore (they validate and say what they
    refuse in the tab). A new unqueued handler fails here."""
    from lowvram_gen.ui.app import build_app
    from lowvram_gen.ui.context import UiOptions

    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path)))
    unqueued = sorted({(f.fn.__module__.rsplit(".", 1)[1], f.fn.__qualname__) for f in app.fns.values()
                       if not f.queue and f.fn is not None})
    assert unqueued == sorted({
        ("pickers", "build.<locals>.add_lora"), ("pickers", "build.<locals>.add_embedding"),
        ("sendto", "gallery_buttons.<locals>.remember"), ("sendto", "gallery_buttons.<locals>.<lambda>"),
        ("context", "TabContext.cancel"), ("vqgan", "build.<locals>.cancel"), ("vqgan", "build.<locals>.<lambda>"),
        ("widgets", "seed_buttons.<locals>.<lambda>"), ("widgets", "swap_button.<locals>.<lambda>"),
        ("img2img", "size_from"), ("inpaint", "build.<locals>.editor_size"), ("rng_setting", "row.<locals>.chosen"), ("system", "build.<locals>.device_text"), ("remembered", "wire.<locals>.remember"),
        ("remembered", "wire.<locals>.restore"), ("widgets", "seed_extras.<locals>.toggle"),
        ("context", "TabContext.skip"), ("live", "shown_while_running.<locals>.start"),
        ("live", "shown_while_running.<locals>.refresh"), ("live", "wire.<locals>.end"),
        ("controlnet", "show_thresholds"), ("controlnet", "_unit.<locals>.<lambda>"), ("vae_picker", "row.<locals>.chosen"), ("vae_picker", "refreshed"),
            ("family_defaults", "on_pick"), ("token_counter", "counted"), ("forever", "again"),
            ("forever", "wire.<locals>.<lambda>"), ("settings", "_applied_entry.<locals>.entry"),
            ("settings", "_wire.<locals>.reset_all"), ("settings", "_wire.<locals>.restore"),
            ("xyz", "build.<locals>.<lambda>"),  # the Script dropdown shows its controls: a visibility update
            # the Video tab's: its own progress timer's start/refresh and end (ui/live.py's, keyed by its job),
            # Interrupt, and a model pick filling in the model's own frames/fps/size/steps/CFG (read offline; a
            # model it cannot tell leaves them as they are)
            ("video", "_end_of_run.<locals>.<lambda>"), ("video", "_on_pick"),
            ("video", "_shown_while_running.<locals>.refresh"), ("video", "_shown_while_running.<locals>.start"),
            ("video", "build.<locals>.cancel")})


@needs_browser
def test_png_info_sends_a_vqgan_png_to_txt2img_and_says_what_was_not_used(page, tmp_path):
    png = _png_with(tmp_path / "vqgan-made.png", VQGAN_TEXT)
    _drop_on_png_info(page, png, "Adam")
    page.click("#pnginfo-to-txt2img")
    _value_is(page, "#prompt textarea", "a lighthouse at dusk")  # the txt2img tab is showing, filled
    note = page.locator("#txt2img-sent")
    note.get_by_text("Sampler 'Adam'", exact=False).wait_for(timeout=30_000)
    assert note.is_visible() and "Filled from vqgan-made.png" in note.inner_text()
    assert "Engine" in note.inner_text() and page.locator("#seed input").first.input_value() == "77"
    # a PNG it cannot read at all: the error reaches the user (the send runs in the queue, so gradio shows it)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    page.get_by_role("tab", name="PNG Info").click()
    page.locator("#pnginfo-image input[type=file]").set_input_files(str(broken))
    page.click("#pnginfo-to-img2img")
    page.get_by_text("invalid PNG", exact=False).first.wait_for(timeout=30_000)  # the toast


def test_a_user_error_is_one_console_line_and_a_bug_keeps_its_traceback(server, capsys):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(server.url, verbose=False)
    with pytest.raises(AppError):
        client.predict(prompt="x", width=500, height=64, steps=1, api_name="/generate")
    err = capsys.readouterr().err
    assert "lowvram-gen: error: invalid width: 500" in err and "Traceback" not in err, err
    real = server.session.generate

    def bug(request, **kw):
        raise RuntimeError("a real bug")

    server.session.generate = bug
    try:
        with pytest.raises(AppError):
            client.predict(prompt="x", width=64, height=64, steps=1, api_name="/generate")
    finally:
        server.session.generate = real
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a real bug" in err


def test_the_console_says_when_each_job_starts_and_ends(server, capsys):
    from gradio_client import Client

    long_prompt = "a console fox " * 10
    _, info, _, seed = Client(server.url, verbose=False).predict(prompt=long_prompt, width=64, height=64, steps=2,
                                                                seed=5, api_name="/generate")
    err = capsys.readouterr().err
    started = [line for line in err.splitlines() if "txt2img started" in line]
    assert started == [f"lowvram-gen: txt2img started: '{long_prompt[:59]}…', 64x64, 2 steps, seed 5"], err
    ended = next(line for line in err.splitlines() if "txt2img ended in" in line)
    made = next(server.outdir.rglob("*-5-a-console-fox*.png"))  # not another test's seed-5 image
    assert re.search(r"ended in \d+\.\d s: .+; 1 file\(s\): ", ended) and made.name in ended, ended


@needs_browser
def test_the_gallery_offers_no_upload_and_its_selection_still_works(page):
    assert page.locator("#gallery").get_by_text("Drop Media Here", exact=False).count() == 0
    _fill_job(page, "two foxes", 64, 64, 1)
    _fill_number(page, "seed", 300)
    _set_slider(page, "batch", 2)
    page.click("#generate")
    page.wait_for_function("() => document.querySelectorAll('#gallery img').length === 2", timeout=120_000)
    assert page.locator("#gallery").get_by_text("Drop Media Here", exact=False).count() == 0
    page.locator("#gallery img").nth(1).click()  # select the second image: its own parameters
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('Seed: 301')",
                           timeout=30_000)
    _set_slider(page, "batch", 1)


@needs_browser
def test_refresh_beside_the_model_box_says_so_in_words_and_finds_a_new_model(page, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))  # the server runs in this process
    button = page.locator("#model-refresh")
    assert button.inner_text().strip() == "Refresh"  # text, not an emoji an emoji-less machine shows as a box
    box = button.bounding_box()
    model = page.locator("#model").bounding_box()
    assert abs(box["y"] - model["y"]) < model["height"] and 0 <= box["x"] - (model["x"] + model["width"]) < 40
    (tmp_path / "made-after-start").mkdir()
    (tmp_path / "made-after-start" / "model_index.json").write_text("{}")
    button.click()
    page.locator("#model input").first.click()
    page.get_by_role("option", name=str(tmp_path / "made-after-start")).wait_for(timeout=30_000)
    page.keyboard.press("Escape")


@needs_browser
def test_a_failed_job_keeps_its_error_in_the_summary_and_the_gallery_its_images(page):
    _fill_job(page, "kept", 64, 64, 1)
    page.click("#generate")
    _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.startsWith('kept')",
                           timeout=60_000)
    _fill_number(page, "width", 500)  # refused by the server's validation
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#summary textarea').value.includes('invalid width: 500')",
                           timeout=60_000)
    assert "multiple of 8" in page.locator("#summary textarea").input_value()
    assert page.locator("#gallery img").count() == 1 and page.locator("#info textarea").input_value().startswith("kept")
    for panel in ("#gallery", "#info", "#summary"):
        assert "Error" not in page.locator(panel).inner_text(), panel  # no gradio "Error" badge
    _fill_number(page, "width", 64)
    page.locator("#prompt textarea").fill("kept <lora:no such lora:1>")  # fails inside the job
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#summary textarea').value.includes('no such lora')",
                           timeout=120_000)
    assert page.locator("#gallery img").count() == 1 and "Error" not in page.locator("#gallery").inner_text()


def test_launch_prints_its_url_without_gradios_share_true_hint(tmp_path):
    import os
    import subprocess
    import sys

    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "lowvram_gen", "ui", "--port", str(port), "--outdir",
                             str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path)
    lines = []
    try:
        for line in proc.stdout:  # until the URL (a server that dies ends the loop)
            lines.append(line)
            if "Running on local URL" in line:
                break
        lines.append(proc.stdout.readline())  # the line after it, where gradio put its hint
    finally:
        proc.terminate()
        proc.wait(60)
    text = "".join(lines)
    assert f"http://127.0.0.1:{port}" in text, text
    assert "share=True" not in text and "--share" in text, text


def test_sd_x4_is_offered_only_where_its_model_is_here(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from lowvram_gen.a1111.upscaler_names import SD_X4_REPO, check_upscaler
    from lowvram_gen.ui.widgets import upscaler_choices

    monkeypatch.delenv("LOWVRAM_GEN_SD_X4", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert "sd-x4" not in upscaler_choices() and "sd-x4" not in upscaler_choices(hires=True)
    assert check_upscaler("sd-x4") == "sd-x4"  # the CLI still takes it, and says offline how to get it
    cache = tmp_path / "cache"
    snapshot = cache / ("models--" + SD_X4_REPO.replace("/", "--")) / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model_index.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert upscaler_choices()[-1] == "sd-x4"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    (tmp_path / "x4").mkdir()
    (tmp_path / "x4" / "model_index.json").write_text("{}")
    monkeypatch.setenv("LOWVRAM_GEN_SD_X4", str(tmp_path / "x4"))
    assert "sd-x4" in upscaler_choices()


def test_the_progress_says_waiting_only_behind_another_clients_job_and_counts_the_jobs_ahead():
    """Rough edge 9: a job that loads a model with nothing else queued said 'waiting for the GPU'. Issue 29 item 11:
    a job behind others (of the web UI or the REST API: one registry) says how many are ahead of it."""
    import threading

    from lowvram_gen.jobs.registry import Job, Registry

    jobs, release = Registry(), threading.Event()
    assert jobs.ahead("alice") == 0  # nothing runs: the progress says 'starting'
    job = jobs.start("alice", Job(lambda on_step, cancel: release.wait(30)))
    bobs = jobs.start("bob", Job(lambda on_step, cancel: None))
    try:
        assert jobs.ahead("alice") == 0  # alice's own job is not 'another'
        assert jobs.ahead("bob") == 1  # bob's job waits behind alice's
        assert jobs.ahead("carol") == 2  # not registered yet: behind both
    finally:
        release.set()
        job._thread.start()
        job.done.wait(30)
    assert jobs.ahead("bob") == 0  # alice's job is done
    jobs.finish("alice", job)
    jobs.finish("bob", bobs)


def test_a_vqgan_pngs_model_does_not_set_the_model_box(tmp_path):
    """VQGAN-CLIP writes its VQGAN's name as `Model:`; its 'tiny' set the diffusers Model box to the SD tiny."""
    import gradio as gr

    from lowvram_gen.ui import sendto

    png = _png_with(tmp_path / "vqgan.png", VQGAN_TEXT)
    values, said = sendto.values_for(sendto.TXT2IMG, png)
    filled = dict(zip(sendto.TXT2IMG, values))
    assert filled["model"] == gr.update()  # left as it is
    assert any("'tiny' is a VQGAN model" in line for line in said), said
    a1111 = _png_with(tmp_path / "sd.png", "a fox\nSteps: 5, Sampler: Euler a, Seed: 1, Size: 64x64, Model: tiny")
    assert dict(zip(sendto.TXT2IMG, sendto.values_for(sendto.TXT2IMG, a1111)[0]))["model"] == "tiny"


def test_send_to_sets_the_extra_seed_options_from_the_png_and_turns_them_off_without(tmp_path):
    """A1111 writes its variation fields only when used: a PNG with them ticks Extra and fills them; one without
    them puts them back off (the same seed would not give the same image otherwise)."""
    from lowvram_gen.ui import sendto

    text = "a fox\nSteps: 2, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny"
    varied = _png_with(tmp_path / "varied.png",
                       text + ", Variation seed: 9, Variation seed strength: 0.3, Seed resize from: 32x48")
    plain = _png_with(tmp_path / "plain.png", text)
    for keys in (sendto.TXT2IMG, sendto.IMG2IMG):
        values, said = sendto.values_for(keys, varied)
        got = dict(zip(keys, values))
        assert [got[k] for k in sendto.EXTRA_SEED] == [True, 9, 0.3, 32, 48]
        assert not any("Variation" in line or "resize" in line for line in said), said
        got = dict(zip(keys, sendto.values_for(keys, plain)[0]))
        assert [got[k] for k in ("seed_extra", "subseed_strength", "seed_resize_from_w", "seed_resize_from_h")] \
            == [False, 0, 0, 0]


def test_the_extra_seed_options_from_the_api_reach_the_png(server):
    from gradio_client import Client

    from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata

    client = Client(server.url, verbose=False)
    _, info, _, _ = client.predict(prompt="varied fox", width=64, height=64, steps=1, seed=23, subseed=7,
                                   subseed_strength=0.4, seed_resize_from_w=32, seed_resize_from_h=32,
                                   api_name="/generate")
    assert "Variation seed: 7, Variation seed strength: 0.4, Seed resize from: 32x32" in info
    made = next(server.outdir.rglob("*-23-*.png"))
    assert parse_a1111_parameters(read_png_metadata(made)[0])["Variation seed"] == "7"
    _, info, _, _ = client.predict(prompt="varied fox", width=64, height=64, steps=1, seed=24, api_name="/generate")
    assert "Variation seed" not in info and "Seed resize" not in info  # an older client's call: off


def test_the_extra_checkbox_shows_the_seed_options_and_unticking_turns_them_off(page):
    """As A1111's: the row is hidden until Extra is ticked; unticking it puts strength and sizes back to 0, so
    nothing hidden changes the image."""
    row = page.locator("#seed-extras")
    assert not row.is_visible()
    page.locator("#seed-extra input").check()
    row.wait_for(state="visible", timeout=10_000)
    strength = page.locator("#subseed-strength input[type=number]").first
    strength.fill("0.4")
    strength.press("Enter")
    page.locator("#seed-extra input").uncheck()
    row.wait_for(state="hidden", timeout=10_000)
    page.locator("#seed-extra input").check()
    row.wait_for(state="visible", timeout=10_000)
    assert strength.input_value() == "0"


def test_send_to_fills_hires_fixs_own_settings_and_puts_them_back_to_same_without(tmp_path):
    """Issue 19: an A1111 PNG's Hires resize, sampler, schedule type, CFG scale and prompts fill the Hires fix controls
    (nothing "not used"); a PNG without them puts them back to "the first pass's" (A1111 writes them only when they
    differ), or the same seed would not give the same image."""
    from lowvram_gen.request import SAME_SAMPLER, SAME_SCHEDULER
    from lowvram_gen.ui import sendto

    text = ("a fox\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, Denoising strength: 0.5, "
            'Hires sampler: DPM++ 2M, Hires prompt: "a fox, red", Hires negative prompt: blur, Hires CFG Scale: 4, '
            "Hires schedule type: Karras, Hires resize: 128x96, Hires steps: 3, Hires upscaler: Latent (bicubic)")
    values, said = sendto.values_for(sendto.TXT2IMG, _png_with(tmp_path / "hires.png", text))
    got = dict(zip(sendto.TXT2IMG, values))
    assert [got[k] for k in ("hires_resize_w", "hires_resize_h", "hires_sampler", "hires_schedule_type", "hires_cfg",
                             "hires_prompt", "hires_negative", "hires_steps", "hires_upscaler", "hires_scale")] == [
        128, 96, "DPM++ 2M", "karras", 4.0, "a fox, red", "blur", 3, "Latent (bicubic)", 1.0]
    assert not said, said
    plain = _png_with(tmp_path / "plain.png", "a fox\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 5, Size: 64x64, "
                                              "Model: tiny, Denoising strength: 0.5, Hires upscale: 2, Hires upscaler: "
                                              "Latent")
    got = dict(zip(sendto.TXT2IMG, sendto.values_for(sendto.TXT2IMG, plain)[0]))
    assert [got[k] for k in ("hires_resize_w", "hires_resize_h", "hires_sampler", "hires_schedule_type", "hires_cfg",
                             "hires_prompt", "hires_negative", "hires_steps", "hires_scale")] == [
        0, 0, SAME_SAMPLER, SAME_SCHEDULER, 0, "", "", 0, 2.0]


def test_hires_fixs_own_settings_from_the_api_reach_the_png(server):
    """The new Hires fix inputs come last in /generate's positional order; by name they reach the job."""
    from gradio_client import Client

    client = Client(server.url, verbose=False)
    # the first pass's sampler named: a hires sampler equal to the first pass's (DPM++ 2M Karras is the default
    # now) is not written, as in A1111
    _, info, _, _ = client.predict(prompt="a fox", width=64, height=64, steps=2, seed=31, sampler="Euler",
                                   hires_upscaler="lanczos",
                                   hires_steps=1, hires_resize_w=128, hires_resize_h=96, hires_sampler="DPM++ 2M",
                                   hires_schedule_type="karras", hires_cfg=4, hires_prompt="a fox, red",
                                   hires_negative="blur", api_name="/generate")
    assert ('Hires sampler: DPM++ 2M, Hires prompt: "a fox, red", Hires negative prompt: blur, Hires CFG Scale: 4, '
            "Hires schedule type: Karras, Hires resize: 128x96, Hires steps: 1, Hires upscaler: Lanczos") in info
    made = next(server.outdir.rglob("*-31-*.png"))
    from PIL import Image

    assert Image.open(made).size == (128, 96)
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    from lowvram_gen.ui import controlnet

    names = [p["parameter_name"] for p in api]
    start = names.index("hires_resize_w")  # after the older inputs; the newer ones (the ControlNet units) after it
    assert names[start:start + 7] == ["hires_resize_w", "hires_resize_h", "hires_sampler", "hires_schedule_type",
                                      "hires_cfg", "hires_prompt", "hires_negative"]
    assert names[-len(controlnet.KEYS):] == list(controlnet.KEYS)


@needs_browser
def test_png_info_fills_the_hires_controls_and_regenerates_the_same_hires_image(page, server, tmp_path):
    """A PNG made with Hires resize, its own sampler, schedule type, CFG and prompts, sent from PNG Info to txt2img
    and generated again in the browser: the same parameters, the same pixels."""
    from lowvram_gen import GenerationRequest

    original = server.session.generate(GenerationRequest(
        prompt="a lighthouse", negative_prompt="fog", width=64, height=64, steps=2, seed=5151, sampler="Euler",
        hires_resize_w=96, hires_resize_h=128, hires_steps=1, hires_sampler="DPM++ 2M", hires_schedule_type="karras",
        hires_cfg=4, hires_prompt="a lighthouse, red", hires_negative="rain", hires_upscaler="Latent (nearest-exact)",
        outdir=str(tmp_path))).images[0]
    _drop_on_png_info(page, original, "Seed: 5151")
    page.click("#pnginfo-to-txt2img")
    _value_is(page, "#prompt textarea", "a lighthouse")
    _generate_and_match(page, server, original, 5151)
