"""The README's "Big models on small cards" table: what `lowvram-gen plan` picks per model and card.

    python benchmarks/plan_table.py        # prints two Markdown tables (seconds: the planner's estimate)

The first: each built-in model (the transformer families too, one row per family record with shipped configs) on
cards of 2 to 24 GB, the RAM not limited. The second: the issue-30 targets, a card and a RAM size each, with the pick,
its estimates, and where it does not fit, the planner's one sentence saying what does (planning/nearest.py); beside
each, what a peer asks for the same model (PEERS, with its source).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = (("sd15", 512), ("sdxl", 1024), ("sd3", 1024), ("flux", 1024))
# issue 30's targets: (model, side, VRAM GiB, RAM GiB); a model whose record is not registered (yet) is left out
TARGETS = (("qwen-image", 1024, 8, 32), ("z-image", 1024, 6, 16), ("flux2-klein", 1024, 4, 12),
           ("flux2-dev", 1024, 12, 32))
# what peers publish for the same model (their words, their source); family key -> text
PEERS = {
    "qwen-image": "ComfyUI + city96 GGUF: Q4_K_S on a 16 GB card, 32 GB RAM recommended; Q3_K_M (3-bit) for 12 GB "
                  "([smeltcore](https://smeltcore.com/recipes/qwen-image-on-rtx-5060-ti-20b-text-to-image-via-gguf-"
                  "quantization/), [12 GB](https://smeltcore.com/recipes/qwen-image-on-rtx-3060-20b-text-to-image-via-"
                  "comfyui-gguf-q3-ampere-sm-86-12-gb/)); its users ask for \"8G / 12G please\" (issue 31 of "
                  "QwenLM/Qwen-Image, as issue 30 quotes it)",
    "z-image": "ComfyUI with GGUF: Q4_K_M ~5.8 GB VRAM, the BF16 stack ~14-16 GB ([zimage.net](https://zimage.net/blog/"
               "8gb-vram-gguf-guide)); stable-diffusion.cpp: Q3/Q4 GGUF + a Q4 Qwen3 with --offload-to-cpu on 4 GB "
               "([wiki](https://github.com/leejet/stable-diffusion.cpp/wiki/How-to-Use-Z%E2%80%90Image-on-a-GPU-with-"
               "Only-4GB-VRAM)); Forge Neo: 6 GB VRAM / 16 GB RAM minimum ([README](https://github.com/6Morpheus6/"
               "forge-neo))",
    "flux2-klein": "BFL's model card: \"fits in ~13GB VRAM\", RTX 3090/4070 and above; ComfyUI FP8 ~8.4 GB peak "
                   "([smeltcore](https://smeltcore.com/recipes/flux-2-klein-4b-on-rtx-3060-fp8-comfyui-4-step-text-to-"
                   "image-at-8-4-gb/))",
    "flux2-dev": "Wan2GP: \"only 8 GB\" of VRAM \"but you will need at least 64 GB of RAM\" (as issue 30 quotes it); "
                 "SD.Next: pre-quantized (~32 GB) with its default offloading \"runs on GPUs with ~20GB\" "
                 "([release 2025-12-11](https://github.com/vladmandic/sdnext/discussions/4464))",
}
# with a ControlNet of the known size beside the denoiser (planning/controlnet.py): SD 1.5's 0.72 GB, SDXL's 2.5 GB,
# SD3's and Flux's as diffusers' from_transformer makes them by default
CONTROLNETS = (("sd15", 512, "sd15"), ("sdxl", 1024, "sdxl"), ("sd3", 1024, "sd3"), ("flux", 1024, "flux"))
# an inpainting checkpoint (sd-1.5-inpainting, SDXL inpainting): its UNet takes 9 input channels (estimate.py's
# inpaint_input_bytes); with "only masked" the job's size is the crop's, whatever the canvas
INPAINTING = (("sd15", 512, "inpainting"), ("sdxl", 1024, "inpainting"))
CARDS = (2, 4, 6, 8, 12, 24)


def _models() -> list[tuple[str, int]]:
    """The built-in models above, then every other family record with shipped configs at 1024x1024 (the issue's size;
    Qwen-Image's native 1328 px is above what the budget presets make uncapped)."""
    from lowvram_gen import families

    known = {m for m, _ in MODELS}
    return list(MODELS) + [(f.builtin, 1024) for f in families.builtin_families()
                           if f.builtin and f.builtin not in known]


def target_rows() -> list[dict]:
    """The issue's targets as `lowvram-gen plan` plans them (the same Session), each with the planner's pick, its
    estimates, whether it fits at full size with int8 or better, and the one sentence on what does where not."""
    from lowvram_gen import families
    from lowvram_gen.models.profile import is_builtin
    from lowvram_gen.planning.nearest import plan_nearest, status
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    session = Session()
    rows = []
    for model, side, vram, ram in TARGETS:
        if not is_builtin(model):
            continue
        profile = session.model_profile(model)
        request = GenerationRequest(model=model, width=side, height=side).validated()
        device = session.device(vram=f"{vram}GiB", ram=f"{ram}GiB")
        result = session.plan(request, device, profile=profile)
        chosen = next(e for e in result.estimates if e.name == result.preset.name)
        family = families.by_name(model)
        rows.append({"model": model, "family": family.key, "label": family.label or family.name, "side": side,
                     "vram_gib": vram, "ram_gib": ram, "preset": result.preset.name,
                     "status": status(result, side, side), "vram_bytes": chosen.estimate_bytes,
                     "ram_bytes": chosen.host_peak_bytes, "streamed_bytes_per_step": chosen.streamed_bytes_per_step,
                     "seconds_per_step": chosen.est_seconds_per_step, "refusal": result.refusal,
                     "nearest": plan_nearest(session, request, device, profile, result, model),
                     "peer": PEERS.get(family.key, "")})
    return rows


def print_targets() -> None:
    from lowvram_gen.hardware.device import format_size

    print("| model, size | target | lowvram-gen's plan | VRAM / RAM estimate | fits? | what a peer asks |")
    print("|---|---|---|---|---|---|")
    for r in target_rows():
        fits = "yes" if r["status"] == "fits" else r["nearest"] or r["refusal"]
        streamed = f", streams {format_size(r['streamed_bytes_per_step'])}/step" if r["streamed_bytes_per_step"] else ""
        print(f"| {r['label']} {r['side']}x{r['side']} | {r['vram_gib']} GB VRAM + {r['ram_gib']} GB RAM | "
              f"`{r['preset']}`{streamed}, ~{r['seconds_per_step']:.1f} s/step | {format_size(r['vram_bytes'])} / "
              f"{format_size(r['ram_bytes'])} | {fits} | {r['peer']} |")


def main() -> int:
    from lowvram_gen.hardware.device import format_size, simulated
    from lowvram_gen.models.controlnet_config import known_config
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.controlnet import controlnet_profile, with_controlnets
    from lowvram_gen.planning.planner import plan
    from lowvram_gen.presets import load_presets

    presets = load_presets()
    print("| model, size | " + " | ".join(f"{gib} GB card" for gib in CARDS) + " |")
    print("|---|" + "---|" * len(CARDS))
    rows = [(arch, side, None) for arch, side in _models()] + list(CONTROLNETS) + list(INPAINTING)
    for arch, side, controlnet in rows:
        cells = []
        profile = profile_builtin(arch)
        if controlnet == "inpainting":
            from dataclasses import replace

            profile = replace(profile, unet_in_channels=9)
        elif controlnet:
            profile = with_controlnets(profile, [controlnet_profile(known_config(controlnet), controlnet)])
        for gib in CARDS:
            result = plan(simulated(f"{gib}GiB"), profile, side, side, 1, presets)
            row = next(e for e in result.estimates if e.name == result.preset.name)
            note = "" if row.fits else ", nothing fits"
            size = f", made at {row.width} px" if row.capped else ""
            streamed = f", streams {format_size(row.streamed_bytes_per_step)}/step" if row.streamed_bytes_per_step else ""
            cells.append(f"`{row.name}`{size}{streamed}, ~{row.est_seconds_per_step:.1f} s/step{note}")
        label = f"{arch} {side} px" + (" inpainting (9-channel UNet)" if controlnet == "inpainting"
                                       else f" + {controlnet} ControlNet" if controlnet else "")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    print_targets()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
