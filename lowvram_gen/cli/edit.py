"""`lowvram-gen edit PROMPT --image IMG [--image IMG2 ...]`: an editing model (Qwen-Image-Edit, FLUX.1 Kontext,
Flux.2 with reference images) edits or takes from the given images (issue 30). The job is generate's (the request's
reference_images, engines/sd/edit.py): every generate flag works here too.

One default is the edit's own, where the flag is not given: the size is the first image's (down to a multiple of
16, at most about 1024x1024 pixels, its aspect kept), as an edit keeps the picture it edits. Steps and CFG left unset
are the family's, as for any job (its record's `sampling`: Kontext edits at guidance 2.5). No heavy imports here.
"""

from __future__ import annotations

import argparse
import math

GRID = 16  # every editing pipeline's sides: its VAE's 8 x the 2x2 latent packing
MAX_AREA = 1024 * 1024  # the pixels the editing models are trained at


def add_edit_parser(sub, add_generation_args) -> None:
    """The `edit` subcommand: --image (repeatable) and generate's flags."""
    ed = sub.add_parser("edit", help="edit images with an editing model (Qwen-Image-Edit, FLUX.1 Kontext, Flux.2)",
                        description="Edit the --image(s) as the prompt says, with an editing model (--model: "
                                    "Qwen-Image-Edit, Qwen-Image-Edit-Plus, FLUX.1 Kontext, Flux.2). The size "
                                    "defaults to the first image's; every generate flag works here too.")
    ed.add_argument("--image", dest="reference_images", action="append", required=True, metavar="IMAGE",
                    help="a reference image to edit or take from (repeatable: Qwen-Image-Edit-Plus takes 3, "
                         "Flux.2 Klein 4; Qwen-Image-Edit and Kontext one)")
    add_generation_args(ed)


def edit_defaults(args: argparse.Namespace) -> None:
    """The edit's own default on `args`, where the flags are not given: the size from the first image. (Steps and
    CFG left unset are the family's, as for every job: its record's `sampling`, Kontext's 28 at guidance 2.5.)"""
    if args.width is None and args.height is None and args.reference_images and not args.from_png:
        args.width, args.height = size_of(args.reference_images[0])


def size_of(path: str) -> tuple[int, int] | tuple[None, None]:
    """An image's size made an edit's: at most MAX_AREA pixels (aspect kept), down to multiples of GRID, at least 64
    a side; (None, None) for an unreadable file (the request says why)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            w, h = image.size
    except (OSError, ValueError, Image.DecompressionBombError):
        return None, None
    scale = min(1.0, math.sqrt(MAX_AREA / (w * h)))
    return (max(64, int(w * scale) // GRID * GRID), max(64, int(h * scale) // GRID * GRID))

