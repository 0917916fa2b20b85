"""`POST /lowvram/v1/video`: a video clip through the REST API (issue 33). A1111 has no video route, so this one lives
under our own prefix, with our own JSON body, beside A1111's /sdapi/v1 routes on the same server (docs/api-video.md).

It is one of the API's routes in everything but its body: the same route class (api/routes.py: HTTP Basic auth
checked before the body is read, the body-size limit, the JSON parsed once with limits: api/guard.py, the --api-log
line, A1111's error bodies), the same queue (`ApiContext.take_slot`: --queue-size) and the same job registry and
Session lock as the image routes and the web UI (`routes._run`), so /sdapi/v1/progress follows its steps and
/sdapi/v1/interrupt stops it at its next step, answering the clip of what finished.

The body (every field optional but `prompt`; null is the default):
    prompt, negative_prompt, frames (0: the model's own count), fps, width, height (the model's own size when both
    are left out), steps, cfg_scale, cfg_scale_2 (Wan 2.2 A14B's low-noise expert), seed (-1: random),
    sampler_name, model (a checkpoint of GET /sdapi/v1/sd-models by its title or name: never a path of the server's;
    default the API's model), init_image (a base64 image, as img2img's: image-to-video), save_frames (the frames as
    PNGs too), allow_upscale (a lower resolution with the frames upscaled after is a rung of the ladder).
The answer: {"video": base64 of the clip, "format": "mp4" or "webp", "videos": [base64 of each clip, ...] (only
when a job made more than one: a batch count), "frames": [base64 PNG, ...] (with save_frames),
"info": {the parameters that ran, seed, preset, attempts, warnings, what_ran, ...}}.

A value refused is a 422 in FastAPI's validation shape whose `loc` names the body's field (`["body", "frames"]`),
as the image routes answer; an unknown field is refused too (this is our own route: a typo would make another clip
than asked, and no client of A1111's sends this body).

This module does not import routes.py (routes.py mounts it): what it needs of it is handed to `build_router`.
FastAPI is imported there too, so importing this module loads neither FastAPI nor torch.

(No `from __future__ import annotations`: FastAPI reads the route's annotations.)
"""

import tempfile
from pathlib import Path
from typing import Any, Callable

from lowvram_gen.a1111.api_names import MODELS, refused
from lowvram_gen.api import answers, listings
from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.request import GenerationRequest

PREFIX = "/lowvram/v1"
ROUTE = "/video"
KIND = "video"  # the job's name in the registry and on the console ("API video")

# the body's fields -> the request's; the message names of the request's checks -> the body's fields
FIELDS = {"prompt": "prompt", "negative_prompt": "negative_prompt", "frames": "frames", "fps": "fps",
          "width": "width", "height": "height", "steps": "steps", "cfg_scale": "cfg_scale",
          "cfg_scale_2": "cfg_scale_2", "seed": "seed", "sampler_name": "sampler", "model": "model",
          "init_image": "init_image", "save_frames": "save_frames", "allow_upscale": "allow_upscale"}
_SAID = {"negative prompt": "negative_prompt", "cfg scale": "cfg_scale", "cfg scale 2": "cfg_scale_2",
         "sampler": "sampler_name", "schedule type": "sampler_name", "init image": "init_image",
         "save frames": "save_frames", "allow upscale": "allow_upscale", "size": "width"}
_FORMATS = {".mp4": "mp4", ".webp": "webp"}


_BODY_NAMES = {ours: theirs for theirs, ours in FIELDS.items()}  # the request's field names -> the body's


def json_field(exc: InvalidRequest) -> str | None:
    """The body's field a refusal names (the request's message name, or the body's own); None: none of them."""
    name = _SAID.get(exc.field, exc.field)
    return name if name in FIELDS else _BODY_NAMES.get(name)


class UnknownField(InvalidRequest):
    """A body's field the route does not take: its `loc` is that field."""


def refusal(exc: InvalidRequest) -> tuple[dict, int]:
    """The 422 answer of a refused value: FastAPI's validation body, its `loc` the body's field."""
    field = exc.field if isinstance(exc, UnknownField) else json_field(exc)
    if field is not None and field != exc.field:
        exc = InvalidRequest(field, exc.value, exc.allowed)
    return answers.validation_error(exc, field), 422


def map_body(body: Any, model: str, outdir: str, find_model: Callable[[str], str | None],
             image_file: Callable[[Any, str], str], size_of: Callable[[str], tuple[int, int] | None] | None = None
             ) -> GenerationRequest:
    """The validated video request of a body. `model`: the API's model (a body without one runs it); `find_model`:
    a checkpoint's title or name -> its spec (None: not listed); `image_file`: a base64 image and its field -> the
    path of a file holding it; `size_of`: a model spec -> its own (width, height), for a body that gives neither
    (default: the family record's, `model_size`)."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", body, "send a JSON object: {\"prompt\": \"...\", \"frames\": 0, ...} "
                                           "(docs/api-video.md)")
    unknown = [name for name in body if name not in FIELDS]
    if unknown:
        raise UnknownField(unknown[0], body[unknown[0]], "not a field of the video route; it takes "
                             + ", ".join(FIELDS))
    given = {name: value for name, value in body.items() if value is not None}
    fields = {FIELDS[name]: value for name, value in given.items() if name not in ("model", "init_image")}
    fields.setdefault("frames", 0)  # the model's own count
    fields.update(outdir=outdir, extra={"api": KIND})
    if "model" in given:
        found = find_model(given["model"]) if isinstance(given["model"], str) else None
        if found is None:  # a listed checkpoint only, as sd_model_checkpoint: never a path of the server's
            raise refused("model", given["model"], MODELS)
        fields["model"] = found
    else:
        fields["model"] = model
    if "width" not in given and "height" not in given:
        size = (size_of or model_size)(fields["model"])
        if size is not None:
            fields["width"], fields["height"] = size
    if "init_image" in given:
        fields["init_image"] = image_file(given["init_image"], "init_image")
    return GenerationRequest(**fields).validated()


def model_size(spec: str) -> tuple[int, int] | None:
    """A video model's own (width, height) from its family record and folder (no torch); None: not a video model
    the record knows (its job is refused by the engine, which says why)."""
    from lowvram_gen.families.sampling import folder_facts
    from lowvram_gen.families.spec import index_folder, record_of_spec

    record = record_of_spec(spec)
    if record is None or not record.is_video:
        return None
    video = record.video_facts(folder_facts(spec, index_folder(spec)))
    return tuple(video.size) if video is not None else None


def clip_of(outcome) -> str | None:
    """The clip's path: a finished job's result's, or among the files an interrupted job's Cancelled error kept (the
    engine decodes and saves the clip as it was when the steps stopped); None when it stopped before its first
    step."""
    return next(iter(clips_of(outcome)), None)


def clips_of(outcome) -> list[str]:
    """Every clip's path, in order (a batch count makes several; the first is `clip_of`'s): a finished job's
    result's `videos`, or the clips among the files an interrupted job kept."""
    if isinstance(outcome, Cancelled):
        return [str(p) for p in outcome.images if Path(p).suffix.lower() in _FORMATS]
    return list(getattr(outcome, "videos", None) or ([outcome.video] if outcome.video else []))


def sidecar(clip: str) -> dict:
    """The clip's JSON sidecar (video_out.py: parameters, meta, frame_count, fps, width, height, frames), {} when
    there is none or it cannot be read."""
    from lowvram_gen import safe_json
    from lowvram_gen.video_out import sidecar_path

    path = sidecar_path(clip)
    try:
        data = safe_json.loads(path.read_bytes(), what=str(path))
    except (OSError, safe_json.BadJson):
        return {}
    return data if isinstance(data, dict) else {}


def frames_of(clip: str, side: dict) -> list[str]:
    """The clip's frames' PNGs its sidecar names (save_frames), in order."""
    from lowvram_gen.video_out import frames_folder

    folder = frames_folder(clip)
    names = side.get("frames") if isinstance(side.get("frames"), list) else []
    return [str(folder / Path(name).name) for name in names if isinstance(name, str)]


def info(request: GenerationRequest, result, side: dict, warnings: list[str], what_ran: str, version: str) -> dict:
    """The answer's `info`: the parameters that ran (the job's result's; an interrupted job's from its clip's
    sidecar `side`; the request's where neither says), the seed, preset, attempts, warnings and what ran."""
    meta = side.get("meta") if isinstance(side.get("meta"), dict) else {}
    ran = meta.get("request") if isinstance(meta.get("request"), dict) else {}

    def said(name, of_result=None, of_side=None):
        got = getattr(result, of_result or name, None) if result is not None else None
        if got in (None, "", 0):
            got = side.get(of_side or name)
        return got if got is not None else ran.get(name, getattr(request, name, None))

    seeds = list(getattr(result, "seeds", None) or [])
    return {
        "prompt": request.prompt, "negative_prompt": request.negative_prompt,
        "frames": said("frames", "frame_count", "frame_count"), "fps": said("fps"), "width": said("width"),
        "height": said("height"), "steps": said("steps"),
        "cfg_scale": ran.get("cfg_scale", request.cfg_scale), "cfg_scale_2": ran.get("cfg_scale_2",
                                                                                     request.cfg_scale_2),
        "seed": seeds[0] if seeds else meta.get("seed", request.seed), "sampler_name": said("sampler"),
        "model": listings.model_entry(request.model)["model_name"],
        "init_image": request.init_image is not None, "save_frames": request.save_frames,
        "allow_upscale": request.allow_upscale, "upscaled": bool(getattr(result, "upscaled", False)),
        "preset": getattr(result, "preset", None) or meta.get("preset"),
        "attempts": list(getattr(result, "attempts", None) or meta.get("attempts") or []),
        "seconds": getattr(result, "seconds", None),
        "parameters": side.get("parameters") if isinstance(side.get("parameters"), str) else None,
        "warnings": warnings, "what_ran": what_ran, "version": version,
    }


def answer(request: GenerationRequest, job, version: str) -> dict:
    """The route's answer for a job that ended done, or interrupted: the clip of what finished, a warning saying so
    (one stopped before its first step made none: `video` and `format` are null, as an image route answers no
    images then)."""
    if isinstance(job.error, Cancelled):
        result, what_ran, warnings = None, str(job.error), [f"interrupted: {job.error}"]
    else:
        result, what_ran, warnings = job.result, job.result.summary, list(job.result.warnings)
    clips = clips_of(job.error if result is None else result)
    clip = clips[0] if clips else None
    side = sidecar(clip) if clip else {}
    out = {"video": answers.encoded(clip) if clip else None,
           "format": _FORMATS.get(Path(clip).suffix.lower(), Path(clip).suffix[1:]) if clip else None,
           "info": info(request, result, side, warnings, what_ran, version)}
    if len(clips) > 1:  # a batch count's clips, each in base64 (the first is `video`)
        out["videos"] = [answers.encoded(path) for path in clips]
    if request.save_frames:
        frames = list(result.frames) if result is not None else frames_of(clip, side) if clip else []
        out["frames"] = [answers.encoded(path) for path in frames]
    return out


def generate(ctx, body: Any, watch, run: Callable) -> dict:
    """Map the body, run the job as the image routes run theirs (`run`: routes._run, in the registry, under the
    queue's slot) and answer the clip. A refused value raises InvalidRequest (answered by `build_router`)."""
    model, _ = ctx.state.current()
    stored: dict[str, Any] = {}  # the init image's file -> the body's base64, which a refusal names instead

    def image_file(value, name, folder):
        path = answers.image_file(value, name, folder)
        stored[path] = value
        return path

    with tempfile.TemporaryDirectory(prefix="lowvram-gen-api-video-") as folder:
        try:
            request = map_body(body, model, ctx.state.outdir, ctx.state.find_model,
                               lambda value, name: image_file(value, name, Path(folder)))
            ctx.take_slot()
            try:
                job = run(ctx, request, KIND, watch)  # a failed job raises its error
            finally:
                ctx.free_slot()
        except InvalidRequest as exc:
            if isinstance(exc.value, str) and exc.value in stored:  # never a path of the server's in an answer
                raise InvalidRequest(exc.field, shown(stored[exc.value]), exc.allowed) from None
            raise
        return answer(request, job, ctx.version)


def shown(value: Any) -> Any:
    """A base64 value as a refusal names it: its length and start, not kilobytes of text."""
    return f"<{len(value)} characters: {value[:24]}...>" if isinstance(value, str) and len(value) > 40 else value


def build_router(ctx, route_class: type, run: Callable):
    """The /lowvram/v1 router: `route_class` is the API's (routes._route_class(ctx): auth, body limits, error
    shapes, the log) and `run` the way an API job runs (routes._run)."""
    from fastapi import APIRouter, Body, Request
    from fastapi.responses import JSONResponse

    router = APIRouter(prefix=PREFIX, route_class=route_class)

    @router.post(ROUTE)
    def video(request: Request, body: dict[str, Any] = Body(...)):
        try:
            return generate(ctx, body, request.state.watch, run)
        except InvalidRequest as exc:
            content, status = refusal(exc)
            return JSONResponse(content, status_code=status)

    return router


__all__ = ["FIELDS", "PREFIX", "ROUTE", "answer", "build_router", "clip_of", "frames_of", "generate", "info",
           "json_field", "map_body", "model_size", "refusal", "shown", "sidecar"]
