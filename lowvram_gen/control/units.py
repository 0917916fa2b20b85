"""A request's ControlNet units, validated once, and how A1111's sd-webui-controlnet writes them in a PNG.

A unit is one ControlNet with its control image, as a unit of A1111's extension: the model, the image,
the weight (A1111's "Control Weight", 0-2), the guidance start and end (the fraction of the steps it acts
in, diffusers' `control_guidance_start/end`) and the preprocessor with its thresholds. The request's
`control_mode` applies to all of them (in A1111 each unit has its own; diffusers has one `guess_mode`
per call, so several units must share it).

Control modes, as A1111's extension means them (its ControlMode; the per-output scales, the CFG halves and the
guidance start/end steps are control/weights.py's numbers, engines/sd/controlnet.plan applies them):
- "balanced": the ControlNet on both halves of the CFG batch at the unit's weight: diffusers' default.
- "prompt" ("My prompt is more important"): its outputs scaled by 0.825^(12-i) (soft injection), both halves.
- "controlnet" ("ControlNet is more important"): those scaled outputs on the conditional half only (diffusers'
  `guess_mode` runs it there; its own 10^(-1+i/(n-1)) scales are replaced by the extension's).

The PNG text (`ControlNet 0: "Module: canny, Model: ..., Weight: 1, ..."`) is the extension's own
(scripts/infotext.py serialize_unit: the unit's fields in its order, `Field Name: value`, hidden slider
values left out), so A1111's PNG Info and Civitai read it; `unit_from_text` reads it back, the control
image excepted: a PNG does not hold it. The `ControlNet N` labels are a1111/fields.py's (a1111/infotext.py writes
and reads them); the extension's API units are a1111/controlnet_units.py's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from lowvram_gen.control.resize import CONTROL_RESIZE, check_control_resize
from lowvram_gen.errors import InvalidRequest

MAX_UNITS = 4  # A1111's default number of ControlNet units is 3; more is a typo's cost, not a card's
MAX_WEIGHT = 2.0  # A1111's "Control Weight" slider maximum
PREPROCESSORS = ("none", "canny")  # need no model: always there
# A1111's other preprocessors, not built here: named so the refusal can say so (the built model-based ones are
# control/detectors.py NAMES, run through controlnet_aux when it is installed)
NOT_BUILT = ("depth_leres", "depth_leres++", "depth_zoe", "depth_anything", "depth_anything_v2", "dw_openpose_full",
             "normal_bae", "normal_midas", "softedge_hed", "softedge_hedsafe", "softedge_pidinet", "softedge_pidisafe",
             "scribble_hed", "scribble_pidinet", "scribble_xdog", "mlsd", "seg_ofade20k", "seg_ofcoco", "seg_ufade20k",
             "tile_resample", "shuffle", "mediapipe_face", "inpaint_only", "reference_only", "lineart_anime_denoise")
CANNY_DEFAULTS = (100, 200)  # the extension's canny "Low/High Threshold" slider defaults (range 1-255)
CONTROL_MODES = {"balanced": "Balanced", "prompt": "My prompt is more important",
                 "controlnet": "ControlNet is more important"}


@dataclass(frozen=True)
class ControlNetUnit:
    """One ControlNet and its control image. `image`: a path; None only before validation (a unit read from a
    PNG, waiting for its --control-image)."""

    model: str
    image: str | None = None
    weight: float = 1.0
    guidance_start: float = 0.0
    guidance_end: float = 1.0
    preprocessor: str = "none"
    canny_low: int = CANNY_DEFAULTS[0]
    canny_high: int = CANNY_DEFAULTS[1]
    resize_mode: str = "resize"  # control/resize.py: resize (Just Resize), crop (Crop and Resize), fill (Resize and
    # Fill): how a control image of another aspect ratio is brought to the job's size


def parse_controlnet_flag(value: str) -> ControlNetUnit:
    """`--controlnet MODEL[:WEIGHT[:START[:END]]]`: up to three trailing numbers; anything else is the model
    (a Windows path `C:\\...` keeps its drive letter)."""
    text = str(value).strip()
    if not text:
        raise InvalidRequest("--controlnet", value, "give MODEL or MODEL:WEIGHT[:START[:END]]")
    parts = text.split(":")
    numbers: list[str] = []
    while len(parts) > 1 and len(numbers) < 3 and re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)\s*", parts[-1]):
        numbers.insert(0, parts.pop())
    model = ":".join(parts).strip()
    if not model:
        raise InvalidRequest("--controlnet", value, "give MODEL or MODEL:WEIGHT[:START[:END]]")
    names = ("weight", "guidance_start", "guidance_end")
    return ControlNetUnit(model, **{n: float(v) for n, v in zip(names, numbers)})


def parse_preprocessor_flag(value: str) -> dict:
    """`--preprocessor none`, `canny`, or `canny:LOW:HIGH` (the extension's thresholds) -> unit fields."""
    name, *numbers = [p.strip() for p in str(value).split(":")]
    fields: dict = {"preprocessor": name}
    if numbers:
        if name.lower() != "canny" or len(numbers) != 2:
            raise InvalidRequest("--preprocessor", value,
                                 "thresholds go with canny only: canny:LOW:HIGH, e.g. canny:100:200")
        fields["canny_low"], fields["canny_high"] = numbers
    return fields


def _number(field: str, value: Any, lo: float, hi: float) -> float:
    allowed = f"a number from {lo:g} to {hi:g}"
    if isinstance(value, bool):
        raise InvalidRequest(field, value, allowed)
    try:
        number = float(str(value).strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise InvalidRequest(field, value, allowed) from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise InvalidRequest(field, value, allowed)
    return number


def _whole(field: str, value: Any, lo: int, hi: int) -> int:
    number = _number(field, value, lo, hi)
    if number != int(number):
        raise InvalidRequest(field, value, f"a whole number from {lo} to {hi}")
    return int(number)


def check_preprocessor(field: str, value: Any) -> str:
    """'none', 'canny', or A1111's name of a model-based one (control/detectors.py) once it can run here: its
    library installed and its weight files found, said in one sentence otherwise (before anything loads)."""
    from lowvram_gen.control import detectors

    name = str(value or "none").strip().lower()
    if name in PREPROCESSORS:
        return name
    if detectors.canonical(name) is not None:
        return detectors.check(field, name)
    allowed = f"use one of {', '.join(PREPROCESSORS + detectors.NAMES)}"
    if name in NOT_BUILT or name.split("_")[0] in {m.split("_")[0] for m in NOT_BUILT}:
        raise InvalidRequest(field, value, f"not built here; {allowed} (or make the map elsewhere and pass it with "
                                           "none)")
    raise InvalidRequest(field, value, allowed)


def check_control_mode(value: Any) -> str:
    """balanced | prompt | controlnet (also A1111's labels)."""
    text = str(value if value is not None else "balanced").strip()
    by_label = {label.lower(): key for key, label in CONTROL_MODES.items()}
    key = text.lower() if text.lower() in CONTROL_MODES else by_label.get(text.lower())
    if key is None:
        raise InvalidRequest("control mode", value, "use balanced, prompt or controlnet (A1111's Balanced, "
                                                    "My prompt is more important, ControlNet is more important)")
    return key


def check_unit(index: int, unit: Any, check_image: Callable[[str, Any], str],
               image_required: bool = True) -> ControlNetUnit:
    """A unit (or its fields as a mapping, from a JSON line or a form) checked: clear errors naming the unit.
    `check_image(field, path)`: the request's readable-image check (request.check_image_path)."""
    where = f"ControlNet unit {index}"
    if isinstance(unit, Mapping):
        known = set(ControlNetUnit.__dataclass_fields__)
        unknown = sorted(set(unit) - known)
        if unknown:
            raise InvalidRequest(f"{where} field", unknown[0], "allowed fields: " + ", ".join(sorted(known)))
        if not unit.get("model"):
            raise InvalidRequest(f"{where} model", unit.get("model"), "give a ControlNet model (a name in "
                                 "models/ControlNet, a folder, a file or a hub id)")
        unit = ControlNetUnit(**dict(unit))
    if not isinstance(unit, ControlNetUnit):
        raise InvalidRequest(where, unit, "give a ControlNetUnit or its fields as a mapping")
    if not isinstance(unit.model, str) or not unit.model.strip():
        raise InvalidRequest(f"{where} model", unit.model, "give a ControlNet model (a name in models/ControlNet, "
                                                             "a folder, a file or a hub id)")
    image = unit.image
    if image is None or (isinstance(image, str) and not image.strip()):
        if image_required:
            raise InvalidRequest(f"{where} control image", image,
                                 f"ControlNet {unit.model.strip()!r} needs a control image: give --control-image "
                                 "IMAGE (one per --controlnet, in order; a PNG's parameters do not hold it)")
        image = None
    else:
        image = check_image(f"{where} control image", image)
    start = _number(f"{where} guidance start", unit.guidance_start, 0.0, 1.0)
    end = _number(f"{where} guidance end", unit.guidance_end, 0.0, 1.0)
    if start >= end:
        raise InvalidRequest(f"{where} guidance start", start,
                             f"must be below its guidance end ({end:g}): the fraction of the steps it acts in")
    low = _whole(f"{where} canny low threshold", unit.canny_low, 1, 255)
    high = _whole(f"{where} canny high threshold", unit.canny_high, 1, 255)
    if low > high:
        raise InvalidRequest(f"{where} canny low threshold", low, f"must not be above the high threshold ({high})")
    return replace(unit, model=unit.model.strip(), image=image,
                   weight=_number(f"{where} weight", unit.weight, 0.0, MAX_WEIGHT),
                   guidance_start=start, guidance_end=end,
                   preprocessor=check_preprocessor(f"{where} preprocessor", unit.preprocessor),
                   canny_low=low, canny_high=high,
                   resize_mode=check_control_resize(f"{where} resize mode", unit.resize_mode))


def check_units(value: Any, check_image: Callable[[str, Any], str],
                image_required: bool = True) -> tuple[ControlNetUnit, ...]:
    """The request's units: a sequence of units or mappings (none: an empty tuple)."""
    if value is None or value == "" or value == ():
        return ()
    if isinstance(value, (ControlNetUnit, Mapping)):
        value = [value]
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise InvalidRequest("controlnets", value, "give a list of ControlNet units (model, image, weight, ...)")
    units = list(value)
    if len(units) > MAX_UNITS:
        raise InvalidRequest("controlnets", f"<{len(units)} units>", f"at most {MAX_UNITS} ControlNet units")
    return tuple(check_unit(i, u, check_image, image_required) for i, u in enumerate(units))


def _per_unit(flag: str, given: list, count: int, what: str) -> list:
    """A repeatable flag's values, one per unit in order ([] when not given); `--control-resize` alone may be given
    once for all units."""
    if not given:
        return []
    if flag == "--control-resize" and len(given) == 1:
        return given * count
    if len(given) != count:
        extra = " (or once for all)" if flag == "--control-resize" else ""
        raise InvalidRequest(flag, f"{len(given)} given", f"give one per {what}, in order{extra} ({count} unit(s))")
    return given


def _with(units: list, images: list, preprocessors: list, resizes: list) -> tuple[ControlNetUnit, ...]:
    units = [replace(u, image=images[i]) if images else u for i, u in enumerate(units)]
    units = [replace(u, **parse_preprocessor_flag(preprocessors[i])) if preprocessors else u
             for i, u in enumerate(units)]
    return tuple(replace(u, resize_mode=resizes[i]) if resizes else u for i, u in enumerate(units))


def units_from_flags(models: list[str], images: list[str], preprocessors: list[str],
                     resizes: list[str] = ()) -> tuple[ControlNetUnit, ...]:
    """--controlnet, --control-image, --preprocessor and --control-resize (each repeatable, one per unit, in order)
    as units."""
    count = len(models)
    images = _per_unit("--control-image", images, count, "--controlnet")
    if preprocessors and len(preprocessors) != count:
        raise InvalidRequest("--preprocessor", f"{len(preprocessors)} given",
                             f"give none (each unit: none) or one per --controlnet, in order ({count} "
                             "ControlNet(s))")
    resizes = _per_unit("--control-resize", list(resizes), count, "--controlnet")
    return _with([parse_controlnet_flag(m) for m in models], images, preprocessors, resizes)


def with_flags(units: tuple[ControlNetUnit, ...], images: list[str], preprocessors: list[str],
               resizes: list[str] = ()) -> tuple[ControlNetUnit, ...]:
    """A PNG's units (read without their images) given --control-image, --preprocessor and --control-resize, one
    per unit in order."""
    what = "ControlNet unit of the PNG"
    return _with(list(units), _per_unit("--control-image", images, len(units), what),
                 _per_unit("--preprocessor", preprocessors, len(units), what),
                 _per_unit("--control-resize", list(resizes), len(units), what))


# ------------------------------------------------------------------------------------------------ infotext


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def unit_text(unit: ControlNetUnit, model_label: str, control_mode: str, processor_res: int) -> str:
    """The extension's `ControlNet N` value for `unit` (its fields in its order; hidden slider values left out).
    `model_label`: the model as the extension lists it, `name [hash]` for a file. What ran: the control image
    brought to the job's size by the unit's resize mode, the preprocessor at that size (Pixel Perfect, `processor_res` its
    shorter side), no low-VRAM mode of the extension's own, the detected map not saved."""
    fields = {"Module": unit.preprocessor, "Model": model_label, "Weight": _shown(unit.weight),
              "Resize Mode": CONTROL_RESIZE[unit.resize_mode], "Low Vram": "False"}
    if unit.preprocessor == "canny":
        fields.update({"Processor Res": str(processor_res), "Threshold A": str(unit.canny_low),
                       "Threshold B": str(unit.canny_high)})
    elif unit.preprocessor != "none":  # a model-based one: its resolution, no thresholds shown
        fields["Processor Res"] = str(processor_res)
    fields.update({"Guidance Start": _shown(unit.guidance_start), "Guidance End": _shown(unit.guidance_end),
                   "Pixel Perfect": "True", "Control Mode": CONTROL_MODES[control_mode], "Hr Option": "Both",
                   "Save Detected Map": "False"})
    return ", ".join(f"{k}: {v}" for k, v in fields.items())


_HASH = re.compile(r"\s*\[[0-9a-fA-F]{8,10}\]\s*$")  # the extension lists files as `name [hash]`


def unit_from_text(key: str, text: str, notes: list[str]) -> tuple[ControlNetUnit, str | None]:
    """(the unit, its control mode key or None) from the extension's `ControlNet N` value, image left out.
    Fields we do not use are said in `notes` where they change the result; the old format (1.1.2xx: `preprocessor: canny, model: ...`) too."""
    pairs = {}
    for item in str(text).split(","):
        name, sep, value = item.partition(":")
        if sep:
            pairs[name.strip().lower()] = value.strip()
    where = f"{key!r} in the image's parameters"
    model = pairs.get("model")
    if not model or model.lower() == "none":
        raise InvalidRequest(where, text, "expected the extension's 'Module: ..., Model: ..., Weight: ...' text")
    model = _HASH.sub("", model)
    module = pairs.get("module", pairs.get("preprocessor", "none"))
    unit = ControlNetUnit(model, weight=_number(f"{where} Weight", pairs.get("weight", 1), 0, MAX_WEIGHT),
                          preprocessor=module)
    if "guidance start" in pairs or "guidance end" in pairs:
        unit = replace(unit, guidance_start=_number(f"{where} Guidance Start", pairs.get("guidance start", 0), 0, 1),
                       guidance_end=_number(f"{where} Guidance End", pairs.get("guidance end", 1), 0, 1))
    elif "starting/ending" in pairs:  # the old format: "starting/ending: (0, 1)" (split by the comma above)
        match = re.search(r"starting/ending:\s*\(([^,]+),\s*([^)]+)\)", str(text))
        if match:
            unit = replace(unit, guidance_start=_number(where, match.group(1), 0, 1),
                           guidance_end=_number(where, match.group(2), 0, 1))
    if module.strip().lower() == "canny":
        unit = replace(unit, canny_low=pairs.get("threshold a", CANNY_DEFAULTS[0]),
                       canny_high=pairs.get("threshold b", CANNY_DEFAULTS[1]))
        try:
            unit = replace(unit, canny_low=int(float(unit.canny_low)), canny_high=int(float(unit.canny_high)))
        except ValueError:
            raise InvalidRequest(f"{where} Threshold A/B", text, "expected whole numbers") from None
    unit = replace(unit, resize_mode=check_control_resize(f"{where} Resize Mode", pairs.get("resize mode")))
    mode = pairs.get("control mode")
    key_mode = None
    if mode is not None:
        labels = {label.lower(): k for k, label in CONTROL_MODES.items()}
        numbers = {"0": "balanced", "1": "prompt", "2": "controlnet"}  # the API's integer form
        key_mode = labels.get(mode.lower()) or numbers.get(mode) or mode
    return unit, key_mode
