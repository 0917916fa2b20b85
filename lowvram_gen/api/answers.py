"""What the API answers, in A1111's shapes: base64 images, the `info` JSON string, PNG Info, error bodies.

- Images are the saved PNG files' bytes, base64 (no data: prefix, as A1111 sends them): each carries its
  `parameters` text, as A1111's API images carry theirs, and our `lowvram_gen` JSON chunk.
- `info` is a JSON *string* (A1111's `Processed.js()`): prompt, seeds, size, sampler, `infotexts` (each image's
  PNG `parameters` text, exactly), job_timestamp, version... plus `warnings` (the fields not used, what the job
  said) and `what_ran` (the job's summary: the preset and every attempt).
- A value the request refuses: 422 with FastAPI's validation body, `{"detail": [{"type", "loc", "msg",
  "input"}]}`, which A1111 answers for a value its model refuses; the message is ours (it names the value and
  what is allowed). Any other error: A1111's own error body, `{"error", "detail", "body", "errors"}`.
- Base64 images come in with or without a `data:image/...;base64,` prefix, as A1111 takes them.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import time
from pathlib import Path
from typing import Any

from lowvram_gen.a1111.fields import BY_NAME, VAE_HASH, api_key, label
from lowvram_gen.errors import InvalidRequest, LowVramError
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.prompting.styles import take_out

_DATA_URL = re.compile(r"^data:[\w/+.-]+(;[\w=.-]+)*;base64,", re.IGNORECASE)
_SIZE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def image_bytes(value: Any, field: str) -> bytes:
    """The bytes of a base64 image (a data: URL prefix is allowed); a clear error for anything else."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field, _shown(value), "send a base64 image (PNG or JPEG; a data: URL works too)")
    text = _DATA_URL.sub("", value.strip())
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(field, _shown(value), "not base64: send the image's bytes base64-encoded (a data: "
                                                   "URL works too)") from None


def image_file(value: Any, field: str, folder: Path) -> str:
    """Write a base64 image into `folder` (a file named for its format); the request checks it as any path."""
    from PIL import Image, UnidentifiedImageError

    from lowvram_gen.request import unreadable_image

    data = image_bytes(value, field)
    try:
        with Image.open(io.BytesIO(data)) as image:
            suffix = "." + (image.format or "png").lower()
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(field, _shown(value), unreadable_image(exc)) from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{re.sub(r'[^A-Za-z0-9_]+', '-', field)}-{time.monotonic_ns()}{suffix}"
    path.write_bytes(data)
    return str(path)


def _shown(value: Any) -> Any:
    """A base64 value as an error names it: its start and its length, not kilobytes of text."""
    return f"<{len(value)} characters: {value[:24]}...>" if isinstance(value, str) and len(value) > 40 else value


def encoded(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode("ascii")


def info(request, images: list[str], kind: str, model_name: str, warnings: list[str], what_ran: str,
         version: str, timestamp: str | None = None) -> str:
    """A1111's `info` string of a job that saved `images` (paths) from `request` (validated)."""
    texts, seeds, subseeds = [], [], []
    for i, path in enumerate(images):
        text, ours = read_png_metadata(path)
        texts.append(text or "")
        fields = parse_a1111_parameters(text or "")
        seed = (ours or {}).get("seed")
        seeds.append(seed if isinstance(seed, int) else _int(fields.get(label("seed")), request.seed))
        subseeds.append(_int(fields.get(label("subseed")), request.subseed_for(i) if request.subseed >= 0 else -1))
    first = parse_a1111_parameters(texts[0]) if texts else {}
    standard = {"prompt", "negative_prompt", *map(label, ("steps", "sampler", "cfg_scale", "seed", "width", "model"))}
    count = len(images)
    key = api_key  # A1111's answer names the request's fields as its body does
    answer = {
        key("prompt"): request.prompt, "all_prompts": [request.prompt] * count,
        key("negative_prompt"): request.negative_prompt, "all_negative_prompts": [request.negative_prompt] * count,
        key("seed"): seeds[0] if seeds else request.seed, "all_seeds": seeds,
        key("subseed"): subseeds[0] if subseeds else request.subseed, "all_subseeds": subseeds,
        key("subseed_strength"): request.subseed_strength, key("width"): request.width, key("height"): request.height,
        key("sampler"): first.get(label("sampler"), request.sampler),
        key("schedule_type"): first.get(label("schedule_type")),
        # the numbers that ran, as the image says them: a body without steps / CFG runs its model family's
        key("cfg_scale"): _number(first.get(label("cfg_scale")), request.cfg_scale),
        key("steps"): _int(first.get(label("steps")), request.steps), key("batch_size"): request.batch_size,
        BY_NAME["restore_faces"].api: False, "face_restoration_model": None, "sd_model_name": model_name,
        "sd_model_hash": None, "sd_vae_name": first.get(label("vae")), "sd_vae_hash": first.get(VAE_HASH),
        key("seed_resize_from_w"): request.seed_resize_from_w or -1,
        key("seed_resize_from_h"): request.seed_resize_from_h or -1,
        key("strength"): request.strength if kind == "img2img" else (request.hires_denoise if request.hires else None),
        "extra_generation_params": {k: v for k, v in first.items() if k not in standard},
        "index_of_first_image": 0, "infotexts": texts, BY_NAME["styles"].api: list(request.styles),
        "job_timestamp": timestamp or time.strftime("%Y%m%d%H%M%S"), "clip_skip": request.clip_skip,
        "is_using_inpainting_conditioning": False, "version": version,
        "warnings": warnings, "what_ran": what_ran,
    }
    return json.dumps(answer, ensure_ascii=False)


def _int(value: Any, default: int) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _number(value: Any, default: float | None) -> float | None:
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return default


def png_info(value: Any, styles=None) -> dict:
    """/png-info's answer for a base64 image: `info` (its parameters text, "" without one), `items` (its other
    text chunks: our JSON record), `parameters` (the text's fields as A1111's parser gives them: with `styles`, a
    styles file's StyleBook, the styles found taken out of the prompts and named in "Styles array", as A1111's)."""
    from PIL import Image, UnidentifiedImageError

    from lowvram_gen.request import unreadable_image

    data = image_bytes(value, "image")
    try:
        with Image.open(io.BytesIO(data)) as image:
            chunks = {k: v for k, v in (getattr(image, "text", None) or image.info).items() if isinstance(v, str)}
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidRequest("image", _shown(value), unreadable_image(exc)) from None
    text = chunks.pop("parameters", "") or ""
    parameters = a1111_parameters(text) if text.strip() else {}
    if parameters and styles is not None:
        parameters = _without_styles(parameters, styles)
    return {"info": text, "items": chunks, "parameters": parameters}


# A1111's parser's keys of the prompts -> the request's (prompting/styles.take_out reads the request's)
_PROMPTS = {"Prompt": "prompt", "Negative prompt": "negative_prompt", "Hires prompt": "hires_prompt",
            "Hires negative prompt": "hires_negative"}


def _without_styles(parameters: dict, book) -> dict:
    taken = take_out({ours: parameters[theirs] for theirs, ours in _PROMPTS.items() if theirs in parameters}, book)
    if "styles" not in taken:  # the hires prompts hold other styles: nothing taken out, as A1111
        return parameters
    out = {**parameters, **{theirs: taken[ours] for theirs, ours in _PROMPTS.items() if theirs in parameters}}
    return {**out, "Styles array": list(taken["styles"])}


def a1111_parameters(text: str) -> dict:
    """A parameters text as A1111's parser answers it: "Prompt", "Negative prompt", then each field as text, a
    "WxH" size as "<key>-1" and "<key>-2"."""
    fields = parse_a1111_parameters(text)
    out = {"Prompt": fields.pop("prompt"), "Negative prompt": fields.pop("negative_prompt")}
    for key, value in fields.items():
        size = _SIZE.match(str(value))
        if size:
            out[f"{key}-1"], out[f"{key}-2"] = size.group(1), size.group(2)
        else:
            out[key] = value
    return out


def validation_error(exc: InvalidRequest, field: str | None) -> dict:
    """FastAPI's (and so A1111's) 422 body for one refused value of JSON `field` (None: of the body), with our
    message."""
    loc = ["body", *(int(p) if p.isdigit() else p for p in field.split("."))] if field else ["body"]
    value = exc.value if isinstance(exc.value, (str, int, float, bool, type(None))) else repr(exc.value)
    return {"detail": [{"type": "value_error", "loc": loc, "msg": str(exc), "input": value}]}


def error_body(exc: BaseException | str, detail: str | None = None) -> dict:
    """A1111's error body (its API's exception handler): the error's type, `detail`, an empty `body`, and the
    message in `errors`."""
    if isinstance(exc, str):
        return {"error": "HTTPException", "detail": detail if detail is not None else exc, "body": "", "errors": exc}
    message = str(exc)
    return {"error": type(exc).__name__, "detail": message if detail is None else detail, "body": "",
            "errors": message}


def status_of(exc: BaseException) -> int:
    """The HTTP status of an error: 422 for bad input (our exit code 2: an unknown model, a job that does not fit
    the RAM), 500 for a job that failed (out of memory at every step, a write error) and for a bug."""
    return 422 if isinstance(exc, LowVramError) and exc.exit_code == 2 else 500
