"""`lowvram-gen vqgan PROMPTS ...` and `lowvram-gen plan --engine vqgan`: parsers and commands.

Light at import time (cli/main.py imports it to build its parser): torch loads only when a job runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from lowvram_gen.cli.output import print_result, run_interruptible
from lowvram_gen.engines.vqgan.request import AUGMENTS, DEFAULT_AUGMENTS, INIT_NOISE, MAX_CUTN, MAX_ITERATIONS, OPTIMIZERS

EPILOG = f"""\
prompts:  'a lighthouse at dusk:1|oil painting:0.5|blurry:-0.5' -- text:weight:stop separated by |.
          A negative weight pushes away from a text; stop (a loss value) stops a prompt pulling once it
          is reached. Write \\: for a colon inside the text.
augments: {', '.join(f'{k} {v}' for k, v in AUGMENTS.items())} (default {' '.join(DEFAULT_AUGMENTS)}; 'none' for none)
models:   --vqgan tiny (default; random weights, noise) | a diffusers VQModel folder or hub id |
          vqgan_imagenet_f16_16384.ckpt (its .yaml beside it, or --vqgan-config); converted once, cached.
          --clip tiny | ViT-B/32 | ViT-B/16 | ViT-L/14 | a CLIP hub id or folder.
Ctrl-C stops at the next iteration and keeps the image so far; a second Ctrl-C quits at once.
"""


def add_vqgan_parser(sub, add_memory_flags) -> None:
    p = sub.add_parser("vqgan", help="VQGAN-CLIP: steer a VQGAN image towards text and image prompts",
                       description="VQGAN-CLIP (as in nerdyrodent/VQGAN-CLIP) with memory presets and an out-of-memory "
                                   "ladder that resumes from the current image instead of starting over.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", nargs="?", default="", help="text prompts, 'text:weight:stop|...' (may be '' with "
                                                          "--image-prompt)")
    p.add_argument("--image-prompt", "--image-prompts", dest="image_prompts", action="append", default=[],
                   metavar="PATH[:W[:STOP]]", help="an image to steer towards (repeat for several)")
    p.add_argument("--init-image", metavar="PATH", help="start from this image instead of random codes")
    p.add_argument("--init-weight", default=0.0, metavar="X", help="keep close to the init image (default 0)")
    p.add_argument("--init-noise", default="none", metavar="|".join(INIT_NOISE), help="start from noise (default none)")
    p.add_argument("--size", nargs=2, default=[512, 512], metavar=("W", "H"), help="multiples of 16 (default 512 512)")
    p.add_argument("--iterations", default=500, metavar="N", help=f"1-{MAX_ITERATIONS} (default 500)")
    p.add_argument("--save-every", default=50, metavar="N",
                   help="progress image every N iterations; 0: only the final image (default 50)")
    p.add_argument("--cutn", "--cuts", default=32, metavar="N",
                   help=f"cutouts per iteration, 1-{MAX_CUTN} (default 32)")
    p.add_argument("--cut-pow", default=1.0, metavar="X", help="cutout size power (default 1)")
    p.add_argument("--lr", "--learning-rate", default=0.1, metavar="X", help="learning rate (default 0.1)")
    p.add_argument("--optimizer", default="Adam", metavar="NAME", help=", ".join(OPTIMIZERS) + " (default Adam)")
    p.add_argument("--augments", nargs="+", default=list(DEFAULT_AUGMENTS), metavar="CODE",
                   help="cutout augmentations, codes listed below ('none' for none)")
    p.add_argument("--seed", default=-1, metavar="N", help="0..4294967295, or -1 for random (default)")
    p.add_argument("--batch", dest="batch_size", default=1, metavar="N", help="images, seeds seed+i (default 1)")
    p.add_argument("--vqgan", default="tiny", metavar="SPEC",
                   help="VQGAN: tiny, a VQModel folder/hub id, or a taming .ckpt")
    p.add_argument("--vqgan-config", metavar="YAML", help="the taming .yaml when it is not beside the .ckpt")
    p.add_argument("--clip", default="tiny", metavar="SPEC", help="CLIP: tiny, ViT-B/32, a hub id or a folder")
    p.add_argument("--video", action="store_true", help="also write a progress video (mp4 with the video extra, else animated WebP)")
    p.add_argument("--outdir", metavar="DIR", help="output folder (default outputs/<date>/)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the result to stdout")
    add_memory_flags(p)


def request_from_args(args):
    from lowvram_gen.engines.vqgan.request import VqganRequest

    augments = args.augments
    if len(augments) == 1 and augments[0].lower() == "none":
        augments = []
    return VqganRequest(
        prompt=args.prompts, image_prompts=tuple(args.image_prompts), init_image=args.init_image,
        init_weight=args.init_weight, init_noise=args.init_noise, width=args.size[0], height=args.size[1],
        iterations=args.iterations, save_every=args.save_every, cutn=args.cutn, cut_pow=args.cut_pow, lr=args.lr,
        optimizer=args.optimizer, augments=tuple(a for item in augments for a in item.split(",") if a),
        seed=args.seed, batch_size=args.batch_size, vqgan=args.vqgan, vqgan_config=args.vqgan_config,
        clip=args.clip, video=args.video, outdir=args.outdir,
    ).validated()


def run_vqgan_command(args, session_kwargs: dict) -> int:
    request = request_from_args(args)  # bad input: exit 2 before anything heavy is imported
    from lowvram_gen.session import Session

    session = Session(**session_kwargs)
    result = run_interruptible(lambda on_step, cancel: session.generate_vqgan(request, on_step=on_step, cancel=cancel),
                               "it", "")
    return print_result(result, args.json, result.images + result.videos)


# ------------------------------------------------------------------------------------------- plan


def add_vqgan_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("VQGAN-CLIP (--engine vqgan; --model then names the VQGAN)")
    g.add_argument("--engine", choices=("sd", "vqgan"), default="sd", help="sd (default) or vqgan")
    g.add_argument("--clip", default="ViT-B/32", metavar="SPEC", help="CLIP for --engine vqgan (default ViT-B/32)")
    g.add_argument("--cutn", default=32, metavar="N", help="cutouts per iteration for --engine vqgan (default 32)")


def plan_vqgan_command(args, session_kwargs: dict) -> int:
    """`plan --engine vqgan`: every preset's VQGAN-CLIP estimate (--model defaults to vqgan_imagenet_f16_16384)."""
    from lowvram_gen.engines.vqgan.request import VqganRequest
    from lowvram_gen.hardware import device as device_mod
    from lowvram_gen.models import profile as memory
    from lowvram_gen.planning import vqgan as memory_vqgan
    from lowvram_gen.request import as_int, as_side

    width, height = (as_side(name, 512 if value is None else value, multiple=16)
                     for name, value in (("width", args.width), ("height", args.height)))
    cutn = as_int("cutn", args.cutn, 1, MAX_CUTN)
    vqgan = memory_vqgan.DEFAULT_VQGAN if memory.is_builtin(args.model) else args.model
    from lowvram_gen.session import Session

    # the Session `lowvram-gen vqgan` with these flags would make: its presets, forced preset, --xformers and the
    # remembered failures are the plan's; the models are counted from their specs, not loaded
    session = Session(**session_kwargs)
    dev = session.device(vram=args.vram)
    try:
        profile = memory_vqgan.profile_from_specs(vqgan, args.clip)
    except ValueError as exc:
        from lowvram_gen.errors import InvalidRequest

        raise InvalidRequest("model", vqgan, str(exc)) from None
    result = session.plan_vqgan(VqganRequest(vqgan=vqgan, clip=args.clip, width=width, height=height, cutn=cutn),
                                dev, profile=profile)
    if args.json:
        print(json.dumps({"engine": "vqgan", "device": dev.as_dict(), "model": vqgan, "clip": args.clip,
                          "profile": profile.as_dict(), "width": width, "height": height, "cutn": cutn,
                          **result.as_dict()}))
        return 0
    gib = device_mod.format_size
    print(f"device: {dev.name}; usable {gib(dev.usable_bytes)} (free {gib(dev.free_bytes)}, "
          f"reserve {gib(dev.reserve_bytes)})")
    print(f"job: VQGAN-CLIP {vqgan} + {args.clip}, {width}x{height}, {cutn} cutouts")
    presets = session.presets()
    for e in result.estimates:
        mark = "->" if e.name == result.preset.name else "  "
        knobs = presets[e.name].vqgan if e.name in presets else None
        size = f"{e.width}x{e.height}" + (" (capped, upscaled after)" if (e.width, e.height) != (width, height) else "")
        extra = ""
        if knobs:
            extra = (f", chunks of {min(knobs.cutn_chunk, cutn)}"
                     + (", checkpointing" if knobs.gradient_checkpointing else "")
                     + (", autocast" if knobs.clip_autocast else ""))
        print(f"{mark} {e.name:9} {gib(e.estimate_bytes):>9}  {'fits' if e.fits else 'too big':7}  {size}{extra}")
    print(f"would run: {result.preset.name} ({result.reason})")
    return 0
