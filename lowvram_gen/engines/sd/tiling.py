"""A1111's Tiling (seamless textures): circular padding in the denoiser's and the VAE's convolutions for one job.

Every `torch.nn.Conv2d` of the UNet and the VAE pads with the far side of its input ("circular") instead of zeros
while a pass or a decode runs, so what leaves the right edge comes back at the left: the image tiles without a seam.
`seamless(pipe, on)` sets them and puts back what each had in `finally`, whatever ends the pass (an out-of-memory
the ladder retries, a cancel, an error); it is entered around each pass and decode rather than once per job because
a ladder rung may reload a component from disk, whose new convolutions must tile too.

accelerate's offload hooks wrap a module's forward and move its weights; Conv2d's forward reads `padding_mode` from
the module each call, so offloaded models tile as resident ones do. diffusers' VAE tiling (`enable_tiling`) decodes
the latents in overlapping tiles: circular padding there would wrap each tile on itself and seam every tile edge,
so a tiling job never decodes tiled (`untiled`): the ladder's tiled-decode rung is skipped for the next preset, and
the plan counts the whole decode (`untiled_presets`, Session.plan).
Transformer denoisers (FLUX, SD3, Qwen-Image ...) work on patch tokens, not padded convolutions: refused (`check`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from lowvram_gen import families
from lowvram_gen.errors import InvalidRequest

CIRCULAR = "circular"
SKIPPED_RUNG = "no tiled VAE decode: seamless tiling needs the whole image in one piece"


def check(pipe, request) -> None:
    """Refuse `tiling` on a family whose denoiser has no padded convolutions to wrap (its record's `denoiser`)."""
    if not getattr(request, "tiling", False):
        return
    record = families.of_pipe(pipe)
    if record.denoiser != "unet":
        raise InvalidRequest("tiling", True, f"seamless tiling is not built for {record.name or type(pipe).__name__}: "
                                             "its denoiser is a transformer over patches, not padded convolutions "
                                             "(tiling is for SD 1.x/2.x and SDXL)")


def convolutions(pipe) -> list:
    """The Conv2d layers of the pipeline's denoiser and VAE (encoder and decoder), each once."""
    import torch

    seen: dict[int, torch.nn.Conv2d] = {}
    for name in (families.of_pipe(pipe).denoiser, "vae"):
        component = getattr(pipe, name, None)
        if isinstance(component, torch.nn.Module):
            seen.update((id(m), m) for m in component.modules() if isinstance(m, torch.nn.Conv2d))
    return list(seen.values())


@contextmanager
def seamless(pipe, on: bool) -> Iterator[None]:
    """The pipeline's convolutions pad circularly inside the block when `on`; each is back as it was after it."""
    if not on:
        yield
        return
    before = [(conv, conv.padding_mode) for conv in convolutions(pipe)]
    try:
        for conv, _ in before:
            conv.padding_mode = CIRCULAR
        yield
    finally:
        for conv, mode in before:
            conv.padding_mode = mode


def untiled(settings, on: bool):
    """The memory settings a tiling job applies: without diffusers' VAE tiling (see the module's docstring)."""
    return replace(settings, vae_tiling=False) if on and settings.vae_tiling else settings


def untiled_presets(presets: dict, forced):
    """The presets (name -> Preset) and the forced one (or None) a tiling job is planned with: their decode untiled,
    so the plan counts the whole VAE decode the job runs."""
    def one(preset):
        return replace(preset, memory=untiled(preset.memory, True))

    return {name: one(p) for name, p in presets.items()}, forced and one(forced)
