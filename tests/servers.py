"""The one in-process server harness of the tests: `lowvram-gen ui` (with `api=True` its A1111 REST API too, with
`webui=False` the API alone) on a free port of this machine, on its own Session and output folder, with the
embedded tiny model. The web UI's tests (ui_helpers.py) and the API's (api_helpers.py) both start it; a test that
needs a server of its own (auth, a queue of 1) makes a `Server` and closes it.

Not a test module (pytest collects test_*.py only): test modules import from here, never from each other.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from lowvram_gen.session import Session


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`launch()` of lowvram_gen/server.py in this process, not blocking; `flags`: its keywords (auth, queue_size, api,
    api_auth, api_log, webui)."""

    def __init__(self, tmp: Path, **flags):
        from lowvram_gen.server import launch

        self.outdir = tmp / "outputs"
        self.outdir.mkdir(parents=True, exist_ok=True)
        self.session = Session(outdir=str(self.outdir))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.api_url = f"{self.url}sdapi/v1"
        self.app = launch(self.session, str(self.outdir), "tiny", port=self.port, block=False, **flags)

    def client(self, user: str | None = None, password: str | None = None):
        """A webuiapi client of the A1111 API (a server started with `api=True`)."""
        import webuiapi

        return webuiapi.WebUIApi(port=self.port, username=user, password=password)

    def close(self):
        self.app.close()


def module_server(folder: str, **flags):
    """A module-scoped `server` fixture: one Server for the test module that imports it, in a temporary `folder`."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        srv = Server(tmp_path_factory.mktemp(folder), **flags)
        yield srv
        srv.close()

    return server
