"""The progress video of a VQGAN-CLIP run, written beside its final image (the encoders are video_out.py's, which
writes generated clips too).

H.264 mp4 through PyAV (the `video` extra: `pip install lowvram-gen[video]`; its wheels bundle
FFmpeg, so no system ffmpeg is needed) when it is installed, an animated WebP through Pillow
otherwise. Like every output, the file is written under a hidden temporary name and linked into
place, so a crash never leaves a truncated video under the final name and nothing is overwritten.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FPS = 10
HOLD_LAST_S = 1.5  # the final frame stays on screen a moment, as in VQGAN-CLIP's own videos


def have_mp4() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def write_progress_video(frames: list, png: Path) -> Path:
    """Write `frames` (PIL images, oldest first) as PNG's sibling .mp4 (or .webp); return its path."""
    if len(frames) < 2:
        raise ValueError(f"a progress video needs at least 2 frames, got {len(frames)}")
    suffix, writer = (".mp4", _mp4) if have_mp4() else (".webp", _webp)
    target = png.with_suffix(suffix)
    tmp = png.with_name(f".{png.stem}.{secrets.token_hex(6)}{suffix}.tmp")
    try:
        writer(frames, tmp)
        os.link(tmp, target)  # fails rather than overwrite a file that already has this name
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return target


def _mp4(frames: list, path: Path) -> None:
    from lowvram_gen.video_out import write_mp4

    held = frames + [frames[-1]] * round(HOLD_LAST_S * FPS)
    write_mp4(held, path, FPS)  # odd sides lose their last row/column: yuv420p needs even ones


def _webp(frames: list, path: Path) -> None:
    from lowvram_gen.video_out import write_webp

    durations = [1000 // FPS] * (len(frames) - 1) + [int(HOLD_LAST_S * 1000)]
    write_webp(frames, path, durations)
