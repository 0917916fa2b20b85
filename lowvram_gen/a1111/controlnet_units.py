"""ControlNet units as a batch line or A1111's REST API (or any mapping of request fields) gives them, in A1111's
sd-webui-controlnet API shape too: one parser for both.

`controlnets` is a list of unit objects. Besides the request's own unit fields (control/units.py ControlNetUnit:
model, image, weight, guidance_start, guidance_end, preprocessor, canny_low, canny_high, resize_mode), a unit takes
the names
of A1111's sd-webui-controlnet API (its ControlNetUnit's JSON):
- `module` (the preprocessor), `input_image` (the image), `threshold_a`/`threshold_b` (canny's thresholds; -1,
  the extension's "unset", is the default), `guidance` (its old name of guidance_end), `enabled` (false: the unit
  is left out);
- `control_mode`: per unit there, one per job here (the units must agree); its labels and integer form 0/1/2 too;
- `resize_mode`: Just Resize (0, or 3, its latent variant), Crop and Resize (1), Resize and Fill (2), by name or
  integer (control/resize.py: the unit's `resize_mode`);
- `mask` (empty only: a unit's own mask is not supported) and `hr_option` (Both only: the hires pass gets the
  map too);
- `pixel_perfect`, `processor_res`, `low_vram`/`lowvram` and `save_detected_map`: accepted and not used (the
  preprocessor always runs at the job's size, as Pixel Perfect does; the map is not saved);
- a model as the extension lists it, `name [hash]`, or `None` (no model: refused as a missing one).
The whole A1111 API request shape works too: `"alwayson_scripts": {"controlnet": {"args": [unit, ...]}}`.

A batch line's image is a path; the REST API gives `image=` a function that stores a base64 image as a file
(api/answers.py image_file), called with the field the error should name (`ControlNet unit 0 image`), and
`unit_field` names the extension's JSON key of a refused unit value (a 422's loc).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from lowvram_gen.errors import InvalidRequest

RENAMED = {"module": "preprocessor", "input_image": "image", "threshold_a": "canny_low", "threshold_b": "canny_high",
           "guidance": "guidance_end"}
NOT_USED = frozenset({"pixel_perfect", "processor_res", "low_vram", "lowvram", "save_detected_map"})
BOTH = ("Both", "HiResFixOption.BOTH", "0")
MODES = {"0": "balanced", "1": "prompt", "2": "controlnet"}  # the extension API's integer control modes
_HASH = re.compile(r"\s*\[[0-9a-fA-F]{8,10}\]\s*$")  # the extension lists model files as `name [hash]`
SCRIPT_NAMES = ("controlnet", "ControlNet")


def with_units(fields: Mapping[str, Any], image: Callable[[str, Any], str] | None = None) -> dict:
    """`fields` with `controlnets` (and A1111's `alwayson_scripts`) as the request's unit mappings and
    `control_mode`; other fields as they are. `image(field, value)`: a unit's image value -> a path (None: the
    value is a path already)."""
    out = dict(fields)
    scripts = out.pop("alwayson_scripts", None)
    if scripts is not None:
        if not isinstance(scripts, Mapping) or set(scripts) - set(SCRIPT_NAMES):
            raise InvalidRequest("alwayson_scripts", scripts, 'only {"controlnet": {"args": [unit, ...]}} (A1111\'s '
                                                              "ControlNet extension) runs here")
        script = next(iter(scripts.values()), None)
        args = script.get("args") if isinstance(script, Mapping) else None
        if not isinstance(args, list):
            raise InvalidRequest("alwayson_scripts controlnet", script, 'give {"args": [unit, ...]}')
        if out.get("controlnets"):
            raise InvalidRequest("controlnets", "and alwayson_scripts", "give the units once, in either")
        out["controlnets"] = args
    units = out.get("controlnets")
    if not isinstance(units, list):
        return out  # absent, or not a list: the request's own check says what it wants
    converted, modes = [], set()
    for i, unit in enumerate(units):
        if not isinstance(unit, Mapping):
            converted.append(unit)
            continue
        unit = dict(unit)
        if unit.pop("enabled", True) in (False, "false", "False", 0):
            continue
        where = f"ControlNet unit {i}"
        mode = unit.pop("control_mode", None)
        if mode is not None:
            modes.add(MODES.get(str(mode), mode))
        if unit.pop("mask", None) not in (None, ""):
            raise InvalidRequest(f"{where} mask", "<image>", "a unit's own mask is not supported: leave it out")
        hr_option = unit.pop("hr_option", None)
        if hr_option is not None and str(hr_option) not in BOTH:
            raise InvalidRequest(f"{where} hr_option", hr_option, "Both only (the hires pass gets the map too)")
        for name in NOT_USED:
            unit.pop(name, None)
        for theirs, ours in RENAMED.items():
            if theirs in unit:
                if ours in unit:
                    raise InvalidRequest(f"{where} field", theirs, f"give {ours!r} or {theirs!r}, not both")
                unit[ours] = unit.pop(theirs)
        for threshold in ("canny_low", "canny_high"):
            if unit.get(threshold) in (-1, -1.0, "-1"):  # the extension's "unset": the preprocessor's default
                del unit[threshold]
        if isinstance(unit.get("model"), str):
            unit["model"] = _HASH.sub("", unit["model"])
            if unit["model"].strip() == "None":  # the extension's "no model"
                unit["model"] = ""
        if image is not None:
            unit["image"] = image(f"{where} image", unit.get("image"))
        converted.append(unit)
    out["controlnets"] = converted
    if modes:
        if len(modes) > 1 or (out.get("control_mode") not in (None, *modes)):
            raise InvalidRequest("control_mode", ", ".join(sorted(map(str, modes | {out.get("control_mode")} - {None}))),
                                 "one control mode for every unit of a job (diffusers has one per call)")
        out["control_mode"] = modes.pop()
    return out


# the unit's field as its errors name it (control/units.py, this module) -> the extension's JSON key
UNIT_KEYS = {"image": "image", "control image": "image", "model": "model", "weight": "weight",
             "guidance start": "guidance_start", "guidance end": "guidance_end", "preprocessor": "module",
             "canny low threshold": "threshold_a", "canny high threshold": "threshold_b", "resize mode": "resize_mode",
             "mask": "mask", "hr_option": "hr_option"}
_UNIT = re.compile(r"^ControlNet unit (\d+)(?: (.+))?$")


def unit_field(exc: InvalidRequest) -> str | None:
    """`alwayson_scripts.controlnet.args.N.key` for a refused value of ControlNet unit N (None: not a unit's)."""
    match = _UNIT.match(exc.field)
    if match is None:
        return None
    what = match.group(2) or ""
    key = exc.value if what == "field" and isinstance(exc.value, str) else UNIT_KEYS.get(what)
    return f"alwayson_scripts.controlnet.args.{match.group(1)}" + (f".{key}" if key else "")
