"""A1111's Extras routes, `/sdapi/v1/extra-single-image` and `/sdapi/v1/extra-batch-images`: our upscalers
(upscale/upscalers.py, the Upscale tab's and `lowvram-gen upscale`'s) with A1111's request fields and answers.

A1111's rules, as its postprocessing upscale script and its `Upscaler.upscale` keep them:
- resize_mode 0 upscales by `upscaling_resize`; 1 to `upscaling_resize_w` x `upscaling_resize_h`: by the larger of
  the two ratios, then (`upscaling_crop`) centred on a canvas of exactly that size;
- the size an upscaler reaches is the scaled size rounded down to a multiple of 8;
- `upscaler_1` "None" (A1111's default) leaves the image as it is; `upscaler_2` at `extras_upscaler_2_visibility`
  above 0 is blended over the first one's result;
- the answer's image keeps the source PNG's text chunks and adds `postprocessing` (the infotext); `html_info` is
  that text as HTML; a batch answers the last image's.

Images come and go as base64 only (a path is never read: FAULTS 33/34); an upscaler is a name /sdapi/v1/upscalers
lists (a path only inside --api-allow-paths). Face restoration (`gfpgan_visibility`, `codeformer_visibility` above 0)
is not built: refused in one sentence, 422 naming the field, as a txt2img field is refused. Sizes are capped: a side
of MAX_SIDE_OUT px at most, in and out (Pillow refuses a decompression bomb before decoding it), MAX_IMAGES images.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lowvram_gen.a1111 import api_names
from lowvram_gen.a1111.upscaler_names import NONE, check_upscaler
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_BATCH, MAX_SIDE, as_bool, as_float, as_int
from lowvram_gen.upscale.command import MAX_SCALE

MAX_SIDE_OUT = MAX_SIDE * 2  # px a side, as `lowvram-gen upscale` caps its result
MAX_IMAGES = MAX_BATCH  # images of one extra-batch-images request
FACES = "face restoration (GFPGAN, CodeFormer) is not built in lowvram-gen: send 0 (GET /sdapi/v1/face-restorers " \
        "lists none)"
# A1111's ExtrasBaseRequest defaults
DEFAULTS: dict[str, Any] = {
    "resize_mode": 0, "show_extras_results": True, "gfpgan_visibility": 0, "codeformer_visibility": 0,
    "codeformer_weight": 0, "upscaling_resize": 2, "upscaling_resize_w": 512, "upscaling_resize_h": 512,
    "upscaling_crop": True, "upscaler_1": NONE, "upscaler_2": NONE, "extras_upscaler_2_visibility": 0,
    "upscale_first": False,
}


@dataclass(frozen=True)
class Spec:
    """What an extras body asks for, checked."""

    resize_mode: int
    scale: float
    width: int
    height: int
    crop: bool
    upscaler_1: str | None  # None: A1111's "None", no upscale
    upscaler_2: str | None
    visibility_2: float


def _upscaler(value: Any, field: str, allowed: tuple[Path, ...]) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", NONE.lower())):
        return None
    name = api_names.check_upscaler(value, field, allowed)  # a listed name, or a path inside an allowed folder
    return check_upscaler(name, field)  # an image upscaler: the latent ones work inside a hires pass only


def read_spec(body: Any, allowed: tuple[Path, ...] = ()) -> Spec:
    """The checked fields of an extras body (A1111's defaults for those left out or null)."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", body, "send a JSON object of A1111's extras fields")
    got = {**DEFAULTS, **{k: v for k, v in body.items() if k in DEFAULTS and v is not None}}
    for field in ("gfpgan_visibility", "codeformer_visibility"):
        if as_float(field, got[field], 0.0, 1.0) != 0:
            raise InvalidRequest(field, got[field], FACES)
    as_float("codeformer_weight", got["codeformer_weight"], 0.0, 1.0)  # CodeFormer's: nothing to weigh without it
    as_bool("show_extras_results", got["show_extras_results"])  # A1111 sends the images whatever it says
    as_bool("upscale_first", got["upscale_first"])  # before face restoration, which is not built
    mode = as_int("resize_mode", got["resize_mode"], 0, 1, " (0: by upscaling_resize, 1: to upscaling_resize_w x h)")
    scale = as_float("upscaling_resize", got["upscaling_resize"], 0.0, MAX_SCALE)
    if scale <= 0:
        raise InvalidRequest("upscaling_resize", got["upscaling_resize"], f"a factor above 0, at most {MAX_SCALE:g}")
    width = as_int("upscaling_resize_w", got["upscaling_resize_w"], 1, MAX_SIDE_OUT)
    height = as_int("upscaling_resize_h", got["upscaling_resize_h"], 1, MAX_SIDE_OUT)
    first, second = (_upscaler(got[name], name, allowed) for name in ("upscaler_1", "upscaler_2"))
    return Spec(mode, scale, width, height, as_bool("upscaling_crop", got["upscaling_crop"]), first, second,
                as_float("extras_upscaler_2_visibility", got["extras_upscaler_2_visibility"], 0.0, 1.0))


def read_image(value: Any, field: str):
    """(RGB-or-RGBA PIL image, its text chunks) of a base64 image; a clear error naming `field` otherwise."""
    from PIL import Image, UnidentifiedImageError

    from lowvram_gen.api.answers import _shown, image_bytes
    from lowvram_gen.request import unreadable_image

    data = image_bytes(value, field)
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if max(opened.size) > MAX_SIDE_OUT:
                raise InvalidRequest(field, _shown(value), f"is {opened.width}x{opened.height}; at most {MAX_SIDE_OUT} "
                                                           "px a side")
            text = {k: v for k, v in (getattr(opened, "text", None) or {}).items() if isinstance(v, str)}
            image = opened.convert("RGBA" if "A" in opened.getbands() else "RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(field, _shown(value), unreadable_image(exc)) from None
    return image, text


def _reached(size: tuple[int, int], scale: float) -> tuple[int, int]:
    """The size A1111's upscalers reach: the scaled size rounded down to a multiple of 8."""
    return int((size[0] * scale) // 8 * 8), int((size[1] * scale) // 8 * 8)


Upscale = Callable[[Any, tuple[int, int], str], Any]  # (image, size, upscaler name) -> image at that size


def process(image, spec: Spec, upscale: Upscale, field: str = "image"):
    """(the image as A1111's Extras upscale leaves it, the infotext's fields in A1111's order)."""
    from PIL import Image

    info: dict[str, str] = {}
    if spec.upscaler_1 is None:
        return image, info
    if spec.resize_mode == 1:
        scale = max(spec.width / image.width, spec.height / image.height)
        info["Postprocess upscale to"] = f"{spec.width}x{spec.height}"
    else:
        scale = spec.scale
        info["Postprocess upscale by"] = f"{scale:g}"
    size = _reached(image.size, scale)
    if min(size) < 8 or max(size) > MAX_SIDE_OUT:
        raise InvalidRequest(field, f"{image.width}x{image.height}", f"x{scale:g} is {size[0]}x{size[1]}: an "
                                                                    f"upscaled side must be 8 to {MAX_SIDE_OUT} px")

    def one(name: str):
        out = upscale(image, size, name)
        if spec.resize_mode == 1 and spec.crop:
            canvas = Image.new(out.mode, (spec.width, spec.height))
            canvas.paste(out, (spec.width // 2 - out.width // 2, spec.height // 2 - out.height // 2))
            out = canvas
        return out

    result = one(spec.upscaler_1)
    if spec.resize_mode == 1 and spec.crop:
        info["Postprocess crop to"] = f"{result.width}x{result.height}"
    info["Postprocess upscaler"] = spec.upscaler_1
    if spec.upscaler_2 is not None and spec.visibility_2 > 0:
        second = one(spec.upscaler_2)
        result = Image.blend(result, second.convert(result.mode), spec.visibility_2)
        info["Postprocess upscaler 2"] = spec.upscaler_2
    return result, info


def infotext(info: dict[str, str]) -> str:
    """A1111's `Key: value, ...` line, a value with a comma, colon or quote quoted as its infotext quotes it."""
    import json

    def quoted(text: str) -> str:
        return json.dumps(text, ensure_ascii=False) if any(c in text for c in ',:"\n') else text

    return ", ".join(f"{key}: {quoted(str(value))}" for key, value in info.items())


def html_info(text: str) -> str:
    """A1111's `plaintext_to_html`: each line escaped, joined with <br>, in one paragraph."""
    return "<p>" + "<br>\n".join(html.escape(line) for line in text.split("\n")) + "</p>"


def encoded(image, chunks: dict[str, str], text: str) -> str:
    """The image as base64 PNG bytes with the source's text chunks and A1111's `postprocessing` one."""
    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    for key, value in {**chunks, **({"postprocessing": text} if text else {})}.items():
        meta.add_itxt(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=meta)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _sources(body: dict, batch: bool) -> list[tuple[Any, str]]:
    """(base64 value, its JSON field) of each image a body sends."""
    if not batch:
        if body.get("image") in (None, ""):
            raise InvalidRequest("image", body.get("image"), "send the image to upscale, base64 (PNG, JPEG or WebP)")
        return [(body["image"], "image")]
    items = body.get("imageList")
    if not isinstance(items, list) or not items:
        raise InvalidRequest("imageList", items if not isinstance(items, str) else "<text>",
                             'send a list of {"data": base64 image, "name": file name}')
    if len(items) > MAX_IMAGES:
        raise InvalidRequest("imageList", f"<{len(items)} images>", f"at most {MAX_IMAGES} images a request")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "data" not in item:
            raise InvalidRequest(f"imageList.{i}", "<item>", 'each item is {"data": base64 image, "name": file name}')
        out.append((item["data"], f"imageList.{i}.data"))
    return out


def run(body: Any, batch: bool, upscale_all: Callable[[Callable[[Upscale], Any]], Any],
        allowed: tuple[Path, ...] = ()) -> dict:
    """The answer of an extras body (`batch`: extra-batch-images). Every field and image is checked before any
    upscaler runs; `upscale_all(work)` runs `work(upscale)` holding the GPU (the Session's lock)."""
    spec = read_spec(body, allowed)
    images = [(*read_image(value, field), field) for value, field in _sources(body, batch)]

    def work(upscale: Upscale):
        return [(process(image, spec, upscale, field), chunks) for image, chunks, field in images]

    done = upscale_all(work) if spec.upscaler_1 is not None else work(None)
    encoded_images, text = [], ""
    for (image, info), chunks in done:
        text = infotext(info)
        encoded_images.append(encoded(image, chunks, text))
    answer = {"html_info": html_info(text)}
    return {**answer, "images": encoded_images} if batch else {**answer, "image": encoded_images[0]}


def session_upscale(session) -> Callable[[Callable[[Upscale], Any]], Any]:
    """`upscale_all` on a Session: its lock held for the whole request (one GPU job at a time, as generation), its
    device probed once, and the upscalers of upscale/upscalers.py (tiles halved on out-of-memory)."""
    from lowvram_gen.upscale.upscalers import upscale_images

    def upscale_all(work):
        with session.lock:
            device = session.device().torch_device
            return work(lambda image, size, name: upscale_images([image], size, name, device)[0])

    return upscale_all
