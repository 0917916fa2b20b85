"""The Video tab (issue 33) in a real headless Chromium (tests/ui_helpers.py's fixtures): a tiny Wan 2.1 clip
(tests/tiny_video.py, 9 frames of 64x64) generated from the tab, its progress line and live preview while it runs, the
clip in the player with its parameters, and Interrupt keeping the clip decoded as it was.

A job that must still be running when the test looks at the page is held by a hook around Session.generate at a step
(bounded waits on events, never sleeps): the hook holds the step's progress callback until the test releases it or
presses Interrupt (which sets the job's cancel event).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ui_helpers import _fill_number, _set_slider, browser, needs_browser, open_tab, page, server  # noqa: F401

PREVIEW_SRC = ("() => { const i = document.querySelector('#vid-live-preview img');"
               " return i && i.complete && i.naturalWidth > 0 && i.src; }")
PLAYER_SRC = "() => { const v = document.querySelector('#vid-player video'); return v && v.src; }"


@pytest.fixture(scope="module")
def wan21(tmp_path_factory):
    import tiny_video

    folder = tmp_path_factory.mktemp("video-models") / "wan21"
    tiny_video.save("wan21", folder)
    return folder


@pytest.fixture()
def hold(server):
    """hold(at, video=True) -> (reached, release): the video job (with video=False: the image job) waits at its step
    `at` (after that step's progress and preview went out) until `release` is set or the job is cancelled
    (Interrupt), 60 s at most. Session.generate is restored after."""
    real = server.session.generate
    reached, release = threading.Event(), threading.Event()

    def install(at: int, video: bool = True):
        def held(request, on_step=None, cancel=None, **kw):
            def step(i, total):
                on_step(i, total)
                if i == at and request.is_video == video:
                    reached.set()
                    for _ in range(600):
                        if release.is_set() or cancel.wait(0.1):
                            break
            return real(request, on_step=step, cancel=cancel, **kw)

        server.session.generate = held
        return reached, release

    yield install
    release.set()
    server.session.generate = real


def _fill_clip(page, model: Path, steps: int, own_frames: int = 81) -> None:
    """Open the Video tab, pick the model (typed: the tiny folder is not in the models folder), which sets the
    frames, fps, size, steps and CFG to its own (`own_frames`: Wan 2.1's 81 frames of 832x480), then ask for 9 frames
    of 64x64 in `steps` steps, a preview every step."""
    open_tab(page, "Video")
    page.locator("#vid-prompt textarea").fill("a red boat on a lake")
    _fill_number(page, "vid-frames", 5)  # not the model's: the pick below sets it back to 81
    box = page.locator("#vid-model input").first
    box.fill(str(model))
    box.press("Enter")
    page.wait_for_function("(n) => document.querySelector('#vid-frames input').value === n", arg=str(own_frames),
                           timeout=30_000)
    _fill_number(page, "vid-frames", 9)
    _fill_number(page, "vid-fps", 8)
    _fill_number(page, "vid-width", 64)
    _fill_number(page, "vid-height", 64)
    _fill_number(page, "vid-seed", 123)
    _set_slider(page, "vid-steps", steps)
    _set_slider(page, "vid-preview-every", 1)


def _progress_has(page, text: str) -> None:
    page.wait_for_function("(t) => document.querySelector('#vid-progress').innerText.includes(t)", arg=text,
                           timeout=60_000)


def _summary_has(page, text: str) -> str:
    page.wait_for_function("(t) => document.querySelector('#vid-summary textarea').value.includes(t)", arg=text,
                           timeout=120_000)
    return page.locator("#vid-summary textarea").input_value()


@needs_browser
def test_a_tiny_wan_clip_shows_its_progress_its_preview_then_plays_with_its_parameters(page, server, hold, wan21):
    reached, release = hold(2)
    _fill_clip(page, wan21, 3)
    page.click("#vid-generate")
    assert reached.wait(60)  # held at step 2 of 3: the line says so, and step 1's and 2's previews went out
    _progress_has(page, "Step 2/3")
    page.wait_for_function(PREVIEW_SRC, timeout=60_000)
    size = page.evaluate("() => { const i = document.querySelector('#vid-live-preview img');"
                         " return [i.naturalWidth, i.naturalHeight]; }")
    assert size == [64, 64]  # the middle frame at the clip's size
    release.set()
    page.wait_for_function(PLAYER_SRC, timeout=120_000)
    page.wait_for_selector("#vid-live-preview", state="hidden", timeout=60_000)  # hidden once the job ended
    info = page.locator("#vid-info textarea").input_value()
    assert "a red boat on a lake" in info and "Seed: 123" in info and "Frames: 9" in info, info
    clips = [p for p in Path(server.outdir).rglob("*.mp4")]
    assert clips, "no clip was written"
    src = page.evaluate(PLAYER_SRC)
    assert any(c.name in src for c in clips), (src, clips)


@needs_browser
def test_a_clip_waits_in_the_one_queue_behind_another_clients_image_job(page, server, hold, wan21):
    """One GPU, one job: an API client's txt2img job (gradio_client, as a script would send it) is held at its step
    1; the Video tab's job waits behind it and its line says so, then runs once the image is done."""
    from gradio_client import Client

    reached, release = hold(1, video=False)
    client = Client(server.url, verbose=False)
    image = client.submit(prompt="first, an image", width=64, height=64, steps=2, seed=1, api_name="/generate")
    assert reached.wait(60)
    _fill_clip(page, wan21, 2)
    page.click("#vid-generate")
    _progress_has(page, "Waiting: 1 job ahead")
    assert not page.evaluate(PLAYER_SRC)
    release.set()
    assert image.result(timeout=120)[1].startswith("first, an image")
    page.wait_for_function(PLAYER_SRC, timeout=120_000)


@needs_browser
def test_interrupt_keeps_the_clip_decoded_as_it_was(page, server, hold, wan21):
    reached, _ = hold(2)
    before = set(Path(server.outdir).rglob("*.mp4"))
    _fill_clip(page, wan21, 6)
    page.click("#vid-generate")
    assert reached.wait(60)
    assert page.locator("#vid-cancel").inner_text().strip() == "Interrupt"
    page.click("#vid-cancel")
    summary = _summary_has(page, "cancel")
    page.wait_for_function(PLAYER_SRC, timeout=120_000)
    kept = set(Path(server.outdir).rglob("*.mp4")) - before
    assert len(kept) == 1, (summary, kept)
    assert next(iter(kept)).name in page.evaluate(PLAYER_SRC)
    assert "step 2 of 6" in summary, summary
    info = page.locator("#vid-info textarea").input_value()
    assert "Seed: 123" in info and "Frames: 9" in info, info  # the kept clip's own parameters
    page.click("#vid-random-seed")
    page.click("#vid-reuse-seed")  # ♻: the kept clip's seed
    page.wait_for_function("() => document.querySelector('#vid-seed input').value === '123'", timeout=30_000)


@needs_browser
def test_a_refused_clip_says_why_in_what_ran_and_runs_nothing(page, server, wan21):
    """Frames 10 for Wan (4k+1): one sentence in What ran, the player left as it was. (Sent with Ctrl+Enter in the
    prompt, as on the image tabs.)"""
    _fill_clip(page, wan21, 2)
    _fill_number(page, "vid-frames", 10)
    page.locator("#vid-prompt textarea").press("Control+Enter")
    summary = _summary_has(page, "10")
    assert "9" in summary and "13" in summary, summary
    assert not page.evaluate(PLAYER_SRC)


def test_the_model_list_has_the_video_folders_and_a_pick_sets_the_models_own_controls(tmp_path):
    """Not a browser test: the Model list keeps the video folders of the models folder (not the embedded SD models),
    and picking one sets frames, fps, size, steps and CFG to its record's; CFG 2 is shown for a two-expert model only
    (Wan 2.2 A14B, its low-noise expert's 3.0)."""
    import tiny_video

    from lowvram_gen.ui.context import UiOptions
    from lowvram_gen.ui.tabs import video

    for kind in ("wan21", "wan22-a14b", "ltx"):
        tiny_video.save(kind, tmp_path / kind)
    options = UiOptions(outdir=str(tmp_path / "out"), model="tiny", models_folder=str(tmp_path))
    assert sorted(Path(m).name for m in video.model_choices(options)) == ["ltx", "wan21", "wan22-a14b"]
    assert video.video_model("tiny") is None  # an image model: not in the list, refused by the engine if typed

    frames, fps, width, height, steps, cfg, cfg_2 = video._on_pick(str(tmp_path / "wan22-a14b"), 7.0)
    assert (frames, fps, width, height, steps, cfg) == (81, 16.0, 1280, 720, 40, 4.0)
    assert cfg_2.visible is True and cfg_2.value == 3.0
    *own, cfg_2 = video._on_pick(str(tmp_path / "wan21"), 7.0)
    assert own == [81, 16.0, 832, 480, 50, 5.0] and cfg_2.visible is False
    *own, cfg_2 = video._on_pick(str(tmp_path / "ltx"), 7.0)
    assert own == [161, 24.0, 704, 480, 50, 3.0] and cfg_2.visible is False


def test_the_video_flags_of_a_message_name_the_tabs_controls():
    from lowvram_gen.ui.tabs.video import for_ui

    said = for_ui("pass --frames 9 or 13; --cfg-2 is Wan 2.2 A14B's; --cfg 5 and --model x")
    assert said == ("fill in the Frames box 9 or 13; the CFG 2 slider is Wan 2.2 A14B's; the CFG scale slider 5 and "
                    "the Model box x"), said


@pytest.fixture(scope="module")
def ti2v(tmp_path_factory):
    """Wan 2.2 TI2V's tiny folder, made before any page loads (a module fixture, as `wan21`)."""
    import tiny_video

    folder = tmp_path_factory.mktemp("video-models") / "wan22-ti2v"
    tiny_video.save("wan22-ti2v", folder)
    return folder


@needs_browser
def test_image_to_video_from_the_init_image_with_its_frames_saved(ti2v, page, server, tmp_path):
    """Wan 2.2 TI2V's image-to-video (the same folder, WanImageToVideoPipeline): the uploaded init image reaches the
    job (the clip's JSON sidecar keeps its request), and "Save frames" writes the 9 frames beside the clip."""
    from PIL import Image

    from lowvram_gen.video_out import read_clip

    init = tmp_path / "first frame.png"
    Image.new("RGB", (64, 64), (220, 30, 30)).save(init)
    before = set(Path(server.outdir).rglob("*.mp4"))
    _fill_clip(page, ti2v, 2, own_frames=121)  # TI2V's own: 121 frames of 1280x704, set back to 9 of 64x64
    page.locator("#vid-init input[type=file]").set_input_files(str(init))
    page.wait_for_selector("#vid-init img", timeout=30_000)
    page.check("#vid-save-frames input[type=checkbox]")
    page.click("#vid-generate")
    page.wait_for_function(PLAYER_SRC, timeout=120_000)
    (clip,) = set(Path(server.outdir).rglob("*.mp4")) - before
    request = read_clip(clip)[1]["request"]
    assert request["init_image"] and Path(request["init_image"]).suffix == ".png", request
    assert request["frames"] == 9 and request["save_frames"] is True
    assert len(list(clip.parent.glob(f"{clip.stem}-frames/*.png"))) == 9


def test_an_api_client_runs_the_tabs_video_endpoint(server, wan21):
    """The tab's Generate is the gradio API's /video (gradio_client), with the same request fields; the clip comes
    back with its parameters, What ran and the seed; a refusal is the client's error in one sentence."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(server.url, verbose=False)
    video, info, summary, seed = client.predict(
        prompt="a boat, by API", model=str(wan21), frames=9, fps=8, width=64, height=64, steps=2, seed=77,
        preview_every=0, api_name="/video")
    assert str(video).endswith(".mp4") and seed == 77, video  # the clip, downloaded by the client
    assert info.startswith("a boat, by API") and "Frames: 9" in info and "FPS: 8" in info, info
    assert summary.startswith("finished at"), summary
    with pytest.raises(AppError, match="frames"):
        client.predict(prompt="bad", model=str(wan21), frames=10, width=64, height=64, steps=2, api_name="/video")
