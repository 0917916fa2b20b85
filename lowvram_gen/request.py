"""The request every front end builds, and its validation.

Validation happens here, once, before any model work: the CLI, the web UI, the batch script and
the Python API all call `GenerationRequest.validated()` (or `from_mapping`, which also coerces text
from forms and prompt files). No torch import here, so `--help` and validation stay fast.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from lowvram_gen.a1111 import unipc_options
from lowvram_gen.a1111.fields import BY_NAME, request_name
from lowvram_gen.a1111.upscaler_names import check_upscaler, latent_mode  # names only: no upscaler loading
from lowvram_gen.control.resize import check_init_resize
from lowvram_gen.control.units import ControlNetUnit, check_control_mode, check_units
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.filename_pattern import check_pattern
from lowvram_gen.hires import HiresGeometry, geometry
from lowvram_gen.networks.tags import extract_lora_tags, merge_refs, parse_lora_flag
from lowvram_gen.prompting.parse import PromptSyntaxError, parse_attention
from lowvram_gen.prompting.styles import check_names as check_style_names
from lowvram_gen.rng import DEFAULT as DEFAULT_RNG, check_rng
from lowvram_gen.samplers import check_installed, split_sampler  # light: tables of names, no torch
from lowvram_gen.schedules import AUTOMATIC, check_schedule_type, label

SAME_SAMPLER = "Use same sampler"  # A1111's Hires sampler choice for the first pass's own (the request's "")
SAME_SCHEDULER = "Use same scheduler"  # and its Hires schedule type's

# Caps. They bound what a typo can cost, not what a big card can do; presets cap further.
MAX_SIDE = 4096  # px: SDXL-class models are trained at 1024; 4096 is already 16x that area
MIN_SIDE = 64  # px: one 8x8 latent; anything smaller is not an image a VAE can decode
MAX_STEPS = 150  # A1111's slider maximum
MAX_CFG = 30.0  # A1111's slider maximum
MAX_BATCH = 16  # images per batch; presets split them into forward passes of max_batch
MAX_BATCH_COUNT = 100  # A1111's "Batch count" slider maximum
MAX_SEED = 2**32 - 1  # seeds are 32-bit in A1111 and in most samplers' RNG seeding
MAX_PROMPT_CHARS = 20_000  # a 10 kB prompt is accepted (and truncated by the tokenizer, with a warning)
MAX_HIRES_SCALE = 4.0  # A1111's slider maximum
MAX_CLIP_SKIP = 12  # A1111's slider maximum: SD 1.x's CLIP-L has 12 layers
MAX_REFERENCE_IMAGES = 10  # edit: FLUX.2 [dev]'s most; each family's record says its own (engines/sd/edit.py)
MAX_FRAMES = 1025  # video: 64 s at 16 fps; LTX-2's longest clips are 257 frames, Wan's 81-121
MAX_FPS = 240.0

# C0/C1 control characters except tab and newline: NUL and friends become a space, everywhere.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_prompt(field_name: str, text: Any) -> str:
    """Normalise a prompt the same way for every front end: str, control characters to spaces."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise InvalidRequest(field_name, text, "a prompt must be text")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidRequest(
            field_name, f"<{len(text)} characters>", f"at most {MAX_PROMPT_CHARS} characters are allowed"
        )
    return _CONTROL.sub(" ", text).strip()


def as_int(field_name: str, value: Any, lo: int, hi: int, extra: str = "") -> int:
    """An integer in [lo, hi] from an int or its decimal text; anything else is a clear error."""
    allowed = f"a whole number from {lo} to {hi}{extra}"
    if isinstance(value, bool):
        raise InvalidRequest(field_name, value, allowed)
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise InvalidRequest(field_name, value, allowed)
        value = int(text)
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise InvalidRequest(field_name, value, allowed)
        value = int(value)
    elif not isinstance(value, int):
        raise InvalidRequest(field_name, value, allowed)
    if not lo <= value <= hi:
        raise InvalidRequest(field_name, value, allowed)
    return value


def as_float(field_name: str, value: Any, lo: float, hi: float) -> float:
    allowed = f"a number from {lo:g} to {hi:g}"
    if isinstance(value, bool):
        raise InvalidRequest(field_name, value, allowed)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise InvalidRequest(field_name, value, allowed) from None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidRequest(field_name, value, allowed)
    return float(value)


def parse_size(field_name: str, value: Any) -> tuple[Any, Any]:
    """"WxH" (or "W x H", "0" / "" for off) -> (W, H), unchecked: `validated()` checks the sides."""
    if value in (None, "", 0, "0"):
        return 0, 0
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", str(value))
    if not match:
        raise InvalidRequest(field_name, value, "must be WIDTHxHEIGHT, e.g. 512x512 (0x0: off)")
    return int(match.group(1)), int(match.group(2))


def as_side(field_name: str, value: Any, multiple: int = 8) -> int:
    side = as_int(field_name, value, MIN_SIDE, MAX_SIDE, f" and a multiple of {multiple}")
    if side % multiple:
        lower, upper = side - side % multiple, side - side % multiple + multiple
        raise InvalidRequest(
            field_name, value, f"must be a multiple of {multiple} (try {lower} or {upper}), from {MIN_SIDE} to {MAX_SIDE}"
        )
    return side


@dataclass(frozen=True)
class GenerationRequest:
    """One txt2img job. Defaults follow A1111's txt2img tab."""

    prompt: str = ""
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    # None: not given, the model family's default (families/record.py `sampling`: A1111's 20 / 7 for SD 1.x/2.x and
    # SDXL; Z-Image Turbo 9 / 0, Qwen-Image 50 / 4 ...), filled in once by the Session (`with_sampling`) where the
    # model is known, before the plan: everything after it (infotext, JSON, progress, hires, the API's info) sees numbers
    steps: int | None = None
    cfg_scale: float | None = None
    seed: int = -1  # -1: random; the seed actually used is recorded in the result and the image
    batch_size: int = 1  # images in one batch (made together, as far as the preset's max_batch allows)
    # A1111's "Batch count" (n_iter): batches made one after another; the job makes batch_count x batch_size images,
    # image i with seed+i (and subseed+i), as A1111's all_seeds. Not written in the PNG (A1111 does not write it)
    batch_count: int = 1
    # "default": A1111's default, DPM++ 2M (Automatic schedule: Karras), for SD 1.x/2.x and SDXL; the model folder's
    # own scheduler for the flow-matching families (samplers.py `default_sampling`, the family record says which)
    sampler: str = "default"
    # A1111 1.9+'s schedule type (schedules.py); an old combined sampler name ("DPM++ 2M Karras") sets it too
    schedule_type: str = AUTOMATIC
    model: str = "tiny"  # embedded tiny model, hub id, local folder or single checkpoint file
    config: str | None = None  # base-architecture configs for a single-file checkpoint
    outdir: str | None = None  # default: outputs/<date>/
    preset: str | None = None  # preset name or path; None lets the planner choose
    # img2img: start from this image (path) instead of noise; strength 0 keeps it, 1 ignores it
    init_image: str | None = None
    strength: float = 0.75  # A1111's default denoising strength
    # A1111's setting "With img2img, do exactly the amount of steps the slider specifies": img2img and inpaint run
    # `steps` (from a longer schedule) instead of int(steps x strength) + 1 (img2img_steps.py); not in the PNG
    img2img_fix_steps: bool = False
    # img2img: how an init image of another aspect meets width x height (control/resize.py): resize | crop | fill
    resize_mode: str = "resize"
    # hires fix (A1111): generate at width x height, upscale by hires_scale (or to hires_resize_w x hires_resize_h),
    # then a second img2img pass. It is on when hires_scale is above 1 or a resize is given
    hires_scale: float = 1.0  # 1: off
    hires_upscaler: str = "Latent"  # A1111's default: upscale the latents themselves (bilinear)
    hires_steps: int = 0  # 0: as many as `steps`
    hires_denoise: float = 0.7  # A1111's default for the second pass
    # A1111's "Resize width to" / "Resize height to" (hr_resize_x/y): 0x0 uses hires_scale; one side alone keeps the
    # first pass's aspect; both: the first pass upscaled to cover them and cropped (hires.py)
    hires_resize_w: int = 0
    hires_resize_h: int = 0
    hires_sampler: str = ""  # A1111 1.6+'s Hires sampler; "": the first pass's ("Use same sampler")
    hires_schedule_type: str = ""  # A1111 1.9+'s Hires schedule type; "": the first pass's ("Use same scheduler")
    hires_cfg: float = 0.0  # Forge's "Hires CFG Scale" (hr_cfg); 0: the first pass's cfg_scale
    hires_prompt: str = ""  # A1111's Hires prompt; "": the prompt
    hires_negative: str = ""  # A1111's Hires negative prompt; "": the negative prompt
    loras: tuple[str, ...] = ()  # --lora NAME[:WEIGHT], added to the prompt's <lora:...> tags
    # A1111's styles (styles.csv, prompting/styles.py) by name, in order: the Session applies them to the prompts
    # once, before the plan (and empties this, the names kept in `extra`)
    styles: tuple[str, ...] = ()
    quantize: str | None = None  # --quantize: int8/int4 weights (or none) in every preset; None: as the preset says
    # A1111's "Clip skip": the text encoder's layer counted from the end (1: the last, off; 2: the one before);
    # SD 1.x/2.x and SDXL only (prompting/encode.py's layer_for)
    clip_skip: int = 1
    # A1111's "SD VAE": a VAE of models/VAE by name (its file name), or a path, to decode (and encode) with instead of
    # the model's own; "Automatic" and "None" are the model's own (models/vae.py says why both)
    vae: str = "Automatic"
    # A1111's "Random number generator source" (rng.py): gpu draws the noise on the compute device, cpu on the CPU
    # (then moved), nv as an NVIDIA card's torch.randn does, computed on any device
    rng: str = DEFAULT_RNG
    # A1111's "Eta noise seed delta" (ENSD): after each image's first noise its generator is re-seeded with seed +
    # ensd, so the samplers' step noise (ancestral, DDIM with eta) changes and the first noise does not; 0: off
    ensd: int = 0
    # A1111's UniPC settings (a1111/unipc_options.py): its variant, time steps, order and lower order on the last steps
    unipc_variant: str = "bh1"
    unipc_skip_type: str = "time_uniform"
    unipc_order: int = 3
    unipc_lower_order_final: bool = True
    # A1111's Tiling: circular padding in the UNet's and the VAE's convolutions, so the image tiles seamlessly
    # (engines/sd/tiling.py); SD 1.x/2.x and SDXL
    tiling: bool = False
    # A1111's refiner (1.6+, engines/sd/refiner.py): a second model (a hub id, folder, single file or a checkpoint's
    # name) that takes over the same sampler run where A1111's completed ratio reaches refiner_switch_at; None: none.
    # A switch at 1 is no refiner, as in A1111
    refiner: str | None = None
    refiner_switch_at: float = 0.8
    # A1111's "Images filename pattern" (filename_pattern.py): the saved names' part after the counter, with [tags];
    # "": today's names (counter-seed-prompt). Not in the PNG (A1111 does not write it)
    filename_pattern: str = ""
    # A1111's variation seed ("Extra" seed options): the initial noise is slerp(subseed_strength, the seed's noise,
    # the subseed's noise); 0: off, the seed's image exactly. -1: a random subseed. In a batch the seed stays and
    # the subseed goes up by one per image, as in A1111
    subseed: int = -1
    subseed_strength: float = 0.0
    # A1111's "Resize seed from": the seed's noise drawn for this size (0x0: off) and centred in the image's
    seed_resize_from_w: int = 0
    seed_resize_from_h: int = 0
    # ControlNet (A1111's sd-webui-controlnet): units of model + control image + weight + guidance start/end +
    # preprocessor (control/units.py), and one control mode for all: balanced | controlnet (guess mode)
    controlnets: tuple[ControlNetUnit, ...] = ()
    control_mode: str = "balanced"
    # inpainting (A1111's img2img > Inpaint; needs init_image): white in the mask is repainted (invert_mask: black is);
    # the mask blurred by mask_blur px; inpaint_area "whole" (the picture) or "masked" (A1111's "Only masked": the
    # mask's box grown by mask_padding px, generated at width x height and pasted back); masked_content what the
    # masked area starts from: original | fill | latent-noise | latent-nothing (lowvram_gen/inpaint)
    mask: str | None = None
    mask_blur: int = 4
    inpaint_area: str = "whole"
    mask_padding: int = 32
    masked_content: str = "original"
    invert_mask: bool = False
    # A1111's img2img `mask_round` (its API's, on by default; its Soft inpainting turns it off): the latent mask is
    # rounded to 0/1 and an alpha layer cut at 128; off, both stay grey (inpaint/masks.py)
    mask_round: bool = True
    # edit (an editing model: Qwen-Image-Edit, FLUX.1 Kontext, Flux.2): the reference images its pipeline edits or
    # takes from, paths; how many the model takes is its family's (engines/sd/edit.py checks it once loaded)
    reference_images: tuple[str, ...] = ()
    # video (issue 33, `lowvram-gen video`): `frames` None is an image job; 0 the model's own frame count (its family
    # record's `Video`, resolved by the Session before the plan). The frame rule (Wan 4k+1, LTX 8k+1) and the size
    # multiple are the model's, checked once its record is known (engines/video/checks.py)
    frames: int | None = None
    fps: float | None = None  # the clip's frames per second; None: the model's
    cfg_scale_2: float | None = None  # Wan 2.2 A14B's low-noise expert's CFG scale (`--cfg-2`); None: the model's
    save_frames: bool = False  # the frames as PNGs beside the clip, too
    # a lower resolution with the frames upscaled after is one of the ladder's steps only when the user allows it
    allow_upscale: bool = False
    extra: dict = field(default_factory=dict)  # front-end specific, kept in the JSON metadata

    def validated(self) -> "GenerationRequest":
        """Return a normalised copy, or raise `InvalidRequest` naming the first bad field."""
        seed = as_int("seed", self.seed, -1, MAX_SEED, " (-1 means random)")
        sampler, schedule_type = check_sampler_and_schedule(self.sampler, self.schedule_type)
        return dataclasses.replace(
            self,
            prompt=check_prompt_syntax("prompt", clean_prompt("prompt", self.prompt)),
            negative_prompt=check_prompt_syntax("negative prompt", clean_prompt("negative prompt", self.negative_prompt)),
            width=as_side("width", self.width),
            height=as_side("height", self.height),
            steps=None if _unset(self.steps) else as_int("steps", self.steps, 1, MAX_STEPS),
            cfg_scale=None if _unset(self.cfg_scale) else as_float("cfg scale", self.cfg_scale, 0.0, MAX_CFG),
            seed=seed,
            batch_size=as_int("batch size", self.batch_size, 1, MAX_BATCH),
            batch_count=as_int("batch count", self.batch_count, 1, MAX_BATCH_COUNT),
            sampler=sampler,
            schedule_type=schedule_type,
            model=_non_empty("model", self.model),
            init_image=check_image_path("init image", self.init_image) if self.init_image else None,
            strength=as_float("strength", self.strength, 0.0, 1.0),
            img2img_fix_steps=as_bool("img2img fix steps", self.img2img_fix_steps),
            hires_scale=as_float("hires scale", self.hires_scale, 1.0, MAX_HIRES_SCALE),
            hires_upscaler=check_upscaler_name("hires upscaler", self.hires_upscaler, latent_ok=True),
            hires_steps=as_int("hires steps", self.hires_steps, 0, MAX_STEPS, " (0: as many as steps)"),
            hires_denoise=as_float("hires denoise", self.hires_denoise, 0.0, 1.0),
            hires_cfg=as_float("hires cfg", 0.0 if self.hires_cfg is None else self.hires_cfg, 0.0, MAX_CFG),
            hires_prompt=check_prompt_syntax("hires prompt", clean_prompt("hires prompt", self.hires_prompt)),
            hires_negative=check_prompt_syntax("hires negative prompt",
                                               clean_prompt("hires negative prompt", self.hires_negative)),
            loras=check_loras(self.loras, self.prompt),
            styles=check_style_names(self.styles),
            quantize=check_quantize(self.quantize),
            clip_skip=as_int("clip skip", self.clip_skip, 1, MAX_CLIP_SKIP, " (1: off, A1111's meaning)"),
            vae=check_vae(self.vae),
            rng=check_rng(self.rng),
            ensd=as_int("ENSD", self.ensd, 0, MAX_SEED, " (A1111's eta noise seed delta; 0: off)"),
            unipc_variant=unipc_options.check_variant(self.unipc_variant),
            unipc_skip_type=unipc_options.check_skip_type(self.unipc_skip_type),
            unipc_order=unipc_options.check_order(self.unipc_order),
            unipc_lower_order_final=as_bool("UniPC lower order final", self.unipc_lower_order_final),
            tiling=as_bool("tiling", self.tiling),
            refiner=check_refiner(self.refiner),
            refiner_switch_at=check_switch_at(self.refiner_switch_at),
            filename_pattern=check_pattern(self.filename_pattern),
            subseed=as_int("variation seed", self.subseed, -1, MAX_SEED, " (-1 means random)"),
            subseed_strength=as_float("variation seed strength", self.subseed_strength, 0.0, 1.0),
            controlnets=check_units(self.controlnets, check_image_path),
            control_mode=check_control_mode(self.control_mode),
            resize_mode=check_init_resize(self.resize_mode, bool(self.mask)),
        )._check_hires_sampler()._check_hires_resize()._check_hires()._check_hires_loras()._check_seed_resize() \
            ._check_inpaint()._check_edit()._check_video()

    @property
    def is_video(self) -> bool:
        """A video job (`frames` given, 0 meaning the model's own count)."""
        return self.frames is not None

    def _check_video(self) -> "GenerationRequest":
        """A video job's own fields, and nothing of an image job's that a clip does not take (one sentence each)."""
        fps = None if self.fps is None else as_float("fps", self.fps, 0.0, MAX_FPS)
        if fps is not None and fps <= 0:
            raise InvalidRequest("fps", self.fps, f"frames per second must be above 0 (at most {MAX_FPS:g})")
        checked = dataclasses.replace(
            self, fps=fps, cfg_scale_2=None if _unset(self.cfg_scale_2) else as_float("cfg scale 2", self.cfg_scale_2,
                                                                                       0.0, MAX_CFG),
            save_frames=as_bool("save frames", self.save_frames), allow_upscale=as_bool("allow upscale",
                                                                                         self.allow_upscale))
        if self.frames is None:
            beside = [(n, v) for n, v in (("fps", self.fps), ("cfg scale 2", self.cfg_scale_2)) if v is not None]
            if beside:
                raise InvalidRequest(beside[0][0], beside[0][1], "it is a video option: give frames (a video job, "
                                     "`lowvram-gen video`)")
            return checked
        frames = as_int("frames", self.frames, 0, MAX_FRAMES, " (0: the model's own count)")
        refused = [(name, value) for name, value in (
            ("hires fix", "on" if self.hires else None), ("mask", self.mask),
            ("controlnet", "on" if self.controlnets else None),
            ("reference images", ", ".join(self.reference_images) or None),
            ("batch size", self.batch_size if self.batch_size != 1 else None),
            ("refiner", self.refiner), ("tiling", "on" if self.tiling else None)) if value]
        if refused:
            name, value = refused[0]
            raise InvalidRequest(name, value, f"a video job takes no {name} (one clip per batch count; the init image "
                                              "is its first frame)")
        return dataclasses.replace(checked, frames=frames)

    def _check_inpaint(self) -> "GenerationRequest":
        """The mask and its options (inpaint/): a readable image beside an init image, with something to repaint."""
        from lowvram_gen.inpaint.masks import AREAS, CONTENTS, MAX_BLUR, MAX_PADDING

        # A1111's words, and its API's numbers (a1111/fields.py: the inpaint area 0/1, masked content 0-3)
        area = _choice("inpaint area", self.inpaint_area, AREAS, BY_NAME["inpaint_area"].choices())
        content = _choice("masked content", self.masked_content, CONTENTS, BY_NAME["masked_content"].choices())
        checked = dataclasses.replace(
            self, mask_blur=as_int("mask blur", self.mask_blur, 0, MAX_BLUR),
            inpaint_area=area, mask_padding=as_int("mask padding", self.mask_padding, 0, MAX_PADDING),
            masked_content=content, invert_mask=as_bool("invert mask", self.invert_mask),
            mask_round=as_bool("mask round", self.mask_round))
        if not self.mask:
            return dataclasses.replace(checked, mask=None)
        if not self.init_image:
            raise InvalidRequest("mask", self.mask, "a mask goes with an init image (--init IMAGE): the image to "
                                                    "repaint")
        if self.hires:
            raise InvalidRequest("hires fix", "on", "hires fix with inpainting is not built yet (A1111's img2img has "
                                 "none either): inpaint, then upscale or hires the result")
        path = check_image_path("mask", self.mask)
        check_mask_pixels(path, checked.invert_mask, checked.mask_round)
        return dataclasses.replace(checked, mask=path)


    def _check_edit(self) -> "GenerationRequest":
        """The reference images of an edit: readable images (a list, or one path), as many as any family takes, of
        at least MIN_SIDE px a side, and no init image, mask, hires fix, ControlNet or resize mode beside them (the
        edit pipeline sizes its references itself)."""
        refs = check_references(self.reference_images)
        if refs:
            beside = [(name, value) for name, value in (("init image", self.init_image), ("mask", self.mask),
                                                        ("hires fix", "on" if self.hires else None),
                                                        ("controlnet", "on" if self.controlnets else None),
                                                        ("resize mode", self.resize_mode
                                                         if self.resize_mode not in (None, "", "resize") else None))
                      if value]
            if beside:
                name, value = beside[0]
                raise InvalidRequest(name, value, f"an edit (reference images) takes no {name}: the reference "
                                                  "images are what it edits")
        return dataclasses.replace(self, reference_images=refs)

    @property
    def task(self) -> str:
        """What the job is: edit, inpaint, img2img or txt2img (families.Task's values)."""
        return ("edit" if self.reference_images else "inpaint" if self.mask else "img2img" if self.init_image
                else "txt2img")

    def _check_seed_resize(self) -> "GenerationRequest":
        w, h = self.seed_resize_from_w, self.seed_resize_from_h
        if w in (0, "0", None) and h in (0, "0", None):
            return dataclasses.replace(self, seed_resize_from_w=0, seed_resize_from_h=0)
        if w in (0, "0", None) or h in (0, "0", None):
            raise InvalidRequest("seed resize from", f"{w}x{h}", "give both sides (WxH), or neither (0x0: off)")
        sides = []
        for name, side in (("seed resize from width", w), ("seed resize from height", h)):
            side = as_int(name, side, 8, MAX_SIDE, f" and a multiple of 8 (0x0: off)")
            if side % 8:
                raise InvalidRequest(name, side, f"must be a multiple of 8 (try {side - side % 8 or 8} or "
                                                 f"{side - side % 8 + 8}), from 8 to {MAX_SIDE}")
            sides.append(side)
        return dataclasses.replace(self, seed_resize_from_w=sides[0], seed_resize_from_h=sides[1])

    def with_sampling(self, steps: int, cfg_scale: float) -> "GenerationRequest":
        """This request with its steps and CFG scale, where it gave none, set to these (its family's defaults)."""
        return dataclasses.replace(self, steps=steps if self.steps is None else self.steps,
                                   cfg_scale=float(cfg_scale) if self.cfg_scale is None else self.cfg_scale)

    @property
    def sampling_given(self) -> bool:
        """Whether both the steps and the CFG scale are numbers (given, or filled in by `with_sampling`)."""
        return self.steps is not None and self.cfg_scale is not None

    @property
    def seed_resize_from(self) -> tuple[int, int] | None:
        """(width, height) the seed's noise is drawn at, or None (off)."""
        return (self.seed_resize_from_w, self.seed_resize_from_h) if self.seed_resize_from_w > 0 else None

    def _check_hires_sampler(self) -> "GenerationRequest":
        """The hires sampler and schedule type as the first pass's are checked ("" or A1111's "Use same ..." for the
        first pass's own); a combined name ("DPM++ 2M Karras") sets the hires schedule type too."""
        sampler, schedule = self.hires_sampler, self.hires_schedule_type
        same_sampler = sampler is None or (isinstance(sampler, str)
                                           and sampler.strip().lower() in ("", SAME_SAMPLER.lower()))
        same_schedule = schedule is None or (isinstance(schedule, str)
                                             and schedule.strip().lower() in ("", SAME_SCHEDULER.lower()))
        if same_sampler:
            sampler = ""
            schedule = "" if same_schedule else check_schedule_type(schedule, "hires schedule type")
        else:
            name, named = split_sampler(sampler, "hires sampler")
            given = "" if same_schedule else check_schedule_type(schedule, "hires schedule type")
            if named is not None and given not in ("", AUTOMATIC, named):
                raise InvalidRequest("hires schedule type", schedule,
                                     f"the hires sampler {sampler!r} says {label(named)!r}: give one of them (the "
                                     f"sampler {name!r} and the schedule type apart)")
            check_installed(name)
            sampler, schedule = name, named or given
        return dataclasses.replace(self, hires_sampler=sampler, hires_schedule_type=schedule)

    def _check_hires_resize(self) -> "GenerationRequest":
        sides = []
        for name, side in (("hires resize width", self.hires_resize_w), ("hires resize height", self.hires_resize_h)):
            if side in (0, "0", None, ""):
                sides.append(0)
                continue
            side = as_int(name, side, MIN_SIDE, MAX_SIDE, " and a multiple of 8 (0: from the other side or the scale)")
            if side % 8:
                raise InvalidRequest(name, side, f"must be a multiple of 8 (try {side - side % 8 or 8} or "
                                                 f"{side - side % 8 + 8}), from {MIN_SIDE} to {MAX_SIDE} (0: from the "
                                                 "other side or the scale)")
            sides.append(side)
        return dataclasses.replace(self, hires_resize_w=sides[0], hires_resize_h=sides[1])

    def _check_hires(self) -> "GenerationRequest":
        if self.hires:
            w, h = self.hires_size()
            if self.hires_resize:
                given = "%dx%d" % self.hires_resize
                if max(w, h) > MAX_SIDE or min(w, h) < MIN_SIDE:
                    raise InvalidRequest("hires resize", given, f"{self.width}x{self.height} resized to {given} is "
                                                                f"{w}x{h}; from {MIN_SIDE} to {MAX_SIDE} px a side")
            elif max(w, h) > MAX_SIDE:
                raise InvalidRequest("hires scale", self.hires_scale,
                                     f"{self.width}x{self.height} x{self.hires_scale:g} is {w}x{h}; at most {MAX_SIDE} px a side")
        return self

    def _check_hires_loras(self) -> "GenerationRequest":
        """A hires prompt names the same LoRAs as the prompt, or the job is refused: A1111 switches to the hires
        prompt's LoRAs for the second pass, and a job here keeps one set of LoRAs on its model."""
        if not self.hires or not self.hires_prompt:
            return self
        flags = [parse_lora_flag(f) for f in self.loras]
        first, _ = merge_refs(flags + extract_lora_tags(self.prompt)[1])
        second, _ = merge_refs(flags + extract_lora_tags(self.hires_prompt)[1])
        if {(r.name, r.weight) for r in first} != {(r.name, r.weight) for r in second}:
            def said(refs):
                return ", ".join(f"{r.name}:{r.weight:g}" for r in refs) or "none"

            raise InvalidRequest("hires prompt", self.hires_prompt,
                                 f"its LoRAs ({said(second)}) differ from the prompt's ({said(first)}); A1111 switches "
                                 "LoRAs for the second pass, lowvram-gen keeps one set per job: give the hires prompt "
                                 "the same <lora:...> tags (or leave it empty: the prompt's)")
        return self

    @property
    def hires(self) -> bool:
        return self.hires_scale > 1 or bool(self.hires_resize)

    @property
    def hires_resize(self) -> tuple[int, int] | None:
        """(width, height) of A1111's Hires resize (a side 0: from the other), or None: hires_scale."""
        w, h = self.hires_resize_w or 0, self.hires_resize_h or 0
        return (w, h) if w or h else None

    @property
    def hires_cfg_scale(self) -> float:
        """The second pass's CFG scale: hires_cfg, or the first pass's where it is 0."""
        return self.hires_cfg if self.hires_cfg else self.cfg_scale

    @property
    def hires_sampling(self) -> tuple[str, str]:
        """(sampler, schedule type) of the second pass: the hires ones, the first pass's where they are ""."""
        return self.hires_sampler or self.sampler, self.hires_schedule_type or self.schedule_type

    @property
    def hires_texts(self) -> tuple[str, str]:
        """(prompt, negative prompt) of the second pass: the hires ones, the first pass's where they are "" (A1111's)."""
        return self.hires_prompt or self.prompt, self.hires_negative or self.negative_prompt

    @property
    def latent_upscale(self) -> tuple[str, bool] | None:
        """(interpolate mode, antialias) of a latent hires upscaler, or None for one that works on pixels."""
        try:
            return latent_mode(self.hires_upscaler)
        except KeyError:
            return None

    def hires_geometry(self, multiple: int = 8, base: tuple[int, int] | None = None) -> HiresGeometry:
        """What hires fix upscales the first pass to and keeps of it (hires.py), at the requested size; with `base`
        (a first pass the ladder made smaller) the same, shrunk with it."""
        full = geometry((self.width, self.height), self.hires_scale, self.hires_resize or (0, 0), multiple)
        if base is None or base == (self.width, self.height):
            return full
        if not self.hires_resize:  # the scale applies to the smaller first pass as it is
            return geometry(base, self.hires_scale, (0, 0), multiple)
        least = -(-MIN_SIDE // multiple) * multiple
        w = max(least, int(full.size[0] * base[0] / self.width) // multiple * multiple)
        h = max(least, int(full.size[1] * base[1] / self.height) // multiple * multiple)
        return full.scaled(w, h, multiple)

    def hires_size(self, multiple: int = 8, base: tuple[int, int] | None = None) -> tuple[int, int]:
        """The size with hires fix (its second pass's): `base` (the first pass; default the requested size) times the
        scale, or the resize (hires_geometry), down to multiples of `multiple` (the pipeline's grid)."""
        return self.hires_geometry(multiple, base).size

    def output_size(self) -> tuple[int, int]:
        return self.hires_size() if self.hires else (self.width, self.height)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "GenerationRequest":
        """Build from a dict (JSON line, CSV row, form fields); unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        if "seed_resize_from" in data:  # "WxH", as --seed-resize-from and A1111's infotext write it
            data = dict(data)
            data["seed_resize_from_w"], data["seed_resize_from_h"] = parse_size("seed resize from",
                                                                                data.pop("seed_resize_from"))
        if "hires_resize" in data:  # "WxH" (a side 0: from the other), as --hires-resize and A1111's infotext
            data = dict(data)
            data["hires_resize_w"], data["hires_resize_h"] = parse_size("hires resize", data.pop("hires_resize"))
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = request_name(key)  # A1111's names too (a1111/fields.py: hr_scale, inpainting_fill...)
            if name not in names:
                raise InvalidRequest("field", key, "allowed fields: " + ", ".join(sorted(names - {"extra"})))
            kwargs[name] = value
        return cls(**kwargs).validated()

    @property
    def image_count(self) -> int:
        """Images the job makes: batch_count batches of batch_size."""
        return self.batch_size * self.batch_count

    def resolved_seeds(self) -> list[int]:
        """Seeds for each image of every batch: a random base when seed is -1, then base+i (wrapping at 2^32); with
        a variation seed (strength above 0) every image keeps the base seed and the subseed goes up instead, as in
        A1111 (its all_seeds over batch count x batch size)."""
        base = self.seed if self.seed >= 0 else random.SystemRandom().randrange(0, MAX_SEED + 1)
        step = 0 if self.subseed_strength > 0 else 1
        return [(base + i * step) % (MAX_SEED + 1) for i in range(self.image_count)]

    def with_subseed(self) -> "GenerationRequest":
        """This request with its variation seed fixed (a random one for -1), when it has one (strength above 0)."""
        if self.subseed_strength > 0 and self.subseed < 0:
            return dataclasses.replace(self, subseed=random.SystemRandom().randrange(0, MAX_SEED + 1))
        return self

    def subseed_for(self, index: int) -> int:
        """Image `index`'s variation seed: subseed+index (wrapping at 2^32), as A1111's all_subseeds."""
        return (self.subseed + index) % (MAX_SEED + 1)


def check_sampler_and_schedule(sampler: Any, schedule_type: Any) -> tuple[str, str]:
    """(sampler, schedule type) as A1111 1.9+ splits them: "DPM++ 2M Karras" is DPM++ 2M with Karras; a
    combined name and a different schedule type given beside it is a clear error naming both."""
    name, named = split_sampler(sampler)
    schedule = check_schedule_type(schedule_type)
    if named is not None and schedule not in (AUTOMATIC, named):
        raise InvalidRequest("schedule type", schedule_type,
                             f"the sampler {sampler!r} says {label(named)!r}: give one of them (the sampler "
                             f"{name!r} and the schedule type apart)")
    check_installed(name)
    return name, named or schedule


def check_prompt_syntax(field_name: str, text: str) -> str:
    """A prompt A1111 itself refuses (a malformed weight such as `(x:1.2.3)`) is a clear error here,
    before any model work; everything else is parsed when the prompt is encoded."""
    try:
        parse_attention(text)
    except PromptSyntaxError as exc:
        raise InvalidRequest(field_name, text, str(exc)) from None
    return text


def check_loras(value: Any, prompt: str = "") -> tuple[str, ...]:
    """`--lora` values as a tuple of 'NAME[:W]' (a comma-separated string from a form or a CSV works
    too); malformed weights here and in the prompt's <lora:...> tags are refused before any model work."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    if not all(isinstance(v, str) for v in items):
        raise InvalidRequest("loras", value, "give LoRAs as NAME or NAME:WEIGHT text")
    items = [v.strip() for v in items if v.strip()]
    for item in items:
        parse_lora_flag(item)
    if isinstance(prompt, str):
        extract_lora_tags(prompt)
    return tuple(items)


def check_refiner(value: Any) -> str | None:
    """The refiner's model as text, or None: A1111's API sends "None" or "" for none (any case)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if not isinstance(value, str):
        raise InvalidRequest("refiner", value, "give a model: a hub id, a folder, a .safetensors file or a "
                                               "checkpoint's name (or None)")
    return value.strip()


def check_switch_at(value: Any) -> float:
    """A1111's "Switch at": the fraction of the sampling done before the refiner takes over, above 0 and at most 1
    (1: the refiner never runs)."""
    allowed = "a fraction above 0 and at most 1 (A1111's Switch at, e.g. 0.8; 1: no refiner)"
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0.8
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise InvalidRequest("refiner switch at", value, allowed) from None
    if isinstance(value, bool) or not math.isfinite(number) or not 0 < number <= 1:
        raise InvalidRequest("refiner switch at", value, allowed)
    return number


def check_vae(value: Any) -> str:
    """A VAE's name or path as text; "Automatic" or "None" (any case; empty: Automatic) are the model's own. The file
    is looked up when the job is planned (models/vae.py), as a LoRA's is."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "Automatic"
    if not isinstance(value, str):
        raise InvalidRequest("vae", value, "give a VAE's name (GET /sdapi/v1/sd-vae lists them), Automatic or None")
    text = value.strip()
    return next((own for own in ("Automatic", "None") if text.lower() == own.lower()), text)


def check_quantize(value: Any) -> str | None:
    """None (the preset decides) or one of settings.QUANTIZE; '' from a form or a CSV cell means None."""
    from lowvram_gen.settings import QUANTIZE

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or value.strip().lower() not in QUANTIZE:
        raise InvalidRequest("quantize", value, f"use one of {', '.join(QUANTIZE)} (or leave it out: the preset decides)")
    return value.strip().lower()


def check_image_path(field_name: str, value: Any) -> str:
    """An existing, readable image file; a clear error otherwise (the pixels are read when the job runs)."""
    from pathlib import Path

    from PIL import Image, UnidentifiedImageError

    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise InvalidRequest(field_name, value, "give the path of a PNG, JPEG or WebP image")
    path = Path(value).expanduser()
    if not path.is_file():
        raise InvalidRequest(field_name, str(value), "no such file")
    try:
        with Image.open(path) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(field_name, str(value), unreadable_image(exc)) from None
    return str(path)


def check_references(value: Any) -> tuple[str, ...]:
    """An edit's reference images: a list of paths (one path, or comma-free text from a form, works too), each a
    readable image of at least MIN_SIDE px a side; at most MAX_REFERENCE_IMAGES. () when none is given."""
    from PIL import Image

    items = [value] if isinstance(value, str) else list(value or ())
    items = [v for v in items if not (isinstance(v, str) and not v.strip())]
    if len(items) > MAX_REFERENCE_IMAGES:
        raise InvalidRequest("reference images", len(items),
                             f"at most {MAX_REFERENCE_IMAGES} (FLUX.2 [dev]'s most; each model takes its own number)")
    paths = []
    for item in items:
        path = check_image_path("reference image", item)
        try:
            with Image.open(path) as image:
                size = image.size
        except (OSError, Image.DecompressionBombError) as exc:
            raise InvalidRequest("reference image", path, unreadable_image(exc)) from None
        if min(size) < MIN_SIDE:
            raise InvalidRequest("reference image", path, f"is {size[0]}x{size[1]}: a reference image needs at least "
                                                          f"{MIN_SIDE} px a side")
        paths.append(path)
    return tuple(paths)


def check_mask_pixels(path: str, invert: bool, rounded: bool = True) -> None:
    """A mask with nothing to repaint (all black, or all white inverted) is refused: the job would change nothing."""
    from PIL import Image

    from lowvram_gen.inpaint.masks import read

    try:
        mask = read(path, invert, rounded)
    except (OSError, Image.DecompressionBombError) as exc:
        raise InvalidRequest("mask", path, unreadable_image(exc)) from None
    if mask.getbbox() is None:
        raise InvalidRequest("mask", path, "nothing to repaint: the mask is all black" + (
            " once inverted (--invert-mask repaints its black part)" if invert else
            " (white is repainted; --invert-mask repaints the black part)"))


def as_bool(field_name: str, value: Any) -> bool:
    """True/False from a bool, 0/1 or their text (true/false, yes/no, on/off) as forms and CSV cells give them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise InvalidRequest(field_name, value, "use true or false")


def _choice(field_name: str, value: Any, allowed: tuple[str, ...], aliases: dict[str, str]) -> str:
    """One of `allowed`, any case, or an alias (A1111's words for it); a clear error otherwise."""
    text = value.strip().lower() if isinstance(value, str) else value
    if isinstance(text, (str, int)):  # bool is an int: True/False as 1/0
        text = aliases.get(text, text)
    if text not in allowed:
        raise InvalidRequest(field_name, value, "one of " + ", ".join(allowed))
    return text


def unreadable_image(exc: BaseException) -> str:
    """Why Pillow could not open an image, in words: a decompression bomb (Pillow refuses more than twice its
    MAX_IMAGE_PIXELS before decoding anything), or not an image it can read."""
    from PIL import Image

    if isinstance(exc, Image.DecompressionBombError):
        return f"refused as a possible decompression bomb: {exc}"
    return f"not a readable image ({exc.__class__.__name__})"


def check_upscaler_name(field_name: str, value: Any, latent_ok: bool = False) -> str:
    return check_upscaler(value, field_name, latent_ok=latent_ok)


def _unset(value: Any) -> bool:
    """None, or the empty text of a form field or a CSV cell: not given (the family's default)."""
    return value is None or (isinstance(value, str) and not value.strip())


def _non_empty(field_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field_name, value, "give an embedded name (tiny, tiny-sdxl), a hub id, a folder or a file")
    return value.strip()
