"""A1111's job controls in the web UI, in a real headless Chromium (tests/ui_helpers.py's fixtures): Batch count,
Skip, Interrupt that keeps the running image, and the live preview updating while a job runs.

A job that must still be running when the test clicks is held by a hook around Session.generate that waits for
the event the click sets (bounded waits, never sleeps): each test knows the step at which the click lands.
"""

from __future__ import annotations

import threading

import pytest

from lowvram_gen.jobs.registry import Job, Registry
from ui_helpers import _fill_job, _gallery_image, _set_slider, browser, needs_browser, page, server  # noqa: F401


def _gallery_count(page, n: int) -> None:
    """Wait until the gallery shows `n` images, every one loaded."""
    page.wait_for_function("(n) => { const imgs = [...document.querySelectorAll('#gallery img')];"
                           " return imgs.length === n && imgs.every(i => i.complete && i.naturalWidth > 0); }",
                           arg=n, timeout=120_000)


def _summary_has(page, text: str) -> None:
    page.wait_for_function("(t) => document.querySelector('#summary textarea').value.includes(t)", arg=text,
                           timeout=120_000)


@pytest.fixture()
def hold(server):
    """hold(when) -> an Event set once the job reaches the step `when(pass_number, step)` picks, where it then waits
    (up to 60 s) for the job's cancel or skip event: the click under test. Session.generate is restored after."""
    real = server.session.generate

    def install(when):
        reached = threading.Event()

        def held(request, on_step=None, cancel=None, **kw):
            passes = [0]

            def step(i, total):
                passes[0] += i == 1
                on_step(i, total)
                if when(passes[0], i):
                    reached.set()
                    for _ in range(600):  # until the button's event arrives (60 s at most)
                        if cancel.wait(0.1) or kw["skip"].is_set():
                            break
            return real(request, on_step=step, cancel=cancel, **kw)

        server.session.generate = held
        return reached

    yield install
    server.session.generate = real


@needs_browser
def test_batch_count_fills_the_gallery_with_count_times_size_images(page):
    _fill_job(page, "four boats", 64, 64, 2)
    _set_slider(page, "batch-count", 2)
    _set_slider(page, "batch", 2)
    page.click("#generate")
    _gallery_count(page, 4)
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('Seed:')", timeout=60_000)
    assert "finished at cpu" in page.locator("#summary textarea").input_value()


@needs_browser
def test_skip_keeps_the_running_batch_and_goes_on_with_the_next(page, hold):
    reached = hold(lambda batch, step: batch == 1 and step == 2)
    _fill_job(page, "skip the first", 64, 64, 20)
    _set_slider(page, "batch-count", 2)
    page.click("#generate")
    assert reached.wait(60)  # batch 1 of 2 is at step 2
    page.click("#skip")
    _summary_has(page, "1 image(s) skipped before their last step")
    _gallery_count(page, 2)  # the skipped batch's image and the next batch's, finished


@needs_browser
def test_interrupt_keeps_the_image_of_the_pass_it_stopped(page, hold):
    reached = hold(lambda batch, step: batch == 2 and step == 3)
    _fill_job(page, "interrupt the second", 64, 64, 20)
    _set_slider(page, "batch-count", 3)
    page.click("#generate")
    assert reached.wait(60)
    assert page.locator("#cancel").inner_text().strip() == "Interrupt"
    page.click("#cancel")
    _summary_has(page, "cancelled at step 3 of 20; 2 image(s) kept, the interrupted pass's as it was")
    _gallery_count(page, 2)  # the finished first batch and the interrupted second; no third


@needs_browser
def test_the_live_preview_updates_while_the_job_runs(page, server):
    """Each preview holds the job until the test has seen it in the page: the preview must change from one
    step's to the next's while the job still runs, then hide when the job ends."""
    real = server.session.generate
    seen = {step: threading.Event() for step in range(1, 5)}
    shown = []

    def held(request, on_step=None, cancel=None, **kw):
        def on_preview(image, step, total):
            kw["on_preview"](image, step, total)
            shown.append(step)
            seen[step].wait(60)  # until the page has shown it
        return real(request, on_step=on_step, cancel=cancel, **{**kw, "on_preview": on_preview})

    server.session.generate = held
    src = "() => { const i = document.querySelector('#live-preview img'); return i && i.complete && i.src; }"
    try:
        _fill_job(page, "a preview", 64, 64, 4)
        _set_slider(page, "preview-every", 1)
        page.click("#generate")
        first = page.wait_for_function(src, timeout=60_000).json_value()
        seen[1].set()
        second = page.wait_for_function(f"(old) => {{ const s = ({src})(); return s && s !== old && s; }}",
                                        arg=first, timeout=60_000).json_value()
        assert second != first and shown[:2] == [1, 2] and not shown[2:]  # the job was still at step 2
        for event in seen.values():
            event.set()
        _gallery_image(page)
        page.wait_for_selector("#live-preview", state="hidden", timeout=60_000)  # hidden once the job ended
    finally:
        for event in seen.values():
            event.set()
        server.session.generate = real


def test_registry_current_is_the_job_that_runs_and_skip_reaches_a_sessions_job():
    """A1111's global /interrupt and /skip act on the running job, whichever client started it (the REST API's
    use): current() is the job denoising, not one that waits for the GPU behind it."""
    jobs = Registry()
    release = threading.Event()
    stepping = threading.Event()

    def running(on_step, cancel):
        on_step(1, 20)
        stepping.set()
        release.wait(30)

    first = jobs.start("alice", Job(lambda on_step, cancel: release.wait(30)))  # waits for the GPU: no step yet
    second = jobs.start("bob", Job(running))
    for job in (first, second):
        job._thread.start()
    try:
        assert stepping.wait(30)
        assert jobs.current() is second and (second.step, second.total) == (1, 20)
        assert jobs.skip("bob") is second and second.skip.is_set() and not first.skip.is_set()
        assert jobs.skip("carol") is None
    finally:
        release.set()
    for job in (first, second):
        job.done.wait(30)
    assert jobs.current() is None and jobs.skip("bob") is None


def test_a_jobs_preview_is_its_latest_and_counted():
    job = Job(lambda on_step, cancel: None)
    assert job.preview is None and job.previews == 0
    job.on_preview("first", 1, 4)
    job.on_preview("second", 2, 4)
    assert job.preview == "second" and job.previews == 2
