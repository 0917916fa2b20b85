"""A1111's img2img scripts Loopback and SD upscale through the REST API (issue 32): `script_name` "loopback" /
"sd upscale" (any case) with A1111's `script_args`, through webuiapi's img2img; the registered job's progress says
`loop i/n`; an interrupt keeps the loops that finished; on txt2img they are refused in one sentence; `/scripts` and
`/script-info` list them under img2img as A1111's does."""

from __future__ import annotations

import threading

import pytest
import requests
from PIL import Image

from api_helpers import _post, api, server  # noqa: F401 (api, server: fixtures)

webuiapi = pytest.importorskip("webuiapi", reason="the test extra's webuiapi is not installed: pip install -e .[test]")

INIT = Image.new("RGB", (64, 64), (90, 120, 160))


def test_webuiapi_loopback_answers_the_grid_then_every_loop(server, api):
    result = api.img2img(images=[INIT], prompt="a harbour", seed=5, steps=2, width=64, height=64,
                         denoising_strength=0.6, script_name="Loopback", script_args=[2, 0.3, "Lazy", "None"])
    assert len(result.images) == 3  # A1111's return_grid: the grid first, then each loop's image
    grid, loops = result.images[0], result.images[1:]
    assert grid.size == (2 * 64, 64) and {im.size for im in loops} == {(64, 64)}
    assert grid.crop((64, 0, 128, 64)).tobytes() == loops[1].convert("RGB").tobytes()


def test_webuiapi_sd_upscale_answers_the_assembled_image(server, api):
    # A1111's script_args: info, overlap, upscaler index (1: Lanczos), scale
    result = api.img2img(images=[INIT], prompt="a harbour", seed=5, steps=2, width=64, height=64,
                         denoising_strength=0.3, script_name="SD upscale", script_args=["", 16, 1, 2.0])
    assert [im.size for im in result.images] == [(128, 128)]


class Blocked:
    def __init__(self):
        self.waiting, self.calls = threading.Event(), 0


@pytest.fixture()
def second_loop_waits(server):
    """The second job of a script waits at its second step until it is interrupted (90 s at most), so /interrupt
    arrives while it runs and /progress can be read there."""
    real, blocked = server.session.generate, Blocked()

    def watched(request, on_step=None, cancel=None, **kw):
        blocked.calls += 1
        call = blocked.calls

        def step(i, total):
            on_step(i, total)
            if call == 2 and i >= 2:
                blocked.waiting.set()
                for _ in range(900):  # bounded: a test that never interrupts still ends
                    if cancel.is_set():
                        break
                    cancel.wait(0.1)
        return real(request, on_step=step, cancel=cancel, **kw)

    server.session.generate = watched
    yield blocked
    server.session.generate = real


def test_loopback_progress_says_the_loop_and_an_interrupt_keeps_the_finished_ones(server, api, second_loop_waits):
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=api.img2img(
        images=[INIT], prompt="a harbour", seed=8, steps=3, width=64, height=64, script_name="loopback",
        script_args=[3, 0.5])), daemon=True)
    thread.start()
    assert second_loop_waits.waiting.wait(120)
    progress = api.get_progress()
    assert progress["textinfo"].startswith("loop 2/3 · Step 2/"), progress["textinfo"]
    assert api.interrupt() == {}
    thread.join(120)
    result = box["result"]
    # the second loop was at its last step: it finished, and the third stopped before its first step
    assert any(w.startswith("interrupted: Loopback interrupted in loop") for w in result.info["warnings"])
    assert len(result.images) == 3 and result.images[0].size == (2 * 64, 64)  # the grid of the two, then them


def test_on_txt2img_they_are_refused_in_one_sentence(server):
    bad = _post(server, "txt2img", {"prompt": "x", "script_name": "Loopback", "script_args": [2]})
    detail = bad.json()["detail"][0]
    assert bad.status_code == 422 and detail["loc"] == ["body", "script_name"]
    assert "img2img only" in detail["msg"] and "\n" not in detail["msg"]
    many = _post(server, "img2img", {"prompt": "x", "init_images": [webuiapi.raw_b64_img(INIT)],
                                     "width": 64, "height": 64, "script_name": "sd upscale",
                                     "script_args": ["", 16, 1, 2.0, 5]})
    assert many.status_code == 422 and "SD upscale takes at most 4" in many.text
    zero = _post(server, "img2img", {"prompt": "x", "init_images": [webuiapi.raw_b64_img(INIT)],
                                     "width": 64, "height": 64, "script_name": "loopback", "script_args": [0]})
    assert zero.status_code == 422 and "invalid loops: 0; a whole number from 1 to 32" in zero.text


def test_scripts_and_script_info_list_them_under_img2img(server, api):
    assert api.get_scripts() == {"txt2img": ["x/y/z plot"], "img2img": ["x/y/z plot", "loopback", "sd upscale"]}
    info = {(s["name"], s["is_img2img"]): s["args"] for s in
            requests.get(f"{server.api_url}/script-info", timeout=60).json()}
    looped = info[("loopback", True)]
    assert [(a["label"], a["value"]) for a in looped] == [
        ("Loops", 4), ("Final denoising strength", 0.5), ("Denoising strength curve", "Linear"),
        ("Append interrogated prompt at each iteration", "None")]
    assert looped[2]["choices"] == ["Aggressive", "Linear", "Lazy"] and looped[0]["maximum"] == 32
    upscaled = info[("sd upscale", True)]
    assert [a["label"] for a in upscaled] == [None, "Tile overlap", "Upscaler", "Scale Factor"]
    assert upscaled[2]["value"] == "None" and upscaled[2]["choices"][:3] == ["None", "Lanczos", "Nearest"]
    assert ("loopback", False) not in info
