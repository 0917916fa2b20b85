"""`lowvram-gen video PROMPT` (issue 33): a clip from Wan 2.1/2.2 or LTX-Video through the same memory layer as
images; and what `generate` and `plan` ask of a model before anything loads (a video model is not an image model).

Light at import time (cli/main.py imports it to build its parser): the model's family comes from its folder's
model_index.json (families/spec.py) or a built-in name, and torch loads only when a job runs.
"""

from __future__ import annotations

import sys

from lowvram_gen.cli.output import print_result, run_interruptible

VIDEO_FAMILIES = "Wan 2.1/2.2 and LTX-Video"  # engines/video/checks.py's words (--help stays light)
EPILOG = """\
models:  a diffusers folder of Wan 2.1 (T2V 1.3B/14B, I2V 14B), Wan 2.2 (TI2V 5B, T2V/I2V A14B) or LTX-Video, or
         its hub id once downloaded; for `plan` also the built-in names wan21-t2v-1.3b, wan21-t2v-14b,
         wan21-i2v-14b, wan22-ti2v-5b, wan22-t2v-a14b, wan22-i2v-a14b, ltx-video.
frames:  Wan takes 4k+1 frames (81 by default), LTX-Video 8k+1 (161); width and height are multiples of the
         model's VAE factor times its patch (Wan 2.1: 16, Wan 2.2 TI2V and LTX-Video: 32). A wrong count or size is
         refused with the nearest ones that work.
output:  an H.264 mp4 (PyAV, the video extra: pip install 'lowvram-gen[video]'), else an animated WebP (said); the
         parameters in the file's metadata and in <name>.json beside it; --save-frames adds <name>-frames/*.png.
Ctrl-C stops at the next step and keeps the clip so far; a second Ctrl-C quits at once.
"""


# ------------------------------------------------------------------------------- what the model is, before loading


def model_record(spec: str | None):
    """(the family record `spec` names, its folder's facts) from files only: a folder's (or a downloaded hub id's)
    model_index.json, else a built-in name (its facts those of the configs shipped with the package); (None, None)
    where that cannot be known before loading (a single file, a hub id not downloaded). The embedded tiny models are
    their shapes' records (SD 1.5, SDXL), with no facts."""
    from lowvram_gen import families
    from lowvram_gen.families.sampling import folder_facts
    from lowvram_gen.families.spec import index_folder, record_of_spec

    from lowvram_gen.families.record import FolderFacts
    from lowvram_gen.models.tiny import TINY_MODELS

    if not spec:
        return None, None
    if spec in TINY_MODELS:
        return families.by_name("sdxl" if spec == "tiny-sdxl" else "sd15"), FolderFacts(name=spec)
    record = record_of_spec(spec)
    if record is not None:
        return record, folder_facts(spec, index_folder(spec))
    record = families.by_name(spec)
    if record is None:
        return None, None
    from lowvram_gen.models.profile import CONFIGS  # the shipped configs of a built-in name, read as a folder's

    return record, folder_facts(spec, CONFIGS / record.builtin if record.builtin else None)


def is_video_model(spec: str | None) -> bool | None:
    """True: a video family; False: an image model (tiny included); None: not known before loading."""
    record, _ = model_record(spec)
    return None if record is None else record.is_video


def refuse_video_model(spec: str | None) -> None:
    """`generate` (img2img, inpaint, edit) given a video model: the engine's sentence pointing to `lowvram-gen video`,
    said before anything loads."""
    record, facts = model_record(spec)
    if record is not None and record.is_video:
        from lowvram_gen.engines.video.checks import VideoModel, refuse_video_model as refusal

        raise refusal(spec, VideoModel(record, record.video_facts(facts), facts,
                                       str(facts.model_index.get("_class_name") or "")))


def refuse_image_model(spec: str | None) -> None:
    """`video` (and `plan --frames`) given an image model: the engine's sentence naming what `video` takes, said before
    anything loads."""
    record, _ = model_record(spec)
    if record is not None and not record.is_video:
        from lowvram_gen.engines.video.checks import refuse_image_model as refusal

        raise refusal(spec, record)


def default_size(spec: str | None) -> tuple[int, int] | None:
    """The (width, height) the model's clips have when a job gives none (its record's Video facts); None: unknown."""
    record, facts = model_record(spec)
    return tuple(record.video_facts(facts).size) if record is not None and record.is_video else None


def plan_video_fields(args) -> dict:
    """`plan --frames N [--fps F] [--init-image IMG]`: the request's video fields (checked as a video request's are),
    and the clip's own `size` where the model's record says it; {} for an image plan. --fps or --init-image without
    --frames, and --frames on an image model, are refused in one sentence."""
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.request import GenerationRequest

    frames, fps, init = (getattr(args, name, None) for name in ("frames", "fps", "init_image"))
    if frames is None:
        for flag, value in (("--fps", fps), ("--init-image", init)):
            if value is not None:
                raise InvalidRequest(flag, value, "it plans a clip: give --frames N too (0: the model's own count)")
        return {}
    refuse_image_model(args.model)
    checked = GenerationRequest(model=args.model, frames=frames, fps=fps, init_image=init).validated()
    fields = {"frames": checked.frames, "fps": checked.fps, "init_image": checked.init_image}
    size = default_size(args.model)
    return {**fields, "size": size} if size is not None else fields


def clip_words(request) -> str:
    """What `plan` says of a clip on its job line: ", 81 frames at 16 fps, from first.png"; "" for an image."""
    if request.frames is None:
        return ""
    words = f", {request.frames} frames" if request.frames else ", the model's frame count"
    if request.fps:
        words += f" at {request.fps:g} fps"
    return words + (f", from {request.init_image}" if request.init_image else "")


# ----------------------------------------------------------------------------------------------------- parser


def add_video_parser(sub, add_memory_flags, add_quantize) -> None:
    """`video`: its own job flags, and exactly `generate`'s memory flags and --quantize (cli/main.py's helpers)."""
    import argparse

    p = sub.add_parser("video", help="text or image to video (Wan 2.1/2.2, LTX-Video)",
                       description="Make a short clip from a prompt (and a first frame with --init-image) with the "
                                   "same memory presets, planner and out-of-memory ladder as images.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", help="what to film")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help=f"the video model ({VIDEO_FAMILIES}): a diffusers folder or a downloaded hub id")
    p.add_argument("--frames", metavar="N",
                   help="frames of the clip: Wan 4k+1 (81), LTX-Video 8k+1 (161); 0 or left out: the model's")
    p.add_argument("--fps", metavar="F", help="frames per second of the clip, above 0 (default: the model's, 16 for "
                                              "Wan 2.1 and A14B, 24 for Wan 2.2 TI2V and LTX-Video)")
    p.add_argument("--width", metavar="N", help="default: the model's (832 for Wan 2.1, 1280 for Wan 2.2, 704 LTX)")
    p.add_argument("--height", metavar="N", help="default: the model's (480 for Wan 2.1, 704/720 for Wan 2.2, 480 LTX)")
    p.add_argument("--steps", metavar="N",
                   help="denoising steps, 1-150 (default: the model's, 50 for Wan, 40 for Wan 2.2 A14B)")
    p.add_argument("--cfg", dest="cfg_scale", metavar="X", help="CFG scale, 0-30 (default: the model's)")
    p.add_argument("--cfg-2", dest="cfg_scale_2", metavar="X",
                   help="Wan 2.2 A14B's second guidance: the low-noise expert's CFG scale, 0-30 (default: the "
                        "model's)")
    p.add_argument("--negative", "--negative-prompt", dest="negative_prompt", metavar="TEXT", help="what not to film")
    p.add_argument("--seed", metavar="N", help="0..4294967295, or -1 for random (default)")
    p.add_argument("--sampler", metavar="NAME",
                   help="'default' (the model folder's flow-matching scheduler) or a flow-matching one the pipeline "
                        "takes (UniPC, Euler, ...)")
    p.add_argument("--init-image", dest="init_image", metavar="IMAGE",
                   help="image-to-video: the clip's first frame (Wan 2.1 I2V, Wan 2.2 TI2V and I2V A14B, LTX-Video)")
    p.add_argument("--save-frames", action="store_true", help="also save every frame as a PNG (<name>-frames/)")
    p.add_argument("--allow-upscale", action="store_true",
                   help="where the size cannot fit at any memory step, make it smaller and upscale the frames after "
                        "(said in the result); without it such a job is refused, naming a size that fits")
    p.add_argument("--outdir", metavar="DIR", help="output folder (default outputs/<date>/)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (video, frames, preset, attempts, seconds, warnings, ...) to stdout")
    add_quantize(p)
    add_memory_flags(p)


# the request fields the video flags set (argparse dest = GenerationRequest field); None: not given
VIDEO_FLAGS = ("prompt", "negative_prompt", "model", "width", "height", "steps", "cfg_scale", "cfg_scale_2", "seed",
               "sampler", "init_image", "fps", "quantize")


def request_from_args(args):
    """The video request of `args`, validated: bad input is refused here, before anything heavy is imported or
    loaded (an image model too, where its folder or name says so)."""
    from lowvram_gen.request import GenerationRequest

    refuse_image_model(args.model)
    fields = {name: getattr(args, name) for name in VIDEO_FLAGS if getattr(args, name, None) is not None}
    if args.width is None or args.height is None:
        size = default_size(args.model)  # the model's own size: the request's default 512 is an image's
        if size is not None:
            fields.setdefault("width", size[0])
            fields.setdefault("height", size[1])
    return GenerationRequest(**fields, frames=0 if args.frames is None else args.frames, outdir=args.outdir,
                             save_frames=args.save_frames, allow_upscale=args.allow_upscale).validated()


def run_video_command(args, session_kwargs: dict) -> int:
    request = request_from_args(args)
    from lowvram_gen.session import Session

    session = Session(**session_kwargs)
    result = run_interruptible(lambda on_step, cancel: session.generate(request, on_step=on_step, cancel=cancel),
                               "step", " and keeping the clip so far")
    # every clip of a batch count, one path a line (its JSON's `videos`)
    return print_result(result, args.json, list(result.videos) or ([result.video] if result.video else []))
