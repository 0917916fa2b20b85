"""The A1111 API against hostile requests, through real HTTP to the running server (FAULTS 33, 35, 36; issue 29
items 1, 5, 6, 7): the login is checked before the body is read, every body has a size limit (413), bad JSON
(NaN, Infinity, 1e400, lone surrogates, deep nesting) is a 422 naming the field, and a non-ASCII user logs in.

Raw sockets where a client library would not send the request (a body announced but never sent, a body that
streams past the limit)."""

from __future__ import annotations

import base64
import json
import socket
import time

import pytest
import requests

from servers import Server

BIG = 200 * 2**20  # the attack run's 200 MB


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """The API alone (--nowebui, as the attack run), with a login and a 1 MiB body limit."""
    srv = Server(tmp_path_factory.mktemp("sec"), api=True, webui=False, api_auth="u:p,ü:pässword",
                 api_body_limit=1)
    yield srv
    srv.close()


def _raw(srv, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes, float]:
    """Send `head` (request line and headers) and `body`, nothing more; the status and answer that came back, and
    how long it took. The connection stays open: a server that waits for the announced body times out here."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode("latin-1") + b"\r\n" + body)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or not _complete(answer):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except socket.timeout:
            pass
    if not answer:
        return 0, b"", time.monotonic() - started
    return int(answer.split(b" ", 2)[1]), answer.partition(b"\r\n\r\n")[2], time.monotonic() - started


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


# -- FAULTS 33: the login before the body; a limit on every body -----------------------------------------------

def test_an_anonymous_client_is_refused_before_its_body_is_read(guarded):
    head = (f"POST /sdapi/v1/txt2img HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\n"
            f"Content-Length: {BIG}\n")
    status, body, took = _raw(guarded, head, b'{"prompt": "')  # 200 MB announced, 12 bytes sent
    assert status == 401 and took < 5, (status, took)
    assert json.loads(body)["detail"] == "Incorrect username or password"


def test_an_anonymous_body_that_streams_is_not_held(guarded):
    """An anonymous client pushes 200 MB: the server answers 401 and stops reading, so it never holds the body."""
    before = _rss()
    sent = 0
    chunk = b" " * 2**20
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=3) as sock:
        sock.sendall(f"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {BIG}\r\n\r\n".encode())
        try:
            while sent < BIG:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the server closed the connection, or stopped reading (the send timed out)
            pass
    assert sent < BIG // 2, f"the server read {sent >> 20} MiB of an anonymous body"
    assert _rss() - before < 100 * 2**20


def test_a_body_past_the_limit_is_413_for_a_logged_in_client_too(guarded):
    head = (f"POST /sdapi/v1/txt2img HTTP/1.1\nHost: x\nAuthorization: {_basic('u', 'p')}\n"
            f"Content-Type: application/json\nContent-Length: {BIG}\n")
    status, body, took = _raw(guarded, head, b"{")
    assert status == 413 and took < 5, (status, took)
    assert "--api-body-limit" in json.loads(body)["detail"]
    # chunked: no Content-Length to go by, the bytes are counted as they come
    def chunks():
        for _ in range(3):
            yield b" " * (600 * 1024)
    answer = requests.post(f"{guarded.api_url}/txt2img", data=chunks(), auth=("u", "p"), timeout=30,
                           headers={"Content-Type": "application/json"})
    assert answer.status_code == 413


def test_a_body_under_the_limit_still_reaches_its_route(guarded):
    answer = requests.post(f"{guarded.api_url}/png-info", json={"image": "not base64!"}, auth=("u", "p"),
                           timeout=30)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "image"]


def test_the_body_limit_flag_is_checked_before_the_server_starts(tmp_path):
    from lowvram_gen.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="--api-body-limit"):
        Server(tmp_path, api=True, webui=False, api_body_limit=0)


def test_the_ui_command_passes_the_body_limit(monkeypatch, tmp_path):
    from lowvram_gen import server as launch_module
    from lowvram_gen.cli.main import main

    launched = []
    monkeypatch.setattr(launch_module, "check_port", lambda port, host: int(port))
    monkeypatch.setattr(launch_module, "launch", lambda session, outdir, model, **kw: launched.append(kw))
    assert main(["ui", "--nowebui", "--api-body-limit", "8", "--outdir", str(tmp_path)]) == 0
    assert launched[0]["api_body_limit"] == 8


# -- FAULTS 35, 36: what the body's JSON holds ---------------------------------------------------------------

@pytest.mark.parametrize("text, field", [
    ('{"prompt": "x", "cfg_scale": NaN}', "cfg_scale"),
    ('{"prompt": "x", "seed": 1e400}', "seed"),
    ('{"prompt": "x", "denoising_strength": Infinity}', "denoising_strength"),
    ('{"prompt": "x", "alwayson_scripts": {"controlnet": {"args": [{"weight": -Infinity}]}}}',
     "alwayson_scripts.controlnet.args.0.weight"),
    ('{"prompt": "lone \\ud800 here"}', "prompt"),
])
def test_numbers_and_text_json_cannot_carry_are_422_naming_the_field(guarded, text, field):
    answer = requests.post(f"{guarded.api_url}/txt2img", data=text.encode(), auth=("u", "p"), timeout=30,
                           headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert ".".join(str(p) for p in detail["loc"][1:]) == field and detail["msg"].startswith(f"{field}: ")


def test_deeply_nested_json_is_422_not_a_recursion_error(guarded):
    nested = b"[" * 100000 + b"]" * 100000  # valid JSON, 200 kB
    answer = requests.post(f"{guarded.api_url}/txt2img", data=nested, auth=("u", "p"), timeout=30,
                           headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "nested too deeply" in answer.json()["detail"][0]["msg"]


def test_a_body_that_is_not_utf8_is_422(guarded):
    answer = requests.post(f"{guarded.api_url}/txt2img", data=b'{"prompt": "\xff\xfe"}', auth=("u", "p"),
                           timeout=30, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "UTF-8" in answer.json()["detail"][0]["msg"]


# -- FAULTS 36: a user name that is not ASCII ------------------------------------------------------------------

def test_a_non_ascii_api_user_logs_in_with_utf8_basic_auth(guarded):
    status, body, _ = _raw(guarded, f"GET /sdapi/v1/options HTTP/1.1\nHost: x\n"
                                    f"Authorization: {_basic('ü', 'pässword')}\n")
    assert status == 200, body
    status, _, _ = _raw(guarded, f"GET /sdapi/v1/options HTTP/1.1\nHost: x\nAuthorization: {_basic('ü', 'p')}\n")
    assert status == 401
    # requests sends str credentials as latin-1: the same user typed by an old client is not the UTF-8 one
    assert requests.get(f"{guarded.api_url}/options", auth=("ü".encode(), "pässword".encode()),
                        timeout=30).status_code == 200


def test_a_non_ascii_gradio_user_logs_in_to_the_ui_and_the_api(tmp_path):
    srv = Server(tmp_path, api=True, auth="ü:p")
    try:
        login = requests.post(f"{srv.url}login", data={"username": "ü", "password": "p"}, timeout=30)
        assert login.status_code == 200 and login.json() == {"success": True}
        assert requests.get(f"{srv.api_url}/options", auth=("ü".encode(), b"p"), timeout=30).status_code == 200
        # on gradio's app (--api) too, the login comes before the body
        status, _, took = _raw(srv, f"POST /sdapi/v1/txt2img HTTP/1.1\nHost: x\nContent-Length: {BIG}\n", b"{")
        assert status == 401 and took < 5, (status, took)
    finally:
        srv.close()


def test_a_user_name_that_is_not_unicode_is_refused_at_start():
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.server import parse_auth

    name = b"\xfc".decode("utf-8", "surrogateescape")  # a Latin-1 'ü' from a non-UTF-8 terminal, as argv holds it
    with pytest.raises(InvalidRequest, match="not valid UTF-8"):
        parse_auth(f"{name}:p", "--api-auth")
