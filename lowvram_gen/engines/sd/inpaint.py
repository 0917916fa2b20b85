"""Inpainting in a Stable Diffusion job: diffusers' inpaint pipeline over the loaded pipeline, and masked content.

`inpaint_pipe` makes StableDiffusionInpaintPipeline / StableDiffusionXLInpaintPipeline over the loaded pipeline's
components with the auto-pipelines' `from_pipe`, as pipeline.img2img_pipe makes the img2img one (no weights
copied, cast or read: DiffusionPipeline.from_pipe would cast every shared model to float32). The same pipeline
runs both kinds of checkpoint: an inpainting UNet (9 input channels: the latents, the mask and the masked image's
latents) gets the mask as its input; an ordinary one (4 channels) does not.

Both kinds keep the area outside the mask by A1111's blend (engines/sd/a1111_blend.py, one mechanism on the pass's
scheduler): each model call's denoised estimate blended with the clean init latents (DDIM, PLMS, UniPC: the model's
input, as A1111's timestep samplers do), and the final latents once more, in place of diffusers' own (an ordinary
UNet's latents blended after each step with the init noised to the next level; none for an inpainting UNet). A
diffusers class named as the sampler runs as plain diffusers does, with diffusers' blend.

`latent_mask` is A1111's latent mask on the UNet families' pipelines: an ordinary UNet's latents are blended with
the pass's mask resized to the latent size and rounded to 0/1 (the request's `mask_round`, on by default) or kept
grey (off), not diffusers' nearest sample of its mask cut at half (inpaint/masks.py's `latent_weights`); an
inpainting UNet reads the mask unrounded with `mask_round` off.

`masked_content` is A1111's "latent noise" / "latent nothing": the init image's latents inside the mask replaced
by the image's own seeded noise, or by zeros, before the pipeline noises them to the first step's level.

An inpaint pipeline that renders a size of its own whatever it is asked (its record's `rendered_sizes`: Qwen-Image-
Edit's, about 1024x1024 pixels at the init image's aspect) is planned, stepped down and reported at that size
(`rendered`, `planned`, `job_warnings`): the init image and mask go to it at the job's size, as a user gives them to
diffusers, and what it makes is resized to the job's size.
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
    if not record.is_generic and task is Task.TXT2IMG:  # a family a record knows: its own sentence per task
        if request.mask and not record.has_task(Task.INPAINT):
            raise InvalidRequest("task", "inpaint", f"{record.name} has no inpaint pipeline in diffusers: use txt2img"
                                 f"{' or img2img' if record.has_task(Task.IMG2IMG) else ''}")
        content = getattr(request, "masked_content", "original")
        if request.mask and content in ("latent-noise", "latent-nothing") and not _encodes_apart(record):
            raise InvalidRequest("masked content", content, f"{record.name}'s inpaint pipeline encodes the init image "
                                 "inside its own latents step, where it cannot be replaced: use original or fill")
        init = None if request.mask else getattr(request, "init_image", None)  # with a mask: the inpaint pipeline
        hires = getattr(request, "hires", False)
        img2img = "hires fix's second pass (an img2img pass)"
        if init and not record.has_task(Task.IMG2IMG):
            raise InvalidRequest("task", "img2img", f"{record.name} has no img2img pipeline in diffusers: use txt2img")
        if hires and not record.has_task(Task.IMG2IMG):
            resize = getattr(request, "hires_resize", None)  # the field the user gave: a resize, else the scale
            field, given = ("hires resize", "%dx%d" % resize) if resize else ("hires scale", request.hires_scale)
            raise InvalidRequest(field, given, f"{record.name} has no img2img pipeline in diffusers for {img2img}: "
                                 "leave hires fix off and upscale after")
    if request.mask and not getattr(request, "mask_round", True) and record.denoiser != "unet":
        raise InvalidRequest("mask round", False, f"{record.name}'s inpaint pipeline rounds the mask itself (the grey "
                             "latent mask is built for the UNet models: SD 1.x/2.x and SDXL): leave mask_round on")
    if request.mask and (task not in (Task.TXT2IMG, Task.IMG2IMG) or not record.has_task(Task.INPAINT)):
        names = list(dict.fromkeys(r.name for r in families.all_families() if r.has_task(Task.INPAINT)))
        built = " and ".join(filter(None, (", ".join(names[:-1]), names[-1])))  # 'SD 1.x/2.x and SDXL'
        raise InvalidRequest("mask", request.mask, f"inpainting is built for {built}, not {type(pipe).__name__}")


def own_size(record, request):
    """The function giving the size the job's inpaint pipeline renders for an init image of (width, height), where
    it renders one of its own (the record's `rendered_sizes`); None where it renders the size asked, or the job is
    not a plain inpaint (no mask, or a ControlNet's inpaint pipeline)."""
    if record is None or not getattr(request, "mask", None) or getattr(request, "controlnets", ()):
        return None
    return record.rendered_sizes.get(Task.INPAINT.value)


def renders_own_size(pipe, request) -> bool:
    """Whether the job's inpaint pipeline renders a size of its own (see `own_size`)."""
    return own_size(families.of_pipe(pipe), request) is not None


def rendered(pipe, request, size: tuple[int, int]) -> tuple[int, int]:
    """The size the job's pass renders when given an init image of `size`: `size`, or its pipeline's own."""
    made = own_size(families.of_pipe(pipe), request)
    return tuple(made(*size)) if made else tuple(size)


def planned(profile, record, request):
    """(`profile`, the size the plan counts or None for the request's): where the family's inpaint pipeline renders a
    size of its own (Qwen-Image-Edit's), that size; where it joins its init image's VAE latents to the image tokens in
    every block (the record's `joined_init_tasks`: Kontext's, Klein's, Qwen-Image-Edit's), those latents counted as an
    edit's reference (engines/sd/edit.planned), at the size rendered."""
    import dataclasses

    made = own_size(record, request)
    size = tuple(made(request.width, request.height)) if made else None
    if joins_init(record, request) and profile.denoiser == "transformer":
        width, height = size or (request.width, request.height)
        side = int(profile.vae_scale_factor) * int(profile.transformer_patch)
        init_tokens = width * height // side ** 2
        profile = dataclasses.replace(profile, reference_tokens=profile.reference_tokens + init_tokens)
    return profile, size


def joins_init(record, request) -> bool:
    """Whether the job is a plain inpaint (a mask, no ControlNet) whose pipeline joins the init latents to the image
    tokens (the record's `joined_init_tasks`)."""
    return (record is not None and bool(getattr(request, "mask", None)) and not getattr(request, "controlnets", ())
            and Task.INPAINT.value in record.joined_init_tasks)


def job_warnings(pipe, request) -> list[str]:
    """What the job's inpaint pass does not do as asked, one line each, for the result's warnings: a pipeline that
    renders its own size (made at that size, resized to the asked one); a ControlNet inpaint pipeline's unused
    denoising strength, and the unit's control image where it reads the init image instead (Qwen-Image's)."""
    if not getattr(request, "mask", None):
        return []
    record = families.of_pipe(pipe)
    out = []
    size = (request.width, request.height)
    made = rendered(pipe, request, size)
    if made != size:
        out.append(f"{record.pipeline_for(Task.INPAINT)} renders {made[0]}x{made[1]} when given {size[0]}x{size[1]} "
                   "(its call renders a size of its own at the image's aspect, whatever width and height it is "
                   f"given): the image is resized to {size[0]}x{size[1]}")
    facts = record.controlnet
    if request.controlnets and facts is not None and facts.inpaint:
        name = record.pipeline_for(Task.CONTROLNET_INPAINT)
        if request.strength < 1:
            out.append(f"{name} repaints the masked area from noise: denoising strength {request.strength:g} is not "
                       "used")
        if facts.inpaint == "control" and any(u.image and not _same_image(u.image, request.init_image)
                                              for u in request.controlnets):
            out.append(f"{name} reads the init image and the mask (its inpainting ControlNet's input), not a control "
                       "image: the unit's control image is not used")
    return out


def _same_image(a, b) -> bool:
    """Whether two image files hold the same pixels (the same file, or a copy: the REST API stores each image apart)."""
    if a == b:
        return True
    import numpy as np
    from PIL import Image

    with Image.open(a) as x, Image.open(b) as y:
        return x.size == y.size and np.array_equal(np.asarray(x.convert("RGB")), np.asarray(y.convert("RGB")))


def _encodes_apart(record) -> bool:
    """Whether the family's inpaint pipeline encodes the init image in `_encode_vae_image`, where `masked_content`
    replaces it (SD, SDXL); Z-Image's encodes it inside prepare_latents."""
    import diffusers

    return hasattr(getattr(diffusers, record.pipeline_for(Task.INPAINT), None), "_encode_vae_image")


def inpaint_pipe(pipe):
    """The inpaint pipeline over the same components (no copy, no reload), kept on `pipe`; the config entries its
    record says the pipeline reads and the loaded components lack set on them first (`complete_configs`)."""
    from diffusers import AutoPipelineForInpainting
    from diffusers.pipelines.auto_pipeline import AUTO_INPAINT_PIPELINES_MAPPING

    record = families.of_pipe(pipe)
    name = record.pipeline_for(Task.INPAINT)
    complete_configs(pipe, record.task_configs.get(Task.INPAINT.value, {}))
    mapped = name in (cls.__name__ for cls in AUTO_INPAINT_PIPELINES_MAPPING.values())
    return kept_pipe(pipe, AutoPipelineForInpainting if mapped or not name else _Direct(name), "_lowvram_inpaint")


def complete_configs(pipe, entries) -> None:
    """Each of `entries` ({component: {key: value}}) set on the loaded component's config where it has no such key
    (Chroma's `guidance_embeds`, which ChromaInpaintPipeline reads and ChromaTransformer2DModel's config lacks). Done
    on every call, as the pipeline is taken: a component loaded again (int8, a LoRA's reload) gets it too. A key the
    config has is left as it is; no other pipeline of the family reads these, so its other tasks run as before."""
    for name, values in entries.items():
        component = getattr(pipe, name, None)
        missing = {k: v for k, v in values.items() if k not in component.config} if component is not None else {}
        if missing:
            component.register_to_config(**missing)


class _Direct:
    """`from_pipe` for an inpaint class the auto-pipelines do not map (Flux.2 Klein's), built as they build theirs:
    the shared components and the config's own arguments, nothing copied or cast."""

    def __init__(self, name: str):
        self.name = name

    def from_pipe(self, pipe):
        import diffusers

        cls = getattr(diffusers, self.name)
        expected, optional = cls._get_signature_keys(cls)
        return cls(**{k: v for k, v in pipe.components.items() if k in expected},
                   **{k: v for k, v in pipe.config.items() if k in optional})


@contextlib.contextmanager
def mask_hooks(pipe, request, mask, seeds: list[int], device: str):
    """The pass's inpaint hooks on `pipe`: the request's masked content, A1111's latent mask (its mask_round) and,
    on a UNet pipeline run by an A1111 sampler, A1111's blend (`blends_as_a1111`)."""
    from lowvram_gen.engines.sd import a1111_blend

    rounded = getattr(request, "mask_round", True)
    a1111 = blends_as_a1111(pipe, request)
    own = a1111_blend.blend(pipe, lambda like: latent_mask_tensor(mask, like, False, rounded),
                            getattr(request, "sampler", "") in a1111_blend.INPUT_BLEND) if a1111 \
        else contextlib.nullcontext()
    with masked_content(pipe, request.masked_content, [mask], seeds, device, rounded), \
            latent_mask(pipe, mask, rounded, blends_itself=not a1111), own:
        yield


def blends_as_a1111(pipe, request) -> bool:
    """Whether the pass blends as A1111 does (engines/sd/a1111_blend.py): a UNet inpaint pipeline run by one of
    A1111's samplers (or the default); a diffusers class named as the sampler runs as plain diffusers, its blend too."""
    from lowvram_gen.samplers import AS_DIFFUSERS

    return (getattr(pipe, "unet", None) is not None and hasattr(pipe, "prepare_mask_latents")
            and getattr(request, "sampler", "default") not in AS_DIFFUSERS)


def latent_mask_tensor(mask, like, inpainting: bool, rounded: bool):
    """The mask `like` (the pipeline's, B x 1 x h x w) becomes: an ordinary UNet's blend weights by A1111's rule
    (masks.latent_weights); an inpainting UNet's input the pixel mask over 255 sampled nearest to the latent size,
    rounded with `rounded` (A1111's conditioning mask)."""
    import numpy as np
    import torch

    from lowvram_gen.inpaint.masks import latent_weights

    h, w = like.shape[-2:]
    if inpainting:
        pixels = torch.from_numpy(np.asarray(mask.convert("L"), dtype=np.float32) / 255.0)[None, None]
        small = torch.nn.functional.interpolate(torch.round(pixels) if rounded else pixels, size=(h, w))
    else:
        small = torch.from_numpy(latent_weights(mask, (w, h), rounded))[None, None]
    return small.to(like.device, like.dtype).expand(like.shape).contiguous()


@contextlib.contextmanager
def latent_mask(pipe, mask, rounded: bool, blends_itself: bool = True):
    """A1111's latent mask (`latent_mask_tensor`) in place of the one a UNet inpaint pipeline's prepare_mask_latents
    makes from its mask cut at half; a pipeline without a UNet keeps its own (check refuses mask_round off there).
    Not `blends_itself` (A1111's blend does it: engines/sd/a1111_blend.py): an ordinary UNet's loop is given a mask of
    ones, so its own blend after each step keeps the latents as they are (1 * latents + 0 * its noised init)."""
    if getattr(pipe, "unet", None) is None or not hasattr(pipe, "prepare_mask_latents"):
        yield
        return
    inpainting = is_inpainting_model(pipe)
    original = pipe.prepare_mask_latents

    def prepare(*args, **kwargs):
        made, masked_image_latents = original(*args, **kwargs)
        if not inpainting and not blends_itself:
            return torch.ones_like(made), masked_image_latents
        if inpainting and rounded:  # diffusers' own: its mask cut at half, sampled nearest, as A1111's rounded one
            return made, masked_image_latents
        return latent_mask_tensor(mask, made, inpainting, rounded), masked_image_latents

    import torch

    pipe.prepare_mask_latents = prepare
    try:
        yield
    finally:
        del pipe.prepare_mask_latents


@contextlib.contextmanager
def masked_content(pipe, content: str, masks: list, seeds: list[int], device: str, rounded: bool = True):
    """A1111's latent noise / latent nothing on the init latents the inpaint pipeline prepares (its
    `prepare_latents` encodes the init image with `_encode_vae_image`): inside the mask (each pass mask's latent
    weights, masks.latent_weights: rounded unless mask_round is off) they become the image's seeded noise or zeros.
    "original" and "fill" (pixels) change nothing here. The masked-image latents a 9-channel UNet reads are encoded
    later, outside `prepare_latents`, and stay."""
    if content not in ("latent-noise", "latent-nothing"):
        yield
        return
    import numpy as np
    import torch

    from lowvram_gen.inpaint.masks import latent_weights

    original_prepare = pipe.prepare_latents
    encode = pipe._encode_vae_image

    def replaced(*args, **kwargs):
        latents = encode(*args, **kwargs)
        h, w = latents.shape[-2:]
        rows = []
        for i in range(latents.shape[0]):
            rows.append(latent_weights(masks[i % len(masks)], (w, h), rounded))
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
