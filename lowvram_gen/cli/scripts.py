"""The img2img command's A1111 scripts: `--loopback N` and `--sd-upscale SCALE` (lowvram_gen/img2img_scripts).

Each loop or tile is one `Session.generate` job with its own plan and tqdm bar; a line `loop i/n` / `tile i/n`
on stderr says which. Without --json stdout gets every image saved, one per line (Loopback's grid last); with
--json one object: the script's result (`images`, `final`, `grid`, `seeds`, `summary`, `warnings`, ...).
"""

from __future__ import annotations

import json
import sys


def add_script_args(p) -> None:
    """The script flags of `img2img` (no heavy imports)."""
    g = p.add_argument_group("A1111's img2img scripts (one of them)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--loopback", metavar="N",
                   help="A1111's Loopback: N img2img passes, each from the last one's image (1-32); every loop's "
                        "image is saved, with a grid of them")
    x.add_argument("--sd-upscale", dest="sd_upscale", metavar="SCALE",
                   help="A1111's SD upscale: upscale the init image by SCALE (above 1), cut it into tiles of "
                        "--width x --height and img2img each tile as its own job (a small card upscales a big "
                        "image), then join them with a feathered overlap")
    g.add_argument("--loopback-final-denoise", dest="loopback_final_denoise", default=0.5, metavar="X",
                   help="Loopback's final denoising strength, 0-1 (default 0.5): the strength moves to it from "
                        "--strength over the loops")
    g.add_argument("--loopback-curve", dest="loopback_curve", default="Linear", metavar="Linear|Aggressive|Lazy",
                   help="Loopback's denoising strength curve (default Linear)")
    g.add_argument("--sd-upscale-overlap", dest="sd_upscale_overlap", default=64, metavar="PX",
                   help="SD upscale's tile overlap in px, smaller than the tile (default 64)")
    g.add_argument("--sd-upscale-upscaler", dest="sd_upscale_upscaler", default="Lanczos", metavar="NAME",
                   help="SD upscale's upscaler: None (no upscale, as A1111's), Lanczos (default), Nearest, sd-x4 or "
                        "an ESRGAN-family model of models/ESRGAN")


def wanted(args) -> bool:
    """Whether the command line asks for a script."""
    return getattr(args, "loopback", None) is not None or getattr(args, "sd_upscale", None) is not None


def run_script_command(args, request, session, said: list[str]) -> int:
    """Run the script the flags name over `request` on `session`; print as `generate` does."""
    from lowvram_gen.jobs.console import ProgressBar

    bar = ProgressBar("step")

    def run_one(job):
        return session.generate(job, on_step=bar.update)

    def on_part(_index, _total, line):
        print(line, file=sys.stderr)

    try:
        from lowvram_gen.img2img_scripts import scripts

        if args.loopback is not None:
            descriptor, kwargs = scripts.LOOPBACK, dict(loops=args.loopback,
                                                        final_denoising_strength=args.loopback_final_denoise,
                                                        denoising_curve=args.loopback_curve)
        else:
            descriptor, kwargs = scripts.SD_UPSCALE, dict(overlap=args.sd_upscale_overlap,
                                                          upscaler=args.sd_upscale_upscaler,
                                                          scale_factor=args.sd_upscale)
        result = scripts.run(descriptor, request, session, run_one=run_one, on_part=on_part, outdir=args.outdir,
                             cpu=bool(getattr(args, "cpu", False)), **kwargs)
    finally:
        bar.close()
    report(result, args.json, said, [*result.images, *([result.grid] if result.grid else [])])
    return 0


def report(result, as_json: bool, said: list[str], paths: list[str]) -> None:
    """A script's or a grid's end, as `generate` prints a job's: its warnings and summary on stderr; on stdout its
    `paths` one a line, or with --json its result's object (the command line's warnings `said` first)."""
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.summary, file=sys.stderr)
    if as_json:
        data = result.as_json()
        data["warnings"] = [*said, *(w for w in result.warnings if w not in said)]
        print(json.dumps(data))
    else:
        for path in paths:
            print(path)
