"""Host-header check (DNS-rebinding defence) and API-key authentication."""

from __future__ import annotations

import hmac
import ipaddress
import logging

from aiohttp import web

from node.errors import AuthenticationFailed, ForbiddenHost

log = logging.getLogger(__name__)

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
OPEN_PATHS = {"/health", "/v1/health", "/health/ready", "/metrics"}  # no key needed (still Host-checked)
# llama-server's own inference routes (api/llama_native.py, api/embed_routes.py, api/rerank_routes.py)
# and its aliases of /v1 routes without the prefix (api/openai.py, api/openai_responses.py): the key as on /v1
NATIVE_PATHS = frozenset({"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/apply-template",
                          "/props", "/embedding", "/embeddings", "/rerank", "/reranking",
                          "/models", "/chat/completions", "/responses"})


def _host_name(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8800
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        return host.rsplit(":", 1)[0]
    return host


def host_allowed(host_header: str | None, extra: set[str]) -> bool:
    """True for loopback names/addresses and explicitly allowed names."""
    if not host_header:
        return False
    name = _host_name(host_header)
    if name in LOOPBACK_NAMES or name in extra:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def presented_key(request: web.Request) -> str | None:
    """The key from `Authorization: Bearer …` or `x-api-key`."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def make_auth_middleware(api_key: str, *, inference_needs_key: bool, allowed_hosts: set[str]):
    """Middleware: Host check on every path; the key on admin always, inference by default."""

    @web.middleware
    async def auth_middleware(request: web.Request, handler):
        if not host_allowed(request.headers.get("Host"), allowed_hosts):
            log.warning("DIAG: rejected request with a non-loopback Host header path=%s", request.path)
            raise ForbiddenHost("Host header is not a loopback name; refusing (DNS-rebinding protection)")
        path = request.path
        needs_key = path.startswith("/api/admin") or (
            (path.startswith("/v1") or path in NATIVE_PATHS) and inference_needs_key)
        if needs_key and path not in OPEN_PATHS:
            key = presented_key(request)
            if not key or not hmac.compare_digest(key.encode(), api_key.encode()):
                log.debug("DIAG: auth failure path=%s auth_present=%s", path, key is not None)
                raise AuthenticationFailed(
                    "Incorrect API key provided." if key else
                    "Missing API key: send `Authorization: Bearer <key>` (the key is in the data dir's api_key file).")
        return await handler(request)

    return auth_middleware
