"""What an API request passes before its route reads it: the login from its headers alone (HTTP Basic, UTF-8 as RFC
7617 says), then its body, read up to a size limit, then that body's JSON, parsed once with limits.

Order matters (FAULTS 33): a client without the password is answered 401 before one byte of its body is read, and
nobody (with a password or not) makes the server hold more than the limit: a Content-Length past it is answered 413
at once, and a body that streams (chunked) is counted as it comes and refused when it passes the limit.

The JSON (FAULTS 35, 36): NaN, Infinity and numbers too large for a float (1e400), lone surrogates (`"\\ud800"`),
invalid UTF-8 and nesting deeper than MAX_DEPTH are refused with 422 naming the field, in FastAPI's validation
body as the routes' other refusals; never a 500 or a RecursionError.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from hmac import compare_digest

from lowvram_gen import safe_json
from lowvram_gen.api.answers import error_body

DEFAULT_BODY_LIMIT_MB = 64
MAX_DEPTH = safe_json.MAX_DEPTH  # A1111's deepest body (alwayson_scripts.controlnet.args[i].field) is 5 levels


class Refused(Exception):
    """A request answered before its route runs: `status` (401, 413 or 422) and the body to answer."""

    def __init__(self, status: int, body: dict, headers: dict | None = None):
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers


def basic_credentials(header: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) as bytes from an `Authorization: Basic ...` header; None when absent or malformed.
    Bytes, not text: the client's UTF-8 is compared with the configured names' UTF-8, whatever they hold."""
    scheme, _, param = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(param.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


def authorized(credentials: list[tuple[str, str]] | None, header: str | None) -> bool:
    """Whether `header` names one of `credentials` (no credentials: everyone is)."""
    if not credentials:
        return True
    given = basic_credentials(header)
    if given is None:
        return False
    found = False
    for user, password in credentials:  # every pair compared: the time does not say which user exists
        found |= compare_digest(given[0], user.encode("utf-8")) & compare_digest(given[1], password.encode("utf-8"))
    return found


# On a refusal before the body was read, the connection closes after the answer: kept open, the server would go
# on reading (and dropping) whatever the client still sends, for as long as it sends.
_CLOSE = {"Connection": "close"}


def unauthorized() -> Refused:
    return Refused(401, _http_error(401, "Incorrect username or password"), {"WWW-Authenticate": "Basic", **_CLOSE})


def too_large(limit: int) -> Refused:
    return Refused(413, _http_error(413, f"the request body is larger than the API's limit of {limit // 2**20} MiB "
                                   f"(--api-body-limit)"), _CLOSE)


def _http_error(status: int, message: str) -> dict:
    """A1111's error body of an HTTPException (`errors` is its str(): the status, then the message)."""
    return error_body(f"{status}: {message}", detail=message)


async def read_body(request, limit: int) -> bytes:
    """The body, at most `limit` bytes: a Content-Length past it is refused before reading, a streamed body as soon
    as what came passes it."""
    announced = request.headers.get("content-length")
    if announced is not None:
        try:
            if int(announced) > limit:
                raise too_large(limit)
        except ValueError:
            raise Refused(400, _http_error(400, "Content-Length is not a number"), _CLOSE) from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class _Bad:
    """A number JSON cannot carry (NaN, Infinity, 1e400), kept with its text until the field is known."""

    def __init__(self, text: str):
        self.text = text


def _float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _Bad(text)


def parse(body: bytes):
    """The JSON of `body`, or Refused(422) naming the first field that holds what no job can take. The nesting is
    measured first by safe_json's linear scan (json.loads would recurse into it); the numbers and strings are
    checked here, where the field that holds them is known."""
    if safe_json.depth(body) > MAX_DEPTH:
        raise _refusal([], "<nested>", f"the JSON is nested too deeply (more than {MAX_DEPTH} levels)")
    try:
        value = json.loads(body, parse_constant=_Bad, parse_float=_float)
    except RecursionError:
        raise _refusal([], "<nested>", f"the JSON is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except UnicodeDecodeError:
        raise _refusal([], "<bytes>", "the body is not UTF-8 text: send JSON in UTF-8") from None
    except ValueError as exc:  # JSONDecodeError included: FastAPI's own answer for it
        pos = getattr(exc, "pos", 0)
        raise Refused(422, {"detail": [{"type": "json_invalid", "loc": ["body", pos], "msg": "JSON decode error",
                                        "input": {}, "ctx": {"error": getattr(exc, "msg", str(exc))}}]}) from None
    _check(value)
    return value


def _check(value) -> None:
    """Walk the parsed body without recursion: the depth, the numbers and the strings of every field."""
    todo = [(value, [])]
    while todo:
        item, path = todo.pop()
        if len(path) > MAX_DEPTH:
            raise _refusal([], "<nested>", f"the JSON is nested too deeply (more than {MAX_DEPTH} "
                                                         f"levels)")
        if isinstance(item, _Bad):
            raise _refusal(path, item.text, f"{item.text} is not a number JSON can carry: send a finite number")
        if isinstance(item, str):
            _text(item, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                _text(key, path + [key])
                todo.append((child, path + [key]))
        elif isinstance(item, list):
            todo.extend((child, path + [i]) for i, child in enumerate(item))


def _text(text: str, path: list) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = _shown(text)
        shown = shown if len(shown) <= 80 else shown[:80] + "..."
        raise _refusal(path, shown, f"holds a lone surrogate ({text[exc.start]!a}), which is not text: send "
                                    f"valid Unicode") from None


def _shown(text: str) -> str:
    """`text` with its surrogates written as escapes: an answer must itself be valid UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _refusal(path: list, shown: str, message: str) -> Refused:
    path = [_shown(p) if isinstance(p, str) else p for p in path]
    field = ".".join(str(p) for p in path)
    named = f"{field}: " if field else ""
    return Refused(422, {"detail": [{"type": "value_error", "loc": ["body", *path], "msg": named + message,
                                     "input": shown}]})
