"""A1111's field names, written once: one spec per field, read by every front end that speaks A1111.

Each `Field` ties our name (the `GenerationRequest` field it sets, or A1111's own key where it sets none) to its
label in the PNG `parameters` text (a1111/infotext.py writes and reads it), its key in A1111's txt2img/img2img JSON
body (a1111/api_body.py) with A1111's API default, and the other names a batch line and `from_mapping` take for it
(batch/files.py, request.py). Each has ONE policy, the same in the API and in a batch line:

- used: it sets the request (or, for A1111's own API keys such as `enable_hr` or `send_images`, what the API does);
- warned: accepted and ignored; silent at a value that changes nothing (`neutral`, A1111's defaults, so an A1111
  script sending them keeps working), at any other a warning naming the field and saying why it is not used here;
- refused: a clear error naming the value and what to do instead, unless the value is `neutral` (left out).

Standard library only, and nothing of the project but errors and rng.py's words: the request imports this.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.rng import WORDS as RNG_WORDS
from lowvram_gen.rng import check_rng

USED, WARNED, REFUSED = "used", "warned", "refused"
ANY = "any value"  # `neutral` of a field that changes nothing whatever it says
TXT2IMG, IMG2IMG, BOTH, BATCH = "txt2img", "img2img", "both", "batch"  # which A1111 body has it (BATCH: none)


def read_int(label: str, value: Any) -> int:
    """A PNG field's whole number; an error naming the field otherwise (`'Steps' in the image's parameters`)."""
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise InvalidRequest(f"{label!r} in the image's parameters", value, "expected a whole number")
    return int(text)


def read_float(label: str, value: Any) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise InvalidRequest(f"{label!r} in the image's parameters", value, "expected a number") from None


def read_text(label: str, value: Any) -> str:
    return str(value)


def read_bool(label: str, value: Any) -> bool:
    """`True` / `False` (as A1111 writes a setting's bool, any case); an error naming the field."""
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidRequest(f"{label!r} in the image's parameters", value, "expected True or False")
    return text == "true"


def read_refiner(label: str, value: Any) -> str:
    """`Refiner: name [hash]` as A1111 writes a checkpoint's short title: the name (the hash is not a model)."""
    return re.sub(r"\s*\[[0-9a-fA-F]{8,64}\]\s*$", "", str(value).strip())


def read_rng(label: str, value: Any) -> str:
    """`RNG: CPU` / `RNG: NV` (A1111's words, any case) as the request's cpu / nv; an error naming the field."""
    try:
        return check_rng(str(value))
    except InvalidRequest as exc:
        raise InvalidRequest(f"{label!r} in the image's parameters", value, exc.allowed) from None


@dataclass(frozen=True)
class Field:
    """One A1111 field: its names in each place, how its value converts, and its one policy."""

    name: str  # the request field it sets; for A1111's own fields (request=False), its API key / option name
    api: str | None = None  # its key in A1111's JSON body ("override_settings.KEY" for a setting)
    label: str | None = None  # its label in the PNG parameters text
    request: bool = True  # `name` is a GenerationRequest field
    aliases: tuple[str, ...] = ()  # the other names a batch line (and GenerationRequest.from_mapping) takes
    policy: str = USED
    neutral: Any = ()  # warned/refused: the values that change nothing (ANY: every value)
    why: str = ""  # warned: why it is not used here; refused: what to do instead
    default: Any = None  # A1111's API default, where the body leaves it out (or sends null)
    body: str = BOTH  # the A1111 body that has it: txt2img, img2img, both; BATCH: a batch line's option only
    when: str = ""  # the API sets it only with "hires" (enable_hr) or "inpaint" (a mask)
    empty: Any = None  # the request value A1111's empty API value (null, "", 0) means, where it means another
    said: tuple[str, ...] = ()  # the request's names of it in its errors (default: `name` with spaces)
    old_labels: tuple[str, ...] = ()  # labels older A1111 versions (or Forge) wrote, read too
    read: Callable[[str, Any], Any] | None = None  # PNG text -> request value (None: a1111/infotext.py's own rule)
    words: Mapping[Any, str] = field(default_factory=dict)  # request value -> A1111's word for it (PNG, UI)
    api_values: Mapping[Any, str] = field(default_factory=dict)  # A1111's API numbers -> request value
    shown: str | None = None  # how an error shows a value too long to quote ("<image>")

    def neutral_value(self, value: Any) -> bool:
        """Whether `value` changes nothing (as JSON gives it, or as a batch line's text)."""
        if self.neutral == ANY:
            return True
        if isinstance(value, (list, tuple, dict)):
            return not value
        if isinstance(value, str):
            return any(_same_text(value.strip().lower(), n) for n in self.neutral)
        return any(value == n for n in self.neutral)

    def warning(self, value: Any) -> str:
        return f"{self.name} {value!r} {'are' if isinstance(value, (list, tuple)) else 'is'} not used: {self.why}"

    def refusal(self, value: Any) -> InvalidRequest:
        return InvalidRequest(self.name, self.shown or value, self.why)

    def choices(self) -> dict:
        """{A1111's word (lower case) or API value: request value}: what the request takes besides its own values."""
        out: dict = {word.lower(): value for value, word in self.words.items() if isinstance(value, str)}
        for theirs, ours in self.api_values.items():
            out[theirs] = ours
            out[str(theirs).lower()] = ours
        return out

    def from_word(self, text: str) -> Any:
        """The request value of A1111's word (any case); the text itself where it is none (the request names it)."""
        key = text.strip().lower()
        return next((value for value, word in self.words.items() if word.lower() == key), text.strip())


def _same_text(text: str, neutral: Any) -> bool:
    if neutral is None:
        return text in ("", "none", "null")
    if isinstance(neutral, bool):
        return text in (("true", "1", "yes", "on") if neutral else ("false", "0", "no", "off"))
    if isinstance(neutral, (int, float)):
        try:
            return float(text) == neutral
        except ValueError:
            return False
    return text == str(neutral).lower()


_K_DIFFUSION = "k-diffusion's sampler parameters are not part of diffusers' schedulers"
_INAREA = {"whole": "Whole picture", "masked": "Only masked"}
_CONTENTS = ("fill", "original", "latent-noise", "latent-nothing")  # A1111's inpainting_fill 0-3, in order


def _numbered(values: tuple) -> dict:
    return dict(enumerate(values))


# In A1111's order where the PNG text has one (a1111/infotext.py writes them in its own order, as A1111 does)
FIELDS: tuple[Field, ...] = (
    Field("prompt", api="prompt", default=""),
    Field("negative_prompt", api="negative_prompt", aliases=("negative",), default="", empty=""),
    # A1111's saved styles (prompting/styles.py), by name: applied to the prompts before the job; no PNG label (the
    # PNG holds the prompts with the styles' text, as A1111 writes them)
    Field("styles", api="styles", aliases=("style",), default=[], said=("styles", "style")),
    Field("steps", api="steps", label="Steps", default=50, read=read_int),
    Field("sampler", api="sampler_name", label="Sampler", aliases=("sampler_name", "sampler_index"), empty="Euler"),
    Field("sampler_index", request=False, api="sampler_index", default="Euler",
          why="A1111's older name of sampler_name, read where sampler_name is not given"),
    Field("schedule_type", api="scheduler", label="Schedule type", aliases=("scheduler",)),
    Field("cfg_scale", api="cfg_scale", label="CFG scale", aliases=("cfg",), default=7.0, read=read_float),
    Field("seed", api="seed", label="Seed", default=-1, read=read_int),
    Field("width", api="width", label="Size", default=512),  # Size: WxH, both sides
    Field("height", api="height", label="Size", default=512),
    Field("subseed", api="subseed", label="Variation seed", default=-1, said=("variation seed",), read=read_int),
    Field("subseed_strength", api="subseed_strength", label="Variation seed strength", default=0,
          said=("variation seed strength",), read=read_float),
    Field("seed_resize_from_w", api="seed_resize_from_w", label="Seed resize from", default=-1,
          said=("seed resize from width", "seed resize from")),  # WxH, both sides; 0 or -1: off
    Field("seed_resize_from_h", api="seed_resize_from_h", label="Seed resize from", default=-1,
          said=("seed resize from height",)),
    Field("batch_size", api="batch_size", label="Batch size", aliases=("batch", "n"), default=1, read=read_int),
    Field("batch_count", api="n_iter", default=1),  # a batch line's n_iter repeats the line: BATCH_ONLY
    Field("model", api="override_settings.sd_model_checkpoint", label="Model"),
    Field("quantize", label="Quantize"),  # ours: the int8/int4 weights that made the image
    Field("clip_skip", api="override_settings.CLIP_stop_at_last_layers", label="Clip skip", read=read_int),
    # A1111's "SD VAE" (models/vae.py): written with `VAE hash` (the file's sha256, 10 hex digits) where a VAE file ran
    Field("vae", api="override_settings.sd_vae", label="VAE", said=("vae", "VAE"), read=read_text),
    # A1111's "Random number generator source" setting; its PNG says `RNG: CPU`/`RNG: NV`, nothing for the default GPU
    Field("rng", api="override_settings.randn_source", label="RNG", aliases=("randn_source",), words=RNG_WORDS,
          read=read_rng),
    # A1111's "Eta noise seed delta" setting; its PNG says `ENSD: 31337` where it is not 0
    Field("ensd", api="override_settings.eta_noise_seed_delta", label="ENSD", aliases=("eta_noise_seed_delta",),
          read=read_int),
    # A1111's UniPC settings (a1111/unipc_options.py), labelled with their infotext names where not their defaults
    Field("unipc_variant", api="override_settings.uni_pc_variant", label="UniPC variant",
          aliases=("uni_pc_variant",), said=("UniPC variant",), read=read_text),
    Field("unipc_skip_type", api="override_settings.uni_pc_skip_type", label="UniPC skip type",
          aliases=("uni_pc_skip_type",), said=("UniPC skip type",), read=read_text),
    Field("unipc_order", api="override_settings.uni_pc_order", label="UniPC order", aliases=("uni_pc_order",),
          said=("UniPC order",), read=read_int),
    Field("unipc_lower_order_final", api="override_settings.uni_pc_lower_order_final",
          label="UniPC lower order final", aliases=("uni_pc_lower_order_final",), said=("UniPC lower order final",),
          read=read_bool),
    # A1111's Tiling (engines/sd/tiling.py): its PNG says `Tiling: True` when on, nothing when off
    Field("tiling", api="tiling", label="Tiling", default=False, read=read_bool),
    # A1111's refiner (engines/sd/refiner.py): its PNG says `Refiner: name [hash]` and `Refiner switch at: 0.8`
    Field("refiner", api="refiner_checkpoint", label="Refiner", aliases=("refiner_checkpoint",), read=read_refiner),
    Field("refiner_switch_at", api="refiner_switch_at", label="Refiner switch at", default=0.8,
          said=("refiner switch at",), read=read_float),
    # A1111's "Images filename pattern" setting (filename_pattern.py); no label: A1111 writes nothing of it in the PNG
    Field("filename_pattern", api="override_settings.samples_filename_pattern",
          aliases=("samples_filename_pattern",), said=("filename pattern",)),
    Field("init_image", api="init_images", body=IMG2IMG),
    Field("strength", api="denoising_strength", label="Denoising strength", default=0.75, body=IMG2IMG),
    # A1111's setting "With img2img, do exactly the amount of steps the slider specifies" (img2img_steps.py); no
    # label: A1111 writes nothing of it in the PNG
    Field("img2img_fix_steps", api="override_settings.img2img_fix_steps", said=("img2img fix steps",)),
    # inpainting (A1111's img2img > Inpaint): the API sets them with a mask only, as A1111 uses them
    Field("mask", api="mask", body=IMG2IMG, when="inpaint"),
    Field("mask_blur", api="mask_blur", label="Mask blur", body=IMG2IMG, when="inpaint", read=read_int),
    Field("invert_mask", api="inpainting_mask_invert", label="Mask mode", aliases=("inpainting_mask_invert",),
          default=0, body=IMG2IMG, when="inpaint", words={False: "Inpaint masked", True: "Inpaint not masked"}),
    Field("inpaint_area", api="inpaint_full_res", label="Inpaint area", aliases=("inpaint_full_res",), default=True,
          body=IMG2IMG, when="inpaint", words=_INAREA,
          api_values={0: "whole", 1: "masked", "false": "whole", "true": "masked"}),
    Field("mask_padding", api="inpaint_full_res_padding", label="Masked area padding",
          aliases=("inpaint_full_res_padding",), default=0, body=IMG2IMG, when="inpaint",
          old_labels=("Only masked padding, pixels",), read=read_int),
    Field("masked_content", api="inpainting_fill", label="Masked content", aliases=("inpainting_fill",), default=0,
          body=IMG2IMG, when="inpaint", words={c: c.replace("-", " ") for c in _CONTENTS},
          api_values=_numbered(_CONTENTS)),
    Field("mask_blur_x", request=False, api="mask_blur_x", default=4, body=IMG2IMG),  # mask_blur's, where it is null
    Field("mask_blur_y", request=False, api="mask_blur_y", default=4, body=IMG2IMG),
    # A1111's img2img mask_round (no UI control, no PNG label: its Soft inpainting turns it off); inpaint/masks.py
    Field("mask_round", api="mask_round", default=True, body=IMG2IMG, when="inpaint"),
    # hires fix: the API sets them with enable_hr only (A1111 ignores them without it)
    Field("enable_hr", request=False, api="enable_hr", default=False, body=TXT2IMG),
    Field("hires_denoise", api="denoising_strength", label="Denoising strength", default=0.75, body=TXT2IMG,
          when="hires"),
    Field("hires_sampler", api="hr_sampler_name", label="Hires sampler", aliases=("hr_sampler_name",),
          body=TXT2IMG, when="hires", empty=""),
    Field("hires_prompt", api="hr_prompt", label="Hires prompt", aliases=("hr_prompt",), default="", body=TXT2IMG,
          when="hires", empty="", read=read_text),
    Field("hires_negative", api="hr_negative_prompt", label="Hires negative prompt", aliases=("hr_negative_prompt",),
          default="", body=TXT2IMG, when="hires", empty="", said=("hires negative prompt",), read=read_text),
    Field("hires_cfg", api="hr_cfg", label="Hires CFG Scale", aliases=("hr_cfg",), body=TXT2IMG, when="hires",
          empty=0.0, old_labels=("Hires CFG scale",), read=read_float),  # Forge's
    Field("hires_schedule_type", api="hr_scheduler", label="Hires schedule type", aliases=("hr_scheduler",),
          body=TXT2IMG, when="hires", empty=""),
    Field("hires_resize_w", api="hr_resize_x", label="Hires resize", aliases=("hr_resize_x",), default=0,
          body=TXT2IMG, when="hires", said=("hires resize width", "hires resize")),  # WxH, both sides
    Field("hires_resize_h", api="hr_resize_y", label="Hires resize", aliases=("hr_resize_y",), default=0,
          body=TXT2IMG, when="hires", said=("hires resize height",)),
    Field("hires_scale", api="hr_scale", label="Hires upscale", aliases=("hr_scale",), default=2.0, body=TXT2IMG,
          when="hires", read=read_float),
    Field("hires_steps", api="hr_second_pass_steps", label="Hires steps", aliases=("hr_second_pass_steps",),
          default=0, body=TXT2IMG, when="hires", read=read_int),
    Field("hires_upscaler", api="hr_upscaler", label="Hires upscaler", aliases=("hr_upscaler",), body=TXT2IMG,
          when="hires", empty="Latent"),
    # the API's units come in alwayson_scripts (a1111/controlnet_units.py); the PNG has one label a unit, from 0
    Field("controlnets", label="ControlNet {}"),
    Field("control_mode"),  # one for every unit of a job (the units' own must agree)
    # A1111's API's own keys, what the API does with them (a1111/api_body.py)
    Field("send_images", request=False, api="send_images", default=True),
    Field("save_images", request=False, api="save_images", default=False),  # every image is saved here
    Field("include_init_images", request=False, api="include_init_images", default=False, body=IMG2IMG),
    Field("override_settings", request=False, api="override_settings"),
    Field("override_settings_restore_afterwards", request=False, api="override_settings_restore_afterwards",
          default=True),
    Field("alwayson_scripts", request=False, api="alwayson_scripts", default={}),  # ControlNet's only
    # A1111's fields lowvram-gen does not build: warned, or refused where ignoring them makes another image
    Field("restore_faces", request=False, api="restore_faces", policy=WARNED, neutral=(None, False),
          why="face restoration is not part of lowvram-gen"),
    Field("do_not_save_samples", request=False, api="do_not_save_samples", policy=WARNED, neutral=(None, False),
          default=False, why="lowvram-gen always saves the images in its output folder"),
    Field("do_not_save_grid", request=False, api="do_not_save_grid", policy=WARNED, neutral=(None, False),
          default=False, why="lowvram-gen makes no grid"),
    Field("eta", request=False, api="eta", policy=WARNED, neutral=(None, 0, 1),
          why="the diffusers schedulers run their own noise (eta 1 for the ancestral samplers, 0 for DDIM)"),
    Field("s_min_uncond", request=False, api="s_min_uncond", policy=WARNED, neutral=(None, 0),
          why="negative guidance minimum sigma is not part of lowvram-gen"),
    Field("s_churn", request=False, api="s_churn", policy=WARNED, neutral=(None, 0), why=_K_DIFFUSION),
    Field("s_tmax", request=False, api="s_tmax", policy=WARNED, neutral=(None, 0, math.inf), why=_K_DIFFUSION),
    Field("s_tmin", request=False, api="s_tmin", policy=WARNED, neutral=(None, 0), why=_K_DIFFUSION),
    Field("s_noise", request=False, api="s_noise", policy=WARNED, neutral=(None, 1), why=_K_DIFFUSION),
    Field("disable_extra_networks", request=False, api="disable_extra_networks", policy=WARNED,
          neutral=(None, False), default=False, why="LoRA tags in the prompt are always used"),
    Field("firstpass_image", request=False, api="firstpass_image", policy=WARNED, neutral=(None, ""),
          why="a first-pass image for hires fix is not used"),
    Field("comments", request=False, api="comments", policy=WARNED, neutral=ANY),
    Field("force_task_id", request=False, api="force_task_id", policy=WARNED, neutral=ANY),
    Field("infotext", request=False, api="infotext", policy=WARNED, neutral=(None, ""),
          why="the fields are read from the JSON, not from an infotext"),
    # A1111's scripts: "x/y/z plot", img2img's "loopback" and "sd upscale", in the API (a1111/api_body.py `_script`:
    # any other refused), not in a batch
    Field("script_args", request=False, api="script_args", policy=WARNED, neutral=ANY, default=[]),  # script_name's
    Field("script_name", request=False, api="script_name", policy=REFUSED, neutral=(None, ""),
          why='lowvram-gen runs A1111\'s "x/y/z plot" and img2img\'s "loopback" and "sd upscale" from the API\'s '
              "script_name (not from a batch line): leave any other out"),
    Field("firstphase_width", request=False, api="firstphase_width", policy=WARNED, neutral=(None, 0), default=0,
          body=TXT2IMG, why="the old hires fix's first-pass size is not used: give width and height"),
    Field("firstphase_height", request=False, api="firstphase_height", policy=WARNED, neutral=(None, 0), default=0,
          body=TXT2IMG, why="the old hires fix's first-pass size is not used: give width and height"),
    Field("hr_checkpoint_name", request=False, api="hr_checkpoint_name", policy=WARNED, body=TXT2IMG,
          neutral=(None, "", "Use same checkpoint"), why="the hires pass runs on the job's own model"),
    Field("image_cfg_scale", request=False, api="image_cfg_scale", policy=WARNED, neutral=ANY, body=IMG2IMG),
    Field("initial_noise_multiplier", request=False, api="initial_noise_multiplier", policy=WARNED,
          neutral=(None, 1), body=IMG2IMG, why="the init image's noise is not scaled"),
    Field("resize_mode", api="resize_mode", default=0, body=IMG2IMG,
          api_values={0: "resize", 1: "crop", 2: "fill", 3: "latent"}),
    Field("latent_mask", request=False, api="latent_mask", policy=REFUSED, neutral=(None, ""), body=IMG2IMG,
          shown="<image>", why="a latent mask apart from the mask is not supported: send the mask alone"),
    # A1111's "prompts from file" script's own options: its saving and display
    Field("prompt_for_display", request=False, policy=WARNED, neutral=(None, ""), body=BATCH,
          why="the prompt is shown as it is"),
    Field("outpath_samples", request=False, policy=WARNED, neutral=(None, ""), body=BATCH,
          why="the output folder is the batch's (--outdir)"),
    Field("outpath_grids", request=False, policy=WARNED, neutral=(None, ""), body=BATCH,
          why="lowvram-gen makes no grid"),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
# other names -> the request field, as batch lines and GenerationRequest.from_mapping take them
ALIASES: dict[str, str] = {alias: f.name for f in FIELDS if f.request for alias in f.aliases}
# A1111's prompts-from-file n_iter repeats its line (a batch's own field), where the API's makes batch_count
BATCH_ONLY = {"n_iter": "repeat"}
# A1111's fields with no request field that a batch line takes: by their one policy, warned or refused
NOT_BUILT: dict[str, Field] = {f.name: f for f in FIELDS if not f.request and f.policy in (WARNED, REFUSED)}
# the infotext labels that are one request field each (Size, Seed resize from, Hires resize: two)
LABELS: dict[str, str] = {f.name: f.label for f in FIELDS if f.label and f.request}
# what our images add for people (what ran, what was found): nothing to set from them
PRESET, GENERATED_SIZE, SAFETY, ENGINE = "Lowvram preset", "Generated size", "Safety checker", "Engine"
VAE_HASH = "VAE hash"  # A1111's: the first 10 hex digits of the VAE file's sha256, before `VAE`
INFORMATIONAL = frozenset({PRESET, GENERATED_SIZE, "Lora hashes", "TI hashes", SAFETY, "Model hash", "Version",
                           "Batch pos", VAE_HASH})
# VQGAN-CLIP's images: its request's fields under A1111's labels where they mean the same, ours for the rest
VQGAN_LABELS = {"iterations": "Steps", "optimizer": "Sampler", "seed": "Seed", "size": "Size", "vqgan": "Model",
                "clip": "CLIP", "engine": ENGINE, "cutn": "Cutouts", "cut_pow": "Cut power", "lr": "Learning rate",
                "preset": PRESET, "image_prompts": "Image prompts", "init_image": "Init image",
                "init_weight": "Init weight", "init_noise": "Init noise", "generated_size": GENERATED_SIZE,
                "iteration": "Iteration"}
VQGAN_ENGINE = "VQGAN-CLIP"
UNIT_LABEL = re.compile(BY_NAME["controlnets"].label.replace("{}", r"(\d+)"))  # `ControlNet 0`


def label(name: str) -> str:
    """The PNG label of request field `name`."""
    return LABELS[name]


def labelled(name: str) -> tuple[str, ...]:
    """Every label request field `name` is read from: its own and the older ones."""
    spec = BY_NAME[name]
    return (spec.label, *spec.old_labels)


def api_key(name: str) -> str:
    """A1111's JSON key of request field `name`."""
    return BY_NAME[name].api


def request_name(key: str) -> str:
    """The request field a batch line's or a mapping's key names (an alias's field; any other key as it is)."""
    return ALIASES.get(key, key)


def line_fields(fields: Mapping[str, Any], warnings: list[str]) -> dict:
    """A batch line's fields by the request's names: aliases renamed (a name given twice is an error), A1111's
    fields we do not build by their policy: warned (dropped, a warning at a value that changes something) or
    refused at such a value; any other key as it is (the request says if it is unknown)."""
    out: dict = {}
    for key, value in fields.items():
        spec = NOT_BUILT.get(key)
        if spec is not None:
            if not spec.neutral_value(value):
                if spec.policy == REFUSED:
                    raise spec.refusal(value)
                warnings.append(spec.warning(value))
            continue
        name = BATCH_ONLY.get(key) or request_name(key)
        if name in out:
            raise InvalidRequest("field", key, f"{name!r} is given twice on this line")
        out[name] = value
    return out
