"""A PNG's A1111 `parameters` text back into `GenerationRequest` fields: the one way `generate --from-png`
and the web UI's PNG Info / Send-to buttons read an image's settings.

It inverts `engines.sd.job.a1111_fields`: `Size: WxH` is width and height, `Denoising strength` is the
hires pass's when `Hires upscale` is there and img2img's otherwise, and `Sampler` is the name A1111 shows.
Our images write the sampler that actually ran (`samplers.a1111_name` of the model's own scheduler when
the request said "default", e.g. PLMS for SD 1.5's PNDM), so where our JSON chunk says the request was
"default" it maps back to "default"; a scheduler class name (no A1111 name matched) is the model's own
scheduler, so "default" too. `Schedule type` (A1111 1.9+) is the request's schedule type, and the old combined
names (`Sampler: DPM++ 2M Karras`) are split into both; `Schedule type: Automatic` is what A1111 means by it, the
sampler's own default there (Karras for DPM++ 2M).

`Variation seed`, `Variation seed strength` and `Seed resize from` are A1111's extra seed options (the
request's subseed, subseed_strength and seed_resize_from_w/h). Hires fix's fields are A1111 1.10's (`Hires upscale`
or `Hires resize: WxH`, `Hires upscaler` in A1111's names, our old lower-case ones too, `Hires steps`, `Hires
sampler`, `Hires schedule type`, `Hires prompt`, `Hires negative prompt`) and Forge's `Hires CFG Scale`; a
`Hires sampler` or `Hires schedule type` our own PNG wrote for a request's "default" / "same" reads back as that.
`ControlNet N` (A1111's sd-webui-controlnet) is a unit of the request's `controlnets` without its control image,
which a PNG does not hold (control/units.py). Fields we do not use (ENSD, VAE, Eta...) are listed, not refused; a value we use but cannot read (`Steps: many`) is an `InvalidRequest` naming the field.
Ranges are checked later, by `GenerationRequest.validated()`, with the CLI's messages. Standard library only:
the CLI imports this before it decides to load torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lowvram_gen.control.units import UNIT_KEY, unit_from_text
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.request import SAME_SAMPLER, SAME_SCHEDULER, check_quantize
from lowvram_gen.upscale.upscalers import builtin
from lowvram_gen.samplers import A1111_AUTOMATIC, DEFAULT, SAMPLERS, split_sampler
from lowvram_gen.schedules import AUTOMATIC, check_schedule_type

# what our own images add for people (what ran, what was found): nothing to set from them
INFORMATIONAL = frozenset({"Lowvram preset", "Generated size", "Lora hashes", "TI hashes", "Safety checker",
                           "Model hash", "Version", "Batch pos"})
_SIZE = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*")


@dataclass
class Infotext:
    """What an image's parameters say, as request fields; `ignored`: the A1111 fields we have no use for."""

    fields: dict
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # lenient reading only: the fields whose value could not be used, each with why ("Sampler 'Adam': use ...")
    unusable: list[str] = field(default_factory=list)
    # A1111's inpaint fields (or our JSON's mask) were there: a rerun needs the init image and the mask again
    inpainted: bool = False


def _int(key: str, value: str) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise InvalidRequest(f"{key!r} in the image's parameters", value, "expected a whole number")
    return int(text)


def _float(key: str, value: str) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise InvalidRequest(f"{key!r} in the image's parameters", value, "expected a number") from None


# A1111 fields that are one number of the request: (request field, reader)
_NUMBERS = {"Steps": ("steps", _int), "CFG scale": ("cfg_scale", _float), "Seed": ("seed", _int),
            "Batch size": ("batch_size", _int), "Hires upscale": ("hires_scale", _float),
            "Hires steps": ("hires_steps", _int), "Clip skip": ("clip_skip", _int),
            "Hires CFG Scale": ("hires_cfg", _float), "Hires CFG scale": ("hires_cfg", _float),
            "Variation seed": ("subseed", _int), "Variation seed strength": ("subseed_strength", _float)}


def _sampler(params: dict, ours: dict | None) -> tuple[str, str | None]:
    """(the request's sampler, the schedule type its name ends with or None)."""
    name = str(params["Sampler"]).strip()
    request = (ours or {}).get("request")
    if isinstance(request, dict) and request.get("sampler") == DEFAULT:
        return DEFAULT, None  # our image: the text holds the resolved name of the model's own scheduler
    if name.endswith("Scheduler") and name not in SAMPLERS:
        return DEFAULT, None  # a diffusers class no A1111 name matches: only the model's own scheduler writes that
    return split_sampler(name, "'Sampler' in the image's parameters")


def _schedule(value, params: dict, ours: dict | None) -> str:
    """The request's schedule type from `Schedule type: value`: a combined sampler name's own wins (as in A1111),
    A1111's Automatic is the sampler's default there, and the Uniform our PNGs write for a request's Automatic
    (where A1111 would read no schedule type as another) is Automatic again."""
    try:
        sampler, named = _sampler(params, ours) if "Sampler" in params else (None, None)
    except InvalidRequest:
        sampler, named = None, None  # said once, for the Sampler field
    if named:
        return named
    key = check_schedule_type(str(value), "'Schedule type' in the image's parameters")
    request = (ours or {}).get("request")
    if key == AUTOMATIC:
        return A1111_AUTOMATIC.get(sampler, AUTOMATIC)
    if key == "uniform" and isinstance(request, dict) and request.get("schedule_type", AUTOMATIC) == AUTOMATIC:
        return AUTOMATIC
    return key


def _quantize(value: str) -> str | None:
    """int8/int4/none as the request spells it (the UI's Quantize box offers exactly those); a value we do not
    know names the PNG's field, as `Steps: many` does."""
    try:
        return check_quantize(str(value))
    except InvalidRequest as exc:
        raise InvalidRequest("'Quantize' in the image's parameters", value, exc.allowed) from None


def _upscaler(value: str) -> str:
    """A built-in upscaler in A1111's spelling (ours were lower case: `latent`); any other name as written (a model
    file, checked when the request is validated)."""
    name = str(value).strip()
    return builtin(name) or name


def _hires_sampler(value, params: dict, ours: dict | None) -> tuple[str, str | None]:
    """(the request's hires sampler, the schedule type its name ends with or None), as `_sampler` reads `Sampler`."""
    request = (ours or {}).get("request")
    if isinstance(request, dict) and request.get("hires_sampler") == DEFAULT:
        return DEFAULT, None
    name = str(value).strip()
    if name.endswith("Scheduler") and name not in SAMPLERS:
        return DEFAULT, None
    return split_sampler(name, "'Hires sampler' in the image's parameters")


def _hires_schedule(value, params: dict, ours: dict | None) -> str:
    """The request's hires schedule type from `Hires schedule type: value`, as `_schedule` reads `Schedule type`: the
    Automatic of the sampler the second pass ran (the hires one, else the first pass's)."""
    try:
        if "Hires sampler" in params:
            sampler, named = _hires_sampler(params["Hires sampler"], params, ours)
        else:
            sampler, named = _sampler(params, ours) if "Sampler" in params else (None, None)
            named = None
    except InvalidRequest:
        sampler, named = None, None  # said once, for the sampler's own field
    if named:
        return named
    key = check_schedule_type(str(value), "'Hires schedule type' in the image's parameters")
    request = (ours or {}).get("request")
    if key == AUTOMATIC:
        return A1111_AUTOMATIC.get(sampler, AUTOMATIC)
    if key == "uniform" and isinstance(request, dict) and request.get("hires_schedule_type", "") == "":
        return ""  # ours: the first pass's schedule type, which is Uniform for this sampler
    return key


def _size(key: str, value) -> tuple[int, int]:
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if not match:
        raise InvalidRequest(f"{key!r} in the image's parameters", value, "expected WIDTHxHEIGHT, e.g. 512x768")
    return int(match.group(1)), int(match.group(2))


def request_fields(params: dict, ours: dict | None = None, lenient: bool = False) -> Infotext:
    """`GenerationRequest` keyword arguments from `parse_a1111_parameters`' dict (and our JSON chunk, if any).

    Only what the text says is set; the caller's defaults (or explicit flags) fill the rest. A value that cannot
    be used (`Steps: many`, VQGAN-CLIP's `Sampler: Adam`) is an InvalidRequest, or with `lenient` (the web UI's
    Send to, which fills what it can) left out and listed in `unusable` with the reason.
    """
    fields: dict = {"prompt": params.get("prompt", ""), "negative_prompt": params.get("negative_prompt", "")}
    notes: list[str] = []
    ignored: list[str] = []
    unusable: list[str] = []
    for key, value in params.items():
        if key in ("prompt", "negative_prompt"):
            continue
        try:
            _read(key, value, params, ours, fields, ignored, notes)
        except InvalidRequest as exc:
            if not lenient:
                raise
            unusable.append(f"{key} {str(value).strip()!r} ({exc.allowed})")
    return Infotext(fields, ignored, notes, unusable)


def _read(key: str, value, params: dict, ours: dict | None, fields: dict, ignored: list[str],
          notes: list[str]) -> None:
    """Set the request field(s) of one A1111 field in `fields` (or list it in `ignored`)."""
    hires = "Hires upscale" in params or "Hires resize" in params
    if key in _NUMBERS:
        field_name, read = _NUMBERS[key]
        fields[field_name] = read(key, value)
    elif key == "Sampler":
        fields["sampler"], named = _sampler(params, ours)
        if named:
            fields["schedule_type"] = named
    elif key == "Schedule type":
        fields["schedule_type"] = _schedule(value, params, ours)
    elif key == "Size":
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise InvalidRequest("'Size' in the image's parameters", value, "expected WIDTHxHEIGHT, e.g. 512x768")
        fields["width"], fields["height"] = int(match.group(1)), int(match.group(2))
    elif key == "Seed resize from":
        text = str(value).strip()
        match = _SIZE.fullmatch(text)
        if re.fullmatch(r"-1\s*x\s*-1", text):  # old A1111 versions wrote their "off" as -1x-1
            fields["seed_resize_from_w"], fields["seed_resize_from_h"] = 0, 0
        elif not match:
            raise InvalidRequest("'Seed resize from' in the image's parameters", value,
                                 "expected WIDTHxHEIGHT, e.g. 512x512")
        else:
            fields["seed_resize_from_w"], fields["seed_resize_from_h"] = int(match.group(1)), int(match.group(2))
    elif key == "Model" and str(params.get("Engine", "")).strip() == "VQGAN-CLIP":
        # a VQGAN's name (VQGAN-CLIP's tiny is not the diffusers tiny): never a model for this request
        notes.append(f"Model {str(value).strip()!r} is a VQGAN model (the image was made by VQGAN-CLIP): not used")
    elif key == "Model":
        fields["model"] = str(value).strip()
    elif key == "Quantize":
        fields["quantize"] = _quantize(value)
    elif key == "Denoising strength":
        fields["hires_denoise" if hires else "strength"] = _float(key, value)
    elif key == "Hires upscaler":
        fields["hires_upscaler"] = _upscaler(value)
    elif key == "Hires resize":
        fields["hires_resize_w"], fields["hires_resize_h"] = _size(key, value)
    elif key == "Hires sampler" and str(value).strip() == SAME_SAMPLER:  # A1111's parser's own default
        fields["hires_sampler"] = ""
    elif key == "Hires schedule type" and str(value).strip() == SAME_SCHEDULER:
        fields["hires_schedule_type"] = ""
    elif key == "Hires sampler":
        fields["hires_sampler"], named = _hires_sampler(value, params, ours)
        if named:
            fields["hires_schedule_type"] = named
    elif key == "Hires schedule type":
        fields["hires_schedule_type"] = _hires_schedule(value, params, ours)
    elif key == "Hires prompt":
        fields["hires_prompt"] = str(value)
    elif key == "Hires negative prompt":
        fields["hires_negative"] = str(value)
    elif UNIT_KEY.fullmatch(key):  # A1111's sd-webui-controlnet: one unit each, its control image not in the PNG
        unit, mode = unit_from_text(key, value, notes)
        fields["controlnets"] = (*fields.get("controlnets", ()), unit)
        if mode is not None and fields.setdefault("control_mode", mode) != mode:
            notes.append(f"{key}: control mode {mode!r} differs from the first unit's; one control mode applies "
                         f"to every unit here ({fields['control_mode']!r})")
    elif key in INPAINT_KEYS:
        _inpaint(key, value, fields)
    elif key not in INFORMATIONAL:
        ignored.append(key)


# A1111's inpaint fields (its img2img > Inpaint); the mask itself is not in a PNG
INPAINT_KEYS = ("Mask blur", "Mask mode", "Inpaint area", "Masked area padding", "Only masked padding, pixels",
                "Masked content")


def _inpaint(key: str, value, fields: dict) -> None:
    text = str(value).strip()
    if key == "Mask blur":
        fields["mask_blur"] = _int(key, text)
    elif key in ("Masked area padding", "Only masked padding, pixels"):  # A1111 1.6+'s name, and the older one
        fields["mask_padding"] = _int(key, text)
    elif key == "Mask mode":
        if text not in ("Inpaint masked", "Inpaint not masked"):
            raise InvalidRequest("'Mask mode' in the image's parameters", value,
                                 "expected 'Inpaint masked' or 'Inpaint not masked'")
        fields["invert_mask"] = text == "Inpaint not masked"
    elif key == "Inpaint area":  # A1111's words as the request's values; anything else: the request names it
        fields["inpaint_area"] = {"only masked": "masked", "whole picture": "whole"}.get(text.lower(), text)
    else:  # 'latent noise' -> 'latent-noise'
        fields["masked_content"] = text.lower().replace(" ", "-")


def inpainted(info: "Infotext", ours: dict | None = None) -> bool:
    """Whether the image was inpainted: A1111's inpaint fields, or our JSON's request with a mask."""
    request = (ours or {}).get("request") or {}
    return bool(request.get("mask")) or any(k in info.fields for k in ("mask_blur", "mask_padding", "invert_mask",
                                                                        "inpaint_area", "masked_content"))


class NoParameters(InvalidRequest):
    """A file that is not a PNG we can read, or a PNG without A1111 parameters."""


def read_infotext(path: str | Path) -> tuple[str, dict | None]:
    """(parameters text, our JSON chunk or None) of an image; `NoParameters` naming the file otherwise."""
    from PIL import Image, UnidentifiedImageError

    from lowvram_gen.request import unreadable_image

    shown = str(path)
    try:
        text, ours = read_png_metadata(path)
    except FileNotFoundError:
        raise NoParameters("PNG", shown, "no such file") from None
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise NoParameters("PNG", shown, unreadable_image(exc)) from None
    if not text or not text.strip():
        raise NoParameters("PNG", shown, "it holds no generation parameters (no A1111 'parameters' text "
                                         "chunk: saved by another tool, or stripped by an image host)")
    return text, ours


def from_png(path: str | Path, lenient: bool = False) -> Infotext:
    """The request fields of an image's parameters (`read_infotext`, then `request_fields`)."""
    text, ours = read_infotext(path)
    info = request_fields(parse_a1111_parameters(text), ours, lenient)
    info.inpainted = inpainted(info, ours)
    if info.inpainted and "mask_blur" not in info.fields:  # A1111 writes Mask blur only above 0
        info.fields["mask_blur"] = 0
    return info


def local_model(spec: str, models_folder: str | Path | None = None) -> str | None:
    """`spec` as a model that loads here without a download, or None: an embedded name, an existing
    path, a hub id in the cache, or (as A1111 writes `Model: name`) a checkpoint in the models folder
    by its file name without the extension."""
    from lowvram_gen.models.discover import model_choices

    spec = spec.strip()
    if not spec:
        return None
    if Path(spec).expanduser().exists():
        return spec
    choices = model_choices(models_folder)
    if spec in choices:
        return spec
    for choice in choices:
        if Path(choice).stem == spec or Path(choice).name == spec:
            return choice
    return None
