"""The routes of A1111's sd-webui-controlnet extension that its API clients call, answered as the extension
answers them (its scripts/api.py), from our ControlNet models and preprocessors:

- `GET /controlnet/version`: the extension's API version, 2.
- `GET /controlnet/model_list`: "None", the embedded `tiny-controlnet` (for the `tiny` model) and the models in
  models/ControlNet (models/controlnet.py `available()`, the names a job finds them by), a file as `name [hash]`
  (A1111's short hash, as the extension lists it), a diffusers folder by its name; scanned at every call (its
  `update` is always true here).
- `GET /controlnet/module_list`: the preprocessors a unit takes here (none, canny and the model-based ones of
  control/detectors.py) and their sliders.
- `POST /controlnet/detect`: a preprocessor run on base64 images at `controlnet_processor_res` (the shorter side
  of the map; the extension's default 512), the maps answered base64.

The units themselves come with a txt2img/img2img body's `alwayson_scripts` (a1111/api_body.py,
a1111/controlnet_units.py).
No FastAPI here: routes.py serves these.
"""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path
from typing import Any

from lowvram_gen.control.units import CANNY_DEFAULTS, PREPROCESSORS, check_preprocessor
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import as_int

API_VERSION = 2  # the extension's external_code.get_api_version()
DEFAULT_RES, MIN_RES, MAX_RES = 512, 64, 2048  # the extension's Preprocessor Resolution default and slider range
NO_MODEL = "None"  # the extension lists it first: a unit without a model


def version() -> dict:
    return {"version": API_VERSION}


def model_list() -> dict:
    """The extension's model list: "None", then each model as a unit names it (`name [hash]` for a file)."""
    from lowvram_gen.models.controlnet import available, short_hash
    from lowvram_gen.models.tiny import TINY_CONTROLNET

    found = sorted(available().items(), key=lambda item: item[0].lower())
    # the embedded one is a folder once built (listed before it is: its name is what a unit gives)
    return {"model_list": [NO_MODEL, *(name if name == TINY_CONTROLNET or path.is_dir() else
                                       f"{name} [{short_hash(path)}]" for name, path in found)]}


def module_list() -> dict:
    """The preprocessors a unit's `module` takes here, with the extension's detail shape (canny's two sliders; the
    model-based ones' resolution slider). A model-based one is listed whether or not its weights are here: a unit
    naming one whose files are missing is refused saying which and where they were looked for."""
    from lowvram_gen.control import detectors

    low, high = CANNY_DEFAULTS
    sliders = {"none": [], "canny": [
        {"name": "Canny Low Threshold", "value": low, "min": 1, "max": 255, "step": 1},
        {"name": "Canny High Threshold", "value": high, "min": 1, "max": 255, "step": 1}]}
    resolution = [{"name": "Preprocessor Resolution", "value": DEFAULT_RES, "min": MIN_RES, "max": MAX_RES}]
    detail = {name: {"model_free": True, "sliders": sliders[name]} for name in PREPROCESSORS}
    detail.update({name: {"model_free": not detectors.MODULES[name].files, "sliders": resolution}
                   for name in detectors.NAMES})
    return {"module_list": list(detail), "module_detail": detail}


def _number(body: dict, name: str, default: int, lo: int, hi: int, unset: tuple = (None, -1, -1.0)) -> int:
    value = body.get(name)
    return default if value in unset else as_int(name, value, lo, hi)


def detect(body: Any) -> dict:
    """The maps of `controlnet_input_images` (webuiapi sends `controlnet_images`) by `controlnet_module`, each at
    `controlnet_processor_res` on its shorter side, base64 PNG; canny takes `controlnet_threshold_a/b` (-1: 100 and
    200, the extension's defaults)."""
    from PIL import Image

    from lowvram_gen.api.answers import image_file
    from lowvram_gen.control.preprocess import control_map

    if not isinstance(body, dict):
        raise InvalidRequest("body", body, "send a JSON object: controlnet_module, controlnet_input_images, ...")
    module = check_preprocessor("controlnet_module", body.get("controlnet_module"))
    images = body.get("controlnet_input_images") or body.get("controlnet_images")
    if not isinstance(images, list) or not images:
        raise InvalidRequest("controlnet_input_images", images, "send a list of base64 images")
    if body.get("controlnet_masks"):
        raise InvalidRequest("controlnet_masks", "<images>", "no preprocessor here takes a mask: leave it out")
    res = _number(body, "controlnet_processor_res", DEFAULT_RES, MIN_RES, MAX_RES)
    low = _number(body, "controlnet_threshold_a", CANNY_DEFAULTS[0], 1, 255)
    high = _number(body, "controlnet_threshold_b", CANNY_DEFAULTS[1], 1, 255)
    if module == "canny" and low > high:
        raise InvalidRequest("controlnet_threshold_a", low, f"must not be above controlnet_threshold_b ({high})")
    maps = []
    with tempfile.TemporaryDirectory(prefix="lowvram-gen-detect-") as folder:
        for i, value in enumerate(images):
            path = image_file(value, f"controlnet_input_images.{i}", Path(folder))
            with Image.open(path) as im:
                w, h = im.size
            k = res / min(w, h)
            made = control_map(path, max(1, round(w * k)), max(1, round(h * k)), module, low, high)
            out = io.BytesIO()
            made.save(out, format="PNG")
            maps.append(base64.b64encode(out.getvalue()).decode("ascii"))
    return {"images": maps, "info": "Success"}
