"""The /sdapi/v1 routes (A1111's names, methods and answers) over one Session and the web UI's job registry, and
our own /lowvram/v1/video (api/video.py: A1111 has no video route) with the same route class, queue and registry.

Every generation goes through `Session.generate` (which holds the GPU lock: one job at a time, whoever sent
it) in a `jobs.registry.Job` run by `jobs.run` in the same `Registry` as the UI's jobs, so the UI says "waiting for
the GPU" while an API job runs and A1111's global /interrupt reaches a UI job as well as an API one. The routes
are plain functions: FastAPI runs them in its thread pool, so /progress and /interrupt answer while a job
runs. At most `queue_size` API jobs run or wait at once (the UI's --queue-size); past that a job is answered
503, as the UI answers "queue is full".

With credentials (--api-auth, or --gradio-auth's when --api-auth is not given) every route asks for HTTP
Basic auth (UTF-8): anonymous or wrong answers 401, in A1111's error body, before the body is read; every body
is read up to --api-body-limit (413 past it) and its JSON parsed once with limits (api/guard.py).
`log_requests` (--api-log) says one line per request on the console, as A1111's --api-log.

(No `from __future__ import annotations`: FastAPI reads the routes' annotations.)
"""

import asyncio
import dataclasses
import logging
import tempfile
import threading
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, Body, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from lowvram_gen.api import answers, controlnet, guard, listings, names, progress, system_routes
from lowvram_gen.api import video
from lowvram_gen.api import scripts as api_scripts
from lowvram_gen.img2img_scripts import scripts as img2img_scripts
from lowvram_gen.a1111.api_body import json_field, map_body, renamed
from lowvram_gen.api.state import ApiState
from lowvram_gen.errors import Cancelled, InvalidRequest, LowVramError
from lowvram_gen.jobs import console
from lowvram_gen.jobs.progress import PartProgress
from lowvram_gen.jobs.registry import Job, Registry
from lowvram_gen.jobs.run import run
from lowvram_gen.xyz.runner import run_grid

log = logging.getLogger(__name__)
PREFIX = "/sdapi/v1"


class QueueFull(Exception):
    """More API jobs than --queue-size run or wait: answered 503."""


@dataclass
class ApiContext:
    session: Any  # the Session every job runs in
    registry: Registry  # the web UI's (or, with --nowebui, the API's own)
    state: ApiState
    queue_size: int = 16
    credentials: list[tuple[str, str]] | None = None
    log_requests: bool = False
    version: str = ""
    allow_paths: tuple[Path, ...] = ()  # --api-allow-paths: the folders a body may name files in (else names only)
    body_limit: int = guard.DEFAULT_BODY_LIMIT_MB * 2**20  # bytes (--api-body-limit)
    flags: dict = field(default_factory=dict)  # the launch flags /cmd-flags says (listen, port, nowebui, ...)
    _waiting: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take_slot(self) -> None:
        with self._lock:
            if self._waiting >= self.queue_size:
                raise QueueFull(f"the queue is full: {self._waiting} API job(s) run or wait for the GPU "
                                f"(--queue-size {self.queue_size}); try again later")
            self._waiting += 1

    def free_slot(self) -> None:
        with self._lock:
            self._waiting -= 1


def _answer(exc: BaseException) -> JSONResponse:
    """An error in A1111's shapes (answers.py): 422 with the validation body for a refused value."""
    if isinstance(exc, InvalidRequest):
        exc = renamed(exc)
        return JSONResponse(answers.validation_error(exc, json_field(exc)), status_code=422)
    if isinstance(exc, RequestValidationError):
        return JSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)
    if isinstance(exc, HTTPException):
        return JSONResponse(answers.error_body(exc, detail=exc.detail), status_code=exc.status_code,
                            headers=exc.headers)
    if isinstance(exc, QueueFull):
        return JSONResponse(answers.error_body(exc), status_code=503)
    if isinstance(exc, LowVramError):
        console.user_error(str(exc))
        return JSONResponse(answers.error_body(exc), status_code=answers.status_of(exc))
    log.exception("API error", exc_info=exc)  # a bug: its traceback on the console
    return JSONResponse(answers.error_body(exc), status_code=500)


def _route_class(ctx: ApiContext) -> type[APIRoute]:
    class A1111Route(APIRoute):
        """Answers errors in A1111's shapes and says each request on the console with --api-log."""

        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def route(request: Request):
                started = time.perf_counter()
                request.state.watch = ClientWatch()
                try:
                    await _admit(ctx, request)
                    response = await _watched(handler(request), request)
                except guard.Refused as exc:
                    response = JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)
                except Exception as exc:  # noqa: BLE001 - every error is answered in A1111's shape
                    response = _answer(exc)
                if ctx.log_requests:
                    client = request.client.host if request.client else "-"
                    console.say(f"API {request.method} {request.url.path} {response.status_code} {client} "
                                f"{time.perf_counter() - started:.3f}s")
                return response

            return route

    return A1111Route


class ClientWatch:
    """Whether the client that asked for a job is still connected (FAULTS 21): the route notes when the connection
    closes (`left`), and the job run for that request (`attach`) is cancelled then, as /interrupt cancels it: it
    stops at its next step and keeps the images it finished."""

    def __init__(self):
        self._lock = threading.Lock()
        self._job: Job | None = None
        self.gone = False

    def attach(self, job: Job) -> None:
        with self._lock:
            self._job = job
            if self.gone:
                job.cancel.set()

    def left(self) -> None:
        with self._lock:
            self.gone = True
            if self._job is not None:
                self._job.cancel.set()


async def _watched(answer, request: Request, every: float = 0.5):
    """Await the route's `answer`, looking every `every` seconds whether its client hung up (Starlette reads the
    connection's disconnect message once the body is read); the answer itself is awaited to its end."""
    task = asyncio.ensure_future(answer)
    while not request.state.watch.gone:
        done, _ = await asyncio.wait({task}, timeout=every)
        if done:
            break
        if await request.is_disconnected():
            request.state.watch.left()
    return await task


async def _admit(ctx: ApiContext, request: Request) -> None:
    """The login from the headers, then the body up to the limit, then its JSON (api/guard.py), before FastAPI's
    handler reads the body (it reads it before it solves a route's dependencies, so auth as a dependency came too
    late). Starlette's Request keeps what was read in `_body` and `_json`, and the handler takes them from there:
    the body is read and parsed once."""
    if not guard.authorized(ctx.credentials, request.headers.get("authorization")):
        raise guard.unauthorized()
    body = await guard.read_body(request, ctx.body_limit)
    request._body = body
    if body:  # in a worker thread: a large body's parse does not hold up /progress and /interrupt
        request._json = await run_in_threadpool(guard.parse, body)


def build_router(ctx: ApiContext) -> APIRouter:
    """A1111's /sdapi/v1 routes and our own /lowvram/v1/video (api/video.py: A1111 has no video route), both with
    the same auth, body limits, error shapes, queue and job registry."""
    outer = APIRouter()
    outer.include_router(_sdapi_router(ctx))
    outer.include_router(video.build_router(ctx, _route_class(ctx), _run))
    return outer


def _sdapi_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter(prefix=PREFIX, route_class=_route_class(ctx))

    @router.post("/txt2img")
    def txt2img(request: Request, body: dict[str, Any] = Body(...)):
        return _generate(ctx, body, "txt2img", request.state.watch)

    @router.post("/img2img")
    def img2img(request: Request, body: dict[str, Any] = Body(...)):
        return _generate(ctx, body, "img2img", request.state.watch)

    @router.get("/progress")
    def progress_(skip_current_image: bool = False):
        return progress.progress(ctx.registry.current(), skip_current_image)

    @router.post("/interrupt")
    def interrupt():
        job = ctx.registry.current()
        if job is not None:
            job.cancel.set()
        return {}

    @router.post("/skip")
    def skip():
        job = ctx.registry.current()
        if job is not None:
            job.skip.set()

    @router.get("/options")
    def get_options():
        return ctx.state.options()

    @router.post("/options")
    def set_options(body: dict[str, Any] = Body(...)):
        try:
            ctx.state.set_options(body, ctx.allow_paths)
        except InvalidRequest as exc:  # A1111 refuses an unknown checkpoint with its error body
            return JSONResponse(answers.error_body(exc), status_code=422)

    @router.get("/sd-models")
    def sd_models():
        return listings.sd_models(ctx.state.current()[0], ctx.state.models_folder)

    @router.post("/refresh-checkpoints")
    def refresh_checkpoints():
        return None  # /sd-models scans the folders at every call

    @router.get("/sd-vae")
    def sd_vae():
        return listings.sd_vae()

    @router.post("/refresh-vae")
    def refresh_vae():
        return None  # /sd-vae scans the folder at every call

    @router.get("/prompt-styles")
    def prompt_styles():
        return [dataclasses.asdict(style) for style in ctx.session.style_book().styles.values()]

    @router.get("/samplers")
    def samplers():
        return listings.samplers()

    @router.get("/schedulers")
    def schedulers():
        return listings.schedulers()

    @router.get("/loras")
    def loras():
        return listings.loras()

    @router.post("/refresh-loras")
    def refresh_loras():
        return None  # /loras scans the folder at every call

    @router.get("/embeddings")
    def embeddings():
        return listings.embeddings()

    @router.get("/upscalers")
    def upscalers():
        return listings.upscalers()

    @router.get("/latent-upscale-modes")
    def latent_upscale_modes():
        return listings.latent_upscale_modes()

    @router.get("/scripts")
    def scripts():
        return api_scripts.scripts()

    @router.get("/script-info")
    def script_info():
        return api_scripts.script_info()

    @router.post("/png-info")
    def png_info(body: dict[str, Any] = Body(...)):
        try:
            book = ctx.session.style_book()
        except LowVramError:  # a styles file that cannot be read: the prompts as they are
            book = None
        return answers.png_info(body.get("image"), book)

    system_routes.add(router, ctx)  # memory, cmd-flags, extras, the lists and the routes not built
    return router


def build_controlnet_router(ctx: ApiContext) -> APIRouter:
    """The ControlNet extension's own routes (api/controlnet.py), with the same auth, error shapes and log."""
    router = APIRouter(prefix="/controlnet", route_class=_route_class(ctx))

    @router.get("/version")
    def version():
        return controlnet.version()

    @router.get("/model_list")
    def model_list(update: bool = True):
        return controlnet.model_list()  # scanned at every call, `update` or not

    @router.get("/module_list")
    def module_list(alias_names: bool = False):
        return controlnet.module_list()  # no aliases: the names are the ones the units take

    @router.post("/detect")
    def detect(body: dict[str, Any] = Body(...)):
        try:
            return controlnet.detect(body)
        except InvalidRequest as exc:  # the field named is the body's own key
            return JSONResponse(answers.validation_error(exc, None if exc.field == "body" else exc.field),
                                status_code=422)

    return router


def _generate(ctx: ApiContext, body: dict, kind: str, watch: ClientWatch | None = None) -> dict:
    """Map the body, run the job in the registry and answer A1111's images, parameters and info. An interrupted
    job answers the images it kept, as A1111 answers an interrupted one; the info's warnings say so."""
    model, clip_skip = ctx.state.current()
    with tempfile.TemporaryDirectory(prefix="lowvram-gen-api-") as folder:
        mapped = map_body(body, kind, model, clip_skip, ctx.state.outdir, ctx.state.find_model,
                          lambda value, name="init_images": answers.image_file(value, name, Path(folder)),
                          lambda fields: names.check(fields, ctx.allow_paths), ctx.state.current_vae(),
                          ctx.state.current_rng(), ctx.state.fix_steps(), ctx.state.current_ensd(),
                          ctx.state.current_unipc())
        request = mapped.request
        if not request.filename_pattern:  # the API's samples_filename_pattern (POST /options), where the body sets none
            request = replace(request, filename_pattern=ctx.state.current_pattern())
        ctx.session.style_book().check(request.styles)  # an unknown style: 422 before the job is queued
        script = api_scripts.img2img_script(mapped.script, mapped.script_args)  # Loopback, SD upscale
        grid = None if mapped.script_args is None or script is not None else api_scripts.grid_of(
            request, mapped.script_args, kind, find_model=ctx.state.find_model, allowed=ctx.allow_paths)
        ctx.take_slot()
        try:
            job = _run(ctx, request, kind, watch, grid, script)  # a failed job raises its error: _answer answers it
        finally:
            ctx.free_slot()
    warnings = list(mapped.warnings)
    if grid is not None:  # X/Y/Z plot: the grid (and what the script_args ask besides), its cells' images saved
        images, what_ran = api_scripts.answer_images(grid, job.result), job.result.summary
        warnings += job.result.warnings
    elif script is not None and job.error is None:  # Loopback: its grid then every loop's; SD upscale: the image(s)
        images, what_ran = job.result.shown(), job.result.summary
        warnings += job.result.warnings
    elif isinstance(job.error, Cancelled):
        images, what_ran = job.error.images, str(job.error)
        warnings.append(f"interrupted: {what_ran}")
    else:
        images, what_ran = job.result.images, job.result.summary
        warnings += job.result.warnings
        ctx.state.keep({name: getattr(request, name) for name in mapped.keep_settings})
    info = answers.info(request, images, kind, listings.model_entry(request.model)["model_name"], warnings,
                        what_ran, ctx.version)
    return {"images": [answers.encoded(p) for p in images] if mapped.send_images else [],
            "parameters": mapped.parameters, "info": info}


def _run(ctx: ApiContext, request, kind: str, watch: ClientWatch | None = None, grid=None, script=None) -> Job:
    """Run `request` as a registered job and wait for it to end: done, or cancelled (its Cancelled error on the job);
    a job that failed raises its error. Its Skip and live previews (every show_progress_every_n_steps, /options) are
    the job's own, as a UI job's. With an X/Y/Z `grid`, its cells one after another in the one job (progress
    `cell i/n`; an interrupted grid ends done, with the cells it finished); with an img2img `script` (descriptor,
    its keywords) its loops or tiles, each a job of the session (progress `loop i/n`, `tile i/n`; an interrupted
    one ends cancelled, with the images it finished)."""
    key = f"sdapi-{kind}-{uuid.uuid4().hex}"
    preview_every = ctx.state.preview_every()
    cells = PartProgress(len(grid)) if grid is not None else PartProgress() if script is not None else None

    def work(on_step, cancel):
        kwargs = dict(on_step=on_step, cancel=cancel, skip=job.skip, on_preview=job.on_preview,
                      preview_every=preview_every)
        if grid is not None:
            return run_grid(ctx.session, grid, on_cell=lambda i, n: cells.cell(
                i, n, request.batch_count, 2 if request.hires else 1), **kwargs)
        if script is not None:
            descriptor, script_kwargs = script
            return img2img_scripts.run(descriptor, request, ctx.session, on_part=cells.part, outdir=request.outdir,
                                       run_one=lambda one: ctx.session.generate(one, **kwargs), **script_kwargs)
        return ctx.session.generate(request, **kwargs)

    job = Job(work)
    if watch is not None:  # the client hanging up stops it as /interrupt does
        watch.attach(job)
    with closing(run(ctx.registry, key, job, f"API {kind}", request, tick=None, progress=cells)) as events:
        for _ in events:
            pass
    return job
