"""Writing a video: a generated clip (`save_clip`, issue 33) and VQGAN-CLIP's progress video share these writers.

- H.264 mp4 through PyAV (the `video` extra: `pip install lowvram-gen[video]`; its wheels bundle FFmpeg, so no system
  ffmpeg is needed), yuv420p so every browser and player shows it; without PyAV an animated WebP through Pillow, and
  the clip's `note` says so.
- The A1111 parameters text goes into the file itself: the mp4's `comment` tag (what FFmpeg, PyAV and players show
  as the comment), the WebP's EXIF UserComment (where A1111 puts it in a WebP). Beside the clip a JSON sidecar
  `<stem>.json` holds the same text and our metadata; `--save-frames` adds `<stem>-frames/00000.png`..., each PNG
  with the parameters as an image of ours has them.
- Names and writes are the images' (outputs.py): `00012-1234-a-fox.mp4` from `next_image_path`, written under a
  hidden temporary name and linked into place (`outputs.save_new_file`), so a crash never leaves a truncated clip
  under its final name and nothing is ever overwritten.

Only the standard library, Pillow and outputs.py are imported with this module; PyAV (and numpy, for array frames)
only when a clip is written.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable

from PIL import Image

from lowvram_gen import outputs
from lowvram_gen.errors import OutputError

CRF = "18"  # x264's constant rate factor: visually lossless, and clips of a few seconds stay small
WEBP_QUALITY = 90
NO_PYAV = "PyAV is not installed (pip install lowvram-gen[video]): saved as animated WebP"
_USER_COMMENT = 0x9286  # EXIF UserComment, in the Exif IFD
_EXIF_IFD = 0x8769


@dataclass(frozen=True)
class SavedClip:
    """What `save_clip` wrote: the clip, its frames' PNGs (when asked for), "mp4" or "webp", and a note for the user
    ("" when there is nothing to say: the WebP fallback and a crop to even sides are said here)."""

    path: Path
    frames: list[Path] = field(default_factory=list)
    container: str = "mp4"
    note: str = ""

    @property
    def sidecar(self) -> Path:
        return sidecar_path(self.path)


def have_pyav() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def as_rate(fps) -> Fraction:
    """The frame rate as the exact fraction the container stores: 16 -> 16/1, 23.976 -> 2997/125, 30000/1001 kept.
    Refuses what is not a finite number above 0, in one sentence."""
    try:
        value = float(fps)
    except (TypeError, ValueError):
        raise ValueError(f"fps must be a number above 0, got {fps!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"fps must be a number above 0, got {fps!r}")
    rate = fps if isinstance(fps, Fraction) else Fraction(value).limit_denominator(1001)  # 1001: NTSC's rates
    return rate


def sidecar_path(clip: str | Path) -> Path:
    """`00012-7-a-fox.json` beside `00012-7-a-fox.mp4`."""
    return Path(clip).with_suffix(".json")


def frames_folder(clip: str | Path) -> Path:
    """`00012-7-a-fox-frames/` beside `00012-7-a-fox.mp4`."""
    clip = Path(clip)
    return clip.with_name(f"{clip.stem}-frames")


def as_images(frames: Iterable) -> list[Image.Image]:
    """RGB PIL images from what a pipeline returns: PIL images, H x W x 3 arrays (uint8, or floats in [0, 1] as
    diffusers' output_type="np" gives them: scaled as diffusers' own numpy_to_pil scales them, so a frame saved here
    equals the pipeline's "pil" frame), or one F x H x W x 3 array. At least one frame, all of one size."""
    if hasattr(frames, "ndim") and getattr(frames, "ndim") == 4:
        frames = list(frames)
    images = [_as_image(f, i) for i, f in enumerate(frames)]
    if not images:
        raise ValueError("a clip needs at least 1 frame, got 0")
    size = images[0].size
    for i, image in enumerate(images):
        if image.size != size:
            raise ValueError(f"every frame of a clip must have one size: frame 0 is {size[0]}x{size[1]}, frame {i} "
                             f"is {image.size[0]}x{image.size[1]}")
    return images


def _as_image(frame, index: int) -> Image.Image:
    if isinstance(frame, Image.Image):
        return frame if frame.mode == "RGB" else frame.convert("RGB")
    import numpy as np

    array = np.asarray(frame)
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"frame {index} is not an image: an array of shape {array.shape}, not height x width x 3")
    if array.dtype != np.uint8:
        array = (np.clip(array.astype(np.float32), 0.0, 1.0) * 255).round().astype(np.uint8)
    if array.shape[-1] == 1:
        array = array[..., 0]
    return Image.fromarray(array).convert("RGB")


# ------------------------------------------------------------------------------------------------- writers


def write_mp4(frames: list[Image.Image], path: Path, fps, comment: str = "") -> tuple[int, int]:
    """H.264 (libx264, yuv420p) `frames` at `fps` into `path` (any name: the container is given, not guessed from it);
    `comment` in the file's metadata. yuv420p needs even sides: an odd side loses its last row or column. Returns the
    size written."""
    import av

    width, height = (d - d % 2 for d in frames[0].size)
    if width < 2 or height < 2:
        raise ValueError(f"a frame of {frames[0].size[0]}x{frames[0].size[1]} is too small for H.264 (at least 2x2)")
    # faststart: the index at the front, so a browser's player starts before the whole file has come
    with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        if comment:
            container.metadata["comment"] = comment
        stream = container.add_stream("libx264", rate=as_rate(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": CRF}
        for image in frames:
            image = image.convert("RGB")
            if image.size != (width, height):
                image = image.crop((0, 0, width, height))
            container.mux(stream.encode(av.VideoFrame.from_image(image)))
        container.mux(stream.encode())  # flush the encoder
    return width, height


def write_webp(frames: list[Image.Image], path: Path, durations_ms: list[int] | int, comment: str = "") -> None:
    """An animated, looping WebP through Pillow: `durations_ms` per frame (or one for all), `comment` as the EXIF
    UserComment (A1111's place for a WebP's parameters: "UNICODE" then UTF-16)."""
    extra = {}
    if comment:
        exif = Image.Exif()
        exif.get_ifd(_EXIF_IFD)[_USER_COMMENT] = b"UNICODE\0" + comment.encode("utf-16-be")
        extra["exif"] = exif.tobytes()
    frames[0].save(path, format="WEBP", save_all=True, append_images=frames[1:], duration=durations_ms, loop=0,
                   quality=WEBP_QUALITY, **extra)


def webp_duration_ms(fps) -> int:
    """A WebP frame's duration: whole milliseconds (16 fps -> 62 ms; the format has no finer clock)."""
    return max(1, round(1000 / float(as_rate(fps))))


# ---------------------------------------------------------------------------------------------- a clip


def save_clip(frames, outdir: str | Path, seed: int | None, prompt: str, fps, parameters: str, meta: dict,
              save_frames: bool = False, decoration: str = "") -> SavedClip:
    """Save a generated clip: `<counter>-<seed>-<prompt>.mp4` in `outdir` (or `.webp` without PyAV), its sidecar
    `<stem>.json` ({"parameters", "meta", "file", "container", "frame_count", "fps", "width", "height", "frames"}), and
    with `save_frames` its frames as `<stem>-frames/00000.png`... (each with the parameters and `meta` plus its
    index, as outputs.save_png writes them).

    `frames`: see `as_images`. `fps`: a number above 0 (a Fraction kept exact). `parameters`: the A1111 text
    (outputs.a1111_parameters). `decoration`: a file name pattern's part (outputs.next_image_path). Bad frames or fps
    raise ValueError in one sentence before anything is written; a failed write raises OutputError, and nothing
    appears under a final name that is not whole. The clip is written first: a failure after it keeps it."""
    rate = as_rate(fps)
    images = as_images(frames)
    mp4 = have_pyav()
    container, note = ("mp4", "") if mp4 else ("webp", NO_PYAV)
    target = outputs.next_image_path(outdir, seed, prompt, ext=container, decoration=decoration)
    size = images[0].size
    if mp4:
        written: list[tuple[int, int]] = []
        path = outputs.save_new_file(target, lambda tmp: written.append(write_mp4(images, tmp, rate, parameters)),
                                     what="video")
        if written and written[0] != size:
            note = (f"H.264 (yuv420p) takes even sides only: the {size[0]}x{size[1]} frames are "
                    f"{written[0][0]}x{written[0][1]} in the clip (the saved frames keep their size)")
    else:
        path = outputs.save_new_file(target, lambda tmp: write_webp(images, tmp, webp_duration_ms(rate), parameters),
                                     what="video")
    frame_paths = _save_frames(images, path, parameters, meta) if save_frames else []
    folder = frames_folder(path)
    sidecar = {"parameters": parameters, "meta": meta, "file": path.name, "container": container,
               "frame_count": len(images), "fps": float(rate), "width": size[0], "height": size[1],
               "frames": [f"{folder.name}/{p.name}" for p in frame_paths]}
    text = json.dumps(sidecar, default=str, ensure_ascii=False, indent=1)
    _save_sidecar(sidecar_path(path), text)
    return SavedClip(path=path, frames=frame_paths, container=container, note=note)


def _save_frames(images: list[Image.Image], clip: Path, parameters: str, meta: dict) -> list[Path]:
    folder = frames_folder(clip)
    try:
        folder.mkdir()  # a new folder: the clip's name was free, so its frames' folder is ours alone
    except OSError as exc:
        raise OutputError(f"could not save the frames of {clip.name} in {folder}: {exc.strerror or exc}; the clip "
                          "itself is saved") from exc
    return [outputs.save_png(image, folder / f"{i:05d}.png", parameters, {**meta, "frame": i})
            for i, image in enumerate(images)]


def _save_sidecar(path: Path, text: str) -> Path:
    return outputs.save_new_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), what="video's sidecar",
                                 next_free=False)


def read_clip(path: str | Path) -> tuple[str | None, dict | None]:
    """(parameters text, the sidecar's `meta`) of a clip from its sidecar; None for what is absent or unreadable (a
    clip another tool made)."""
    from lowvram_gen.safe_json import BadJson, load_file

    try:
        data = load_file(sidecar_path(path))
    except (OSError, BadJson, ValueError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    parameters, meta = data.get("parameters"), data.get("meta")
    return (parameters if isinstance(parameters, str) else None), (meta if isinstance(meta, dict) else None)
