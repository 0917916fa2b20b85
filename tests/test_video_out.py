"""Saving a generated clip (video_out.save_clip): H.264 mp4 through PyAV read back by PyAV, the animated WebP without
it, the parameters in the file and its sidecar, the frames as PNGs, numbering and atomic writes as the images'."""

from __future__ import annotations

import builtins
import json
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import outputs, video_out
from lowvram_gen.errors import OutputError

PARAMS = "a fox in snow\nNegative prompt: blur\nSteps: 2, Sampler: UniPC, CFG scale: 5, Seed: 7, Frames: 5, FPS: 16"
META = {"model": "tiny-wan", "preset": "fp16"}


def _frames(n: int, size=(48, 32)) -> list:
    """Frames whose red level counts up, so order and count can be checked after H.264."""
    return [Image.new("RGB", size, (min(255, 30 + 40 * i), 120, 200)) for i in range(n)]


def _decode(path):
    av = pytest.importorskip("av", reason="PyAV (the video extra) is not installed")
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate, comment = stream.average_rate, container.metadata.get("comment")
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return frames, rate, comment


def _no_pyav(monkeypatch):
    """Simulates a machine without the video extra: `import av` fails."""
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "av" or name.startswith("av."):
            raise ImportError("No module named 'av'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_mp4_round_trip_frames_size_fps_and_parameters(tmp_path):
    pytest.importorskip("av")
    saved = video_out.save_clip(_frames(5), tmp_path, 7, "a fox in snow", 16, PARAMS, META)
    assert saved.container == "mp4" and saved.note == "" and saved.frames == []
    assert saved.path == tmp_path / "00000-7-a-fox-in-snow.mp4"
    frames, rate, comment = _decode(saved.path)
    assert len(frames) == 5 and frames[0].shape == (32, 48, 3)
    assert rate == 16 and comment == PARAMS
    reds = [int(f[..., 0].mean()) for f in frames]
    assert all(abs(r - (30 + 40 * i)) <= 4 for i, r in enumerate(reds)), reds  # in order, H.264 near-lossless
    side = json.loads(saved.sidecar.read_text())
    assert saved.sidecar == tmp_path / "00000-7-a-fox-in-snow.json"
    assert side["parameters"] == PARAMS and side["meta"] == META
    assert (side["file"], side["container"], side["frame_count"], side["fps"], side["width"], side["height"]) == (
        saved.path.name, "mp4", 5, 16.0, 48, 32)
    assert video_out.read_clip(saved.path) == (PARAMS, META)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([saved.path.name, saved.sidecar.name])  # no temp left


def test_a_fractional_fps_is_stored_exactly(tmp_path):
    pytest.importorskip("av")
    saved = video_out.save_clip(_frames(3), tmp_path, 1, "x", Fraction(30000, 1001), PARAMS, META)
    assert _decode(saved.path)[1] == Fraction(30000, 1001)
    assert video_out.as_rate(23.976) == Fraction(2997, 125) and video_out.as_rate(8) == 8


def test_save_frames_writes_pngs_that_match_the_clip(tmp_path):
    pytest.importorskip("av")
    saved = video_out.save_clip(_frames(4), tmp_path, 3, "fox", 8, PARAMS, META, save_frames=True)
    folder = tmp_path / "00000-3-fox-frames"
    assert saved.frames == [folder / f"{i:05d}.png" for i in range(4)]
    decoded, _, _ = _decode(saved.path)
    for png, frame in zip(saved.frames, decoded):
        with Image.open(png) as im:
            pixels = np.asarray(im.convert("RGB"), dtype=np.int16)
        assert pixels.shape == frame.shape
        assert np.abs(pixels - frame).mean() < 3  # H.264's loss, nothing more
    parameters, meta = outputs.read_png_metadata(saved.frames[2])
    assert parameters == PARAMS and meta == {**META, "frame": 2}
    assert json.loads(saved.sidecar.read_text())["frames"] == [f"{folder.name}/{i:05d}.png" for i in range(4)]


def test_float_arrays_are_scaled_as_diffusers_scales_them(tmp_path):
    rng = np.random.default_rng(0)
    video = rng.random((3, 16, 16, 3), dtype=np.float32)  # output_type="np": F x H x W x 3 in [0, 1]
    images = video_out.as_images(video)
    assert [im.size for im in images] == [(16, 16)] * 3
    assert np.array_equal(np.asarray(images[1]), (video[1] * 255).round().astype(np.uint8))


def test_odd_sizes_are_cropped_to_even_and_said(tmp_path):
    pytest.importorskip("av")
    saved = video_out.save_clip(_frames(2, (33, 17)), tmp_path, 1, "odd", 10, PARAMS, META, save_frames=True)
    frames, _, _ = _decode(saved.path)
    assert frames[0].shape == (16, 32, 3)
    assert "33x17" in saved.note and "32x16" in saved.note
    with Image.open(saved.frames[0]) as png:
        assert png.size == (33, 17)


def test_without_pyav_an_animated_webp_and_a_note(tmp_path, monkeypatch):
    _no_pyav(monkeypatch)
    saved = video_out.save_clip(_frames(3), tmp_path, 7, "fox", 16, PARAMS, META)
    assert saved.container == "webp" and saved.path.suffix == ".webp"
    assert saved.note == "PyAV is not installed (pip install lowvram-gen[video]): saved as animated WebP"
    with Image.open(saved.path) as anim:
        assert anim.format == "WEBP" and anim.n_frames == 3
        comment = anim.getexif().get_ifd(0x8769).get(0x9286)
    assert comment == b"UNICODE\0" + PARAMS.encode("utf-16-be")
    assert json.loads(saved.sidecar.read_text())["container"] == "webp"


def test_numbering_never_overwrites(tmp_path):
    pytest.importorskip("av")
    (tmp_path / "00004-9-fox.png").write_bytes(b"an image")
    first = video_out.save_clip(_frames(2), tmp_path, 9, "fox", 8, PARAMS, META)
    second = video_out.save_clip(_frames(2), tmp_path, 9, "fox", 8, PARAMS, META, save_frames=True)
    assert (first.path.name, second.path.name) == ("00005-9-fox.mp4", "00006-9-fox.mp4")
    assert (tmp_path / "00004-9-fox.png").read_bytes() == b"an image"
    third = video_out.save_clip(_frames(2), tmp_path, 9, "fox", 8, PARAMS, META)
    assert third.path.name == "00007-9-fox.mp4"  # the frames folder counts as taken too


def test_a_name_taken_while_encoding_goes_to_the_next_counter(tmp_path, monkeypatch):
    pytest.importorskip("av")
    real = video_out.write_mp4

    def slow_and_raced(frames, path, fps, comment=""):
        (tmp_path / "00000-1-fox.mp4").write_bytes(b"someone else's")  # another process took the planned name
        return real(frames, path, fps, comment)

    monkeypatch.setattr(video_out, "write_mp4", slow_and_raced)
    saved = video_out.save_clip(_frames(2), tmp_path, 1, "fox", 8, PARAMS, META)
    assert saved.path.name == "00001-1-fox.mp4" and saved.sidecar.name == "00001-1-fox.json"
    assert (tmp_path / "00000-1-fox.mp4").read_bytes() == b"someone else's"


def test_a_crash_mid_write_leaves_no_final_file(tmp_path, monkeypatch):
    pytest.importorskip("av")
    real = video_out.write_mp4

    def crashes(frames, path, fps, comment=""):
        real(frames[:1], path, fps, comment)  # part of the clip is on disk under the temporary name
        assert path.exists() and outputs.TEMP_NAME.match(path.name)
        raise KeyboardInterrupt  # the user's Ctrl-C (or a crash) in the middle of the encode

    monkeypatch.setattr(video_out, "write_mp4", crashes)
    with pytest.raises(KeyboardInterrupt):
        video_out.save_clip(_frames(3), tmp_path, 1, "fox", 8, PARAMS, META)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_is_an_output_error_naming_the_folder(tmp_path, monkeypatch):
    def disk_full(frames, path, fps, comment=""):
        path.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(video_out, "write_mp4", disk_full)
    monkeypatch.setattr(video_out, "have_pyav", lambda: True)
    with pytest.raises(OutputError, match=r"could not save the video in .*No space left on device.*free some disk"):
        video_out.save_clip(_frames(2), tmp_path, 1, "fox", 8, PARAMS, META)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("frames, fps, message", [
    ([], 16, "a clip needs at least 1 frame, got 0"),
    (_frames(2), 0, "fps must be a number above 0, got 0"),
    (_frames(2), -3.5, "fps must be a number above 0, got -3.5"),
    (_frames(2), float("nan"), "fps must be a number above 0, got nan"),
    (_frames(1) + _frames(1, (32, 32)), 16, "frame 0 is 48x32, frame 1 is 32x32"),
    ([np.zeros((4, 4))], 16, "frame 0 is not an image"),
])
def test_bad_frames_or_fps_are_refused_before_anything_is_written(tmp_path, frames, fps, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        video_out.save_clip(frames, tmp_path / "out", 1, "fox", fps, PARAMS, META)
    assert not (tmp_path / "out").exists()


def test_an_existing_sidecar_is_kept_and_the_clip_too(tmp_path, monkeypatch):
    pytest.importorskip("av")
    (tmp_path / "00000-1-fox.json").write_text("mine")
    monkeypatch.setattr(outputs, "_next_counter", lambda folder: 0)  # a foreign file that does not look like ours
    with pytest.raises(OutputError, match="a file of that name exists and is kept"):
        video_out.save_clip(_frames(2), tmp_path, 1, "fox", 8, PARAMS, META)
    assert (tmp_path / "00000-1-fox.json").read_text() == "mine"
    assert (tmp_path / "00000-1-fox.mp4").is_file()  # what was made is not lost
