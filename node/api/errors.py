"""The one place exceptions become HTTP error responses: the OpenAI shape everywhere, Anthropic's
shape on the Anthropic Messages routes (/v1/messages...), Ollama's `{"error": "..."}` on Ollama's
routes (/api/..., but /api/admin). The status is the NodeError's in each."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping
from typing import Literal

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from node import const
from node.api.appkeys import MAX_BODY
from node.api.body_decode import IDENTITY, decode_content
from node.errors import (
    AuthenticationFailed,
    BodyTimeout,
    ForbiddenHost,
    InsufficientCapacity,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    ModelUnavailable,
    NodeError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
)
from node.values import MAX_JSON_DEPTH, NestedTooDeeply, loads_bounded

log = logging.getLogger(__name__)

ANTHROPIC_PATH_PREFIX = "/v1/messages"
MODELS_PATH = "/v1/models"  # both SDKs list models here
OLLAMA_PATH_PREFIX = "/api/"
ADMIN_PATH_PREFIX = "/api/admin"
ErrorShape = Literal["openai", "anthropic", "ollama"]
# what to do here instead of Ollama's pull (its /api/pull answers the same way: api/ollama_models.py)
_NO_PULL = "SwarmLLM pulls from no registry: add a GGUF with `swarmllm download <url>` or the app's Models page"

# NodeError class -> Anthropic error type (the nearest class in the exception's MRO wins);
# https://docs.anthropic.com/en/api/errors lists the types
_ANTHROPIC_TYPES: dict[type[NodeError], str] = {
    InvalidRequest: "invalid_request_error",
    MethodNotAllowed: "invalid_request_error",
    AuthenticationFailed: "authentication_error",
    ForbiddenHost: "permission_error",
    NotFound: "not_found_error",
    PayloadTooLarge: "request_too_large",
    Overloaded: "rate_limit_error",
    RequestTimeout: "timeout_error",
    ModelUnavailable: "overloaded_error",
    InsufficientCapacity: "overloaded_error",
}


def anthropic_error_type(exc: NodeError) -> str:
    """The Anthropic `error.type` of a NodeError (api_error for anything else)."""
    for cls in type(exc).__mro__:
        if cls in _ANTHROPIC_TYPES:
            return _ANTHROPIC_TYPES[cls]
    if exc.http_status < 500:  # a stray HTTP exception mapped by _from_http
        return "invalid_request_error"
    return "api_error"


def to_anthropic(exc: NodeError) -> dict:
    """The Anthropic error body: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": anthropic_error_type(exc), "message": exc.message}}


def error_body(exc: NodeError, shape: ErrorShape = "openai") -> dict:
    """The error's body in one API's shape (Ollama's is `{"error": message}`: its clients read that string)."""
    if shape == "anthropic":
        return to_anthropic(exc)
    if shape == "ollama":
        return {"error": _ollama_message(exc)}
    return exc.to_openai()


def _ollama_message(exc: NodeError) -> str:
    """The message in Ollama's words where its apps read them: a model no name answers to is its
    404 `model "x" not found, try pulling it first` (server/routes.go; apps match "not found" and
    offer a pull, or say to run `ollama pull x`), then, after it, how to add a model here."""
    if isinstance(exc, ModelNotFound) and exc.model is not None:
        return (f"model {json.dumps(exc.model, ensure_ascii=False)} not found, try pulling it first "
                f"({_NO_PULL}; GET /api/tags lists the models this node serves)")
    return exc.message


def error_response(exc: NodeError, headers: dict[str, str] | None = None, *,
                   shape: ErrorShape = "openai") -> web.Response:
    """The error's status with the OpenAI body `{"error": {...}}` (or Anthropic's, or Ollama's)."""
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(retry_after)}
    if getattr(exc, "should_retry", None) is False:  # the official SDKs obey it before the status
        headers = {**(headers or {}), "x-should-retry": "false"}
    return web.Response(
        status=exc.http_status,
        text=json.dumps(error_body(exc, shape)),
        content_type="application/json",
        headers=headers,
    )


def is_anthropic_path(path: str) -> bool:
    """True on the Anthropic Messages routes, whose errors take Anthropic's shape."""
    return path == ANTHROPIC_PATH_PREFIX or path.startswith(ANTHROPIC_PATH_PREFIX + "/")


def is_ollama_path(path: str) -> bool:
    """True on Ollama's routes (/api/chat, /api/tags, ...; not the node's own /api/admin)."""
    return path.startswith(OLLAMA_PATH_PREFIX) and not (
        path == ADMIN_PATH_PREFIX or path.startswith(ADMIN_PATH_PREFIX + "/"))


def path_error_shape(path: str, headers: Mapping[str, str] | None = None) -> ErrorShape:
    """The error shape a path's clients read. /v1/models serves both SDKs: the anthropic one (its
    `anthropic-version` header on every request) reads Anthropic's."""
    if is_anthropic_path(path):
        return "anthropic"
    if headers is not None and _is_models_path(path) and "anthropic-version" in headers:
        return "anthropic"
    return "ollama" if is_ollama_path(path) else "openai"


def _is_models_path(path: str) -> bool:
    return path == MODELS_PATH or path.startswith(MODELS_PATH + "/")


def _from_http(exc: web.HTTPException) -> NodeError:
    if isinstance(exc, web.HTTPNotFound):
        return NotFound(f"no route for this path ({exc.reason})")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"method not allowed; allowed: {', '.join(sorted(exc.allowed_methods))}")
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("request body is too large")
    err = NodeError(exc.reason or "HTTP error")
    err.http_status = exc.status
    err.error_type = "invalid_request_error" if exc.status < 500 else "server_error"
    err.code = None
    return err


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Map NodeError (and stray HTTP exceptions) to the path's error shape; log the unexpected."""
    shape = path_error_shape(request.path, request.headers)
    try:
        return await handler(request)
    except NodeError as exc:
        if exc.http_status >= 500:
            log.warning("request failed path=%s status=%d error=%s", request.path, exc.http_status, exc.message)
        return error_response(exc, shape=shape)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http(exc), shape=shape)
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(NodeError("internal server error; see the node log for details"), shape=shape)


def _received(request: web.Request) -> int:
    """Body bytes received so far, as sent (`total_raw_bytes` from aiohttp 3.13; before it
    `total_bytes`, the same count here: the server does not decompress)."""
    content = request.content
    return getattr(content, "total_raw_bytes", content.total_bytes)


async def read_json(request: web.Request) -> object:
    """The request body as JSON, or a clear 400."""
    if request.content_length is not None and request.content_length > request.app[MAX_BODY]:
        raise PayloadTooLarge(f"request body is larger than {request.app[MAX_BODY]} bytes")
    try:
        raw = await _read_body(request)
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body is larger than {request.app[MAX_BODY]} bytes") from exc
    except RequestPayloadError as exc:  # e.g. Content-Encoding: gzip on a body that is not gzip
        # the rest of the body cannot be read either: the connection ends after this answer, and
        # aiohttp does not try to drain it afterwards (which logged the error again as unhandled)
        _end_connection(request)
        raise InvalidRequest(f"request body could not be read: {exc}") from exc
    except BodyTimeout:
        _end_connection(request)
        raise
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if raw and encoding not in IDENTITY:  # off the loop, stopping at the limit (body_decode.py)
        raw = await asyncio.get_running_loop().run_in_executor(None, decode_content, raw, encoding,
                                                               request.app[MAX_BODY])
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object")
    if len(raw) > _PARSE_ON_LOOP_MAX_BYTES:  # megabytes of JSON would stall the loop for tens of ms
        return await asyncio.get_running_loop().run_in_executor(None, parse_json_text, raw)
    return parse_json_text(raw)


_PARSE_ON_LOOP_MAX_BYTES = 256 * 1024


async def _read_body(request: web.Request) -> bytes:
    """`request.read()`, given up (BodyTimeout) when the client sends no byte for API_BODY_STALL_S
    or has not finished after API_BODY_READ_MAX_S. aiohttp has no timeout of its own here: a
    Content-Length larger than what was sent, or a chunked body that stops, held the handler and the
    connection (with up to max_request_body_bytes of it in memory) for as long as the socket stayed open."""
    if not request.body_exists or request.content.is_eof():  # nothing to wait for: the usual request,
        return await request.read()                          # its whole body already here, no timer
    reading = asyncio.ensure_future(request.read())
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + const.API_BODY_READ_MAX_S
    seen = _received(request)
    try:
        while True:
            wait_s = min(const.API_BODY_STALL_S, give_up_at - loop.time())
            done, _ = await asyncio.wait({reading}, timeout=max(wait_s, 0))
            if done:
                return reading.result()
            got = _received(request)
            if got == seen or loop.time() >= give_up_at:
                why = "sent nothing" if got == seen else "was still not complete"
                log.warning("DIAG: request body timed out path=%s received_bytes=%d declared_bytes=%s why=%s",
                            request.path, got, request.content_length, why.replace(" ", "_"))
                after = const.API_BODY_STALL_S if got == seen else const.API_BODY_READ_MAX_S
                raise BodyTimeout(f"the request body {why} for {after:g} s; "
                                  f"received {got} bytes of {request.content_length or 'a chunked body'}")
            seen = got
    finally:
        if not reading.done():
            reading.cancel()


def _end_connection(request: web.Request) -> None:
    """The connection ends after this answer; its unread body is not drained."""
    request.content.feed_eof()
    if request.protocol is not None:
        request.protocol.close()


def _not_json(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON allows the literal, Python reads it as inf
        raise ValueError(f"{text[:40]} is beyond a float's range")
    return value


def parse_json_text(text: str | bytes, what: str = "request body") -> object:
    """JSON text (a body, or a JSON value sent as a string inside one: Ollama's `format`) parsed as
    the body is: NaN / Infinity / 1e999, lone surrogates and nesting too deep are a 400 naming `what`
    (json.loads took them, and the schema's lone surrogate reached the grammar engine: a 500)."""
    try:
        # Python's json reads NaN and Infinity (JSON has neither) and 1e999 as inf: a body echoed back
        # (Responses' metadata) would then not be JSON
        body = loads_bounded(text, parse_constant=_not_json, parse_float=_finite)
        # \ud800-style escapes decode to lone surrogates, which no tokenizer can encode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return body
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{what} holds a string that is not valid Unicode (a lone surrogate "
                             f"escape such as \\u{ord(exc.object[exc.start]):04x})") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except (NestedTooDeeply, RecursionError) as exc:
        raise InvalidRequest(f"{what} is nested too deeply (more than {MAX_JSON_DEPTH} levels of "
                             f"arrays and objects)") from exc
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise InvalidRequest(f"{what} is not valid JSON: {str(exc)[:200]}") from exc
