"""`lowvram-gen ui`: A1111-style launch flags to a running Gradio app."""

from __future__ import annotations

import sys

from lowvram_gen.errors import InvalidRequest

LOUD = "!" * 78


def parse_auth(text: str | None) -> list[tuple[str, str]] | None:
    """'user:pass[,user2:pass2]' as A1111's --gradio-auth; a clear error for anything else."""
    if not text:
        return None
    pairs = []
    for item in text.split(","):
        user, sep, password = item.strip().partition(":")
        if not sep or not user or not password:
            raise InvalidRequest("--gradio-auth", "<hidden>", "use user:password[,user2:password2]")
        pairs.append((user, password))
    return pairs


def exposure_warning(listen: bool, share: bool, auth) -> str | None:
    if auth or not (listen or share):
        return None
    where = "a public gradio.live link" if share else "every network interface (0.0.0.0)"
    return (f"{LOUD}\nWARNING: lowvram-gen is reachable on {where} WITHOUT a password.\n"
            f"Anyone who can reach it can use your GPU and read your outputs. Add --gradio-auth user:password.\n{LOUD}")


def launch(session, outdir: str, model: str, listen: bool = False, port: int = 7860, auth: str | None = None,
           share: bool = False, queue_size: int = 16, block: bool = True):
    """Build and start the app; `block=False` returns the running app (tests, embedding)."""
    import os

    from lowvram_gen.ui.app import UiOptions, allowed_paths, build_app

    # Gradio notices a closed tab when its heartbeat fails (default every 15 s); the unload event
    # then cancels that tab's job. 2 s keeps a closed tab from holding the GPU for long.
    os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "2")
    credentials = parse_auth(auth)
    warning = exposure_warning(listen, share, credentials)
    if warning:
        print(warning, file=sys.stderr)
    if share:
        print("note: --share makes the app public through a gradio.live tunnel", file=sys.stderr)
    app = build_app(session, UiOptions(outdir=outdir, model=model, queue_size=queue_size))
    host = "0.0.0.0" if listen else "127.0.0.1"
    app.launch(server_name=host, server_port=port, auth=credentials, share=share, allowed_paths=allowed_paths(outdir),
               prevent_thread_lock=not block, quiet=False, show_error=False, inbrowser=False)
    return app
