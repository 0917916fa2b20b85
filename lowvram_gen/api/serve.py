"""Where the API's routes are served: on the app gradio serves the web UI from (`--api`: A1111 adds its routes to
the app its launch returns, and so do we), or alone on a FastAPI app (`--nowebui`, A1111's API-only mode).

Routes can be added to gradio's app after it started: Starlette's router reads its route list per request, and
gradio has no catch-all route that would answer /sdapi/... first.
"""

from __future__ import annotations

import threading
import time

from lowvram_gen.api.routes import ApiContext, build_controlnet_router, build_router

START_TIMEOUT_S = 30.0


def mount(app, ctx: ApiContext) -> None:
    """Add the /sdapi/v1 routes and the ControlNet extension's /controlnet ones to `app` (a FastAPI app: gradio's,
    once launched)."""
    app.include_router(build_router(ctx))
    app.include_router(build_controlnet_router(ctx))


class ApiServer:
    """The API alone (--nowebui): a FastAPI app on uvicorn in a thread, with the interface tests and `launch` use
    of gradio's app (`local_url`, `close()`, `block_thread()`)."""

    def __init__(self, ctx: ApiContext, host: str, port: int):
        import uvicorn
        from fastapi import FastAPI

        self.app = FastAPI(title="lowvram-gen A1111 API", version=ctx.version)
        mount(self.app, ctx)
        self.local_url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="lowvram-gen api")
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API server did not start on {host}:{port}")
            time.sleep(0.05)

    def block_thread(self) -> None:
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            self.close()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(START_TIMEOUT_S)
