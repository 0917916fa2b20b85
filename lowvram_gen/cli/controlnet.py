"""generate/img2img's ControlNet flags: `--controlnet MODEL[:WEIGHT[:START[:END]]]`, `--control-image IMAGE`,
`--preprocessor NAME`, `--control-resize MODE` (each repeatable, one per unit, in order) and `--control-mode`. No heavy imports."""

from __future__ import annotations

import argparse


def add_controlnet_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ControlNet (A1111's sd-webui-controlnet; SD 1.x/2.x, SDXL, SD3 and Flux)")
    g.add_argument("--controlnet", action="append", default=[], metavar="MODEL[:WEIGHT[:START[:END]]]",
                   help="a ControlNet: a name in models/ControlNet, a diffusers folder, a hub id or a "
                        ".safetensors/.pth file; weight 0-2 (default 1), guidance start/end 0-1 (default 0 and 1). "
                        "Repeatable: several units")
    g.add_argument("--control-image", action="append", default=[], metavar="IMAGE",
                   help="the control image of each --controlnet, in order")
    g.add_argument("--preprocessor", action="append", default=[], metavar="none|canny[:LOW:HIGH]|MODULE",
                   help="what each unit's image goes through first, in order (default none: the image is the map; "
                        "canny: edges, thresholds 100:200 as A1111's). A1111's model-based modules (pip install "
                        "'lowvram-gen[preprocessors]', weights from A1111's annotator downloads, "
                        "models/ControlNetPreprocessor or the Hugging Face cache): depth_midas (depth), openpose, "
                        "openpose_hand, openpose_face, openpose_faceonly, openpose_full, lineart_realistic "
                        "(lineart), lineart_coarse, lineart_anime, lineart_standard")
    g.add_argument("--control-resize", action="append", default=[], metavar="resize|crop|fill",
                   help="how each unit's control image of another aspect ratio meets the job's size, in order (or "
                        "once for all units): resize (A1111's Just Resize, the default: stretched), crop (Crop and "
                        "Resize: scaled to cover, the centre kept) or fill (Resize and Fill: scaled to fit, the "
                        "borders filled with the map's border colour)")
    g.add_argument("--control-mode", metavar="balanced|prompt|controlnet",
                   help="balanced (default), prompt (A1111's 'My prompt is more important': the residuals scaled "
                        "down the layers) or controlnet (A1111's 'ControlNet is more important': diffusers' guess "
                        "mode); SD 1.x/2.x and SDXL ControlNets")


def controlnet_fields(args, fields: dict) -> dict:
    """The request's `controlnets` and `control_mode` from the flags, over what --from-png read (`fields`): the
    flags' units replace the PNG's; --control-image / --preprocessor alone fill the PNG's units, in order."""
    from lowvram_gen.control.units import units_from_flags, with_flags

    out: dict = {}
    models, images, preprocessors = args.controlnet, args.control_image, args.preprocessor
    resizes = getattr(args, "control_resize", [])
    if models:
        out["controlnets"] = units_from_flags(models, images, preprocessors, resizes)
    elif fields.get("controlnets") and (images or preprocessors or resizes):
        out["controlnets"] = with_flags(tuple(fields["controlnets"]), images, preprocessors, resizes)
    elif images or preprocessors or resizes:
        from lowvram_gen.errors import InvalidRequest

        flag = "--control-image" if images else "--preprocessor" if preprocessors else "--control-resize"
        raise InvalidRequest(flag, (images or preprocessors or resizes)[0], "goes with --controlnet MODEL (one per unit, in "
                                                                  "order), or with --from-png of an image that has "
                                                                  "ControlNet units")
    if args.control_mode is not None:
        out["control_mode"] = args.control_mode
    return out


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--controlnet", action="append", default=[], metavar="SPEC",
                   help="count a ControlNet beside the denoiser (repeatable): a file, folder, hub id or name in "
                        "models/ControlNet, or a known size: sd15 (0.72 GB in fp16), sdxl (2.5 GB), sd3 (1.06 B "
                        "weights) and flux (2.95 B: what diffusers' from_transformer makes by default)")


def plan_lines(profile, chosen) -> list[str]:
    """What `plan` says of the ControlNets it counted: their weights, and where the chosen candidate keeps them."""
    if not profile.controlnet_units or chosen is None:
        return []
    from lowvram_gen.hardware.device import format_size

    b = chosen.breakdown
    return [f"controlnet: {', '.join(profile.controlnets)}: {profile.controlnet_params / 1e6:.0f} M weights, "
            f"{format_size(b.get('controlnet_bytes', 0))} as {chosen.name} stores them, counted with the "
            f"{profile.denoiser} ({format_size(b.get('controlnet_resident_bytes', 0))} on the GPU while it denoises, "
            f"{format_size(b.get('controlnet_streamed_bytes_per_step', 0))} streamed a step)"]
