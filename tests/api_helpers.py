"""What the tests of A1111's REST API (`lowvram-gen ui --api`) share: the `server` fixture (the web UI and its API in
this process: servers.py), the `api` fixture (a webuiapi client of it) and `_post` (plain HTTP where webuiapi has no
call: the error bodies, unknown fields).

Not a test module (pytest collects test_*.py only): a test module imports its fixtures from here
(`from api_helpers import api, server  # noqa: F401`), never from another test module.
"""

from __future__ import annotations

import pytest
import requests

from servers import module_server

server = module_server("api", api=True)  # the web UI with the API, one for each test module that imports it


@pytest.fixture()
def api(server):
    return server.client()


def _post(server, route: str, body: dict, **kw) -> requests.Response:
    return requests.post(f"{server.api_url}/{route}", json=body, timeout=300, **kw)
