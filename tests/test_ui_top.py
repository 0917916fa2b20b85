"""The top of the SD tabs as A1111 and Forge users know it (issue 29 items 11 and 15): Generate with Interrupt and Skip
beside the prompt, on screen at 1366x768 without scrolling; one progress line a tab (step, `batch i/n`, ETA, or the
jobs a waiting job is behind); ♻ last seed and 🎲 beside every seed; ⇅ swapping Width and Height; the LoRA/embedding
pickers on Inpaint too. In a real headless Chromium (tests/ui_helpers.py's fixtures), and at the Python level where
that is enough (the progress line's arithmetic, the job runner's queue position, the ♻ wiring of the tabs whose
jobs need an image).

A job that must still be running when the test looks is held by a hook around Session.generate that waits for an
event the test sets (bounded waits, never sleeps), as tests/test_ui_live.py's `hold` does.
"""

from __future__ import annotations

import threading
from contextlib import closing
from types import SimpleNamespace

import pytest
from PIL import Image

from lowvram_gen.jobs.progress import StepProgress, clock, waiting
from lowvram_gen.jobs.registry import Job, Registry
from lowvram_gen.jobs.run import run
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session
from ui_helpers import (_fill_job, _fill_number, _gallery_image, _pick_a_lora_and_an_embedding, _set_slider,  # noqa: F401
                        _value_is, browser, needs_browser, server)

TABS = {"txt2img": "", "img2img": "i2i-", "Inpaint": "inp-"}  # tab name -> elem_id prefix
VIEW = {"width": 1366, "height": 768}
# the text shown anywhere on the page that says a job's progress (one text node each time it is drawn)
SAYING = """() => { const found = [], walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) { const n = walk.currentNode, parent = n.parentElement;
    if (parent && parent.offsetParent !== null && /Step \\d+\\/\\d+|batch \\d+\\/\\d+|denoising|\\d+(\\.\\d+)?%/.test(n.textContent))
      found.push(n.textContent.trim()); }
  return found; }"""
LINE = "() => { const e = document.querySelector('#progress'); return e ? e.innerText : ''; }"


@pytest.fixture()
def page(browser, server):  # noqa: F811 - this module's page is a 1366x768 laptop screen
    context = browser.new_context(viewport=VIEW)
    pg = context.new_page()
    pg.goto(server.url)
    pg.wait_for_selector("#prompt textarea", timeout=30_000)
    yield pg
    context.close()


@pytest.fixture()
def held(server):
    """held(at) -> (reached, go): the job waits at each (pass, step) in `at` until the test sets `go[(pass, step)]`,
    after setting `reached[(pass, step)]`. Session.generate is restored after (every gate opened)."""
    real = server.session.generate
    gates = []

    def install(at):
        reached = {k: threading.Event() for k in at}
        go = {k: threading.Event() for k in at}
        gates.append(go)

        def generate(request, on_step=None, cancel=None, **kw):
            passes = [0]

            def step(i, total):
                passes[0] += i == 1
                on_step(i, total)
                if (passes[0], i) in reached:
                    reached[(passes[0], i)].set()
                    go[(passes[0], i)].wait(60)
            return real(request, on_step=step, cancel=cancel, **kw)

        server.session.generate = generate
        return reached, go

    yield install
    for go in gates:
        for event in go.values():
            event.set()
    server.session.generate = real


# -- the progress line, without a browser ------------------------------------------------------------------------


def test_the_progress_line_counts_batches_from_the_passes_and_says_the_eta():
    now = [100.0]
    line = StepProgress(batch_count=2, now=lambda: now[0])
    line.update(1, 4)
    assert line.line() == "Step 1/4 · batch 1/2"  # no ETA before a step has been timed
    now[0] += 2
    line.update(2, 4)  # 2 s a step; 2 steps left of this pass, 4 of the next
    assert line.line() == "Step 2/4 · batch 1/2 · ETA 0:12"
    for step in (3, 4, 1):
        now[0] += 2
        line.update(step, 4)
    assert line.line() == "Step 1/4 · batch 2/2 · ETA 0:06" and line.fraction() == pytest.approx(5 / 8)
    hires = StepProgress(batch_count=2, passes_per_batch=2)
    for _ in range(2):  # batch 1's first pass and its hires pass
        for step in (1, 2):
            hires.update(step, 2)
    assert hires.batch == 1
    hires.update(1, 2)
    assert hires.batch == 2 and "batch 2/2" in hires.line()
    for _ in range(4):  # more passes than planned (a pass retried after an out-of-memory step-down): capped
        hires.update(1, 2)
    assert hires.batch == 2
    assert StepProgress().line() == "Step 0/0" and "batch" not in StepProgress(batch_count=1).line()
    assert clock(3725) == "1:02:05" and waiting(1) == "Waiting: 1 job ahead" and waiting(2) == "Waiting: 2 jobs ahead"


def test_a_job_behind_another_clients_job_says_how_many_are_ahead_until_it_starts():
    """The job runner's line, as the web UI shows it, for a job that waits for the GPU (the Session's lock here) behind
    a job of another client, the REST API's or another browser's alike: both are in the one registry."""
    registry, gpu = Registry(), threading.Lock()
    release, holding, loaded = threading.Event(), threading.Event(), threading.Event()

    def first(on_step, cancel):
        with gpu:
            holding.set()
            release.wait(30)
        return SimpleNamespace(summary="first done", images=[])

    def second(on_step, cancel):
        with gpu:
            loaded.wait(30)  # "loading the model" until the test has seen the line say so
            on_step(1, 2)
            on_step(2, 2)
        return SimpleNamespace(summary="second done", images=[])

    api_job = Job(first)
    api = run(registry, "api-client", api_job, "API txt2img", GenerationRequest(prompt="first"), tick=0.01)
    next(api)  # the API job is registered and holds the GPU
    assert holding.wait(30)
    job, lines = Job(second), []
    with closing(run(registry, "browser", job, "txt2img", GenerationRequest(prompt="second", batch_count=2),
                     tick=0.01, progress=StepProgress(batch_count=2),
                     on_progress=lambda fraction, line: lines.append(line))) as events:
        next(events)
        assert job.line == "Waiting: 1 job ahead"
        release.set()
        for _ in events:  # ticks until the job ahead has ended
            if job.line == "Starting (loading the model)":
                break
        loaded.set()
        for _ in events:
            pass
    for _ in api:
        pass
    assert lines == ["Waiting: 1 job ahead", "Starting (loading the model)", "Step 1/2 · batch 1/2",
                     "Step 2/2 · batch 1/2 · ETA 0:00"]


# -- the page at 1366x768 ----------------------------------------------------------------------------------------


def _in_view(page, elem_id: str) -> bool:
    return page.evaluate("(id) => { const r = document.getElementById(id).getBoundingClientRect();"
                         " return window.scrollY === 0 && r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight"
                         " && r.right <= window.innerWidth; }", elem_id)


@needs_browser
def test_generate_interrupt_and_skip_are_on_screen_at_1366x768_on_every_sd_tab(page):
    for tab, prefix in TABS.items():
        page.get_by_role("tab", name=tab).click()
        page.locator(f"#{prefix}generate").wait_for(timeout=30_000)
        for name in ("generate", "cancel", "skip", "prompt"):
            assert _in_view(page, f"{prefix}{name}"), f"{tab}: #{prefix}{name} is not on screen without scrolling"


@needs_browser
def test_one_progress_line_says_step_batch_i_of_n_and_eta(page, held):
    reached, go = held([(1, 2), (2, 2)])
    _fill_job(page, "two batches", 64, 64, 4)
    _set_slider(page, "batch-count", 2)
    page.click("#generate")
    assert reached[(1, 2)].wait(60)
    page.wait_for_function(f"() => ({LINE})().startsWith('Step 2/4 · batch 1/2 · ETA ')", timeout=60_000)
    # the line is the one progress display of the tab: one element says the step, no gradio progress over outputs
    says = page.evaluate(SAYING)
    pulsing = page.evaluate("() => [...document.querySelectorAll('[data-testid=status-tracker]')].filter(e =>"
                            " e.offsetParent !== null && /generating|pending/.test(e.className)).length")
    assert (len(says), pulsing) == (1, 0), says
    go[(1, 2)].set()
    assert reached[(2, 2)].wait(60)
    page.wait_for_function(f"() => ({LINE})().includes('batch 2/2')", timeout=60_000)
    assert "ETA " in page.evaluate(LINE)
    go[(2, 2)].set()
    page.wait_for_function("() => document.querySelectorAll('#gallery img').length === 2", timeout=120_000)
    page.wait_for_function(f"() => ({LINE})() === ''", timeout=30_000)  # emptied once the job ended


@needs_browser
def test_a_job_behind_another_clients_job_shows_its_queue_position(page, server, held):
    """Another client's job (gradio_client, as an API script would) is held at its step 1; this browser's job waits
    behind it and says so in its progress line, then runs."""
    from gradio_client import Client

    reached, go = held([(1, 1)])
    client = Client(server.url, verbose=False)
    first = client.submit(prompt="first, held", width=64, height=64, steps=2, seed=1, api_name="/generate")
    assert reached[(1, 1)].wait(60)
    _fill_job(page, "second, waiting", 64, 64, 1)
    page.click("#generate")
    page.wait_for_function(f"() => ({LINE})() === 'Waiting: 1 job ahead'", timeout=60_000)
    go[(1, 1)].set()
    assert first.result(timeout=120)[1].startswith("first, held")
    page.wait_for_function("() => document.querySelector('#info textarea').value.startsWith('second, waiting')",
                           timeout=120_000)


# -- ♻, 🎲 and ⇅ -----------------------------------------------------------------------------------------------


def _seed_is(page, prefix: str, value: str) -> None:
    _value_is(page, f"#{prefix}seed input", value)


@needs_browser
def test_dice_and_swap_on_every_tab_with_a_seed_or_a_size(page):
    for tab, prefix in {**TABS, "VQGAN-CLIP": "vq-"}.items():
        page.get_by_role("tab", name=tab).click()
        _fill_number(page, f"{prefix}seed", 1234)
        page.click(f"#{prefix}random-seed")
        _seed_is(page, prefix, "-1")
        _fill_number(page, f"{prefix}width", 64)
        _fill_number(page, f"{prefix}height", 128)
        page.click(f"#{prefix}swap-size")
        _value_is(page, f"#{prefix}width input", "128")
        _value_is(page, f"#{prefix}height input", "64")


@needs_browser
def test_recycle_puts_the_last_seed_back_on_txt2img_and_img2img(page):
    _fill_job(page, "seeded", 64, 64, 1)
    _fill_number(page, "seed", 4242)
    page.click("#generate")
    _gallery_image(page)
    page.click("#random-seed")
    _seed_is(page, "", "-1")
    page.click("#reuse-seed")
    _seed_is(page, "", "4242")
    page.click("#txt2img-to-img2img")
    page.locator("#i2i-init img").first.wait_for(timeout=30_000)
    _fill_number(page, "i2i-seed", 77)
    page.click("#i2i-generate")
    page.locator("#i2i-gallery img").first.wait_for(timeout=120_000)
    page.click("#i2i-random-seed")
    _seed_is(page, "i2i-", "-1")
    page.click("#i2i-reuse-seed")
    _seed_is(page, "i2i-", "77")


def _click_handler(app, elem_id: str):
    """The function a click on the button `elem_id` runs, with the elem_ids of its inputs and outputs."""
    ids = {block._id: block for block in app.blocks.values()}
    button = next(b for b in ids.values() if getattr(b, "elem_id", None) == elem_id)
    fn = next(f for f in app.fns.values() if (button._id, "click") in [(t[0], t[1]) for t in f.targets])
    return fn.fn, [c.elem_id for c in fn.inputs], [c.elem_id for c in fn.outputs]


def test_recycle_on_inpaint_and_vqgan_reads_that_tabs_last_seed(tmp_path):
    """Their jobs need a drawn mask or minutes of VQGAN: the wiring is checked here, the clicks on txt2img and
    img2img in the browser (above)."""
    from lowvram_gen.outputs import save_png
    from lowvram_gen.ui.app import build_app
    from lowvram_gen.ui.context import UiOptions

    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path)))
    fn, inputs, outputs = _click_handler(app, "inp-reuse-seed")
    assert (inputs, outputs) == (["inp-last-seed"], ["inp-seed"]) and fn(31337) == 31337 and fn(None) == -1
    fn, inputs, outputs = _click_handler(app, "vq-reuse-seed")
    assert (inputs, outputs) == (["vq-preview"], ["vq-seed"])
    png = save_png(Image.new("RGB", (16, 16)), tmp_path / "vq.png", "", {"engine": "vqgan", "seed": 2024})
    assert fn(str(png)) == 2024 and fn(None) == -1


# -- the pickers on Inpaint ---------------------------------------------------------------------------------------


@needs_browser
def test_the_lora_and_embedding_pickers_are_on_inpaint_too(page, tmp_path, monkeypatch):
    page.get_by_role("tab", name="Inpaint").click()
    _pick_a_lora_and_an_embedding(page, tmp_path, monkeypatch, prefix="inp-")


# -- a failed job's toast ------------------------------------------------------------------------------------------


def _toasts(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('[data-testid=toast-text]')].map(e => e.innerText)")


@needs_browser
def test_a_failed_job_says_so_in_one_toast(page):
    """Refused by the request's validation, and failed inside the job: one toast message each, whose stream has
    ended (a later job ran to its end after it) before the toasts are counted."""
    _fill_job(page, "refused", 500, 64, 1)
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#summary textarea').value.includes('invalid width: 500')",
                           timeout=60_000)
    page.locator("[data-testid=toast-text]").first.wait_for(timeout=30_000)
    _fill_job(page, "kept", 64, 64, 1)
    page.click("#generate")
    _gallery_image(page)
    assert [t for t in _toasts(page) if "invalid width" in t] and len(_toasts(page)) == 1, _toasts(page)
    page.locator("[data-testid=toast-close]").first.click()
    page.locator("[data-testid=toast-text]").first.wait_for(state="detached", timeout=30_000)
    page.locator("#prompt textarea").fill("fails <lora:no such lora:1>")
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#summary textarea').value.includes('no such lora')",
                           timeout=120_000)
    page.locator("#prompt textarea").fill("kept again")
    page.click("#generate")
    page.wait_for_function("() => document.querySelector('#info textarea').value.startsWith('kept again')",
                           timeout=120_000)
    assert len(_toasts(page)) == 1 and "no such lora" in _toasts(page)[0], _toasts(page)
