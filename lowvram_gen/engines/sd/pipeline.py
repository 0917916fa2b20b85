"""Stable Diffusion (any diffusers text-to-image pipeline): denoise and decode as separate stages.

The split is what lets the retry ladder redo only the VAE decode, tiled, with the latents already
computed, when the decode runs out of memory. For SD 1.x/2.x and SDXL the decode below is the
pipeline's own decode, step for step, so `sampler="default"` gives the same pixels as a plain
diffusers pipeline. Other pipelines (SD3, Flux, ...) pack their latents differently: they run in
one call, and a decode OOM retries the whole chunk at the next preset; their hires fix upscales the
first pass in pixels. What such a pipeline cannot do (the latent hires upscaler, A1111 samplers on a
flow-matching model, sides off its patch grid) is refused by `check_request` / `set_sampler` with a
clear error before any step runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable

from lowvram_gen import families, img2img_steps, schedules
from lowvram_gen.a1111 import unipc_time
from lowvram_gen.engines.sd import controlnet, edit, inpaint, latent_resize, posterior, prompt_steps, rng_source
from lowvram_gen.engines.sd.kept import kept_pipe
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families import Task
from lowvram_gen.families.execution import task_of
from lowvram_gen.prompting.encode import encode_prompts, plain_prompt_for
from lowvram_gen.request import GenerationRequest
from lowvram_gen.samplers import DEFAULT, build_scheduler
from lowvram_gen.schedules import AUTOMATIC, align_table

ProgressFn = Callable[[int, int], None]  # (step done, total steps)
INTERRUPT, SKIP = "interrupt", "skip"  # why a pass stopped before its last step (Denoised.stopped)


@dataclass
class Pass:
    """One forward pass of a job: the request's prompt and settings, for these seeds at this size.

    It holds the request itself rather than copies of its fields; only what a pass changes is here
    (a hires second pass has its own size, init, strength and steps)."""

    request: GenerationRequest
    seeds: list[int]
    width: int
    height: int
    init: object = None  # img2img: PIL images (one per seed) or latents already in model space
    strength: float = 1.0  # img2img: how much of the init is replaced; 0 keeps it as it is
    steps: int | None = None  # None: the request's steps
    texts: "Texts | None" = None  # what the text encoders read; None: the request's prompts as typed
    # the prompts already encoded for one image (text_encoders = "reloaded": the encoders left before the
    # denoiser runs); None: the pipeline call encodes `texts`
    embeds: "dict | None" = None
    # A1111's variation seeds, one per image (the request's subseed+i); None: none (strength 0)
    subseeds: "list[int] | None" = None
    cfg_scale: float | None = None  # None: the request's (a hires second pass: its hires CFG scale)
    # inpainting: the mask (PIL L, the pass's size; white is repainted), with `init` the images to repaint
    mask: object = None
    # inpainting's only masked: ((canvas width, height), crop box) the ControlNet units' images are cut with, as the
    # init image was (control/preprocess.py); None: the control images whole
    control_crop: tuple | None = None
    hires: bool = False  # hires fix's second pass (canny/mlsd units take A1111's soft weights: control/weights.py)
    references: "list | None" = None  # an edit's reference images (PIL), given to the family's edit pipeline
    # img2img's "Just resize (latent upscale)": `init` at its own size, its latents interpolated to the pass's
    latent_resize: bool = False

    @property
    def num_steps(self) -> int:
        return self.steps or self.request.steps

    @property
    def guidance(self) -> float:
        """The CFG scale this pass runs with."""
        return self.request.cfg_scale if self.cfg_scale is None else self.cfg_scale


@dataclass(frozen=True)
class Texts:
    """The prompts as the text encoders read them: `<lora:...>` tags taken out and `embedding:name`
    resolved (networks.job); the PNG keeps the prompts as typed. `clip_skip`: the request's (A1111's
    "Clip skip", 1: off), the layer the SD/SDXL encoders stop at."""

    prompt: str
    negative_prompt: str
    clip_skip: int = 1
    # hires fix's second pass's, where A1111's Hires prompt / Hires negative prompt differ; None: these
    hires: "Texts | None" = None

    @classmethod
    def of(cls, request: GenerationRequest) -> "Texts":
        """The request's prompts as typed (no LoRA tags or embeddings to resolve)."""
        hires = None
        if request.hires and request.hires_texts != (request.prompt, request.negative_prompt):
            hires = cls(*request.hires_texts, request.clip_skip)
        return cls(request.prompt, request.negative_prompt, request.clip_skip, hires)

    @property
    def second(self) -> "Texts":
        """What hires fix's second pass reads."""
        return self.hires or self


def text_kwargs(pipe, texts: Texts, n: int, cfg: bool) -> dict:
    """The pipeline call's text arguments for `n` images: A1111-weighted, chunked embeddings for SD and
    SDXL (prompting.encode; a plain prompt gives exactly diffusers' own embeddings), the plain strings
    with the weighting syntax stripped for pipelines with other text encoders (SD3, Flux, ...). The negative
    prompt goes only to a call that takes one (the family's record: Flux.2 and SANA have none)."""
    embeds = encode_prompts(pipe, texts.prompt, texts.negative_prompt, n, None, clip_skip=texts.clip_skip, do_cfg=cfg)
    if embeds is not None:
        return embeds.as_kwargs()
    prompt = plain_prompt_for(pipe, texts.prompt)[0]
    call = families.of_pipe(pipe).call
    if not call.takes_negative_prompt:
        return dict(prompt=[prompt] * n)
    negative = plain_prompt_for(pipe, texts.negative_prompt)[0] or None
    if negative is None and cfg:  # Qwen-Image: its true CFG needs a negative prompt; its model card's blank one
        negative = call.blank_negative
    if negative is None:  # SANA: its call needs a string
        negative = call.empty_negative
    return dict(prompt=[prompt] * n, negative_prompt=[negative] * n if negative is not None else None)


def guidance_kwargs(pipe, scale: float) -> dict:
    """The call's CFG argument with `scale`, as the family's record names it (`guidance_scale`; `true_cfg_scale` for
    Qwen-Image's CFG); none for a call that takes no guidance."""
    argument = families.of_pipe(pipe).call.cfg_argument
    return {argument: scale} if argument else {}


def encode_texts(pipe, texts: Texts, cfg: bool) -> dict:
    """The pipeline call's text arguments for ONE image as tensors, computed now (text_encoders = "reloaded":
    the encoders leave before the denoiser runs; `for_images` repeats them for a pass). SD/SDXL: our own
    A1111-weighted embeddings (as text_kwargs); Flux and SD3: the pipeline's own `encode_prompt` with the
    arguments its call would pass it, so the embeddings are the ones the call makes from the strings."""
    import torch

    embeds = encode_prompts(pipe, texts.prompt, texts.negative_prompt, 1, None, clip_skip=texts.clip_skip,
                            do_cfg=cfg)
    if embeds is not None:
        return embeds.as_kwargs()
    prompt = plain_prompt_for(pipe, texts.prompt)[0]
    negative = plain_prompt_for(pipe, texts.negative_prompt)[0]
    name = type(pipe).__name__
    record = families.of_pipe(pipe)
    length = record.t5_tokens  # the call's default max_sequence_length, which the call would pass
    style = record.text_encode_apart
    device = pipe._execution_device
    with torch.no_grad():
        if style == "encode_prompt_pooled":  # its negative prompt counts only with true CFG, which we never turn on
            if record.call.negative_prompt:
                raise InvalidRequest("text_encoders", "reloaded", f"{name} with true CFG is not supported with "
                                     "text encoders reloaded per job; use text_encoders = 'kept'")
            embeds, pooled, _ids = pipe.encode_prompt(prompt=[prompt], prompt_2=None, device=device,
                                                      num_images_per_prompt=1, max_sequence_length=length)
            return dict(prompt_embeds=embeds, pooled_prompt_embeds=pooled)
        if style == "encode_prompt_cfg":
            out = pipe.encode_prompt(prompt=[prompt], prompt_2=None, prompt_3=None, device=device,
                                     num_images_per_prompt=1, do_classifier_free_guidance=cfg,
                                     negative_prompt=[negative] if negative else None, max_sequence_length=length)
            keys = ("prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds", "negative_pooled_prompt_embeds")
            return {k: v for k, v in zip(keys, out) if v is not None}
        if style == "encode_prompt_masks":
            return _encode_with_masks(pipe, prompt, negative or record.call.empty_negative, cfg, device, length)
        if style == "encode_prompt_lists":  # Z-Image: one tensor per prompt in a list; the negative always (its CFG
            # runs at any scale above 0, and a call given prompt embeddings with CFG needs the negative's)
            embeds, negatives = pipe.encode_prompt(prompt=[prompt], device=device, do_classifier_free_guidance=True,
                                                   negative_prompt=[negative] if negative else None,
                                                   max_sequence_length=length)
            return dict(prompt_embeds=embeds, negative_prompt_embeds=negatives)
        if style == "encode_prompt_empty_negative":  # Flux.2 Klein: its CFG (base models) is against "", always
            embeds, _ids = pipe.encode_prompt(prompt=[prompt], device=device, max_sequence_length=length)
            empty, _ids = pipe.encode_prompt(prompt=[""], device=device, max_sequence_length=length)
            return dict(prompt_embeds=embeds, negative_prompt_embeds=empty)
        if style == "encode_prompt_embeds":  # Flux.2 dev: the embeddings alone (no negative prompt, no CFG batch)
            embeds, _ids = pipe.encode_prompt(prompt=[prompt], device=device, max_sequence_length=length)
            return dict(prompt_embeds=embeds)
        if style == "encode_prompt_pair":  # Bria: the prompt's and, under CFG, the negative's (zeros for none)
            embeds, negatives, _ids = pipe.encode_prompt(
                prompt=[prompt], device=device, do_classifier_free_guidance=cfg,
                negative_prompt=[negative] if negative else None, max_sequence_length=length)
            return {k: v for k, v in dict(prompt_embeds=embeds, negative_prompt_embeds=negatives).items()
                    if v is not None}
        if style == "encode_prompt_four":  # HiDream: four encoders' embeddings, the negative's under CFG, as the call
            keys = ("prompt_embeds_t5", "negative_prompt_embeds_t5", "prompt_embeds_llama3",
                    "negative_prompt_embeds_llama3", "pooled_prompt_embeds", "negative_pooled_prompt_embeds")
            out = pipe.encode_prompt(prompt=[prompt], device=device, num_images_per_prompt=1,
                                     do_classifier_free_guidance=cfg, negative_prompt=[negative] if negative else None,
                                     max_sequence_length=length)
            return {k: v for k, v in zip(keys, out) if v is not None}
        if style == "encode_prompt_masked":  # Qwen-Image: embeddings and masks; the negative's under CFG, as the call
            negative = negative or (record.call.blank_negative if cfg else None)
            out = {}
            for text, prefix in ((prompt, ""), (negative if cfg else None, "negative_")):
                if text:
                    embeds, mask = pipe.encode_prompt(prompt=[text], device=device, num_images_per_prompt=1,
                                                      max_sequence_length=length)
                    out.update({f"{prefix}prompt_embeds": embeds, f"{prefix}prompt_embeds_mask": mask})
            return {k: v for k, v in out.items() if v is not None}  # a mask of all ones comes back as None
    raise InvalidRequest("text_encoders", "reloaded", f"{name}: encoding its prompts apart from the call is not "
                         "supported (SD, SDXL, SD3, Flux, SANA, Chroma and Lumina 2 are); use text_encoders = 'kept'")


# what encode_prompt gives, by name: SANA's and Lumina 2's four, Chroma's six (with the text position ids, which its
# call makes again from the embeddings)
_MASKED = ("prompt_embeds", "prompt_attention_mask", "negative_prompt_embeds", "negative_prompt_attention_mask")
_MASKED_IDS = ("prompt_embeds", None, "prompt_attention_mask", "negative_prompt_embeds", None,
               "negative_prompt_attention_mask")


def _encode_with_masks(pipe, prompt: str, negative: str | None, cfg: bool, device, length) -> dict:
    """encode_prompt of a pipeline whose prompts come with attention masks (SANA, Chroma, Lumina 2; style
    'encode_prompt_masks'), called as its __call__ calls it: the arguments we set, and for the rest that both take
    the __call__'s defaults (SANA's complex_human_instruction, which encode_prompt alone leaves out)."""
    params = inspect.signature(pipe.encode_prompt).parameters
    given = dict(prompt=[prompt], negative_prompt=[negative] if negative is not None else None,
                 do_classifier_free_guidance=cfg, device=device, num_images_per_prompt=1, max_sequence_length=length)
    for key in params:
        default = _call_default(pipe, key)
        if key not in given and default is not None and not key.endswith(("_embeds", "_mask")):
            given[key] = default
    out = pipe.encode_prompt(**{k: v for k, v in given.items() if k in params})
    names = _MASKED if len(out) == len(_MASKED) else _MASKED_IDS
    # negative_prompt=None: SANA's call defaults it to "", which it refuses beside negative_prompt_embeds
    return {**{k: v for k, v in zip(names, out) if k is not None and v is not None}, "negative_prompt": None}


def for_images(embeds: dict, n: int) -> dict:
    """`encode_texts`' tensors for one image, repeated for `n` along the batch axis (as encode_prompts and
    the pipelines' own num_images_per_prompt repeat them)."""
    return {k: None if v is None else v * n if isinstance(v, list) else _repeat(v, n, _BATCH_AXIS.get(k, 0))
            for k, v in embeds.items()}  # a list: Z-Image's, per prompt


# embeddings whose batch axis is not the first: HiDream's Llama hidden states are (layers, batch, tokens, width)
_BATCH_AXIS = {"prompt_embeds_llama3": 1, "negative_prompt_embeds_llama3": 1}


def _repeat(tensor, n: int, axis: int):
    times = [1] * tensor.ndim
    times[axis] = n
    return tensor.repeat(*times)


@dataclass
class Denoised:
    """What a denoise pass gives: latents (pipelines whose decode runs on its own: SD, SDXL), or the
    images a pipeline decoded (and safety-checked) itself (SD3, Flux, ...)."""

    latents: object = None
    images: list | None = None
    nsfw: list[bool] | None = None
    # the median time between the ends of consecutive steps: one step's work, without the prompt encoding
    # and set-up before the first (None with fewer than two steps). On CUDA the callbacks run ahead of the
    # GPU by at most the launch queue, so over several steps the median is the GPU's time per step
    seconds_per_step: float | None = None
    stopped: str | None = None  # INTERRUPT or SKIP: the pass stopped early, at step stopped_at = (done, total)
    stopped_at: tuple[int, int] | None = None

    @property
    def decoded(self) -> bool:
        return self.images is not None


def splits_decode(pipe) -> bool:
    """Whether this pipeline's decode can run on its own: its family's record says so of its txt2img pipeline
    (SD 1.x/2.x and SDXL)."""
    record, task = task_of(pipe)
    return record.splits_decode and task is Task.TXT2IMG


def size_multiple(pipe) -> int:
    """Width and height must be multiples of this: the VAE's scale factor times the denoiser's patch
    size (SD 1.x/2.x and SDXL: 8; SD3, whose transformer takes 2x2 latent patches: 16), or what the
    pipeline's image processor rounds to (Flux packs 2x2 latents and says so there: 16)."""
    vae = int(getattr(pipe, "vae_scale_factor", 8) or 8)
    patch = int(getattr(pipe, "patch_size", 1) or 1)
    processor = getattr(getattr(pipe, "image_processor", None), "config", None)
    return max(vae * patch, int(getattr(processor, "vae_scale_factor", vae) or vae))


def check_request(pipe, request) -> None:
    """What this pipeline cannot do with `request` (a GenerationRequest), as a clear error before any
    step runs: sides off its grid, or a hires fix it cannot run."""
    name = type(pipe).__name__
    edit.check(pipe, request)  # an edit on a model without one, or a model that only edits without one
    inpaint.check(pipe, request)  # and img2img/hires on a family without the pipeline
    multiple = size_multiple(pipe)
    for field, value in (("width", request.width), ("height", request.height)):
        if value % multiple:
            low = max(multiple, value // multiple * multiple)
            raise InvalidRequest(field, value,
                                 f"{name} needs multiples of {multiple}: use {low} or {low + multiple}")
    if not request.hires:
        return
    if not splits_decode(pipe) and request.latent_upscale is not None:
        raise InvalidRequest("hires upscaler", request.hires_upscaler,
                             f"{name} decodes inside its own call, so its latents cannot be upscaled: "
                             "use Lanczos or an ESRGAN model")
    w, h = request.hires_size()
    if (w % multiple or h % multiple) and request.hires_resize:
        given = "%dx%d" % request.hires_resize
        raise InvalidRequest("hires resize", given, f"{request.width}x{request.height} resized to {given} is {w}x{h}; "
                                                    f"{name} needs multiples of {multiple}")
    if w % multiple or h % multiple:
        raise InvalidRequest("hires scale", request.hires_scale,
                             f"{request.width}x{request.height} x{request.hires_scale:g} is {w}x{h}; {name} needs "
                             f"multiples of {multiple}: pick a scale that gives them (e.g. 2)")


def _flow_matching(scheduler) -> bool:
    name = type(scheduler).__name__  # the scheduler object's kind (any family's folder may hold one), not a family
    return name.startswith("FlowMatch") or scheduler.config.get("prediction_type") == "flow_prediction"


def set_sampler(pipe, sampler: str, schedule_type: str = AUTOMATIC) -> str | None:
    """Switch the scheduler by A1111 name and schedule type; 'default' is the family's default sampler (DPM++ 2M
    for SD 1.x/2.x and SDXL: samplers.default_sampling), else the model folder's own scheduler (with the schedule
    type where it changes it). Returns a warning where the schedule type could not be had
    (the sampler's own schedule runs), else None."""
    pipe.scheduler, warning = _scheduler(pipe, sampler, schedule_type, "sampler")
    return warning


def _scheduler(pipe, sampler: str, schedule_type: str, field: str) -> tuple:
    """(the scheduler for `sampler` and `schedule_type` built on the model folder's own, a warning or None)."""
    if not hasattr(pipe, "_lowvram_scheduler"):  # this object's state: its folder's scheduler not kept yet
        pipe._lowvram_scheduler = pipe.scheduler  # the folder's own, kept for 'default'
    base = pipe._lowvram_scheduler
    if sampler == "Euler" and type(base).__name__ == "FlowMatchEulerDiscreteScheduler":
        # A1111's Euler (its API's default sampler) on a flow-matching model is the flow's Euler step, the one the
        # folder's own FlowMatchEulerDiscreteScheduler takes (Forge runs A1111's Euler so on Flux)
        sampler = DEFAULT
    if sampler != DEFAULT and _flow_matching(base):
        # the A1111 samplers integrate a noise prediction; fed a flow-matching model's velocity they
        # run without error and make wrong images
        raise InvalidRequest(field, sampler,
                             f"{type(pipe).__name__} is a flow-matching model ({type(base).__name__}); "
                             "the A1111 samplers are for noise-prediction models: use 'default'")
    # 'default': A1111's default sampler for the families that have one (SD 1.x/2.x, SDXL), else the folder's own
    unet = getattr(pipe, "unet", None)  # its config says which Align Your Steps table (SD 1.5's or SDXL's)
    return build_scheduler(sampler, schedule_type, base, None if _flow_matching(base)
                           else families.of_pipe(pipe).default_sampler, align_table(getattr(unet, "config", None)))


def hires_scheduler(pipe, request) -> tuple:
    """(the scheduler of hires fix's second pass, a warning or None) where A1111's Hires sampler / Hires schedule
    type differ from the first pass's; (None, None) where the second pass runs the first pass's scheduler."""
    sampler, schedule_type = request.hires_sampling
    if not request.hires or (sampler, schedule_type) == (request.sampler, request.schedule_type):
        return None, None
    scheduler, warning = _scheduler(pipe, sampler, schedule_type, "hires sampler")
    return scheduler, warning and f"hires fix: {warning}"


@contextlib.contextmanager
def scheduler_swapped(pipe, scheduler):
    """`pipe.scheduler` is `scheduler` inside the block (None: unchanged), then the one it was, whatever happens
    inside (an out-of-memory retry, an error, a cancel). The img2img pipeline follows `pipe.scheduler` at each call."""
    if scheduler is None:
        yield
        return
    before = pipe.scheduler
    pipe.scheduler = scheduler
    try:
        yield
    finally:
        pipe.scheduler = before


def _call_default(pipe, name: str):
    """The default of `name` in the pipeline's __call__, or None where it takes no such argument: read only for a
    family no record knows (a record says its own, `t5_tokens`)."""
    param = inspect.signature(type(pipe).__call__).parameters.get(name)
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def prompt_token_count(pipe, prompt: str) -> tuple[int, int]:
    """(tokens in the prompt, tokens the text encoder takes) to warn before truncation. A pipeline with
    a T5 encoder (Flux, SD3 with its T5) takes up to its max_sequence_length T5 tokens past CLIP's 77:
    the prompt is counted with that tokenizer against that length."""
    if not prompt:
        return 0, 0
    record = families.of_pipe(pipe)
    limit = record.t5_tokens if not record.is_generic else _call_default(pipe, "max_sequence_length")
    for name in ("tokenizer_2", "tokenizer_3"):
        tokenizer = getattr(pipe, name, None)
        # the tokenizer object's kind (a T5 one counts T5 tokens), not the family's
        if limit and tokenizer is not None and type(tokenizer).__name__.startswith("T5"):
            return len(tokenizer(prompt, truncation=False).input_ids), int(limit)
    tokenizer = getattr(pipe, "tokenizer", None)
    if tokenizer is None:
        return 0, 0
    return len(tokenizer(prompt, truncation=False).input_ids), tokenizer.model_max_length


def ignores_negative_prompt(pipe) -> bool:
    """Whether the pipeline, called as we call it, drops a negative prompt (its family's record): Flux takes one
    only for its true CFG (true_cfg_scale > 1, default 1.0), which we do not turn on, as a plain diffusers call
    does not; Flux.2 and SANA take none."""
    return not families.of_pipe(pipe).call.negative_prompt


def _generators(seeds: list[int], device: str, rng: str = "gpu"):
    return rng_source.generators(seeds, device, rng)  # one per image, where the request's RNG source draws


def slerp(val: float, low, high):
    """A1111's slerp (modules/rng.py), as it is: one image's noise (C, H, W), the norms and angles taken along
    dim 1 (each channel's columns), and for near-parallel noises its linear blend, weights as A1111 has them."""
    import torch

    low_norm = low / torch.norm(low, dim=1, keepdim=True)
    high_norm = high / torch.norm(high, dim=1, keepdim=True)
    dot = (low_norm * high_norm).sum(1)
    if dot.mean() > 0.9995:
        return low * val + high * (1 - val)
    omega = torch.acos(dot)
    so = torch.sin(omega)
    return (torch.sin((1.0 - val) * omega) / so).unsqueeze(1) * low + (torch.sin(val * omega) / so).unsqueeze(1) * high


def paste_centred(target, noise):
    """A1111's seed resize: `noise` (C, h, w) centred on `target` (C, H, W), cropped where it is larger."""
    dx = (target.shape[2] - noise.shape[2]) // 2
    dy = (target.shape[1] - noise.shape[1]) // 2
    w = noise.shape[2] if dx >= 0 else noise.shape[2] + 2 * dx
    h = noise.shape[1] if dy >= 0 else noise.shape[1] + 2 * dy
    tx, ty = max(dx, 0), max(dy, 0)
    dx, dy = max(-dx, 0), max(-dy, 0)
    target = target.clone()
    target[:, ty:ty + h, tx:tx + w] = noise[:, dy:dy + h, dx:dx + w]
    return target


def varies_noise(step: Pass) -> bool:
    """Whether this pass's noise is A1111's variation/resized noise rather than the seed's own."""
    request = step.request
    return bool(step.subseeds) and request.subseed_strength > 0 or request.seed_resize_from is not None


def _vary(plain, step: Pass, draw):
    """A1111's first noise (modules/rng.py ImageRNG.first) from the seeds' own noise `plain` (B, C, H, W), as the
    images' generators drew it: per image, the seed's noise (at the resize-from size when one is set, drawn again by
    a fresh generator), slerped toward the subseed's (at that same size) by the strength, then centred on `plain`.
    `draw(seeds, (width, height) or None)` draws noise as `plain` was drawn, for other seeds or another size."""
    import torch

    request = step.request
    resize = request.seed_resize_from
    main = draw(step.seeds, resize) if resize else plain
    subs = draw(step.subseeds, resize) if step.subseeds and request.subseed_strength > 0 else None
    out = []
    for i in range(plain.shape[0]):
        noise = main[i].float()
        if subs is not None:
            noise = slerp(request.subseed_strength, noise, subs[i].float())
        if resize:
            noise = paste_centred(plain[i].float(), noise)
        out.append(noise.to(plain.dtype))
    return torch.stack(out)


@contextlib.contextmanager
def _patched(obj, name: str, replacement):
    """`obj.name` is `replacement` inside the block, then what it was (the class's, or the instance's own)."""
    own = vars(obj).get(name)
    setattr(obj, name, replacement)
    try:
        yield
    finally:
        if own is None:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


@contextlib.contextmanager
def _variation_noise(pipe, step: Pass, device: str):
    """A1111's variation seeds in the noise the pipeline draws itself. txt2img: in `prepare_latents`, so diffusers'
    shape, dtype and init sigma stay (slerp and the paste commute with that common scale); img2img (and hires fix's
    second pass, as A1111's): in the scheduler's `add_noise`, where the noise meets the init latents."""
    if not varies_noise(step):
        yield
        return
    if step.init is None:
        original = pipe.prepare_latents
        signature = inspect.signature(original)  # to bind the call's own arguments by name, not to guess a family

        def prepare(*args, **kwargs):
            call = signature.bind(*args, **kwargs).arguments
            if call.get("latents") is not None:
                return original(*args, **kwargs)

            def draw(seeds, size=None):
                width, height = size or (call["width"], call["height"])
                return original(**dict(call, generator=_generators(seeds, device, step.request.rng), width=width,
                                       height=height, latents=None))

            return _vary(original(**dict(call, latents=None)), step, draw)  # the images' generators first

        with _patched(pipe, "prepare_latents", prepare):
            yield
        return

    scheduler = pipe.scheduler
    add_noise = scheduler.add_noise

    def noised(original_samples, noise, timesteps):
        factor = step.width // noise.shape[-1]  # pixels per latent

        def draw(seeds, size=None):
            height, width = (size[1] // factor, size[0] // factor) if size else noise.shape[-2:]
            return rng_source.randn_tensor((noise.shape[0], noise.shape[1], height, width),  # or the NV source's
                                           generator=_generators(seeds, device, step.request.rng),
                                           device=noise.device, dtype=noise.dtype)

        return add_noise(original_samples, _vary(noise, step, draw), timesteps)

    with _patched(scheduler, "add_noise", noised):
        yield


def img2img_pipe(pipe):
    """The image-to-image pipeline over the same components, kept on `pipe`."""
    from diffusers import AutoPipelineForImage2Image

    return kept_pipe(pipe, AutoPipelineForImage2Image, "_lowvram_img2img",
                     families.of_pipe(pipe).pipeline_for(Task.IMG2IMG))


def encode(pipe, images, device: str):
    """PIL images -> latents in model space, the mode of the VAE posterior (deterministic)."""
    import torch

    processed = pipe.image_processor.preprocess(images).to(device=device, dtype=pipe.vae.dtype)
    with torch.inference_mode():
        latents = pipe.vae.encode(processed).latent_dist.mode()
    shift = getattr(pipe.vae.config, "shift_factor", None) or 0.0
    return (latents - shift) * pipe.vae.config.scaling_factor


def stops_early(pipe) -> bool:
    """Whether the pipeline can end its denoising loop early and still return its result: diffusers' `interrupt`
    property, which its loop checks at each step (SD, SDXL, SD3, Flux and most pipelines have it)."""
    # the pipeline class's API (diffusers added `interrupt` class by class), not a family decision
    return isinstance(getattr(type(pipe), "interrupt", None), property)


class _Stopped(Exception):
    """A stop asked of a pipeline without `interrupt`: its call ends here, and its pass with no image."""


@contextlib.contextmanager
def _estimates(scheduler, into: dict):
    """Keep the sampler's latest estimate of the final latents (its step's `pred_original_sample`: Euler, Euler a,
    DDIM, LMS, ...) in `into["latents"]`: what a preview shows and an interrupted pass keeps, as A1111 shows and keeps
    its denoised prediction. Samplers whose step gives none (DPM++ 2M, PLMS, flow matching) leave it unset."""
    step = scheduler.step

    @functools.wraps(step)  # the pipelines read its signature to decide whether to pass `generator` and `eta`
    def estimating(*args, **kwargs):
        out = step(*args, **kwargs)
        pred = out[1] if isinstance(out, tuple) and len(out) > 1 else getattr(out, "pred_original_sample", None)
        into["latents"] = pred if hasattr(pred, "shape") else None  # a tensor, or a step output without one
        return out

    with _patched(scheduler, "step", estimating):
        yield


def denoise(pipe, step: Pass, device: str, on_step: ProgressFn | None = None,
            cancel: threading.Event | None = None, after_last_step: Callable[[], None] | None = None, *,
            skip: threading.Event | None = None, preview=None) -> Denoised:
    """Run the denoising steps of one pass. Progress counts the steps the user asked for (PLMS's
    extra warm-up step is not shown as a step more than asked). `after_last_step` runs once the
    denoiser is done, before a pipeline that decodes in its own call (Flux, SD3) decodes.

    `cancel` (A1111's Interrupt) or `skip` set: the pass stops at the end of the current step through diffusers'
    `interrupt` (the loop's remaining steps do nothing), and gives what it has as any pass does (the sampler's
    estimate of the final latents where it makes one, else the current latents; a pipeline that decodes itself
    decodes them), with `stopped` saying why; the caller decides what comes next. A pipeline without `interrupt`
    ends with no image. `preview` (lowvram_gen.preview.Previews): every `preview.every` steps, the first image's
    latents, copied to the CPU in float32, are posted to it (the time it takes is kept out of the measured step
    time)."""
    import torch

    n = len(step.seeds)
    request = step.request
    if step.init is not None and step.strength == 0:
        if not isinstance(step.init, list):
            return Denoised(latents=step.init)  # latents: nothing to change
        if step.latent_resize and splits_decode(pipe):
            return Denoised(latents=latent_resize.interpolated(
                encode(pipe, step.init, device), *latent_resize.latent_size(pipe, step.width, step.height)))
        if step.latent_resize:
            return Denoised(images=[im.resize((step.width, step.height)) for im in step.init], nsfw=[False] * n)
        if not splits_decode(pipe):  # a pipeline that decodes itself returns images: the init ones, kept
            return Denoised(images=[im.copy() for im in step.init], nsfw=[False] * n)
        return Denoised(latents=encode(pipe, step.init, device))

    ends: list[float] = []
    previewing = [0.0]  # seconds spent on previews, kept out of the step times
    estimate: dict = {}  # the sampler's latest estimate of the final latents (_estimates)
    stop: dict = {}  # why and where the pass stopped early

    def step_end(_pipe, i, _t, kwargs):
        ends.append(time.perf_counter() - previewing[0])
        total = getattr(_pipe, "num_timesteps", None) or step.num_steps  # img2img runs fewer
        warmup = max(0, total - step.num_steps)  # PLMS (PNDM) runs one warm-up step more than asked
        done, total = i + 1 - warmup, total - warmup
        if hasattr(_pipe.scheduler, "progress"):  # DPM adaptive (ksamplers): its error control decides its calls
            done, total = _solver_progress(_pipe, step.num_steps)
        if on_step and done >= 1:  # progress counts the steps the user asked for
            on_step(done, total)
        latents = kwargs.get("latents")
        best = estimate.get("latents")
        best = best if best is not None and latents is not None and best.shape == latents.shape else latents
        if preview is not None and done >= 1 and done % preview.every == 0 and best is not None:
            started = time.perf_counter()
            first = best[:1].detach().to("cpu", torch.float32)  # the GPU's memory is never used for a preview
            preview.post(first, step.width, step.height, done, total)
            previewing[0] += time.perf_counter() - started
        if done >= total:
            if after_last_step is not None:
                after_last_step()
            return kwargs
        why = INTERRUPT if cancel is not None and cancel.is_set() else SKIP if skip is not None and skip.is_set() \
            else None
        if why is None:
            return kwargs
        stop.update(kind=why, at=(max(done, 0), total))
        if not stops_early(_pipe):
            raise _Stopped(why)
        _pipe._interrupt = True  # the loop's remaining steps do nothing; the call returns as at its end
        if after_last_step is not None:
            after_last_step()
        return {**kwargs, "latents": best} if "latents" in kwargs else kwargs

    texts = step.texts or Texts.of(request)
    switching = prompt_steps.for_pass(pipe, step, texts, cfg=step.guidance > 1)  # prompt editing, AND: per call
    text = switching.call_kwargs(step.guidance > 1) if switching else for_images(step.embeds, n) \
        if step.embeds is not None else text_kwargs(pipe, texts, n, cfg=step.guidance > 1)
    if hasattr(pipe.scheduler, "noise_sampler_seed"):  # the scheduler object's kind (DPM++ SDE), not a family
        # DPM++ SDE's Brownian-tree noise: one tree per image, seeded by the image's seed (as A1111 does), so
        # the same seed gives the same image, whatever the batch; unseeded, diffusers seeds it at random
        pipe.scheduler.noise_sampler_seed = list(step.seeds)
    kwargs = dict(
        **text,
        num_inference_steps=step.num_steps,
        **guidance_kwargs(pipe, step.guidance),
        generator=(generators := _generators(step.seeds, device, request.rng)),
        output_type="latent" if splits_decode(pipe) else "pil",
        callback_on_step_end=step_end,
    )
    control = controlnet.for_pass(pipe, step)  # (its ControlNet pipeline, the control arguments) or None
    if control is not None:
        kwargs = controlnet.fit_call(control[0], {**kwargs, **control[1]})
    watched = preview is not None or cancel is not None or skip is not None
    try:
        if step.init is None:
            txt2img = control[0] if control is not None else edit.edit_pipe(pipe) if step.references else pipe
            with rng_source.drawing(request.rng, txt2img, txt2img.scheduler), \
                    rng_source.seed_delta(txt2img.scheduler, generators, step.seeds, request.ensd), \
                    _variation_noise(txt2img, step, device), \
                    controlnet.seeded(control[0] if control is not None else None, step.seeds, device), \
                    unipc_time.options(txt2img.scheduler, request), prompt_steps.switched(txt2img, switching), \
                    _estimates(txt2img.scheduler, estimate) if watched else contextlib.nullcontext():
                out = txt2img(width=step.width, height=step.height, **kwargs,
                              **edit.call_kwargs(pipe, step.references, step.width, step.height))
        else:
            content = contextlib.nullcontext()
            if step.mask is not None:  # inpainting: diffusers' inpaint pipeline (its ControlNet one), the mask too
                i2i = control[0] if control is not None else inpaint.inpaint_pipe(pipe)
                task = Task.CONTROLNET_INPAINT if control is not None else Task.INPAINT
                kwargs["mask_image"] = [step.mask] * n
                content = inpaint.mask_hooks(i2i, request, step.mask, step.seeds, device)
            else:
                i2i = control[0] if control is not None else img2img_pipe(pipe)
                task = Task.CONTROLNET_IMG2IMG if control is not None else Task.IMG2IMG
            record = families.of_pipe(pipe)
            if record.takes_size(task):
                # SD3, Flux, ...: without a size they resize the init image to the model's native size
                kwargs.update(width=step.width, height=step.height)
            kwargs.update(record.task_arguments.get(task.value, {}))
            kwargs["num_inference_steps"], strength = _img2img_schedule(i2i, step)
            own_size = latent_resize.encoded_at_own_size(i2i, step.init, step.width, step.height) \
                if step.latent_resize else contextlib.nullcontext()
            with rng_source.drawing(request.rng, i2i, i2i.scheduler), _variation_noise(i2i, step, device), content, \
                    own_size, posterior.mode_only(i2i), rng_source.seed_delta(i2i.scheduler, generators, step.seeds, request.ensd), \
                    unipc_time.options(i2i.scheduler, request, img2img=True), prompt_steps.switched(i2i, switching), \
                    _estimates(i2i.scheduler, estimate) if watched else contextlib.nullcontext():
                out = i2i(image=step.init, strength=strength, **kwargs)
    except _Stopped:
        return Denoised(images=[], nsfw=[], stopped=stop["kind"], stopped_at=stop["at"])
    per_step = statistics.median(b - a for a, b in zip(ends, ends[1:])) if len(ends) > 1 else None
    stopped = dict(stopped=stop.get("kind"), stopped_at=stop.get("at"))
    if kwargs["output_type"] == "latent":
        return Denoised(latents=out.images, seconds_per_step=per_step, **stopped)
    flags = getattr(out, "nsfw_content_detected", None) or [False] * n  # black images from its own checker
    return Denoised(images=list(out.images), nsfw=[bool(f) for f in flags], seconds_per_step=per_step, **stopped)


def _solver_progress(pipe, steps: int) -> tuple[int, int]:
    """(steps done, steps) of a sampler whose model calls are not known ahead (DPM adaptive: how far it has come);
    once it is done the pipeline's loop ends through `interrupt` (its remaining timesteps are room it did not need)."""
    scheduler = pipe.scheduler
    if scheduler.finished:
        pipe._interrupt = True
        return steps, steps
    return min(int(scheduler.progress * steps), steps - 1), steps


def _img2img_schedule(i2i, step: Pass) -> tuple[int, float]:
    """The schedule's length and the strength to hand `i2i` for A1111's step count (img2img_steps.py): a hires
    second pass's steps are explicit (`step.steps`), an img2img or inpaint pass's are the request's. A pipeline
    without a strength (repainting from noise) runs the pass's steps."""
    counts = img2img_steps.pipeline_counts(i2i)
    if counts is None:
        return step.num_steps, step.strength
    longest = getattr(i2i.scheduler.config, "num_train_timesteps", None) or img2img_steps.LONGEST
    plan = img2img_steps.pass_steps(step.request.steps, step.strength, step.steps,
                                    step.request.img2img_fix_steps, longest)
    plan = schedules.pass_of(i2i.scheduler, plan, step.request)  # A1111's DDIM, PLMS, UniPC: their own rule
    return plan.schedule, plan.strength(counts)


def decode(pipe, latents, upcast: bool = False, safety_check: bool = True):
    """Latents -> PIL images, exactly as the SD/SDXL pipelines do it. `upcast`: decode in float32.
    `safety_check=False` skips the model's safety checker (a hires first pass: only the final image is
    checked, as in A1111, or a blacked-out first pass would come back as an unlabelled dark image)."""
    import torch

    vae = pipe.vae
    needs_upcast = upcast or (vae.dtype == torch.float16 and getattr(vae.config, "force_upcast", False)
                              and families.of_pipe(pipe).vae_force_upcast)
    original_dtype = vae.dtype
    if needs_upcast:
        vae.to(dtype=torch.float32)
    try:
        latents = latents.to(dtype=vae.dtype if needs_upcast else latents.dtype)
        if latents.dtype != vae.dtype:
            latents = latents.to(vae.dtype)
        mean = getattr(vae.config, "latents_mean", None)
        std = getattr(vae.config, "latents_std", None)
        if mean is not None and std is not None:
            mean = torch.tensor(mean).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            std = torch.tensor(std).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            latents = latents * std / vae.config.scaling_factor + mean
        else:
            latents = latents / vae.config.scaling_factor
        with torch.inference_mode():
            image = vae.decode(latents, return_dict=False)[0]
    finally:
        if needs_upcast:
            vae.to(dtype=original_dtype)
    if getattr(pipe, "watermark", None) is not None:
        image = pipe.watermark.apply_watermark(image)
    bad = bad_output(image)
    nsfw = [False] * image.shape[0]
    if safety_check and getattr(pipe, "safety_checker", None) is not None and bad is None:
        # the model folder ships diffusers' safety checker: run it as the pipeline would, and label its black images.
        # Inside inference mode: `image` is an inference tensor and the checker blacks images out in place.
        with torch.inference_mode():
            image, flags = pipe.run_safety_checker(image, image.device, image.dtype)
        nsfw = [bool(f) for f in (flags or nsfw)]
    images = pipe.image_processor.postprocess(image, output_type="pil", do_denormalize=[not f for f in nsfw])
    pipe.maybe_free_model_hooks()
    return Decoded(images, bad, nsfw)


@dataclass
class Decoded:
    images: list  # PIL images
    bad: str | None  # 'nan' | 'black' | None
    nsfw: list[bool]  # per image: blacked out by the model's safety checker


def bad_output(image) -> str | None:
    """'nan' if the decode produced NaN/Inf, 'black' if every image is black, else None."""
    import torch

    if not torch.isfinite(image).all():
        return "nan"
    if bool((image <= -0.999).all()):  # images are in [-1, 1]; -1 everywhere is pure black
        return "black"
    return None
