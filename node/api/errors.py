"""The one place exceptions become HTTP responses in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from node.api.appkeys import MAX_BODY
from node.errors import InvalidRequest, MethodNotAllowed, NodeError, NotFound, PayloadTooLarge

log = logging.getLogger(__name__)


def error_response(exc: NodeError, headers: dict[str, str] | None = None) -> web.Response:
    """JSON body `{"error": {...}}` with the error's status."""
    return web.Response(
        status=exc.http_status,
        text=json.dumps(exc.to_openai()),
        content_type="application/json",
        headers=headers,
    )


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
    """Map NodeError (and stray HTTP exceptions) to the OpenAI error shape; log the unexpected."""
    try:
        return await handler(request)
    except NodeError as exc:
        if exc.http_status >= 500:
            log.warning("request failed path=%s status=%d error=%s", request.path, exc.http_status, exc.message)
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http(exc))
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(NodeError("internal server error; see the node log for details"))


async def read_json(request: web.Request) -> object:
    """The request body as JSON, or a clear 400."""
    if request.content_length is not None and request.content_length > request.app[MAX_BODY]:
        raise PayloadTooLarge(f"request body is larger than {request.app[MAX_BODY]} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body is larger than {request.app[MAX_BODY]} bytes") from exc
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object")
    if len(raw) > _PARSE_ON_LOOP_MAX_BYTES:  # megabytes of JSON would stall the loop for tens of ms
        return await asyncio.get_running_loop().run_in_executor(None, _parse_json, raw)
    return _parse_json(raw)


_PARSE_ON_LOOP_MAX_BYTES = 256 * 1024


def _parse_json(raw: bytes) -> object:
    try:
        body = json.loads(raw)
        # \ud800-style escapes decode to lone surrogates, which no tokenizer can encode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return body
    except UnicodeEncodeError as exc:
        raise InvalidRequest("request body holds a string that is not valid Unicode (a lone surrogate "
                             f"escape such as \\u{ord(exc.object[exc.start]):04x})") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest("request body is not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError as exc:
        raise InvalidRequest("request body is nested too deeply") from exc
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise InvalidRequest(f"request body is not valid JSON: {str(exc)[:200]}") from exc
