"""A clip's latents to frames, as the pipelines' own code decodes them after their loop (diffusers' WanPipeline,
WanImageToVideoPipeline, LTXPipeline, LTXImageToVideoPipeline), run as a stage of its own: the job keeps the latents,
so an out-of-memory here retries the decode alone, tiled (diffusers' `vae.enable_tiling()` on AutoencoderKLWan and
AutoencoderKLLTXVideo; LTX's framewise decoding too), never the steps.

- Wan: latents / (1 / latents_std) + latents_mean (the VAE config's per-channel statistics), then `vae.decode`.
- LTX: the transformer's packed token sequence unpacked to (B, C, F, H, W) (`LTXPipeline._unpack_latents`), its
  denormalisation (`_denormalize_latents`, with the VAE's mean, std and scaling factor), then `vae.decode` with the
  decode timestep where the VAE is timestep-conditioned (the call's default, 0: no noise is mixed in).
Then `video_processor.postprocess_video`: frames as uint8 (F, H, W, 3).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Latents:
    """What the denoise stage leaves: the latents as the pipeline's call returned them (output_type "latent") and the
    clip's shape in pixels, which LTX's packed latents need to be unpacked."""

    tensor: object  # torch.Tensor
    frames: int
    width: int
    height: int


def is_ltx(pipe) -> bool:
    """LTX-Video's pipelines (their packed latents), told by the pipeline class's own unpacking helper."""
    return hasattr(type(pipe), "_unpack_latents") and hasattr(type(pipe), "_denormalize_latents")


def tiled(pipe) -> None:
    """The VAE decodes in tiles (and LTX's frame by frame): the decode's first step down."""
    vae = pipe.vae
    vae.enable_tiling()
    if hasattr(vae, "use_framewise_decoding"):
        vae.use_framewise_decoding = True


def decode(pipe, latents: Latents, upcast: bool = False):
    """(the frames of `latents` as a uint8 array (F, H, W, 3), None or what was wrong: 'nan' where the decode made
    NaN/Inf, 'black' where every frame is black). `upcast`: the VAE decodes in float32 (a 16-bit VAE's overflow), then
    goes back to its dtype."""
    import numpy as np
    import torch
    from diffusers.utils.torch_utils import get_module_execution_device

    from lowvram_gen.engines.sd.pipeline import bad_output

    vae = pipe.vae
    original = vae.dtype
    if upcast:
        vae.to(dtype=torch.float32)
    try:
        device = get_module_execution_device(vae)
        with torch.no_grad():
            if is_ltx(pipe):
                video = _decode_ltx(pipe, latents, device)
            else:
                z = latents.tensor.to(device=device, dtype=vae.dtype)
                mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(z.device, z.dtype)
                std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(z.device,
                                                                                                       z.dtype)
                video = vae.decode(z / std + mean, return_dict=False)[0]
    finally:
        if upcast:
            vae.to(dtype=original)
    bad = bad_output(video)  # decoded pixels are in [-1, 1]
    with torch.no_grad():
        frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]  # float [0, 1], (F, H, W, 3)
    return (np.clip(np.nan_to_num(frames), 0.0, 1.0) * 255).round().astype(np.uint8), bad


def _decode_ltx(pipe, latents: Latents, device):
    import torch

    vae = pipe.vae
    frames = (latents.frames - 1) // pipe.vae_temporal_compression_ratio + 1
    height = latents.height // pipe.vae_spatial_compression_ratio
    width = latents.width // pipe.vae_spatial_compression_ratio
    z = pipe._unpack_latents(latents.tensor.to(device), frames, height, width, pipe.transformer_spatial_patch_size,
                             pipe.transformer_temporal_patch_size)
    z = pipe._denormalize_latents(z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    timestep = None
    if vae.config.timestep_conditioning:  # the call's decode_timestep (0.0) and noise scale (as it): z unchanged
        timestep = torch.zeros(z.shape[0], device=z.device, dtype=vae.dtype)
    return vae.decode(z.to(vae.dtype), timestep, return_dict=False)[0]
