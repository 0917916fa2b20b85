"""Command line: `lowvram-gen generate|plan|doctor ...` with A1111-style memory flags.

Domain errors (`LowVramError`) become a one-line message and an exit code at this edge (2 for bad
input); anything else is a bug and keeps its traceback. Nothing heavy is imported until a command
runs, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

MEMORY_FLAGS = ("medvram", "lowvram", "novram")


def _add_memory_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory (A1111/ComfyUI-style; without them the planner picks per job)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--medvram", action="store_true", help="start at the medvram preset (model offload)")
    x.add_argument("--lowvram", action="store_true", help="start at the lowvram preset (group offload, tiled VAE)")
    x.add_argument("--novram", action="store_true", help="start at the novram preset (sequential offload, fp8 weights)")
    x.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    x.add_argument("--preset", metavar="NAME|PATH", help="start at this preset (a name from presets/ or a .toml file)")
    g.add_argument("--vram-budget", metavar="SIZE",
                   help="use at most this much VRAM, e.g. 6GB (GB means GiB; enforced on CUDA)")
    g.add_argument("--ram-budget", metavar="SIZE",
                   help="most system RAM a job may plan to use, e.g. 10GiB (default: what the machine and its "
                        "cgroup have free); a job that needs more is refused before loading")
    g.add_argument("--reserve-vram", metavar="SIZE", default=None,
                   help="VRAM left for the OS and other programs (default 512MiB)")
    g.add_argument("--xformers", action="store_true",
                   help="use xformers attention where it works (CUDA + the xformers extra); SDPA otherwise")
    _add_precision_flags(p)
    _add_folder_flags(p)


def _add_precision_flags(p: argparse.ArgumentParser) -> None:
    """A1111's precision launch flags: over every preset, a named one too (settings.Precision)."""
    g = p.add_argument_group("precision (A1111's; against black or NaN images, e.g. on GTX 16xx cards)")
    g.add_argument("--no-half", action="store_true",
                   help="weights and compute in float32 in every preset (twice the memory of float16: the planner "
                        "counts it and may pick a cheaper offload); wins over the other precision flags, as in A1111")
    g.add_argument("--no-half-vae", action="store_true", help="keep the VAE in float32, the rest in half precision")
    g.add_argument("--upcast-sampling", action="store_true",
                   help="half-precision weights with the sampling upcast to float32 where diffusers allows: "
                        "attention scores and softmax, and the VAE (no effect with --no-half)")
    g.add_argument("--precision", choices=("full", "autocast"),
                   help="full: the same as --no-half; autocast: half precision where the preset says (the default)")


def _add_folder_flags(p: argparse.ArgumentParser) -> None:
    """A1111's model-folder launch flags (networks/files.kind_dirs): each folder is looked in first, then
    models/<kind> under the models root; each must exist."""
    g = p.add_argument_group("model folders (A1111's; looked in first, then models/<kind>)")
    g.add_argument("--data-dir", metavar="DIR",
                   help="A1111's base folder: models from DIR/models (as LOWVRAM_GEN_MODELS), lowvram-gen's own files "
                        "in DIR/lowvram-gen (as LOWVRAM_GEN_HOME), images in DIR/outputs unless --outdir")
    g.add_argument("--models-dir", metavar="DIR",
                   help="a models/ folder to read as it is, nothing copied (as LOWVRAM_GEN_MODELS): A1111's or Forge's "
                        "(Stable-diffusion/, Lora/, VAE/, ControlNet/, ESRGAN/) or ComfyUI's (checkpoints/, "
                        "diffusion_models/, loras/, vae/, controlnet/, upscale_models/)")
    g.add_argument("--ckpt-dir", metavar="DIR", help="checkpoints: --model NAME and the UI's Model list")
    g.add_argument("--lora-dir", metavar="DIR", help="LoRAs: --lora NAME and <lora:NAME:W>")
    g.add_argument("--embeddings-dir", metavar="DIR", help="textual-inversion embeddings")
    g.add_argument("--controlnet-dir", metavar="DIR", help="ControlNet models: --controlnet NAME")
    g.add_argument("--vae-dir", metavar="DIR", help="VAE files")
    g.add_argument("--styles-file", metavar="FILE",
                   help="A1111's saved styles (--style NAME, the UI's Styles): default styles.csv in the folder "
                        "lowvram-gen runs in; a missing file is no styles")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", metavar="SPEC",
                   help="tiny (default; random weights, noise), tiny-sdxl, sd15|sd21|sdxl|sd3|flux (their hub "
                        "ids), a hub id, a diffusers folder, a .safetensors/.ckpt file or a .gguf UNet/transformer")
    p.add_argument("--config", "--components", dest="config", metavar="FOLDER|HUB_ID",
                   help="base-model configs and tokenizer for a single-file checkpoint (e.g. a diffusers SD 1.5 "
                        "folder); for a .gguf or a transformer file alone (ComfyUI's diffusion_models/) also its VAE "
                        "and text encoders")


def _add_job_fields(p, every_job: bool) -> None:
    """The A1111 fields of a job, defaulting to None (the request's defaults fill them): generate's and
    img2img's flags, and the batch script's defaults for every line (`every_job`)."""
    p.add_argument("--negative", "--negative-prompt", dest="negative_prompt", metavar="TEXT",
                   help="negative prompt of every job without its own" if every_job else "what not to draw")
    p.add_argument("--width", metavar="N", help="multiple of 8 (default 512)")
    p.add_argument("--height", metavar="N", help="multiple of 8 (default 512)")
    p.add_argument("--steps", metavar="N", help="denoising steps, 1-150 (default: the model family's; 20 for SD, "
                                                "9 for Z-Image Turbo, 4 for Flux.2 Klein ...)")
    p.add_argument("--cfg", dest="cfg_scale", metavar="X", help="CFG scale, 0-30 (default: the model family's; 7 for "
                                                               "SD, 0 for Z-Image Turbo, 4 for Qwen-Image ...)")
    p.add_argument("--batch", dest="batch_size", metavar="N",
                   help=f"images {'per' if every_job else 'in this'} job (default 1)")
    p.add_argument("--sampler", metavar="NAME",
                   help="'default' (A1111's: DPM++ 2M, Karras under --schedule-type automatic, for SD 1.x/2.x and "
                        "SDXL; the model's own scheduler for SD3, FLUX, PixArt) or an A1111 name: 'Euler a', "
                        "'DPM++ 2M', 'DPM++ SDE', ...; the old combined names ('DPM++ 2M Karras') set --schedule-type "
                        "too")
    p.add_argument("--schedule-type", metavar="TYPE",
                   help="A1111 1.9+'s schedule type: automatic (default), uniform, karras, exponential, sgm-uniform, "
                        "simple, normal, beta, ... (one the sampler has not in diffusers runs its own, with a warning)")
    p.add_argument("--clip-skip", dest="clip_skip", metavar="N",
                   help="A1111's Clip skip, 1-12: stop the text encoder N-1 layers before its last (default 1: off; "
                        "2 for most anime models); SD 1.x/2.x and SDXL")
    p.add_argument("--vae", metavar="NAME|PATH",
                   help="A1111's SD VAE: a VAE of models/VAE by its file name (.safetensors, .pt, .ckpt, or a "
                        "diffusers folder's name), or a path, to decode with instead of the model's own; Automatic "
                        "(default) or None: the model's own")
    p.add_argument("--rng", metavar="SOURCE",
                   help="A1111's Random number generator source: gpu (default: the compute device's generator), cpu "
                        "(drawn on the CPU: A1111's CPU), nv (an NVIDIA card's torch.randn, computed on any device: "
                        "A1111's NV)")
    p.add_argument("--ensd", metavar="N",
                   help="A1111's Eta noise seed delta (ENSD): after each image's first noise its generator is "
                        "re-seeded with seed + N, which changes the ancestral samplers' step noise (default 0: off; "
                        "31337 is a common setting)")
    p.add_argument("--unipc-variant", dest="unipc_variant", metavar="NAME",
                   help="A1111's UniPC variant: bh1 (default), bh2 or vary_coeff")
    p.add_argument("--unipc-skip-type", dest="unipc_skip_type", metavar="NAME",
                   help="A1111's UniPC skip type: time_uniform (default), time_quadratic or logSNR")
    p.add_argument("--unipc-order", dest="unipc_order", metavar="N", help="A1111's UniPC order, 1-50 (default 3)")
    p.add_argument("--no-unipc-lower-order-final", dest="unipc_lower_order_final", action="store_const", const=False,
                   default=None, help="turn off A1111's UniPC lower order final (on by default)")
    p.add_argument("--style", dest="styles", action="append", default=None, metavar="NAME",
                   help="apply this saved style of styles.csv (A1111's; --styles-file), repeatable: in the order "
                        "given, each style's {prompt} takes the prompt (else its text is appended after ', ')")
    p.add_argument("--tiling", action="store_const", const=True, default=None,
                   help="A1111's Tiling: circular padding in the UNet's and the VAE's convolutions, so the image "
                        "tiles seamlessly (textures); SD 1.x/2.x and SDXL")
    p.add_argument("--refiner", metavar="MODEL",
                   help="A1111's refiner: a second model (SDXL refiner, or a model of the same latent space) that "
                        "takes over the same sampler run at --refiner-switch-at (a hub id, folder, file or a "
                        "checkpoint's name as --model takes it); with hires fix it refines the second pass")
    p.add_argument("--refiner-switch-at", dest="refiner_switch_at", metavar="X",
                   help="the fraction of the sampling done by the model before the refiner takes over, above 0 and "
                        "at most 1 (default 0.8; 1: no refiner)")
    p.add_argument("--filename-pattern", dest="filename_pattern", metavar="PATTERN",
                   help="A1111's images filename pattern: the saved names' part after the counter, e.g. "
                        "'[seed]-[prompt_words]' or '[model_name]-[steps]-[datetime<%%Y%%m%%d>]' (default: "
                        "counter-seed-prompt)")
    p.add_argument("--subseed", metavar="N",
                   help="A1111's Variation seed: 0..4294967295, -1 random (default); its noise is blended into the "
                        "seed's by --subseed-strength (a batch keeps the seed and counts the subseed up)")
    p.add_argument("--subseed-strength", dest="subseed_strength", metavar="X",
                   help="A1111's Variation strength, 0-1 (default 0: off, the seed's own image; 1: the subseed's "
                        "noise); txt2img on SD 1.x/2.x and SDXL")
    p.add_argument("--seed-resize-from", dest="seed_resize_from", metavar="WxH",
                   help="A1111's Resize seed from: draw the seed's noise for this size, centred in the image's "
                        "(a seed found at 512x512 keeps its look at 512x768); sides multiples of 8, 0x0: off")


def _add_fix_steps(p: argparse.ArgumentParser) -> None:
    p.add_argument("--img2img-fix-steps", dest="img2img_fix_steps", action="store_const", const=True, default=None,
                   help="A1111's setting of that name: run exactly --steps steps (the end of a schedule of steps / "
                        "strength) instead of int(steps x strength) + 1 (A1111's default: 10 at 0.5 runs 6)")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    """What generate and img2img share: the prompt, the A1111 fields, hires fix, model and memory flags.

    The request's flags default to None, not to their values: with --from-png, a flag given on the
    command line (even `--seed -1`) overrides the image's value and one left out does not.
    `GenerationRequest`'s own defaults fill what neither gives (see `_request_fields`)."""
    p.add_argument("prompt", nargs="?", help="what to draw (optional with --from-png)")
    p.add_argument("--from-png", metavar="FILE",
                   help="rerun this PNG's parameters (A1111's or ours); the flags given here override them")
    _add_job_fields(p, every_job=False)
    p.add_argument("--batch-count", dest="batch_count", metavar="N",
                   help="A1111's Batch count (n_iter), 1-100: batches made one after another, --batch images each; "
                        "image i of the job gets seed+i (default 1)")
    p.add_argument("--seed", metavar="N", help="0..4294967295, or -1 for random (default)")
    h = p.add_argument_group("hires fix (A1111): a second pass at a larger size (on with --hires-scale above 1 or "
                             "--hires-resize)")
    h.add_argument("--hires-scale", metavar="X", help="upscale by X, then a second pass (1: off)")
    h.add_argument("--hires-resize", dest="hires_resize", metavar="WxH",
                   help="upscale to this size instead of by --hires-scale (A1111's Resize width/height to): Wx0 or 0xH "
                        "keeps the aspect; WxH of another aspect crops the upscaled first pass to it")
    h.add_argument("--hires-upscaler", metavar="NAME",
                   help="A1111's names, any case: Latent (default), Latent (antialiased), Latent (bicubic), Latent "
                        "(bicubic antialiased), Latent (nearest), Latent (nearest-exact), None, Lanczos, Nearest, "
                        "or an ESRGAN-family model")
    h.add_argument("--hires-steps", metavar="N", help="second-pass steps (0: as many as --steps)")
    h.add_argument("--hires-denoise", metavar="X", help="second-pass denoising strength (default 0.7)")
    h.add_argument("--hires-sampler", metavar="NAME", help="the second pass's sampler (default: --sampler's)")
    h.add_argument("--hires-schedule-type", metavar="TYPE",
                   help="the second pass's schedule type (default: --schedule-type's)")
    h.add_argument("--hires-cfg", metavar="X", help="the second pass's CFG scale, 0-30 (0, the default: --cfg's)")
    h.add_argument("--hires-prompt", metavar="TEXT", help="the second pass's prompt (default: the prompt)")
    h.add_argument("--hires-negative", metavar="TEXT",
                   help="the second pass's negative prompt (default: the negative prompt)")
    _add_model(p)
    p.set_defaults(model=None)  # tiny unless --model or the PNG's model (--from-png) says otherwise
    _add_quantize(p)
    p.add_argument("--lora", action="append", default=[], metavar="NAME[:W]",
                   help="apply a LoRA from models/Lora (repeatable; the same as <lora:NAME:W> in the prompt)")
    p.add_argument("--outdir", metavar="DIR", help="output folder (default outputs/<date>/)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the result to stdout")
    from lowvram_gen.cli.controlnet import add_controlnet_args  # no heavy imports

    add_controlnet_args(p)
    _add_memory_flags(p)


def _add_quantize(p: argparse.ArgumentParser) -> None:
    """generate's --quantize (and video's: the same flag, the same meaning)."""
    p.add_argument("--quantize", metavar="none|int8|int4",
                   help="store the UNet/transformer and text encoders in int8 or int4 in every preset (sdnq), or "
                        "none: no int8/int4 candidate (default: the planner decides; 4-bit only when nothing "
                        "lossless fits)")


def version() -> str:
    """The installed distribution's version; the package's own when it runs from a checkout that is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("lowvram-gen")
    except PackageNotFoundError:
        from lowvram_gen import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lowvram-gen",
        description="Stable Diffusion on GPUs that are too small for it: picks a memory preset per job and, on "
                    "out-of-memory, steps down and finishes the job. The default model 'tiny' has random weights "
                    "and makes abstract noise; use --model for real images.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the memory layer does")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="text to image", description="Generate images from a prompt.")
    _add_generation_args(gen)
    from lowvram_gen.cli.xyz import add_xyz_args  # no heavy imports

    add_xyz_args(gen)
    i2i = sub.add_parser("img2img", help="image to image",
                         description="Generate from an init image: --strength 0 keeps it, 1 ignores it.")
    i2i.add_argument("--init", dest="init_image", required=True, metavar="IMAGE", help="the image to start from")
    i2i.add_argument("--strength", metavar="X", help="denoising strength, 0-1 (default 0.75)")
    _add_fix_steps(i2i)
    i2i.add_argument("--resize-mode", dest="resize_mode", metavar="resize|crop|fill|latent",
                     help="an init image of another aspect ratio: resize (A1111's Just resize, the default), crop "
                          "(Crop and resize: the centre kept), fill (Resize and fill: the edges stretched over the "
                          "rest) or latent (Just resize (latent upscale): encoded at its own size, the latents "
                          "stretched)")
    _add_generation_args(i2i)
    from lowvram_gen.cli.scripts import add_script_args  # Loopback, SD upscale (no heavy imports)

    add_script_args(i2i)
    add_xyz_args(i2i)

    inp = sub.add_parser("inpaint", help="repaint the masked part of an image (A1111's img2img > Inpaint)",
                         description="Repaint where the mask is white (--invert-mask: black); everything outside the "
                                     "mask (and its blur) stays the init image's. Every img2img flag works here too.")
    inp.add_argument("--init", dest="init_image", required=True, metavar="IMAGE", help="the image to repaint")
    inp.add_argument("--strength", metavar="X", help="denoising strength, 0-1 (default 0.75)")
    _add_fix_steps(inp)
    inp.add_argument("--resize-mode", dest="resize_mode", metavar="resize|crop|fill",
                     help="an init image of another aspect ratio, and its mask with it: resize (the default), crop or "
                          "fill, as img2img's (the whole picture; only masked cuts the mask's box, whatever the mode)")
    from lowvram_gen.cli.inpaint import add_inpaint_args  # no heavy imports

    add_inpaint_args(inp)
    _add_generation_args(inp)
    from lowvram_gen.cli.edit import add_edit_parser  # no heavy imports

    add_edit_parser(sub, _add_generation_args)

    up = sub.add_parser("upscale", help="upscale an image (Lanczos, Nearest, an ESRGAN-family model, sd-x4)")
    up.add_argument("image", help="the image to upscale (PNG, JPEG, WebP)")
    up.add_argument("--scale", default=2, metavar="X", help="factor, 1-8 (default 2)")
    up.add_argument("--upscaler", default="Lanczos", metavar="NAME",
                    help="Lanczos (default), Nearest, sd-x4, or an ESRGAN-family .pth/.safetensors (a path, or a name "
                         "in models/ESRGAN, with or without its extension); any case")
    up.add_argument("--outdir", metavar="DIR", help="output folder (default outputs/<date>/)")
    up.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    up.add_argument("--json", action="store_true", help="print one JSON object with the result to stdout")

    pl_help = "dry run: which preset would run, and every preset's memory estimate"
    pl = sub.add_parser("plan", help=pl_help,
                        description="Estimate peak VRAM of a job under every preset and show which would run. "
                                    "Needs no GPU: --vram simulates a card.")
    pl.add_argument("--vram", metavar="SIZE", help="simulate a card with this much free VRAM, e.g. 4GB "
                                                    "(GB means GiB, as on graphics cards)")
    pl.add_argument("--model", default="sd15", metavar="SPEC",
                    help="sd15, sd21, sdxl, sd3, flux (configs ship with the package; also their hub ids), "
                         "tiny, a diffusers folder, or a single file (a .gguf counts at its stored size)")
    pl.add_argument("--config", "--components", dest="config", metavar="FOLDER|HUB_ID",
                    help="the base model's diffusers folder, for a single-file --model (a transformer file's "
                         "components)")
    native = ("multiple of 8 (default: the model's native size, 512 SD 1.5, 768 SD 2.1, 1024 SDXL/SD3/Flux; "
              "512 with --engine vqgan)")
    pl.add_argument("--width", metavar="N", help=native)
    pl.add_argument("--height", metavar="N", help=native)
    pl.add_argument("--batch", dest="batch_size", default=1, metavar="N", help="images per job (default 1)")
    pl.add_argument("--steps", metavar="N",
                    help="sampling steps (default: the model family's, 20 for SD): what moves once a job is spread "
                         "over them")
    pl.add_argument("--quantize", metavar="none|int8|int4",
                    help="plan with int8/int4 weights in every preset, or none, as generate's --quantize does")
    pl.add_argument("--ram", metavar="SIZE", help="simulate a machine with this much free system RAM, e.g. 16GB "
                    "(default: this machine's, and its cgroup limit)")
    pl.add_argument("--json", action="store_true", help="print one JSON object (sizes in exact bytes) to stdout")
    pl.add_argument("--vae", metavar="NAME|PATH",
                    help="plan with this VAE file (generate's --vae): its weights read, the model's own kept beside it")
    pl.add_argument("--image", dest="reference_images", action="append", metavar="IMAGE",
                    help="an edit's reference image (repeatable), counted as `edit --image` counts it: an editing "
                         "model (qwen-image-edit, kontext, ...) adds its tokens beside the image's")
    pl.add_argument("--refiner", metavar="MODEL", help="plan a job with this refiner (as generate's --refiner): the "
                    "swap at the switch, its RAM and the bus time")
    pl.add_argument("--refiner-switch-at", dest="refiner_switch_at", metavar="X", help="as generate's (default 0.8)")
    v = pl.add_argument_group("video (a Wan 2.1/2.2 or LTX-Video model: the clip `lowvram-gen video` would make)")
    v.add_argument("--frames", metavar="N", help="plan a clip of N frames (Wan 4k+1, LTX-Video 8k+1; 0: the model's "
                                                 "own count): its latent frames and tokens are counted")
    v.add_argument("--fps", metavar="F", help="the clip's frames per second, above 0 (with --frames; default the "
                                              "model's)")
    v.add_argument("--init-image", dest="init_image", metavar="IMAGE",
                   help="plan image-to-video from this first frame (with --frames): the image encoder is counted")
    from lowvram_gen.cli.controlnet import add_plan_args

    add_plan_args(pl)
    _add_memory_flags(pl)

    doc = sub.add_parser("doctor", help="what to paste into a bug report: GPU, versions, kernels, presets")
    doc.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doc.add_argument("--forget-failures", action="store_true", help="clear the remembered out-of-memory failures")
    doc.add_argument("--skip-bus", action="store_true",
                     help="do not measure the host-to-device bandwidth (on CUDA doctor measures it, about a second, "
                          "and stores it for the planner)")
    _add_memory_flags(doc)

    ui = sub.add_parser("ui", help="the web UI (also what bare `lowvram-gen [flags]` starts)",
                        description="Start the Gradio web UI. Listens on 127.0.0.1 unless --listen.")
    _add_model(ui)
    ui.add_argument("--outdir", metavar="DIR", help="output folder (default outputs/<date>/); the only folder served")
    ui.add_argument("--listen", action="store_true", help="listen on 0.0.0.0 (every interface) instead of 127.0.0.1")
    ui.add_argument("--port", metavar="N", help="a free port, 1-65535 (default 7860; 7861 with --nowebui, as A1111)")
    ui.add_argument("--gradio-auth", metavar="USER:PASS[,USER2:PASS2]", help="require a login")
    ui.add_argument("--share", action="store_true", help="make a public gradio.live link (warns: it is public)")
    ui.add_argument("--queue-size", type=int, default=16, metavar="N", help="most jobs waiting (default 16)")
    a = ui.add_argument_group("A1111's REST API (/sdapi/v1: the webuiapi client, Krita/Photoshop plugins, ...)")
    a.add_argument("--api", action="store_true", help="serve A1111's API beside the web UI, on the same queue")
    a.add_argument("--nowebui", action="store_true", help="serve the API alone, without the web UI (port 7861)")
    a.add_argument("--api-auth", metavar="USER:PASS[,USER2:PASS2]",
                   help="HTTP Basic users of the API (default: --gradio-auth's, so a login UI leaves no open API)")
    a.add_argument("--api-log", action="store_true", help="print one line per API request")
    a.add_argument("--api-allow-paths", metavar="DIR[,DIR]",
                   help="let API bodies name model files by path inside these folders (default: names only, as "
                        "the listing routes give them)")
    ui.add_argument("--autolaunch", action="store_true",
                    help="open the UI in the default web browser once the server is up (A1111's)")
    a.add_argument("--api-body-limit", type=int, metavar="MIB",
                   help="largest API request body, in MiB (default 64: an img2img with a 2048x2048 PNG init image, "
                        "its mask and ControlNet images, base64 as A1111 clients send them, fits; 413 past it)")
    _add_memory_flags(ui)

    from lowvram_gen.batch.command import add_batch_parser  # the batch prompt script's subcommand (no heavy imports)

    add_batch_parser(sub, _add_model, _add_memory_flags, _add_job_fields)
    from lowvram_gen.cli.vqgan import add_vqgan_parser, add_vqgan_plan_args  # VQGAN-CLIP (no heavy imports)

    add_vqgan_parser(sub, _add_memory_flags)
    add_vqgan_plan_args(sub.choices["plan"])
    from lowvram_gen.cli.video import add_video_parser  # text/image to video (no heavy imports)

    add_video_parser(sub, _add_memory_flags, _add_quantize)
    # -- more subcommands: each module offers add_*_parser(sub, ...) and is registered in COMMANDS --
    return parser


def _session_kwargs(args) -> dict:
    """What every command gives its Session; a wrong --preset or size fails here, before torch loads."""
    from lowvram_gen.hardware.device import DEFAULT_RESERVE, parse_size
    from lowvram_gen.presets import find_preset
    from lowvram_gen.settings import Precision

    preset = next((name for name in MEMORY_FLAGS if getattr(args, name, False)), None) or getattr(args, "preset", None)
    if preset:
        find_preset(preset)  # reads the TOML files only; the Session reads them again when it starts
    return {
        "device": "cpu" if getattr(args, "cpu", False) else None,
        "preset": preset,
        "vram_budget": parse_size(args.vram_budget, "--vram-budget") if getattr(args, "vram_budget", None) else None,
        "reserve_vram": parse_size(args.reserve_vram, "--reserve-vram") if getattr(args, "reserve_vram", None)
        else DEFAULT_RESERVE,
        "xformers": bool(getattr(args, "xformers", False)),
        "ram_budget": parse_size(args.ram_budget, "--ram-budget") if getattr(args, "ram_budget", None) else None,
        "precision": Precision.from_flags(getattr(args, "no_half", False), getattr(args, "no_half_vae", False),
                                          getattr(args, "upcast_sampling", False), getattr(args, "precision", None)),
        "styles_file": getattr(args, "styles_file", None),
    }


# --data-dir DIR: the environment variables it stands for (a folder flag of its own kind still wins)
DATA_DIR_PARTS = (("LOWVRAM_GEN_MODELS", "models"), ("LOWVRAM_GEN_HOME", "lowvram-gen"))


@contextmanager
def folder_flags(args):
    """The model-folder flags put in the environment (networks/files.FOLDER_FLAGS) for the command's run, so what
    it starts (`accelerate launch` batch workers, the API server) finds the same folders; put back after. A flag
    naming no folder is refused, naming the flag and the folder."""
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.networks.files import FOLDER_FLAGS

    wanted: dict[str, str] = {}
    data_dir = getattr(args, "data_dir", None)
    flags = [("--data-dir", data_dir, None), ("--models-dir", getattr(args, "models_dir", None), "LOWVRAM_GEN_MODELS")]
    flags += [(flag, getattr(args, flag[2:].replace("-", "_"), None), env) for flag, env in FOLDER_FLAGS.values()]
    for flag, value, env in flags:
        if value is None:
            continue
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise InvalidRequest(flag, value, f"no such folder ({folder.resolve()}"
                                 + (" is a file)" if folder.exists() else " does not exist)") + "; give an existing folder")
        if env is not None:
            wanted[env] = str(folder.resolve())
    if data_dir is not None:
        root = Path(data_dir).expanduser().resolve()
        for env, part in DATA_DIR_PARTS:  # --models-dir wins over DIR/models
            wanted.setdefault(env, str(root / part))
        if getattr(args, "outdir", "absent") is None:  # A1111's outputs/ under its data dir
            from lowvram_gen import outputs

            batch = getattr(args, "command", "") == "batch"
            args.outdir = str(root / "outputs" / f"batch-{Path(args.file).stem or 'prompts'}" if batch
                              else outputs.default_outdir(root / "outputs"))
    saved = {env: os.environ.get(env) for env in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for env, value in saved.items():
            if value is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = value


# the request fields the generate/img2img flags set (argparse dest = GenerationRequest field)
REQUEST_FLAGS = ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale", "seed", "batch_size", "batch_count",
                 "sampler", "model", "init_image", "strength", "hires_scale", "hires_upscaler", "hires_steps",
                 "hires_denoise", "quantize", "schedule_type", "clip_skip", "subseed", "subseed_strength",
                 "hires_sampler", "hires_schedule_type", "hires_cfg", "hires_prompt", "hires_negative", "mask",
                 "mask_blur", "inpaint_area", "mask_padding", "masked_content", "invert_mask", "mask_round", "vae",
                 "reference_images", "rng", "ensd", "img2img_fix_steps", "resize_mode", "unipc_variant",
                 "unipc_skip_type", "unipc_order", "unipc_lower_order_final", "tiling", "styles", "refiner",
                 "refiner_switch_at", "filename_pattern")


def _request_fields(args) -> tuple[dict, list[str]]:
    """The request's fields: --from-png's values (a1111/infotext.py), then every flag given on the command line; and
    what was said about the PNG on stderr (said before the model loads; `--json` repeats it in `warnings`)."""
    from lowvram_gen.errors import InvalidRequest

    fields: dict = {}
    said: list[str] = []

    def say(kind: str, text: str) -> None:
        print(f"{kind}: {text}", file=sys.stderr)
        said.append(text)

    if args.from_png:
        from lowvram_gen.a1111.infotext import from_png, local_model
        from lowvram_gen.prompting.styles import StylesFile

        # the styles found in its prompts are taken out and named (A1111's paste): a rerun makes the same prompt, and
        # --style replaces them as any flag replaces the PNG's value
        read = from_png(args.from_png, styles=StylesFile(getattr(args, "styles_file", None)).book())
        fields = read.fields
        if read.inpainted and not getattr(args, "mask", None):
            raise InvalidRequest("--from-png", args.from_png, "that image was inpainted and its mask is not in a "
                                 "PNG: rerun it with `lowvram-gen inpaint --from-png FILE --init IMAGE --mask MASK`")
        for note in read.notes:
            say("note", note)
        if read.ignored:
            say("note", f"not used from {args.from_png}: {', '.join(read.ignored)}")
        if args.model is None and "model" in fields:
            found = local_model(fields["model"])
            if found is None:
                say("warning", f"the PNG's model {fields['model']!r} is not here (no such file, folder or cached "
                               "hub model); using tiny: pass --model")
                del fields["model"]
            else:
                fields["model"] = found
        if getattr(args, "vae", None) is None and fields.get("vae") not in (None, "Automatic", "None"):
            from lowvram_gen.models import vae

            try:  # A1111 too falls back to the model's own VAE when the infotext names one it lacks
                vae.find(fields["vae"], paths=False)
            except InvalidRequest:
                say("warning", f"the PNG's VAE {fields['vae']!r} is not in {vae.vae_dirs()[0]}; using the "
                               "model's own: pass --vae")
                del fields["vae"]
    elif args.prompt is None:
        raise InvalidRequest("prompt", "", "give a prompt, or --from-png FILE to rerun an image's parameters")
    fields.update({name: getattr(args, name) for name in REQUEST_FLAGS if getattr(args, name, None) is not None})
    from lowvram_gen.cli.controlnet import controlnet_fields

    fields.update(controlnet_fields(args, fields))
    if getattr(args, "seed_resize_from", None) is not None:
        from lowvram_gen.request import parse_size as parse_wxh

        fields["seed_resize_from_w"], fields["seed_resize_from_h"] = parse_wxh("seed resize from",
                                                                               args.seed_resize_from)
    if getattr(args, "hires_resize", None) is not None:
        from lowvram_gen.request import parse_size as parse_wxh

        fields["hires_resize_w"], fields["hires_resize_h"] = parse_wxh("hires resize", args.hires_resize)
    if args.hires_sampler is not None and args.hires_schedule_type is None and "hires_schedule_type" in fields:
        from lowvram_gen.samplers import split_sampler

        if split_sampler(args.hires_sampler, "hires sampler")[1]:  # its name's schedule type wins, as --sampler's
            fields.pop("hires_schedule_type")
    if args.sampler is not None and args.schedule_type is None and "schedule_type" in fields:
        from lowvram_gen.samplers import split_sampler

        _, named = split_sampler(args.sampler)  # --sampler 'DPM++ 2M Karras' wins over the PNG's schedule type;
        if named:  # a plain --sampler keeps it, as A1111's Schedule type box stays when the sampler changes
            fields["schedule_type"] = named
    return fields, said


def cmd_generate(args) -> int:
    from lowvram_gen.request import GenerationRequest

    fields, said = _request_fields(args)
    from lowvram_gen.cli.video import refuse_video_model

    refuse_video_model(fields.get("model") or "tiny")  # a Wan/LTX folder: `video`, said before loading
    request = GenerationRequest(**fields, config=args.config, outdir=args.outdir,
                                loras=tuple(args.lora)).validated()  # before anything heavy is imported or loaded
    kwargs = _session_kwargs(args)
    from lowvram_gen.session import Session

    from lowvram_gen.cli.output import print_result
    from lowvram_gen.jobs.console import ProgressBar

    session = Session(**kwargs)
    from lowvram_gen.cli import scripts, xyz

    if xyz.wanted(args) and scripts.wanted(args):
        from lowvram_gen.errors import InvalidRequest

        raise InvalidRequest("--xyz-x/-y/-z", "with --loopback or --sd-upscale",
                             "an X/Y/Z plot runs plain cells: leave out the img2img script, or the axes")
    if scripts.wanted(args):  # img2img's --loopback / --sd-upscale: one job a loop or tile
        return scripts.run_script_command(args, request, session, said)
    if xyz.wanted(args):  # --xyz-x/-y/-z: a grid of cells, one generate each
        return xyz.run(args, request, session, said)
    bar = ProgressBar("step")
    try:
        result = session.generate(request, on_step=bar.update)
    finally:
        bar.close()
    return print_result(result, args.json, result.images, said)


def cmd_upscale(args) -> int:
    from lowvram_gen.upscale.command import run_upscale

    result = run_upscale(args.image, args.scale, args.upscaler, args.outdir, "cpu" if args.cpu else None)
    print(result["summary"], file=sys.stderr)
    print(json.dumps(result) if args.json else result["images"][0])
    return 0


def _timing_source(timing: dict) -> str:
    """'measured (3)': scaled by three passes measured on this device; 'assumed': timing.py's constants."""
    return f"measured ({timing['jobs']})" if timing.get("source") == "measured" else "assumed"


def cmd_plan(args) -> int:
    if getattr(args, "engine", "sd") == "vqgan":
        from lowvram_gen.cli.vqgan import plan_vqgan_command

        return plan_vqgan_command(args, _session_kwargs(args))
    from lowvram_gen.hardware import device as device_mod
    from lowvram_gen.models.profile import native_side
    from lowvram_gen.request import (MAX_BATCH, MAX_STEPS, GenerationRequest, as_int, as_side, check_quantize,
                                     check_references, check_refiner, check_switch_at)

    width, height = (as_side(name, value) if value is not None else None
                     for name, value in (("width", args.width), ("height", args.height)))
    batch = as_int("batch size", args.batch_size, 1, MAX_BATCH)
    steps = None if args.steps is None else as_int("steps", args.steps, 1, MAX_STEPS)  # None: the family's
    from lowvram_gen.cli.video import plan_video_fields

    video = plan_video_fields(args)  # {} for an image job; bad frames/fps or an image model refused here
    kwargs = _session_kwargs(args)
    from lowvram_gen.session import Session

    # the Session that `generate` with these flags would make: its presets, forced preset, --xformers and the
    # remembered failures are the plan's, so `plan` prints the plan `generate` runs
    session = Session(**kwargs)
    dev = session.device(vram=args.vram, ram=args.ram)
    host = dev.host
    profile, folder = session.model_profile(args.model, args.config, getattr(args, "controlnet", None) or ())
    if getattr(args, "vae", None):  # as generate counts it (Session.profile_for)
        from lowvram_gen.models.profile import with_vae

        profile = with_vae(profile, args.vae)
    from lowvram_gen.cli.video import default_size

    # a clip's own size (832x480 for Wan 2.1), also for one frame of a video model (no --frames)
    own = video.pop("size", None) or default_size(args.model) or (native_side(profile),) * 2
    width, height = width or own[0], height or own[1]
    from lowvram_gen.cli.controlnet import plan_lines

    request = GenerationRequest(model=args.model, config=args.config, width=width, height=height, batch_size=batch,
                                steps=steps, quantize=check_quantize(args.quantize),
                                reference_images=check_references(args.reference_images),
                                refiner=check_refiner(args.refiner),
                                refiner_switch_at=check_switch_at(args.refiner_switch_at), **video)
    result = session.plan(request, dev, profile=(profile, folder))
    from lowvram_gen.planning.nearest import plan_nearest
    from lowvram_gen.planning.shapes import model_shapes, shape_lines

    # a clip's plan: the shapes count the clip's tokens (all its latent frames), and shape_lines says its frames
    shapes = model_shapes(profile, width, height, result.preset.memory.dtype, result.preset.memory.quantize,
                          video=getattr(result, "video", None))
    nearest = plan_nearest(session, request, dev, (profile, folder), result, args.model)
    if args.json:
        print(json.dumps({"device": dev.as_dict(), "model": args.model, "vae": getattr(args, "vae", None),
                          "width": width, "height": height,
                          "batch": batch, "frames": request.frames, "fps": request.fps,
                          "init_image": request.init_image, "controlnets": list(profile.controlnets), "shapes": shapes,
                          "nearest": nearest, **result.as_dict()}))
        return 0
    gib = device_mod.format_size
    if dev.is_accelerator:
        print(f"device: {dev.name}; usable {gib(dev.usable_bytes)} (free {gib(dev.free_bytes)}, "
              f"reserve {gib(dev.reserve_bytes)})")
    else:
        print(f"device: {dev.name} (no GPU)")
    print(f"ram: {host.describe()}")
    vae = f", VAE {args.vae}" if getattr(args, "vae", None) else ""
    from lowvram_gen.cli.video import clip_words

    print(f"job: {args.model} {width}x{height}, batch {batch}{clip_words(request)}{vae}")
    for line in shape_lines(shapes):
        print(line)
    print(f"bus: {result.bus.describe()}")
    wide = max(len(e.name) for e in result.estimates)
    print(f"   {'candidate':{wide}} {'VRAM':>9}  {'':7}  {'RAM':>9}  {'':7}  {'streamed/step':>13}  {'s/step':>6}  "
          f"{'(timing)':12}  size")
    for e in result.estimates:
        mark = "->" if e.name == result.preset.name and not result.refusal else "  "
        size = f"{e.width}x{e.height}" + (" (capped, upscaled after)" if (e.width, e.height) != (width, height) else "")
        vram = (gib(e.estimate_bytes), "fits" if e.fits else "too big") if dev.is_accelerator else ("-", "")
        print(f"{mark} {e.name:{wide}} {vram[0]:>9}  {vram[1]:7}  {gib(e.host_peak_bytes):>9}  "
              f"{'fits' if e.fits_host else 'too big':7}  {gib(e.streamed_bytes_per_step):>13}  "
              f"{e.est_seconds_per_step:6.3g}  {_timing_source(e.timing):12}  {size}, batch {e.batch}")
    if result.refusal:
        print(f"would not run: {result.refusal}")
        if nearest:
            print(f"would fit: {nearest}")
        return 0
    print(f"would run: {result.preset.name} ({result.reason})")
    chosen = next((e for e in result.estimates if e.name == result.preset.name), None)
    if chosen is not None and chosen.streamed_bytes_per_step:
        print(f"streams {gib(chosen.streamed_bytes_per_step)} a step; the weights that cannot fit beside the "
              f"activations are {gib(chosen.lower_bound_bytes_per_step)} (the least any offload streams)")
    for line in plan_lines(profile, chosen):
        print(line)
    if nearest:
        print(f"would fit: {nearest}")
    for warning in result.warnings:
        print(f"warning: {warning}")
    if chosen is not None and chosen.timing.get("source") == "measured":
        print(f"its step time is scaled by what {chosen.timing['jobs']} finished pass(es) took on this device "
              f"({chosen.timing['basis']}): x{chosen.timing['factor']:.3g} the assumed "
              f"{chosen.timing['assumed_seconds_per_step']:.3g} s")
    if len(result.ladder) > 1:
        print(f"on out-of-memory: {' -> '.join(p.name for p in result.ladder[1:])}")
    return 0


def cmd_doctor(args) -> int:
    from lowvram_gen.cli.doctor import report

    if args.forget_failures:
        from lowvram_gen import failures

        print(f"forgot {failures.forget()} remembered failure(s)", file=sys.stderr)
    kwargs = _session_kwargs(args)
    kwargs.pop("styles_file")  # the report plans no prompt
    info = report(**kwargs, measure=not args.skip_bus)
    if args.json:
        print(json.dumps(info, default=str))
    else:
        from lowvram_gen.cli.doctor import format_report

        print(format_report(info))
    return 0


def cmd_ui(args) -> int:
    from lowvram_gen import outputs
    from lowvram_gen.server import check_port, launch, listen_host

    default_port = 7861 if args.nowebui else 7860  # A1111's
    port = check_port(default_port if args.port is None else args.port, listen_host(args.listen))  # before gradio loads
    from lowvram_gen.session import Session

    outdir = args.outdir or str(outputs.default_outdir())
    session = Session(**_session_kwargs(args), outdir=outdir)
    launch(session, outdir, args.model, listen=args.listen, port=port, auth=args.gradio_auth, share=args.share,
           queue_size=args.queue_size, api=args.api, api_auth=args.api_auth, api_log=args.api_log,
           webui=not args.nowebui, api_allow_paths=args.api_allow_paths, api_body_limit=args.api_body_limit,
           autolaunch=args.autolaunch)
    return 0


def cmd_batch(args) -> int:
    from lowvram_gen.batch.command import run_batch_command

    return run_batch_command(args, _session_kwargs(args))


def cmd_vqgan(args) -> int:
    from lowvram_gen.cli.vqgan import run_vqgan_command

    return run_vqgan_command(args, _session_kwargs(args))


def cmd_video(args) -> int:
    from lowvram_gen.cli.video import run_video_command

    return run_video_command(args, _session_kwargs(args))


def cmd_edit(args) -> int:
    """`edit`: generate's job with the edit's own defaults (size from the first image, the family's edit CFG)."""
    from lowvram_gen.cli.edit import edit_defaults

    edit_defaults(args)
    return cmd_generate(args)


COMMANDS = {"generate": cmd_generate, "img2img": cmd_generate, "inpaint": cmd_generate, "upscale": cmd_upscale, "plan": cmd_plan, "doctor": cmd_doctor, "batch": cmd_batch, "ui": cmd_ui,
            "vqgan": cmd_vqgan, "edit": cmd_edit, "video": cmd_video}


def _with_default_command(argv: list[str]) -> list[str]:
    """Bare `lowvram-gen [flags]` starts the web UI, as A1111's launcher does."""
    verbose = [a for a in argv if a in ("-v", "--verbose")]
    rest = [a for a in argv if a not in ("-v", "--verbose")]
    if rest[:1] in (["-h"], ["--help"], ["--version"]) or any(a in COMMANDS for a in argv):
        return argv
    return [*verbose[:1], "ui", *rest]


# What a shell reports for a program stopped by SIGPIPE (128 + 13), as `yes | head -1` shows.
EXIT_CLOSED_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Run one command; `lowvram-gen plan | head -1` ends quietly when the reader closes the pipe early.

    Python ignores SIGPIPE, so a write to a closed stdout raises BrokenPipeError, and so does the
    interpreter's own flush at exit (an "Exception ignored" message). The recipe of the Python docs
    (library/signal.html, "Note on SIGPIPE"): flush here, catch it, point stdout at devnull. The exit
    code is 141, what the shell reports for cat or grep in the same place: the output was not all
    delivered, and `set -o pipefail` scripts should see that as they would for any other tool.
    """
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows up here, not in the interpreter's exit flush
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(_with_default_command(sys.argv[1:] if argv is None else list(argv)))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from lowvram_gen.errors import LowVramError

    try:
        with folder_flags(args):
            return COMMANDS[args.command](args)
    except LowVramError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # python -m lowvram_gen.cli.main (the console script and python -m lowvram_gen call main too)
    sys.exit(main())
