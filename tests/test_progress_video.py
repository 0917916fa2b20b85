"""The VQGAN-CLIP progress video: mp4 through PyAV, animated WebP through Pillow without it."""

from __future__ import annotations

import pytest
from PIL import Image

from lowvram_gen.engines.vqgan import video as progress_video


def _frames(n: int, size=(48, 32)) -> list:
    return [Image.new("RGB", size, (40 * i % 256, 200, 255 - 40 * i % 256)) for i in range(n)]


def test_mp4_has_every_frame_in_order_and_holds_the_last(tmp_path):
    av = pytest.importorskip("av", reason="PyAV (the video extra) is not installed")
    video = progress_video.write_progress_video(_frames(4), tmp_path / "00001-7-fox.png")
    assert video == tmp_path / "00001-7-fox.mp4"
    with av.open(str(video)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    hold = round(progress_video.HOLD_LAST_S * progress_video.FPS)
    assert len(decoded) == 4 + hold and decoded[0].shape == (32, 48, 3)
    reds = [int(f[..., 0].mean()) for f in decoded]
    assert [abs(r - 40 * i) <= 6 for i, r in enumerate(reds[:4])] == [True] * 4  # in order, H.264 near-lossless
    assert all(abs(r - reds[3]) <= 6 for r in reds[4:])
    assert [p.name for p in tmp_path.iterdir()] == [video.name]  # no temporary file left behind


def test_odd_sizes_are_cropped_to_even_for_yuv420(tmp_path):
    av = pytest.importorskip("av", reason="PyAV (the video extra) is not installed")
    video = progress_video.write_progress_video(_frames(2, (33, 17)), tmp_path / "odd.png")
    with av.open(str(video)) as container:
        first = next(container.decode(video=0))
    assert (first.width, first.height) == (32, 16)


def test_without_pyav_an_animated_webp(tmp_path, monkeypatch):
    monkeypatch.setattr(progress_video, "have_mp4", lambda: False)
    video = progress_video.write_progress_video(_frames(3), tmp_path / "fox.png")
    assert video.suffix == ".webp"
    with Image.open(video) as anim:
        assert anim.format == "WEBP" and anim.n_frames == 3


def test_an_existing_file_is_never_overwritten_and_one_frame_is_refused(tmp_path):
    (tmp_path / "fox.mp4").write_bytes(b"mine")
    (tmp_path / "fox.webp").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        progress_video.write_progress_video(_frames(2), tmp_path / "fox.png")
    assert {p.read_bytes() for p in tmp_path.iterdir()} == {b"mine"}
    with pytest.raises(ValueError, match="at least 2 frames, got 1"):
        progress_video.write_progress_video(_frames(1), tmp_path / "one.png")
