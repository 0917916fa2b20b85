"""Issue 33 item 4: video lines in batch files (batch/files.py, command.py, manifest.py, report.py). A line with
`video: true` (or a `frames` field) is a video job with the video options; the manifest and the report name its clip;
a resumed run skips a done video line and redoes one whose clip was deleted; image lines keep the job hashes they had
before video existed (a batch started then still resumes).

The end-to-end test runs a file of one image line (the embedded tiny model) and one video line (the tiny Wan 2.1
folder, tests/tiny_video.py) through a real Session; the others use a fake session that saves what the Session would.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lowvram_gen.batch import manifest as bm
from lowvram_gen.batch.command import run_batch
from lowvram_gen.batch.files import expand, read_entries, request_hash
from lowvram_gen.request import GenerationRequest

TINY = {"width": "64", "height": "64", "steps": "1", "model": "tiny"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jobs_of(path):
    return expand(read_entries(path), dict(TINY))


def records(outdir: Path) -> list[dict]:
    return bm.read_records(bm.current_manifests(outdir))


# -- lines ------------------------------------------------------------------------------------------------------


def test_video_lines_in_every_format_with_the_video_options(tmp_path):
    jsonl = write(tmp_path, "p.jsonl", '{"prompt": "a cat"}\n'
                  '{"prompt": "a boat", "video": true}\n'
                  '{"prompt": "a fox", "frames": 13, "fps": 8, "cfg_scale_2": 3, "save_frames": true, '
                  '"allow_upscale": true}\n')
    txt = write(tmp_path, "p.txt", "--prompt a boat --video true --frames 9 --fps 12\n")
    csv = write(tmp_path, "p.csv", "prompt,video,frames,save_frames\na boat,true,,yes\na cat,,,\n")
    cat, boat, fox = jobs_of(jsonl).jobs
    assert (cat.engine, cat.request.frames) == ("sd", None)
    assert (boat.engine, boat.request.frames) == ("video", 0)  # 0: the model's own count
    assert fox.engine == "video" and fox.request.frames == 13 and fox.request.fps == 8.0
    assert fox.request.cfg_scale_2 == 3.0 and fox.request.save_frames and fox.request.allow_upscale
    (line,) = jobs_of(txt).jobs
    assert (line.engine, line.request.frames, line.request.fps) == ("video", 9, 12.0)
    boat_csv, cat_csv = jobs_of(csv).jobs
    assert (boat_csv.engine, boat_csv.request.frames, boat_csv.request.save_frames) == ("video", 0, True)
    assert (cat_csv.engine, cat_csv.request.frames) == ("sd", None)
    assert boat.request_hash != cat.request_hash != request_hash("video", cat.request)


def test_bad_video_lines_are_skipped_with_one_sentence_naming_the_field(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a", "frames": 9, "video": false}\n'
                 '{"prompt": "b", "frames": 9, "engine": "vqgan"}\n'
                 '{"prompt": "c", "video": "maybe"}\n'
                 '{"prompt": "d", "frames": -3}\n'
                 '{"prompt": "e", "fps": 0, "video": true}\n'
                 '{"prompt": "f", "video": true, "hires_scale": 2}\n'
                 '{"prompt": "g", "fps": 8}\n')
    joblist = jobs_of(path)
    assert joblist.jobs == []
    errors = {bad.line: bad.error for bad in joblist.bad}
    assert "video" in errors[1] and "VQGAN-CLIP" in errors[2] and "video" in errors[3]
    assert "frames" in errors[4] and "fps" in errors[5] and "hires" in errors[6]
    assert "fps" in errors[7] and "frames" in errors[7]  # a video option on an image line: give frames
    # a VQGAN-CLIP line's `video` stays its progress video
    vqgan = write(tmp_path, "v.jsonl", '{"prompt": "a", "engine": "vqgan", "video": true, "steps": 2}\n')
    (job,) = jobs_of(vqgan).jobs
    assert job.engine == "vqgan" and job.request.video is True


def test_image_lines_keep_the_hashes_they_had_before_video():
    """The request's video fields (frames, fps, cfg_scale_2, save_frames, allow_upscale) at their image-job values
    leave the hash as it was, so a batch started before video existed resumes without redoing anything."""
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5).validated()) == "3888bfeb5c2d8f9b"
    clip = GenerationRequest(prompt="a cat", seed=5, frames=9).validated()
    assert request_hash("video", clip) != request_hash("video", GenerationRequest(prompt="a cat", seed=5,
                                                                                  frames=13).validated())


# -- runs with a fake session ------------------------------------------------------------------------------------


class FakeClips:
    """Saves what the Session would, where it would: a clip of 3 small frames through video_out.save_clip (its
    sidecar's meta names the batch job, as the engine's does; with save_frames its frames' PNGs), or one PNG for an
    image job. `fail`: a prompt whose clip is saved and then the job fails (an interrupt after the save)."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def generate(self, request):
        from PIL import Image

        from lowvram_gen.errors import Cancelled
        from lowvram_gen.outputs import next_image_path, save_png
        from lowvram_gen.video_out import save_clip

        self.calls.append(request)
        seed = request.seed if request.seed >= 0 else 1000 + len(self.calls)
        meta = {"request": {"prompt": request.prompt, "extra": request.extra}, "seed": seed, "preset": "fake",
                "attempts": []}
        if not request.is_video:
            path = save_png(Image.new("RGB", (8, 8)), next_image_path(request.outdir, seed, request.prompt), "p",
                            meta)
            return SimpleNamespace(images=[str(path)], seeds=[seed], preset="fake", attempts=[], seconds=0.0,
                                   warnings=[], video=None, frames=[])
        frames = [Image.new("RGB", (16, 16), (40 * i, 0, 0)) for i in range(3)]
        saved = save_clip(frames, request.outdir, seed, request.prompt, 8, "p", meta,
                          save_frames=request.save_frames)
        if request.prompt in self.fail:
            raise Cancelled("cancelled after the clip was saved (simulated)", images=[str(saved.path)])
        return SimpleNamespace(images=[], seeds=[seed], preset="fake", attempts=[], seconds=0.0, warnings=[],
                               video=str(saved.path), frames=[str(p) for p in saved.frames])


def run(file, outdir, session, **kw):
    return run_batch(Path(file), Path(outdir), dict(TINY), {"device": "cpu"}, session=session, **kw)


def test_the_manifest_and_report_name_the_clip_and_resume_skips_it_until_it_is_deleted(tmp_path, capsys):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a cat", "seed": 1}\n'
                 '{"prompt": "a boat", "video": true, "frames": 9, "seed": 2, "save_frames": true}\n')
    out = tmp_path / "out"
    assert run(path, out, FakeClips(), as_json=True) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    image, video = records(out)
    assert video["engine"] == "video" and video["video"].endswith((".mp4", ".webp"))
    assert (out / video["video"]).is_file()
    assert video["outputs"][0] == video["video"] and len(video["outputs"]) == 4  # the clip, then its 3 frames
    assert "video" not in image and image["outputs"][0].endswith(".png")
    assert summary["videos"] == [{"line": 2, "job": video["job"], "video": video["video"]}]
    assert summary["images"] == 1 and summary["done"] == 2
    assert f"clip {path}:2: {video['video']}" in captured.err

    again = FakeClips()
    assert run(path, out, again, as_json=True) == 0
    assert again.calls == [] and json.loads(capsys.readouterr().out)["already_done"] == 2

    (out / video["video"]).unlink()  # a deleted clip: its line runs again, the image line does not
    third = FakeClips()
    assert run(path, out, third) == 0
    assert [r.prompt for r in third.calls] == ["a boat"]


def test_a_clip_saved_before_a_crash_is_adopted_and_a_failed_jobs_clip_is_moved_aside(tmp_path, capsys):
    """A kill between the clip's sidecar and the manifest's record: the next run finds the clip by the job its
    sidecar names and records it, without making it again. A job that failed after its clip was saved (an
    interrupt): its clip, sidecar and frames go to .incomplete/, out of the results, and the job runs again later."""
    from PIL import Image

    from lowvram_gen.video_out import save_clip

    path = write(tmp_path, "p.jsonl", '{"prompt": "a boat", "frames": 9, "seed": 2, "save_frames": true}\n'
                 '{"prompt": "a fox", "frames": 9, "seed": 3}\n')
    out = tmp_path / "out"
    out.mkdir()
    boat, fox = jobs_of(path).jobs
    meta = {"request": {"prompt": "a boat", "extra": boat.request.extra}, "seed": 2, "preset": "fake", "attempts": []}
    crashed = save_clip([Image.new("RGB", (16, 16))] * 3, out, 2, "a boat", 8, "p", meta, save_frames=True)
    session = FakeClips(fail=["a fox"])
    assert run(path, out, session, as_json=True) == 1  # the fox failed
    summary = json.loads(capsys.readouterr().out)
    assert [r.prompt for r in session.calls] == ["a fox"]  # the boat's clip was adopted, not made again
    assert summary["recovered"] == 1 and summary["failed"] == 1
    adopted = next(r for r in records(out) if r["status"] == "ok")
    assert adopted["adopted"] and adopted["video"] == crashed.path.name and len(adopted["outputs"]) == 4
    incomplete = sorted(p.suffix for p in (out / ".incomplete").iterdir() if "a-fox" in p.name)
    assert incomplete == [".json", Path(crashed.path).suffix]  # the fox's clip and its sidecar (no frames asked)
    assert not [p for p in out.iterdir() if "a-fox" in p.name]

    again = FakeClips()
    assert run(path, out, again) == 0
    assert [r.prompt for r in again.calls] == ["a fox"]


def test_a_dry_run_lists_the_video_line_as_a_clip(tmp_path, capsys):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a cat"}\n{"prompt": "a boat", "video": true}\n')
    assert run(path, tmp_path / "out", None, dry_run=True, as_json=True) == 0
    rows = json.loads(capsys.readouterr().out)["jobs"]
    assert [(r["engine"], r["frames"]) for r in rows] == [("sd", None), ("video", 0)]


# -- end to end ---------------------------------------------------------------------------------------------------


def test_one_image_line_and_one_video_line_on_the_tiny_models_then_resume(tmp_path, capsys):
    """A real Session: the embedded tiny SD model makes the image, the tiny Wan 2.1 folder the clip (an mp4 PyAV
    opens: 9 frames of 64x64); the report names the clip; a second run skips both done lines."""
    av = pytest.importorskip("av", reason="PyAV (the `video` extra) reads the clip back")
    from tiny_video import save

    wan = save("wan21", tmp_path / "wan21")
    path = write(tmp_path, "p.jsonl", '{"prompt": "a cat", "seed": 1, "steps": 1}\n'
                 + json.dumps({"prompt": "a boat", "video": True, "model": str(wan), "frames": 9, "steps": 2,
                               "seed": 3}) + "\n")
    out = tmp_path / "out"
    assert run(path, out, None, as_json=True) == 0
    summary = json.loads(capsys.readouterr().out)
    (clip,) = summary["videos"]
    assert clip["line"] == 2 and summary["images"] == 1 and summary["done"] == 2
    with av.open(str(out / clip["video"])) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 9 and (frames[0].width, frames[0].height) == (64, 64)
    assert [r["engine"] for r in records(out)] == ["sd", "video"]

    class Refuses:  # a resumed run must not generate anything
        def generate(self, request):
            raise AssertionError(f"line generated again: {request.prompt}")

    assert run(path, out, Refuses(), as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["already_done"] == 2
