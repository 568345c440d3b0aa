"""Host-header check (DNS-rebinding defence) and API-key authentication."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import time
from collections import OrderedDict

from aiohttp import web

from node import const
from node.api.cors import origin_allowed
from node.api.errors import is_ollama_path
from node.errors import AuthenticationFailed, ForbiddenHost

log = logging.getLogger(__name__)

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
OPEN_PATHS = {"/health", "/v1/health", "/health/ready", "/metrics"}  # no key needed (still Host-checked)
# llama-server's own inference routes (api/llama_native.py, api/embed_routes.py, api/rerank_routes.py)
# and its aliases of /v1 routes without the prefix (api/openai.py, api/openai_responses.py): the key as on /v1
NATIVE_PATHS = frozenset({"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/apply-template",
                          "/props", "/embedding", "/embeddings", "/rerank", "/reranking",
                          "/models", "/chat/completions", "/responses"})



class RefusedHosts:
    """Which refused Host names are said at WARNING: a name once per API_REFUSED_HOST_REPEAT_S, and
    at most API_REFUSED_HOST_PER_WINDOW names per window, the others counted and said with the next
    WARNING. 2026-12-07: a rebinding page or a LAN scanner retrying wrote a WARNING per request;
    then (review r35) the first 64 names were said for good, so a page's random subdomains left a
    later real misconfiguration unsaid."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._said: OrderedDict[str, float] = OrderedDict()  # name -> when last said at WARNING
        self._window_start = -math.inf
        self._in_window = 0
        self.held = 0  # refused requests not said at WARNING since the last WARNING

    def warn(self, name: str) -> tuple[bool, int]:
        """(whether to say this refusal at WARNING, how many were held back before it)."""
        now = self._clock()
        last = self._said.get(name)
        if last is not None and now - last < const.API_REFUSED_HOST_REPEAT_S:
            self.held += 1
            return False, 0
        if now - self._window_start >= const.API_REFUSED_HOST_WINDOW_S:
            self._window_start, self._in_window = now, 0
        if self._in_window >= const.API_REFUSED_HOST_PER_WINDOW:
            self.held += 1
            return False, 0
        self._in_window += 1
        self._said[name] = now
        self._said.move_to_end(name)
        while len(self._said) > const.API_REFUSED_HOST_NAMES_KEPT:
            self._said.popitem(last=False)
        held, self.held = self.held, 0
        return True, held


def host_name(host: str) -> str:
    """The name in a Host header (or an allowed_hosts entry) as matched: lower case, no port, no
    brackets, no trailing dot (`localhost.`), no IPv6 zone id (`[fe80::1%25eth0]`)."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8800
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if ":" in host:  # an IPv6 address: its zone id, raw or as a URL writes it (%25)
        host = host.split("%", 1)[0]
    return host.rstrip(".")


def allowed_names(hosts) -> frozenset[str]:
    """allowed_hosts as host_allowed matches them (`host.docker.internal:8800` is host.docker.internal)."""
    return frozenset(name for name in (host_name(h) for h in hosts) if name)


def bind_name(host: str) -> list[str]:
    """`--host NAME` (a name, not an address): the name, which the printed API URL carries, allowed
    as a Host (2026-12-07, review r35: `--host mylaptop.local` printed a URL the node refused, 403)."""
    name = host_name(host)
    return [name] if name and not _is_ip(name) else []


def host_allowed(host_header: str | None, extra: frozenset[str] | set[str]) -> bool:
    """True for loopback names, any IP address, and explicitly allowed names. An IP address is no
    DNS-rebinding risk (a page whose origin is an address is served by that address: rebinding
    needs a name the attacker's DNS answers), so a phone or WSL reaching a node bound to the LAN by
    its address needs only the key (2026-12-07: it needed `--allow-host ADDRESS` too, as Ollama's
    check does not); a name stays refused unless allowed."""
    if not host_header:
        return False
    name = host_name(host_header)
    if name in LOOPBACK_NAMES or name in extra:
        return True
    return _is_ip(name)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (`--host`) reaches this machine only: a loopback name or address."""
    name = host_name(host)
    return name in LOOPBACK_NAMES or _is_loopback_ip(name)


def _is_loopback_ip(text: str) -> bool:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 (a dual-stack listener's IPv4 client)
    return address.is_loopback


# headers a proxy or tunnel adds: a request through one on this machine (nginx or Caddy for TLS,
# `tailscale serve`, `ssh -L 0.0.0.0:…`) comes from loopback but may be from anywhere (2026-12-07)
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP", "Via")

# the Content-Types a web page may send cross-origin without a CORS preflight (the Fetch standard's
# CORS-safelisted ones); application/json, and any other, makes a browser ask first
SIMPLE_CONTENT_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})


def client_is_local(request: web.Request) -> bool:
    """Whether the connection comes from this machine's loopback and names no proxy (never the Host
    header: any client can write `Host: localhost`). A forwarder that adds no header (socat, a plain
    `ssh -L`) cannot be told apart: its clients count as this machine's."""
    if not request.remote or not _is_loopback_ip(request.remote):
        return False
    return not any(name in request.headers for name in PROXY_HEADERS)


def unpreflighted_write(request: web.Request) -> bool:
    """Whether a web page could have sent this request with no CORS preflight and had it act here:
    a POST with no Content-Type or a safelisted one (a form, `fetch` with `mode: "no-cors"`). Any
    other write (application/json, PUT, DELETE) a browser sends only after a preflight, which the
    node refuses to an origin not in cors_origins; a GET acts on nothing and its answer is not
    readable by such a page. Browser extensions and Electron apps send an Origin but no preflight:
    their JSON requests are not a page's (2026-12-07, review r37: they were 401s under the keyless
    setting)."""
    if request.method != "POST":
        return False
    content_type = request.headers.get("Content-Type")
    if content_type is None:
        return True
    return content_type.split(";", 1)[0].strip().lower() in SIMPLE_CONTENT_TYPES


def forbidden_host_text(host_header: str | None) -> str:
    """What a client whose Host is refused is told: the name, and the setting that admits it."""
    if not host_header:
        return "Missing Host header; refusing (DNS-rebinding protection)"
    name = host_name(host_header)
    shown = name if name.isprintable() and len(name) <= 100 else "this name"
    listed = f"[{name}]" if ":" in name else name
    return (f"Host {shown!r} is not allowed (DNS-rebinding protection: this node answers loopback names, "
            f"IP addresses and the names in its allowed_hosts setting). To reach it by this name, add it to the "
            f"node's config.toml (allowed_hosts = [\"{listed}\"]) or start it with --allow-host {listed}")


def presented_key(request: web.Request) -> str | None:
    """The key from `Authorization: Bearer …` or `x-api-key`."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def make_auth_middleware(api_key: str, *, inference_needs_key: bool, allowed_hosts: frozenset[str],
                         cors_origins: frozenset[str] = frozenset(), refused: RefusedHosts | None = None):
    """Middleware: Host check on every path; the key on admin always, on inference by default and
    always for a client that is not on this machine's loopback, or is a web page whose origin is
    not in cors_origins."""

    refused = refused or RefusedHosts()

    @web.middleware
    async def auth_middleware(request: web.Request, handler):
        host = request.headers.get("Host")
        if not host_allowed(host, allowed_hosts):
            warn, held = refused.warn(host_name(host or "")[:100])
            log.log(logging.WARNING if warn else logging.DEBUG,
                    "DIAG: rejected request with a Host header not allowed path=%s host=%r remote=%s "
                    "(add the name to allowed_hosts; said once per name per %g min)%s", request.path,
                    (host or "")[:100], request.remote, const.API_REFUSED_HOST_REPEAT_S / 60,
                    f" ({held} more refused since the last such WARNING)" if held else "")
            raise ForbiddenHost(forbidden_host_text(host))
        path = request.path
        # Ollama's routes (/api/chat, /api/tags, ...: api/ollama.py) are inference routes as /v1's
        inference = path.startswith("/v1") or path in NATIVE_PATHS or is_ollama_path(path)
        # require_api_key_for_inference = false is for apps on this machine: a client on another
        # one (the LAN, a container) needs the key whatever its Host header says
        local = client_is_local(request)
        # a browser sends Origin on a cross-origin POST (apps do not): a page posting text/plain (no
        # preflight) ran generations here with no key (CSRF; 2026-12-07, review r35); one needing a
        # preflight (JSON) never reaches here from a page not allowed, so it is an extension's or app's
        page = request.headers.get("Origin")
        foreign_page = (page is not None and not origin_allowed(page, cors_origins)
                        and unpreflighted_write(request))
        needs_key = path.startswith("/api/admin") or (
            inference and (inference_needs_key or not local or foreign_page))
        if needs_key and path not in OPEN_PATHS:
            key = presented_key(request)
            if not key or not hmac.compare_digest(key.encode(), api_key.encode()):
                log.debug("DIAG: auth failure path=%s auth_present=%s remote=%s", path, key is not None,
                          request.remote)
                why = "" if inference_needs_key or not inference else (
                    " (require_api_key_for_inference = false covers apps on this machine only: clients on "
                    "other machines, in containers and through a proxy that says so need the key)" if not local
                    else " (require_api_key_for_inference = false does not cover web pages: a page's origin "
                    "needs to be in cors_origins, or its request the key)" if foreign_page else "")
                raise AuthenticationFailed(
                    f"Incorrect API key provided{why}." if key else
                    "Missing API key: send `Authorization: Bearer <key>` (the key is in the data dir's "
                    f"api_key file){why}.")
        return await handler(request)

    return auth_middleware
