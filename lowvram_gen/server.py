"""`lowvram-gen ui`: A1111-style launch flags to a running server: the Gradio web UI, A1111's REST API beside it
(--api) or the API alone (--nowebui), on one Session and one job registry (lowvram_gen/jobs).

The launcher sits above both front ends it serves: the UI (lowvram_gen/ui) and the API (lowvram_gen/api) never import
each other, and this module is the one place that puts them on the same server. It imports neither at import time:
`check_port` and the auth checks run before gradio or FastAPI load (the job registry is plain Python).
"""

from __future__ import annotations

import errno
import os
import socket
import sys

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.jobs.registry import Registry

LOUD = "!" * 78


def parse_auth(text: str | None, flag: str = "--gradio-auth") -> list[tuple[str, str]] | None:
    """'user:pass[,user2:pass2]' as A1111's --gradio-auth and --api-auth; a clear error for anything else.

    Names and passwords may hold any Unicode (a login sends them as UTF-8, RFC 7617); text that is not Unicode
    (bytes of another encoding on the command line, which Python keeps as lone surrogates) could never be typed
    at a login, so it is refused here rather than locking everyone out in silence."""
    if not text:
        return None
    pairs = []
    for item in text.split(","):
        user, sep, password = item.strip().partition(":")
        if not sep or not user or not password:
            raise InvalidRequest(flag, "<hidden>", "use user:password[,user2:password2]")
        try:
            user.encode("utf-8"), password.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(flag, "<hidden>", "a user name or password is not valid UTF-8 text (is the "
                                                   "terminal's encoding UTF-8?); use UTF-8 names") from None
        pairs.append((user, password))
    return pairs


def listen_host(listen: bool) -> str:
    return "0.0.0.0" if listen else "127.0.0.1"


def check_port(port: int | str, host: str) -> int:
    """--port as a number from 1 to 65535 that is free on `host`, checked before gradio starts.

    Gradio reports a bad or busy port from deep inside its server start, as a traceback, after the
    model picker and the UI are built. Binding a socket here names the flag instead. SO_REUSEADDR,
    as uvicorn binds, so a port that a UI just closed (TIME_WAIT) counts as free; a port someone
    listens on still does not. Another program may still take the port before gradio binds it.
    """
    try:
        number = int(str(port).strip())
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise InvalidRequest("--port", port, "use a port number from 1 to 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if os.name != "nt":  # on Windows SO_REUSEADDR would let us bind a port that is in use
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, number))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else f"not available ({exc.strerror or exc})"
            raise InvalidRequest("--port", number, f"{why} on {host}; stop what holds it or pick another port "
                                                   f"from 1 to 65535, e.g. --port {number % 65535 + 1}") from None
    return number


def exposure_warning(listen: bool, share: bool, auth, api: bool = False, api_auth=None,
                     webui: bool = True) -> str | None:
    """The loud warning when what is served beyond this machine (--listen, --share) needs no password: the web UI
    without --gradio-auth, the A1111 API (--api, --nowebui) without --api-auth or --gradio-auth (whose users it
    takes when --api-auth is not given)."""
    if not (listen or share):
        return None
    open_parts, flags = [], []
    if webui and not auth:
        open_parts.append("the web UI")
        flags.append("--gradio-auth user:password")
    if api and not (api_auth or auth):
        open_parts.append("the A1111 API (/sdapi/v1)")
        flags.append("--api-auth user:password")
    if not open_parts:
        return None
    where = "a public gradio.live link" if share else "every network interface (0.0.0.0)"
    verb = "are" if len(open_parts) > 1 else "is"
    return (f"{LOUD}\nWARNING: {' and '.join(open_parts)} of lowvram-gen {verb} reachable on {where} WITHOUT a "
            f"password.\nAnyone who can reach it can use your GPU and read your outputs. Add "
            f"{' and '.join(dict.fromkeys(flags))}.\n{LOUD}")


def launch(session, outdir: str, model: str, listen: bool = False, port: int = 7860, auth: str | None = None,
           share: bool = False, queue_size: int = 16, block: bool = True, api: bool = False,
           api_auth: str | None = None, api_log: bool = False, webui: bool = True,
           api_allow_paths: str | None = None, api_body_limit: int | None = None, autolaunch: bool = False):
    """Build and start the app; `block=False` returns the running app (tests, embedding). `api` (--api) serves
    A1111's REST API beside the UI, on the same session, job registry and queue size; `webui=False`
    (--nowebui) serves the API alone. The API asks for --api-auth's users, or --gradio-auth's without it, and takes
    model names only; `api_allow_paths` (--api-allow-paths DIR[,DIR]) lets it take paths inside those folders;
    `api_body_limit` (--api-body-limit, MiB) is the largest request body it reads. `autolaunch` (--autolaunch) opens
    the UI in the default browser once the server is up (with --nowebui there is no page to open: it says so)."""
    # Gradio notices a closed tab when its heartbeat fails (default every 15 s); the unload event
    # then cancels that tab's job. 2 s keeps a closed tab from holding the GPU for long.
    os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "2")
    credentials = parse_auth(auth)
    api = api or not webui
    api_credentials = parse_auth(api_auth, "--api-auth") or credentials
    from lowvram_gen.a1111.api_names import parse_allowed

    allow_paths = parse_allowed(api_allow_paths)
    if api_body_limit is not None and not 1 <= api_body_limit <= 4096:
        raise InvalidRequest("--api-body-limit", api_body_limit, "use a size in MiB from 1 to 4096 (default 64)")
    if share and not webui:
        raise InvalidRequest("--share", True, "a gradio.live link needs the web UI; leave out --nowebui or --share")
    warning = exposure_warning(listen, share, credentials, api=api, api_auth=api_credentials, webui=webui)
    if warning:
        print(warning, file=sys.stderr)
    if share:
        print("note: --share makes the app public through a gradio.live tunnel", file=sys.stderr)
    jobs = Registry()
    api_context = _api_context(session, jobs, outdir, model, queue_size, api_credentials, api_log,
                               allow_paths, api_body_limit) if api else None
    if api_context is not None:  # what /sdapi/v1/cmd-flags says of the launch
        api_context.flags.update(listen=listen, port=port, share=share, nowebui=not webui, autolaunch=autolaunch,
                                 gradio_auth=bool(auth))
    if not webui:
        from lowvram_gen.api.serve import ApiServer

        server = ApiServer(api_context, listen_host(listen), port)
        print(f"* A1111 API (no web UI) on:  {server.local_url}sdapi/v1/", flush=True)
        if autolaunch:
            print("note: --autolaunch opens the web UI, which --nowebui leaves out: no browser opened", file=sys.stderr)
        if block:
            server.block_thread()
        return server
    from lowvram_gen.ui.app import UiOptions, allowed_paths, build_app
    from lowvram_gen.ui.token_counter import CSS

    app = build_app(session, UiOptions(outdir=outdir, model=model, queue_size=queue_size), jobs)
    # quiet: gradio's own lines would tell the user to "set `share=True` in `launch()`", which they cannot do
    app.launch(server_name=listen_host(listen), server_port=port, auth=credentials, share=share,
               allowed_paths=allowed_paths(outdir), css=CSS,
               prevent_thread_lock=True, quiet=True, show_error=False, inbrowser=False)
    if api_context is not None:
        from lowvram_gen.api.serve import mount

        mount(app.app, api_context)
    print(started_text(app.local_url, share), flush=True)
    if api_context is not None:
        print(f"* A1111 API on:  {app.local_url}sdapi/v1/", flush=True)
    if autolaunch:
        open_browser(app.local_url)
    if block:
        app.block_thread()
    return app


def open_browser(url: str) -> None:
    """A1111's --autolaunch: the UI in the default browser (Python's webbrowser module), at an address a browser
    can open (the UI listening on every interface is reached on 127.0.0.1); a machine without one says so."""
    import webbrowser

    url = url.replace("://0.0.0.0", "://127.0.0.1")
    try:
        opened = webbrowser.open(url)
    except webbrowser.Error:
        opened = False
    if not opened:
        print(f"note: --autolaunch found no browser to open; open {url} yourself", file=sys.stderr)


def _api_context(session, jobs, outdir: str, model: str, queue_size: int, credentials, log_requests: bool,
                 allow_paths: tuple = (), body_limit_mb: int | None = None):
    from lowvram_gen import __version__
    from lowvram_gen.api.guard import DEFAULT_BODY_LIMIT_MB
    from lowvram_gen.api.routes import ApiContext
    from lowvram_gen.api.state import ApiState

    return ApiContext(session=session, registry=jobs, state=ApiState(model=model, outdir=outdir),
                      queue_size=queue_size, credentials=credentials, log_requests=log_requests,
                      version=f"lowvram-gen {__version__}", allow_paths=allow_paths,
                      body_limit=int((body_limit_mb or DEFAULT_BODY_LIMIT_MB) * 2**20))


def started_text(local_url: str, share: bool) -> str:
    """What gradio would print on start, with our flag for a public link instead of its `share=True` (gradio
    itself prints the public URL of --share)."""
    text = f"* Running on local URL:  {local_url}"
    if not share:
        text += "\n* To create a public link, restart with --share (and --gradio-auth user:password)"
    return text
