"""A live preview of a clip while it denoises: its middle frame, from the latents, on the CPU.

Wan's latents (B, C, F, h, w) give their middle latent frame; LTX's packed sequence is unpacked first
(`LTXPipeline._unpack_latents`). Where the family has a published latent-to-RGB map for that many channels
(lowvram_gen/preview.py FORMATS: Wan 2.1's), the frame goes through it (preview.approx); else (Wan 2.2's 48 channels,
LTX) its first three channels, each stretched to its own range, show the shapes.
"""

from __future__ import annotations

from lowvram_gen import preview as previews


def middle_frame(pipe, latents, frames: int, width: int, height: int):
    """An RGB PIL image of `width` x `height` of the middle frame of `latents` (on the CPU)."""
    import torch

    latents = latents.float()
    if latents.dim() == 3:  # LTX: (B, tokens, C), packed
        lf = (frames - 1) // pipe.vae_temporal_compression_ratio + 1
        lh, lw = height // pipe.vae_spatial_compression_ratio, width // pipe.vae_spatial_compression_ratio
        latents = pipe._unpack_latents(latents, lf, lh, lw, pipe.transformer_spatial_patch_size,
                                       pipe.transformer_temporal_patch_size)
    frame = latents[0, :, latents.shape[2] // 2]  # (C, h, w)
    key = previews.latent_format(pipe)
    fmt = previews.FORMATS.get(key) if key else None
    if fmt is not None and fmt.factors and len(fmt.factors) == frame.shape[0]:
        return previews.approx(frame, fmt, (width, height))
    rgb = frame[:3]
    low = rgb.flatten(1).min(1).values.view(3, 1, 1)
    high = rgb.flatten(1).max(1).values.view(3, 1, 1)
    rgb = (rgb - low) / torch.clamp(high - low, min=1e-6) * 2 - 1
    return previews._to_image(rgb, (width, height))
