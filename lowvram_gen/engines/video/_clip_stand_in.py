"""A stand-in for lowvram_gen.video_out.save_clip (helper "cli" writes it), with its signature, used only while that
module is not on this branch: an animated WebP (PIL), a JSON sidecar with `meta`, the frames as PNGs when asked.
Deleted once video_out is merged."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen import outputs


@dataclass
class SavedClip:
    path: str
    frames: list[str]
    container: str
    note: str = ""


def save_clip(frames, outdir, seed, prompt, fps, parameters, meta, save_frames=False, decoration=""):
    from PIL import Image

    path = outputs.next_image_path(outdir, seed, prompt, ext="webp", decoration=decoration)
    images = [Image.fromarray(f) for f in frames]
    tmp = path.with_name(f".{path.name}.tmp")
    images[0].save(tmp, format="WEBP", save_all=True, append_images=images[1:], duration=int(round(1000 / fps)),
                   lossless=True, loop=0)
    os.replace(tmp, path)
    path.with_suffix(".json").write_text(json.dumps({"parameters": parameters, **meta}, default=str))
    saved = []
    if save_frames:
        folder = path.with_name(path.stem + "-frames")
        folder.mkdir(exist_ok=True)
        for i, image in enumerate(images):
            image.save(folder / f"{i:05d}.png")
            saved.append(str(folder / f"{i:05d}.png"))
    return SavedClip(str(Path(path)), saved, "webp", "stand-in saver: animated WebP")
