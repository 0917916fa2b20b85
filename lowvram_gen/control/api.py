"""ControlNet units as a batch line (or any mapping of request fields) gives them, A1111's API shape included.

`controlnets` is a list of unit objects. Besides the request's own unit fields (control/units.py ControlNetUnit:
model, image, weight, guidance_start, guidance_end, preprocessor, canny_low, canny_high), a unit takes the names
of A1111's sd-webui-controlnet API (its ControlNetUnit's JSON): `module` (the preprocessor), `input_image`
(the image: a path here, never base64 data), `threshold_a`/`threshold_b` (canny's thresholds), `enabled` (false:
the unit is left out), `control_mode` (per unit there, one per job here: the units must agree; its integer form
0/1/2 too), and `resize_mode` (Just Resize only, the one run here), `pixel_perfect`, `processor_res`, `low_vram`
and `save_detected_map`, accepted and not used (the preprocessor always runs at the job's size, as Pixel Perfect
does; the map is not saved). The whole A1111 API request shape works too:
`"alwayson_scripts": {"controlnet": {"args": [unit, ...]}}`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from lowvram_gen.errors import InvalidRequest

RENAMED = {"module": "preprocessor", "input_image": "image", "threshold_a": "canny_low", "threshold_b": "canny_high"}
NOT_USED = frozenset({"pixel_perfect", "processor_res", "low_vram", "save_detected_map"})
JUST_RESIZE = ("Just Resize", "0", "ResizeMode.RESIZE", "just_resize")
MODES = {"0": "balanced", "1": "prompt", "2": "controlnet"}  # the extension API's integer control modes
_HASH = re.compile(r"\s*\[[0-9a-fA-F]{8,10}\]\s*$")  # the extension lists model files as `name [hash]`


def with_units(fields: Mapping[str, Any]) -> dict:
    """`fields` with `controlnets` (and A1111's `alwayson_scripts`) as the request's unit mappings and
    `control_mode`; other fields as they are."""
    out = dict(fields)
    scripts = out.pop("alwayson_scripts", None)
    if scripts is not None:
        if not isinstance(scripts, Mapping) or set(scripts) - {"controlnet", "ControlNet"}:
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
        mode = unit.pop("control_mode", None)
        if mode is not None:
            modes.add(MODES.get(str(mode), mode))
        resize = unit.pop("resize_mode", None)
        if resize is not None and str(resize) not in JUST_RESIZE:
            raise InvalidRequest(f"ControlNet unit {i} resize_mode", resize, "Just Resize only (the control image "
                                                                             "is resized to the job's size)")
        for name in NOT_USED:
            unit.pop(name, None)
        for theirs, ours in RENAMED.items():
            if theirs in unit:
                if ours in unit:
                    raise InvalidRequest(f"ControlNet unit {i} field", theirs, f"give {ours!r} or {theirs!r}, not both")
                unit[ours] = unit.pop(theirs)
        if isinstance(unit.get("model"), str):
            unit["model"] = _HASH.sub("", unit["model"])
        converted.append(unit)
    out["controlnets"] = converted
    if modes:
        if len(modes) > 1 or (out.get("control_mode") not in (None, *modes)):
            raise InvalidRequest("control_mode", ", ".join(sorted(map(str, modes | {out.get("control_mode")} - {None}))),
                                 "one control mode for every unit of a job (diffusers has one per call)")
        out["control_mode"] = modes.pop()
    return out
