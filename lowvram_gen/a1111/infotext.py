"""A PNG's A1111 `parameters` text: written from a request (`a1111_fields`, `controlnet_fields`, `vqgan_fields`) and
read back into `GenerationRequest` fields (`request_fields`, `from_png`): the one way `generate --from-png` and the
web UI's PNG Info / Send-to buttons read an image's settings. The labels are a1111/fields.py's.

The reader inverts the writer: `Size: WxH` is width and height, `Denoising strength` is the
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
`RNG: CPU` / `RNG: NV` is the request's noise source (rng.py; A1111 writes none for its default GPU).
`ControlNet N` (A1111's sd-webui-controlnet) is a unit of the request's `controlnets` without its control image,
which a PNG does not hold (control/units.py). `ENSD: N` is the request's eta noise seed delta.
Fields we do not use (Eta, Face restoration...) are listed, not refused; a value we use but cannot read (`Steps: many`) is an `InvalidRequest` naming the field.
Ranges are checked later, by `GenerationRequest.validated()`, with the CLI's messages. Standard library only:
the CLI imports this before it decides to load torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lowvram_gen.a1111.fields import (BY_NAME, ENGINE, GENERATED_SIZE, INFORMATIONAL, PRESET, SAFETY, UNIT_LABEL,
                                      VAE_HASH, VQGAN_ENGINE, VQGAN_LABELS, label, labelled, read_float)
from lowvram_gen.a1111.unipc_options import DEFAULTS as UNIPC_DEFAULTS
from lowvram_gen.a1111.upscaler_names import builtin
from lowvram_gen.control.units import unit_from_text, unit_text
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.prompting.styles import StyleBook, take_out
from lowvram_gen.request import SAME_SAMPLER, SAME_SCHEDULER, GenerationRequest, check_quantize
from lowvram_gen.rng import DEFAULT as DEFAULT_RNG
from lowvram_gen.samplers import A1111_AUTOMATIC, DEFAULT, SAMPLERS, split_sampler
from lowvram_gen.schedules import AUTOMATIC, check_schedule_type

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


# the labels that are one request field each, read by the field's own reader (Steps, CFG scale, Hires steps...)
_SIMPLE = {text: spec for spec in BY_NAME.values() if spec.request and spec.read for text in labelled(spec.name)}
_INPAINT = ("mask_blur", "invert_mask", "inpaint_area", "mask_padding", "masked_content")


def _named_sampler(name: str, field: str, ours_default: bool) -> tuple[str, str | None]:
    """(the request's sampler, the schedule type its name ends with or None) from the name a PNG's `field` says."""
    if ours_default:
        return DEFAULT, None  # our image: the text holds the resolved name of the model's own scheduler
    if name.endswith("Scheduler") and name not in SAMPLERS:
        return DEFAULT, None  # a diffusers class no A1111 name matches: only the model's own scheduler writes that
    return split_sampler(name, f"{label(field)!r} in the image's parameters")


def _ours(ours: dict | None, field: str, value) -> bool:
    """Whether our JSON chunk says the request's `field` was `value`."""
    request = (ours or {}).get("request")
    return isinstance(request, dict) and field in request and request[field] == value


def _sampler(params: dict, ours: dict | None) -> tuple[str, str | None]:
    """(the request's sampler, the schedule type its name ends with or None)."""
    return _named_sampler(str(params[label("sampler")]).strip(), "sampler", _ours(ours, "sampler", DEFAULT))


def _schedule_key(value, field: str, sampler: str | None, named: str | None, ours: dict | None, unset: str) -> str:
    """The request's `field` (schedule type or hires schedule type) from its PNG value: the one a combined sampler
    name says wins (as in A1111), A1111's Automatic is the sampler's default there, and what our PNGs write for a
    request's `unset` (the Uniform where A1111 would read no schedule type as another, the Karras of the default
    sampler's Automatic: samplers.py) is `unset` again."""
    if named:
        return named
    key = check_schedule_type(str(value), f"{label(field)!r} in the image's parameters")
    if key == AUTOMATIC:
        return A1111_AUTOMATIC.get(sampler, AUTOMATIC)
    request = (ours or {}).get("request")
    if isinstance(request, dict) and request.get(field, unset) == unset:
        return unset
    return key


def _schedule(value, params: dict, ours: dict | None) -> str:
    """The request's schedule type from `Schedule type: value` (`_schedule_key`; unset: Automatic)."""
    try:
        sampler, named = _sampler(params, ours) if label("sampler") in params else (None, None)
    except InvalidRequest:
        sampler, named = None, None  # said once, for the Sampler field
    return _schedule_key(value, "schedule_type", sampler, named, ours, AUTOMATIC)


def _quantize(value: str) -> str | None:
    """int8/int4/none as the request spells it (the UI's Quantize box offers exactly those); a value we do not
    know names the PNG's field, as `Steps: many` does."""
    try:
        return check_quantize(str(value))
    except InvalidRequest as exc:
        raise InvalidRequest(f"{label('quantize')!r} in the image's parameters", value, exc.allowed) from None


def _upscaler(value: str) -> str:
    """A built-in upscaler in A1111's spelling (ours were lower case: `latent`); any other name as written (a model
    file, checked when the request is validated)."""
    name = str(value).strip()
    return builtin(name) or name


def _hires_sampler(value, params: dict, ours: dict | None) -> tuple[str, str | None]:
    """(the request's hires sampler, the schedule type its name ends with or None), as `_sampler` reads `Sampler`."""
    return _named_sampler(str(value).strip(), "hires_sampler", _ours(ours, "hires_sampler", DEFAULT))


def _hires_schedule(value, params: dict, ours: dict | None) -> str:
    """The request's hires schedule type from `Hires schedule type: value`, as `_schedule` reads `Schedule type`: the
    Automatic of the sampler the second pass ran (the hires one, else the first pass's); unset: the first pass's."""
    try:
        if label("hires_sampler") in params:
            sampler, named = _hires_sampler(params[label("hires_sampler")], params, ours)
        else:
            sampler, named = _sampler(params, ours) if label("sampler") in params else (None, None)
            named = None
    except InvalidRequest:
        sampler, named = None, None  # said once, for the sampler's own field
    return _schedule_key(value, "hires_schedule_type", sampler, named, ours, "")


def _size(key: str, value, example: str = "512x768") -> tuple[int, int]:
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if not match:
        raise InvalidRequest(f"{key!r} in the image's parameters", value, f"expected WIDTHxHEIGHT, e.g. {example}")
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
    hires = label("hires_scale") in params or label("hires_resize_w") in params
    text = str(value).strip()
    if key in _SIMPLE:
        spec = _SIMPLE[key]
        fields[spec.name] = spec.read(key, value)
    elif key == label("sampler"):
        fields["sampler"], named = _sampler(params, ours)
        if named:
            fields["schedule_type"] = named
    elif key == label("schedule_type"):
        fields["schedule_type"] = _schedule(value, params, ours)
    elif key == label("width"):
        fields["width"], fields["height"] = _size(key, value)
    elif key == label("seed_resize_from_w"):
        if re.fullmatch(r"-1\s*x\s*-1", text):  # old A1111 versions wrote their "off" as -1x-1
            fields["seed_resize_from_w"], fields["seed_resize_from_h"] = 0, 0
        else:
            fields["seed_resize_from_w"], fields["seed_resize_from_h"] = _size(key, value, "512x512")
    elif key == label("model") and str(params.get(ENGINE, "")).strip() == VQGAN_ENGINE:
        # a VQGAN's name (VQGAN-CLIP's tiny is not the diffusers tiny): never a model for this request
        notes.append(f"{key} {text!r} is a VQGAN model (the image was made by {VQGAN_ENGINE}): not used")
    elif key == label("model"):
        fields["model"] = text
    elif key == label("quantize"):
        fields["quantize"] = _quantize(value)
    elif key == label("strength"):  # the hires pass's where there is one, img2img's otherwise
        fields["hires_denoise" if hires else "strength"] = read_float(key, value)
    elif key == label("hires_upscaler"):
        fields["hires_upscaler"] = _upscaler(value)
    elif key == label("hires_resize_w"):
        fields["hires_resize_w"], fields["hires_resize_h"] = _size(key, value)
    elif key == label("hires_sampler") and text == SAME_SAMPLER:  # A1111's parser's own default
        fields["hires_sampler"] = ""
    elif key == label("hires_schedule_type") and text == SAME_SCHEDULER:
        fields["hires_schedule_type"] = ""
    elif key == label("hires_sampler"):
        fields["hires_sampler"], named = _hires_sampler(value, params, ours)
        if named:
            fields["hires_schedule_type"] = named
    elif key == label("hires_schedule_type"):
        fields["hires_schedule_type"] = _hires_schedule(value, params, ours)
    elif UNIT_LABEL.fullmatch(key):  # A1111's sd-webui-controlnet: one unit each, its control image not in the PNG
        unit, mode = unit_from_text(key, value, notes)
        fields["controlnets"] = (*fields.get("controlnets", ()), unit)
        if mode is not None and fields.setdefault("control_mode", mode) != mode:
            notes.append(f"{key}: control mode {mode!r} differs from the first unit's; one control mode applies "
                         f"to every unit here ({fields['control_mode']!r})")
    elif key == label("invert_mask"):
        words = BY_NAME["invert_mask"].words
        if text not in words.values():
            raise InvalidRequest(f"{key!r} in the image's parameters", value,
                                 "expected " + " or ".join(repr(w) for w in words.values()))
        fields["invert_mask"] = text == words[True]
    elif key in (label("inpaint_area"), label("masked_content")):  # A1111's words; any other the request names
        name = "inpaint_area" if key == label("inpaint_area") else "masked_content"
        fields[name] = BY_NAME[name].from_word(text)
    elif key not in INFORMATIONAL:
        ignored.append(key)


def inpainted(info: "Infotext", ours: dict | None = None) -> bool:
    """Whether the image was inpainted: A1111's inpaint fields, or our JSON's request with a mask."""
    request = (ours or {}).get("request") or {}
    return bool(request.get("mask")) or any(k in info.fields for k in _INPAINT)


# ------------------------------------------------------------------------------------------------ writing


def a1111_fields(request: GenerationRequest, sampler: str | tuple[str, str | None], seed: int, preset: str,
                 generated_size: tuple[int, int], quantize: str = "none", clip_skip: int | None = None,
                 subseed: int | None = None, hires_sampler: tuple[str, str | None] | None = None,
                 vae: tuple[str, str] | None = None, refiner: str | None = None) -> dict:
    """The key-value line of A1111's `parameters` text, in A1111's order, plus what lowvram-gen did. `sampler`:
    the A1111 sampler name, or (name, schedule type label or None) written as A1111 1.9+ writes them
    (`Sampler: DPM++ 2M, Schedule type: Karras`). `clip_skip`: the one the encoders used (default: the
    request's); written only above 1, as A1111 does. `subseed`: this image's variation seed (default the
    request's), written with its strength only when the strength is above 0, and `Seed resize from` only when set,
    where A1111 writes them (after Size, before Denoising strength). `hires_sampler`: hires fix's own (name, schedule
    type label or None), None where the second pass ran the first pass's. `vae`: (name, hash) of the VAE file the job
    decoded with, written after Model as A1111 writes them (`VAE hash`, `VAE`); None: the model's own. With the other hires fields in A1111
    1.10's order (its extra_generation_params, Forge's `Hires CFG Scale` where Forge puts it), each only where A1111
    writes it: the sampler, schedule type, prompts and CFG scale only where they differ from the first pass's,
    `Hires upscale` or `Hires resize`, `Hires steps` only when set. `refiner`: the refiner's title as A1111 writes it
    (`name [hash]`; default: the request's refiner), written with `Refiner switch at` where a refiner ran."""
    sampler, schedule = sampler if isinstance(sampler, tuple) else (sampler, None)
    fields = {label("steps"): request.steps, label("sampler"): sampler}
    if schedule:
        fields[label("schedule_type")] = schedule
    fields.update({label("cfg_scale"): request.cfg_scale, label("seed"): seed,
                   label("width"): f"{request.width}x{request.height}", label("model"): request.model})
    if vae is not None:
        fields[VAE_HASH], fields[label("vae")] = vae[1], vae[0]
    if request.subseed_strength > 0:
        fields[label("subseed")] = request.subseed if subseed is None else subseed
        fields[label("subseed_strength")] = request.subseed_strength
    if request.seed_resize_from is not None:
        fields[label("seed_resize_from_w")] = "%dx%d" % request.seed_resize_from
    if request.init_image:
        fields[label("strength")] = request.strength
    if request.mask:
        fields.update(inpaint_fields(request))
    if request.hires:
        fields[label("hires_denoise")] = request.hires_denoise
    clip_skip = request.clip_skip if clip_skip is None else clip_skip
    if clip_skip > 1:
        fields[label("clip_skip")] = clip_skip
    if request.ensd:  # A1111's eta noise seed delta, between Clip skip and RNG as A1111 writes it
        fields[label("ensd")] = request.ensd
    if request.rng != DEFAULT_RNG:  # A1111 writes its RNG source only when it is not its default, GPU
        fields[label("rng")] = BY_NAME["rng"].words[request.rng]
    if request.tiling:  # after RNG, as A1111 writes it
        fields[label("tiling")] = True
    for name, default in UNIPC_DEFAULTS.items():  # A1111's UniPC settings, where not its defaults
        if getattr(request, name) != default:
            fields[label(name)] = getattr(request, name)
    if request.refiner and request.refiner_switch_at < 1:  # engines/sd/refiner.py; a switch at 1 runs none
        fields[label("refiner")] = refiner or request.refiner
        fields[label("refiner_switch_at")] = request.refiner_switch_at
    if request.hires:
        fields.update(hires_fields(request, (sampler, schedule), hires_sampler))
    fields[PRESET] = preset
    if quantize != "none":  # the weights that made the image were int8/int4
        fields[label("quantize")] = quantize
    if generated_size != request.output_size():
        fields[GENERATED_SIZE] = "%dx%d" % generated_size
    return fields


def inpaint_fields(request: GenerationRequest) -> dict:
    """A1111's inpaint fields, where and how its img2img writes them: `Mask mode: Inpaint not masked` when inverted,
    `Mask blur` above 0, `Inpaint area: Only masked` with `Masked area padding`, `Masked content` for all but
    original (A1111's default, which it does not write)."""
    fields: dict = {}
    if request.invert_mask:
        fields[label("invert_mask")] = BY_NAME["invert_mask"].words[True]
    if request.mask_blur > 0:
        fields[label("mask_blur")] = request.mask_blur
    if request.inpaint_area == "masked":
        fields[label("inpaint_area")] = BY_NAME["inpaint_area"].words["masked"]
        fields[label("mask_padding")] = request.mask_padding
    if request.masked_content != "original":
        fields[label("masked_content")] = BY_NAME["masked_content"].words[request.masked_content]
    return fields


def hires_fields(request: GenerationRequest, first: tuple[str, str | None],
                 hires_sampler: tuple[str, str | None] | None) -> dict:
    """A1111's hires fields of a hires request (see `a1111_fields`); `first`: the first pass's (sampler, schedule)."""
    fields: dict = {}
    name, schedule = hires_sampler or first
    if name != first[0]:
        fields[label("hires_sampler")] = name
    prompt, negative = request.hires_texts
    if prompt != request.prompt:
        fields[label("hires_prompt")] = prompt
    if negative != request.negative_prompt:
        fields[label("hires_negative")] = negative
    if request.hires_cfg_scale != request.cfg_scale:
        fields[label("hires_cfg")] = request.hires_cfg_scale
    if schedule != first[1]:  # the plain schedule after a first pass with another: A1111's Automatic says it
        fields[label("hires_schedule_type")] = schedule or "Automatic"
    if request.hires_resize:
        fields[label("hires_resize_w")] = "%dx%d" % request.hires_resize
    else:
        fields[label("hires_scale")] = request.hires_scale
    if request.hires_steps:
        fields[label("hires_steps")] = request.hires_steps
    fields[label("hires_upscaler")] = request.hires_upscaler
    return fields


def controlnet_fields(request: GenerationRequest, model_labels: list[str]) -> dict:
    """`ControlNet N` fields of the PNG text, as A1111's extension writes them (the unit's text: control/units.py);
    `model_labels`: each unit's model as the text names it."""
    return {label("controlnets").format(i): unit_text(unit, model, request.control_mode,
                                                      min(request.width, request.height))
            for i, (unit, model) in enumerate(zip(request.controlnets, model_labels))}


def safety_field() -> dict:
    """A black square says why in any PNG-info viewer, not only in our JSON chunk."""
    return {SAFETY: "blacked out"}


def vqgan_fields(values: dict) -> dict:
    """A VQGAN-CLIP image's fields by their labels (A1111's where they mean the same: Steps are its iterations,
    Sampler its optimizer), in the order of `values` (VQGAN_LABELS' names; None: not written)."""
    return {VQGAN_LABELS[name]: value for name, value in values.items() if value is not None}


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


def from_png(path: str | Path, lenient: bool = False, styles: StyleBook | None = None) -> Infotext:
    """The request fields of an image's parameters (`read_infotext`, then `request_fields`); with `styles` (a
    styles file's), the styles found in its prompts taken out of them and named in `styles`, as A1111's paste does,
    so a rerun with them applies each once."""
    text, ours = read_infotext(path)
    info = request_fields(parse_a1111_parameters(text), ours, lenient)
    if styles is not None:
        info.fields = take_out(info.fields, styles)
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
