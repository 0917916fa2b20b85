"""The /sdapi/v1 routes plugins call at start besides the generation ones (Krita's, Photoshop's, chat bots'): every
other route A1111 1.10 has, each answered in A1111's shape, or refused in one sentence naming what is not built.

- `memory`: A1111's {ram: {free, used, total}, cuda: {system, active, allocated, reserved, inactive, events}} from
  hardware/hostmem.py (the machine's RAM as a job can use it: the cgroup limit counts; `used` is what is not
  available, A1111's counts its own process only: ours is `lowvram_gen.process_bytes`) and torch.cuda (A1111's
  {"error": "unavailable"} without CUDA); our own figures (budgets, reserve, what a job may plan to use, the loaded
  model) under the extra key `lowvram_gen`, which no A1111 client reads.
- `cmd-flags`: the launch flags under A1111's names where it has them (medvram, lowvram, use_cpu, xformers, no_half,
  api, nowebui, listen, port, ckpt, vae_dir, ...), ours beside them (preset, vram_budget, ...). A password is never
  sent (A1111 sends it): a flag that holds one answers "<hidden>".
- lists of what is not built here, empty as A1111's with none installed: face-restorers, hypernetworks, sd-modules,
  extensions; realesrgan-models: the RealESRGAN files among the upscaler models (/upscalers lists them all).
- refresh-embeddings answers null, as the other refresh routes: /embeddings scans its folder at every call.
- unload-checkpoint frees every model (the UI's Free VRAM: Session.free, after the running job); reload-checkpoint
  answers {}: the model loads with the next job, at the precision and offload its plan picks.
- interrogate, create/* and train/* (and preprocess, A1111's older route), server-kill/-restart/-stop: 501 Not
  Implemented in A1111's error body, the `detail` naming what is not built and what to use instead (a 404 would
  tell a client the route does not exist, and it would give up on the whole server).
- extra-single-image, extra-batch-images: api/extras.py.

The routes are added to routes.py's router (its auth before the body, error shapes and log) by `add`.
"""

from __future__ import annotations

import os
from typing import Any

NOT_BUILT = {
    "interrogate": "CLIP and DeepBooru interrogation (image to prompt) is not built in lowvram-gen; write the prompt, "
                   "or read an image's own with POST /sdapi/v1/png-info",
    "create/embedding": "training is not built in lowvram-gen: train an embedding with another tool, put the file in "
                        "models/embeddings (GET /sdapi/v1/embeddings lists it)",
    "create/hypernetwork": "hypernetworks are not built in lowvram-gen: use a LoRA (GET /sdapi/v1/loras)",
    "train/embedding": "training is not built in lowvram-gen: train an embedding with another tool, put the file in "
                       "models/embeddings (GET /sdapi/v1/embeddings lists it)",
    "train/hypernetwork": "hypernetworks are not built in lowvram-gen: use a LoRA (GET /sdapi/v1/loras)",
    "preprocess": "training's image preprocessing is not built in lowvram-gen",
    "server-kill": "lowvram-gen does not stop or restart from the API: stop it where it runs (Ctrl+C)",
    "server-restart": "lowvram-gen does not stop or restart from the API: stop it where it runs (Ctrl+C)",
    "server-stop": "lowvram-gen does not stop or restart from the API: stop it where it runs (Ctrl+C)",
}
HIDDEN = "<hidden>"


def ram(host) -> dict:
    """A1111's `ram` of a HostMemory (hostmem.py)."""
    total, free = int(host.total_bytes), int(host.available_bytes)
    return {"free": free, "used": max(0, total - free), "total": total}


def cuda(torch_cuda=None) -> dict:
    """A1111's `cuda` part: the device's free/used/total and the caching allocator's counters; {"error": ...} where
    there is no CUDA, or where reading it failed."""
    try:
        if torch_cuda is None:
            import torch

            torch_cuda = torch.cuda
        if not torch_cuda.is_available():
            return {"error": "unavailable"}
        free, total = torch_cuda.mem_get_info()
        s = dict(torch_cuda.memory_stats())

        def pair(key: str) -> dict:
            return {"current": s.get(f"{key}.all.current", 0), "peak": s.get(f"{key}.all.peak", 0)}

        return {"system": {"free": free, "used": total - free, "total": total},
                "active": pair("active_bytes"), "allocated": pair("allocated_bytes"),
                "reserved": pair("reserved_bytes"), "inactive": pair("inactive_split_bytes"),
                "events": {"retries": s.get("num_alloc_retries", 0), "oom": s.get("num_ooms", 0)}}
    except Exception as exc:  # noqa: BLE001 - A1111 answers a failed read in the same field
        return {"error": f"{exc}"}


def memory(session, torch_cuda=None, host=None) -> dict:
    """GET /memory: A1111's answer, and ours under `lowvram_gen`."""
    from lowvram_gen.hardware.hostmem import probe_host

    host = host or probe_host(session.ram_budget)
    budget, reserve = session.vram_limits()
    gpu = cuda(torch_cuda)
    usable = None
    if "system" in gpu:
        usable = max(0, gpu["system"]["free"] - reserve)
        usable = min(usable, budget) if budget is not None else usable
    ours = {"device": "cpu" if session.device_pref == "cpu" or "system" not in gpu else "cuda",
            "vram_budget_bytes": budget, "reserve_vram_bytes": reserve, "usable_vram_bytes": usable,
            "ram_budget_bytes": host.budget_bytes, "ram_limit_bytes": host.limit_bytes,
            "ram_limit_source": host.limit_source or None, "process_bytes": host.process_bytes,
            "loaded_model": session.loaded_model_name()}
    return {"ram": ram(host), "cuda": gpu, "lowvram_gen": ours}


def cmd_flags(ctx) -> dict:
    """GET /cmd-flags: the launch flags by A1111's names (its `vars(cmd_opts)` keys), ours beside them."""
    from lowvram_gen.networks.files import FOLDER_FLAGS

    session, launch = ctx.session, dict(ctx.flags)
    preset = session.preset_spec
    precision = session.precision
    folders = {flag[2:].replace("-", "_"): os.environ.get(env) or None for flag, env in FOLDER_FLAGS.values()}
    model, _ = ctx.state.current()
    budget, reserve = session.vram_limits()
    return {
        # A1111's names
        "medvram": preset == "medvram", "medvram_sdxl": False, "lowvram": preset == "lowvram",
        "use_cpu": ["all"] if session.device_pref == "cpu" else [], "xformers": bool(session.xformers),
        "no_half": precision.full, "no_half_vae": precision.no_half_vae, "upcast_sampling": precision.upcast_sampling,
        "precision": "full" if precision.full else "autocast",
        "api": True, "nowebui": bool(launch.get("nowebui", False)), "listen": bool(launch.get("listen", False)),
        "port": launch.get("port"), "share": bool(launch.get("share", False)),
        "autolaunch": bool(launch.get("autolaunch", False)),
        "api_auth": HIDDEN if ctx.credentials else None, "gradio_auth": HIDDEN if launch.get("gradio_auth") else None,
        "api_log": ctx.log_requests, "api_server_stop": False,
        "ckpt": model, "models_dir": os.environ.get("LOWVRAM_GEN_MODELS") or None, **folders,
        "styles_file": launch.get("styles_file"), "outdir": ctx.state.outdir,
        # lowvram-gen's own
        "preset": preset, "novram": preset == "novram",
        "vram_budget": budget, "reserve_vram": reserve, "ram_budget": session.ram_budget,
        "queue_size": ctx.queue_size, "api_body_limit": ctx.body_limit // 2**20,
        "api_allow_paths": [str(p) for p in ctx.allow_paths],
    }


def realesrgan_models() -> list[dict]:
    """A1111's /realesrgan-models: the RealESRGAN files among the upscaler models (name, path, and the scale an
    `x4` in the name says, else null)."""
    import re

    from lowvram_gen.a1111.upscaler_names import model_files, model_path

    out = []
    for name in model_files():
        if "realesr" in name.lower():  # RealESRGAN_x4plus.pth, realesr-general-x4v3.pth, ...
            found = re.search(r"(?<![a-z0-9])x?(\d)x?(?![0-9])", name.lower())
            out.append({"name": name, "path": str(model_path(name)), "scale": int(found.group(1)) if found else None})
    return out


def add(router, ctx) -> None:
    """Add these routes to `router` (routes.py's: its route class answers errors in A1111's shapes)."""
    from fastapi import Body, HTTPException
    from fastapi.responses import JSONResponse

    from lowvram_gen.api import answers, extras
    from lowvram_gen.errors import InvalidRequest

    @router.get("/memory")
    def memory_():
        return memory(ctx.session)

    @router.get("/cmd-flags")
    def cmd_flags_():
        return cmd_flags(ctx)

    @router.get("/face-restorers")
    def face_restorers():
        return []  # GFPGAN and CodeFormer are not built: restore_faces is warned, the extras' visibility refused

    @router.get("/hypernetworks")
    def hypernetworks():
        return []  # not built: a <hypernet:...> tag is not applied

    @router.get("/sd-modules")
    def sd_modules():
        return []  # A1111 1.10's separate text-encoder/VAE modules: none here (VAEs: /sd-vae)

    @router.get("/extensions")
    def extensions():
        return []  # no extensions: ControlNet's routes are built in (/controlnet/*)

    @router.get("/realesrgan-models")
    def realesrgan():
        return realesrgan_models()

    @router.post("/refresh-embeddings")
    def refresh_embeddings():
        return None  # /embeddings scans the folder at every call

    @router.post("/unload-checkpoint")
    def unload_checkpoint():
        ctx.session.free()  # after the running job: its lock
        return {}

    @router.post("/reload-checkpoint")
    def reload_checkpoint():
        return {}  # the next job loads the model, as its plan says

    def refuse(route: str):
        def answer(body: Any = Body(None)):
            raise HTTPException(status_code=501, detail=NOT_BUILT[route])

        return answer

    for route in NOT_BUILT:
        router.add_api_route(f"/{route}", refuse(route), methods=["POST"], name=route)

    def extras_answer(body: Any, batch: bool):
        ctx.take_slot()
        try:
            return extras.run(body, batch, extras.session_upscale(ctx.session), ctx.allow_paths)
        except InvalidRequest as exc:  # the field named is the body's own (dotted inside imageList)
            return JSONResponse(answers.validation_error(exc, None if exc.field == "body" else exc.field),
                                status_code=422)
        finally:
            ctx.free_slot()

    @router.post("/extra-single-image")
    def extra_single_image(body: dict[str, Any] = Body(...)):
        return extras_answer(body, batch=False)

    @router.post("/extra-batch-images")
    def extra_batch_images(body: dict[str, Any] = Body(...)):
        return extras_answer(body, batch=True)
