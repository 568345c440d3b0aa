"""CORS for browser apps, off unless origins are configured (`cors_origins`, `SWARMLLM_CORS_ORIGINS`).

A web page on http://localhost:3000 that calls the node must first pass a preflight: an OPTIONS
request with `Origin` and `Access-Control-Request-Method` and never a key (browsers do not send
one there), so it is answered before the key check. Every other response to an allowed origin,
streams and errors included, carries `Access-Control-Allow-Origin` (added as it is prepared, the
moment a stream's headers leave) and exposes the `x-swarm-*`, `server-timing`, `retry-after` and
`x-should-retry` headers (a browser SDK reads the last to leave a failed model's 500 unretried).
`"*"` allows any origin; the key still guards every request but the preflight, and the Host check
(DNS rebinding) is unchanged. With `require_api_key_for_inference = false` a request whose Origin is
not allowed here still needs the key (auth.py: a page's text/plain POST needs no preflight).
"""

from __future__ import annotations

import logging

from aiohttp import web

log = logging.getLogger(__name__)

_METHODS = "GET, POST, DELETE, OPTIONS"
_EXPOSED = "server-timing, x-request-id, x-swarm-route, x-swarm-segments, x-swarm-peers, x-swarm-nodes, retry-after, x-should-retry"
_MAX_AGE_S = "600"


def allowed_origins(origins: list[str]) -> frozenset[str]:
    """cors_origins as origin_allowed matches them."""
    return frozenset(o.strip().rstrip("/").lower() for o in origins if o.strip())


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    return origin is not None and ("*" in allowed or origin.rstrip("/").lower() in allowed)


def install(app: web.Application, origins: list[str]) -> None:
    """Answer preflights and tag responses for `origins` (nothing at all when empty)."""
    allowed = allowed_origins(origins)
    if not allowed:
        return

    @web.middleware
    async def preflight(request: web.Request, handler):
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not origin_allowed(origin, allowed):
                log.debug("DIAG: CORS preflight refused origin=%s path=%s", origin, request.path)
                return web.Response(status=403, text="origin not allowed (cors_origins)")
            return web.Response(status=204, headers={
                "Access-Control-Allow-Methods": _METHODS,
                "Access-Control-Allow-Headers": request.headers.get(
                    "Access-Control-Request-Headers", "authorization, content-type"),
                "Access-Control-Max-Age": _MAX_AGE_S,
            })
        return await handler(request)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin_allowed(origin, allowed):
            response.headers["Access-Control-Allow-Origin"] = origin  # type: ignore[assignment]
            response.headers["Access-Control-Expose-Headers"] = _EXPOSED
            response.headers.add("Vary", "Origin")

    app.middlewares.insert(0, preflight)  # outermost: before the Host and key checks
    app.on_response_prepare.append(on_prepare)
