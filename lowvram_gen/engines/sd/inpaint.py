"""Inpainting in a Stable Diffusion job: diffusers' inpaint pipeline over the loaded pipeline, and masked content.

`inpaint_pipe` makes StableDiffusionInpaintPipeline / StableDiffusionXLInpaintPipeline over the loaded pipeline's
components with the auto-pipelines' `from_pipe`, as pipeline.img2img_pipe makes the img2img one (no weights
copied, cast or read: DiffusionPipeline.from_pipe would cast every shared model to float32). The same pipeline
runs both kinds of checkpoint: an inpainting UNet (9 input channels: the latents, the mask and the masked image's
latents) gets the mask as its input; an ordinary one (4 channels) has the init image's latents, noised to the
step's level, put back outside the mask after each step, as A1111 does with an ordinary model.

`masked_content` is A1111's "latent noise" / "latent nothing": the init image's latents inside the mask replaced
by the image's own seeded noise, or by zeros, before the pipeline noises them to the first step's level.
"""

from __future__ import annotations

import contextlib

from lowvram_gen import families
from lowvram_gen.engines.sd.kept import kept_pipe
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families import Task
from lowvram_gen.families.execution import task_of

INPAINT_CHANNELS = 9  # latents 4 + mask 1 + masked image latents 4


def is_inpainting_model(pipe) -> bool:
    """Whether the pipeline's UNet is an inpainting one (in_channels 9)."""
    unet = getattr(pipe, "unet", None)  # this object's denoiser and its config: a checkpoint's, not a family's
    return unet is not None and int(unet.config.get("in_channels", 4)) == INPAINT_CHANNELS


def check(pipe, request) -> None:
    """An inpainting model without a mask, or a mask on a pipeline whose family has no inpaint pipeline (its record's
    tasks), is refused before any step runs."""
    if is_inpainting_model(pipe) and not request.mask:
        raise InvalidRequest("model", request.model, "is an inpainting model (its UNet takes 9 input channels): use "
                             "it with inpaint and a mask (lowvram-gen inpaint PROMPT --init IMAGE --mask MASK)")
    record, task = task_of(pipe)
    if request.mask and (task not in (Task.TXT2IMG, Task.IMG2IMG) or not record.has_task(Task.INPAINT)):
        names = list(dict.fromkeys(r.name for r in families.all_families() if r.has_task(Task.INPAINT)))
        built = " and ".join(filter(None, (", ".join(names[:-1]), names[-1])))  # 'SD 1.x/2.x and SDXL'
        raise InvalidRequest("mask", request.mask, f"inpainting is built for {built}, not {type(pipe).__name__}")


def inpaint_pipe(pipe):
    """The inpaint pipeline over the same components (no copy, no reload), kept on `pipe`."""
    from diffusers import AutoPipelineForInpainting

    return kept_pipe(pipe, AutoPipelineForInpainting, "_lowvram_inpaint")


@contextlib.contextmanager
def masked_content(pipe, content: str, masks: list, seeds: list[int], device: str):
    """A1111's latent noise / latent nothing on the init latents the inpaint pipeline prepares (its
    `prepare_latents` encodes the init image with `_encode_vae_image`): inside the mask (each pass mask, at latent
    size, rounded) they become the image's seeded noise or zeros. "original" and "fill" (pixels) change nothing
    here. The masked-image latents a 9-channel UNet reads are encoded later, outside `prepare_latents`, and stay."""
    if content not in ("latent-noise", "latent-nothing"):
        yield
        return
    import numpy as np
    import torch

    original_prepare = pipe.prepare_latents
    encode = pipe._encode_vae_image

    def replaced(*args, **kwargs):
        latents = encode(*args, **kwargs)
        h, w = latents.shape[-2:]
        rows = []
        for i in range(latents.shape[0]):
            small = masks[i % len(masks)].convert("L").resize((w, h))
            rows.append(np.round(np.asarray(small, dtype=np.float32) / 255.0))
        # (B, 1, h, w), or (B, 1, 1, h, w) for a video-style VAE's frame axis (Qwen-Image's latents are B, C, 1, h, w)
        inside = torch.from_numpy(np.stack(rows)).reshape(latents.shape[0], *([1] * (latents.ndim - 3)), h, w)
        inside = inside.to(latents.device, latents.dtype)
        if content == "latent-noise":  # each image's own seed, as A1111 draws it from the image's seed
            gens = [torch.Generator("cpu").manual_seed(seeds[i % len(seeds)]) for i in range(latents.shape[0])]
            fill = torch.stack([torch.randn(latents.shape[1:], generator=g) for g in gens]).to(latents.device,
                                                                                                 latents.dtype)
        else:
            fill = torch.zeros_like(latents)
        return latents * (1 - inside) + fill * inside

    def prepare(*args, **kwargs):
        pipe._encode_vae_image = replaced
        try:
            return original_prepare(*args, **kwargs)
        finally:
            del pipe._encode_vae_image

    pipe.prepare_latents = prepare
    try:
        yield
    finally:
        del pipe.prepare_latents
