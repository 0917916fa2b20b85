"""The README's "Big models on small cards" table: what `lowvram-gen plan` picks per model and card.

    python benchmarks/plan_table.py        # prints a Markdown table (seconds: the planner's estimate)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = (("sd15", 512), ("sdxl", 1024), ("sd3", 1024), ("flux", 1024))
# with a ControlNet of the known size beside the denoiser (planning/controlnet.py): SD 1.5's 0.72 GB, SDXL's 2.5 GB,
# SD3's and Flux's as diffusers' from_transformer makes them by default
CONTROLNETS = (("sd15", 512, "sd15"), ("sdxl", 1024, "sdxl"), ("sd3", 1024, "sd3"), ("flux", 1024, "flux"))
# an inpainting checkpoint (sd-1.5-inpainting, SDXL inpainting): its UNet takes 9 input channels (estimate.py's
# inpaint_input_bytes); with "only masked" the job's size is the crop's, whatever the canvas
INPAINTING = (("sd15", 512, "inpainting"), ("sdxl", 1024, "inpainting"))
CARDS = (2, 4, 6, 8, 12, 24)


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
    rows = [(arch, side, None) for arch, side in MODELS] + list(CONTROLNETS) + list(INPAINTING)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
