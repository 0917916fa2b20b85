"""Sizes the plan and the engines must agree on: the capped resolution and the VAE tile.

Both are planning decisions (the estimate uses them) that the engines then carry out, so they live
here, below the engines, and the engines import them.
"""

from __future__ import annotations

import math

from lowvram_gen.hardware.device import DeviceInfo

MIN_SIDE = 64  # px: one 8x8 latent; the ladder never goes below it


def capped_size(width: int, height: int, max_pixels: int, multiple: int = 8) -> tuple[int, int]:
    """The largest size within `max_pixels` with the same aspect ratio, sides multiples of `multiple`
    (what the pipeline takes: 8 for SD/SDXL, 16 for SD3, Flux and VQGAN-CLIP), at least 64 px.
    Integer square roots: width * sqrt(max / area) in floats is a hair under a whole side where the cap is exactly
    a square of it (1328 px capped at 1024x1024 gave 1023.99..., so 1016)."""
    if width * height <= max_pixels:
        return width, height
    least = -(-MIN_SIDE // multiple) * multiple
    return (max(least, math.isqrt(width * max_pixels // height) // multiple * multiple),
            max(least, math.isqrt(height * max_pixels // width) // multiple * multiple))


def size_multiple(profile) -> int:
    """What a model profile's sides must be multiples of, as engines/sd/pipeline.size_multiple says of the loaded
    pipeline: the VAE's scale factor, times the transformer's patch for a transformer denoiser (Flux, SD3,
    Qwen-Image: 16; SANA's 32x VAE: 32; a UNet: 8), so the plan caps to a size the pipeline takes."""
    vae = int(getattr(profile, "vae_scale_factor", 8) or 8)
    patch = int(getattr(profile, "transformer_patch", 1) or 1) if getattr(profile, "transformer_hidden", 0) else 1
    return vae * patch


def vae_tile_size(device: DeviceInfo) -> int:
    """VAE tile edge in pixels from usable VRAM (Forge's idea: smaller tiles on smaller cards).

    A tile's decode peak grows with its area: ~0.5 GB at 512 px for the SD VAE in half precision
    (docs/benchmarks.md), so 256 px tiles keep the decode near 150 MB on a 2 GB card.
    """
    if not device.is_accelerator:
        return 512
    usable = device.usable_bytes / 2**30
    return 1024 if usable >= 12 else 768 if usable >= 6 else 512 if usable >= 3 else 256
