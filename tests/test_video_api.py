"""Issue 33 item 4: `POST /lowvram/v1/video` (api/video.py, docs/api-video.md), through real HTTP (requests, and a raw
socket where a client library would send the whole body) to the API server running in this process (tests/servers.py,
--nowebui with a login): a tiny Wan 2.1 clip comes back as an mp4 PyAV plays, /sdapi/v1/progress follows it and
/sdapi/v1/interrupt keeps what finished, the login is checked before the body is read, and bad values are 422s naming
their field before any job runs.

The tiny Wan 2.1 folder (tests/tiny_video.py) sits in a models folder (LOWVRAM_GEN_MODELS), so the body names it as a
listed checkpoint, "wan21". A job made slow waits in its step hook on the job's own cancel event (bounded), so the
interrupt arrives while it runs: no sleep decides an outcome.
"""

from __future__ import annotations

import base64
import io
import threading
import time

import pytest
import requests

from servers import Server

av = pytest.importorskip("av", reason="PyAV (the `video` extra) reads the clip back")

AUTH = ("u", "p")
CLIP = {"prompt": "a boat", "model": "wan21", "frames": 9, "width": 64, "height": 64, "steps": 2, "seed": 5}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The API alone (--nowebui) with a login, a models folder holding the tiny Wan 2.1 folder."""
    from tiny_video import save

    models = tmp_path_factory.mktemp("models")
    save("wan21", models / "wan21")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOWVRAM_GEN_MODELS", str(models))
        srv = Server(tmp_path_factory.mktemp("video-api"), api=True, webui=False, api_auth="u:p")
        srv.models = models
        yield srv
        srv.close()


def _post(server, body, **kw) -> requests.Response:
    return requests.post(f"{server.url}lowvram/v1/video", json=body, auth=AUTH, timeout=300, **kw)


def _clip(answer: dict):
    """The answer's clip decoded by PyAV: (frame count, (width, height), fps)."""
    with av.open(io.BytesIO(base64.b64decode(answer["video"]))) as container:
        stream = container.streams.video[0]
        frames = [frame.to_image() for frame in container.decode(stream)]
        return len(frames), frames[0].size, float(stream.average_rate)


def _saved(server) -> list:
    return sorted(p for p in server.outdir.rglob("*") if p.is_file())


# -- the clip --------------------------------------------------------------------------------------------------


def test_a_tiny_wan21_clip_comes_back_as_a_playable_mp4_with_its_frames_and_info(server):
    from PIL import Image

    answer = _post(server, {**CLIP, "fps": 8, "save_frames": True})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["format"] == "mp4"
    assert _clip(data) == (9, (64, 64), 8.0)
    assert len(data["frames"]) == 9
    with Image.open(io.BytesIO(base64.b64decode(data["frames"][4]))) as frame:
        assert frame.format == "PNG" and frame.size == (64, 64)
    info = data["info"]
    assert info["seed"] == 5 and info["frames"] == 9 and info["fps"] == 8 and info["steps"] == 2
    assert (info["width"], info["height"]) == (64, 64) and info["model"] == "wan21"
    assert info["preset"] and info["attempts"] and info["warnings"] == []
    # and without save_frames: the clip alone
    plain = _post(server, {**CLIP, "seed": 6}).json()
    assert "frames" not in plain and _clip(plain)[:2] == (9, (64, 64))


def test_progress_follows_a_clip_and_interrupt_answers_what_finished(server):
    """A clip of 20 steps waits at its second step until interrupted: /sdapi/v1/progress says step 2 of 20, and
    /sdapi/v1/interrupt stops it there; the answer is the clip decoded as it was, with a warning saying so."""
    real = server.session.generate
    blocked, seen = threading.Event(), []

    def slow(request, on_step=None, cancel=None, **kw):
        def step(i, total):
            seen.append(i)
            on_step(i, total)
            if i >= 2:
                blocked.set()
                for _ in range(900):  # bounded: a test that never interrupts still ends
                    if cancel.is_set():
                        break
                    cancel.wait(0.1)
        return real(request, on_step=step, cancel=cancel, **kw)

    server.session.generate = slow
    box = {}
    try:
        thread = threading.Thread(target=lambda: box.update(answer=_post(server, {**CLIP, "steps": 20, "seed": 7,
                                                                                   "save_frames": True})),
                                  daemon=True)
        thread.start()
        assert blocked.wait(120)
        progress = requests.get(f"{server.api_url}/progress", auth=AUTH, timeout=30).json()
        assert progress["state"]["sampling_step"] == 2 and progress["state"]["sampling_steps"] == 20
        assert progress["state"]["job_count"] == 1
        assert requests.post(f"{server.api_url}/interrupt", auth=AUTH, timeout=30).json() == {}
        thread.join(120)
    finally:
        server.session.generate = real
    answer = box["answer"]
    assert answer.status_code == 200, answer.text
    assert max(seen) < 20  # stopped where the interrupt arrived
    data = answer.json()
    assert _clip(data)[:2] == (9, (64, 64))  # the clip is kept: all its frames, decoded from the latents it had
    assert any(w.startswith("interrupted") for w in data["info"]["warnings"])
    assert len(data["frames"]) == 9 and data["info"]["frames"] == 9 and data["info"]["seed"] == 7
    assert data["info"]["preset"]  # what ran, from the clip's sidecar


# -- refusals --------------------------------------------------------------------------------------------------


def test_an_anonymous_client_is_refused_before_its_body_is_read(server):
    """200 MB announced and 12 bytes sent: a 401 at once, not a wait for the rest of the body."""
    import socket

    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /lowvram/v1/video HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n{\"prompt\": \"" % (200 * 2**20))
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401") and time.monotonic() - started < 5, answer[:200]
    assert requests.post(f"{server.url}lowvram/v1/video", json=CLIP, auth=("u", "wrong"), timeout=30
                         ).status_code == 401


@pytest.mark.parametrize("frames", ["ten", -1, 5000, 2.5, True])
def test_a_bad_frames_value_is_a_422_naming_frames_before_any_job(server, frames):
    before = _saved(server)
    answer = _post(server, {**CLIP, "frames": frames})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", "frames"] and "frames" in detail["msg"]
    assert _saved(server) == before


def test_frames_the_model_cannot_take_are_a_422_naming_frames(server):
    """Wan makes 4k+1 frames: 10 is refused with the counts that are (the engine's check, before loading)."""
    answer = _post(server, {**CLIP, "frames": 10})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", "frames"] and "9" in detail["msg"] and "13" in detail["msg"]


@pytest.mark.parametrize("field, value", [("fps", 0), ("cfg_scale_2", 99), ("save_frames", "maybe"),
                                          ("width", "wide")])
def test_other_bad_values_are_422s_naming_their_field(server, field, value):
    answer = _post(server, {**CLIP, field: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", field]


def test_a_server_path_as_model_is_refused_and_an_unknown_field_too(server, tmp_path):
    """A path that is not a listed checkpoint (here a Wan 2.1 folder outside the models folder) is refused in the
    one sentence that never says whether it exists, as the image routes refuse one; so is an unknown name."""
    from tiny_video import save

    outside = save("wan21", tmp_path / "wan21")
    before = _saved(server)
    for model in (str(outside), "/etc/passwd", "no-such-model"):
        answer = _post(server, {**CLIP, "model": model})
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"][0]
        assert detail["loc"] == ["body", "model"] and "names, not server paths" in detail["msg"]
        assert "/sdapi/v1/sd-models" in detail["msg"]
    answer = _post(server, {**CLIP, "frame": 9})  # a typo: not a silently different clip
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "frame"]
    assert _saved(server) == before


def test_image_to_video_takes_a_base64_init_image_and_a_text_only_model_refuses_it(server):
    """Wan 2.2 TI2V 5B makes a clip from an init image (its first frame); Wan 2.1 T2V has no image-to-video: a 422
    naming init_image, which names the body's image, never the file the server stored it in."""
    from PIL import Image

    from tiny_video import save

    save("wan22-ti2v", server.models / "ti2v")
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buffer, "PNG")
    image = base64.b64encode(buffer.getvalue()).decode("ascii")
    answer = _post(server, {**CLIP, "model": "ti2v", "init_image": image})
    assert answer.status_code == 200, answer.text
    assert _clip(answer.json())[:2] == (9, (64, 64)) and answer.json()["info"]["init_image"] is True
    refused = _post(server, {**CLIP, "init_image": image})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"][0]
    assert detail["loc"] == ["body", "init_image"] and "image-to-video" in detail["msg"]
    assert "lowvram-gen-api" not in refused.text and "/tmp" not in refused.text


def test_an_image_model_is_refused_pointing_to_the_video_families(server):
    answer = _post(server, {**CLIP, "model": "tiny"})
    assert answer.status_code == 422, answer.text
    assert "Wan" in answer.text


def test_a_clip_interrupted_before_its_first_step_answers_no_clip_and_says_so():
    """No server needed: the answer of a job whose Cancelled error kept nothing (stopped before its first step)."""
    from types import SimpleNamespace

    from lowvram_gen.api.video import answer
    from lowvram_gen.errors import Cancelled
    from lowvram_gen.request import GenerationRequest

    request = GenerationRequest(prompt="a boat", frames=9, width=64, height=64, seed=3, save_frames=True).validated()
    job = SimpleNamespace(error=Cancelled("cancelled before the first step; no clip made"), result=None)
    out = answer(request, job, "v")
    assert out["video"] is None and out["format"] is None and out["frames"] == []
    assert out["info"]["warnings"] == ["interrupted: cancelled before the first step; no clip made"]
    assert out["info"]["seed"] == 3 and out["info"]["frames"] == 9
