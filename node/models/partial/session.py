"""The HTTP session every request of a partial model's origin goes through (its probe, its layers,
the spot checks of peers' bytes, the adoption of an origin by a model the swarm gave): redirects
are followed, as the Hub's to its CDN must be, but never from a global host to one that is not
(loopback, a LAN, link-local: download/public.py's rule of what is global).

2026-12-07: the origin of a model known from the swarm is the one its holders advertise (any https
URL), and "Help serve" of it had the node follow whatever that origin redirected to: an https server
of a hostile member answering 302 to http://192.168.1.1/... or http://127.0.0.1:PORT/... had the node
GET its LAN's or its own services, as often as the fetch and its checks asked. An origin that is
itself not global (a user's LAN mirror, a local one) redirects where it likes: the user chose it.
Whether the first URL is global is decided by the addresses its connection was given (the session's
resolver records them): until review r61 it was a fresh look-up at the redirect, which a name with
one private record beside a public one, an answer that changed, or one that failed made "not global".
A redirect's target is looked up before the hop (a clear error), and its connection is given only
its global addresses (the session's resolver, for each host a global origin redirected to; aiohttp's
DNS cache is off so no earlier answer stands in): until 2026-12-07 the connection looked the name up
again and took whatever came, so a target answering a public address to the check and 127.0.0.1 or a
LAN address next (DNS rebinding) was connected to."""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from types import SimpleNamespace
from typing import Any

import aiohttp
import aiohttp.abc
from yarl import URL

from node.models.download import public
from node.models.download.urls import display_url

_NAMES_KEPT = 64  # (a session asks an origin and its CDN: a handful of names)


class InwardRedirect(aiohttp.ClientError):
    """A global origin redirected to a host that is not global: not followed (an origin failure)."""


def _host_port(url: Any) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(str(url))
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


class _RecordingResolver(aiohttp.abc.AbstractResolver):
    """aiohttp's threaded resolver, remembering the addresses each host's connections were given,
    and giving a host a global origin redirected to (`global_only`) only its global addresses."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()
        self.used: dict[str, list[str]] = {}
        self.global_only: dict[str, None] = {}  # (ordered: the oldest forgotten first)

    def only_global(self, host: str) -> None:
        if len(self.global_only) >= _NAMES_KEPT:
            self.global_only.pop(next(iter(self.global_only)))
        self.global_only[host] = None

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        hosts = await self._inner.resolve(host, port, family)
        if host in self.global_only:
            hosts = [h for h in hosts if public._counts_as_global(str(h["host"]), port)]  # noqa: SLF001
            if not hosts:
                raise public.NotGlobalAddress("resolves to no global address now (looked up again when "
                                              "connecting)")
        if len(self.used) >= _NAMES_KEPT:
            self.used.pop(next(iter(self.used)))
        self.used[host] = [str(h["host"]) for h in hosts]
        return hosts

    async def close(self) -> None:
        await self._inner.close()


def _connected_global(url: Any, resolver: _RecordingResolver) -> bool:
    """Whether the first URL's connection may have gone to a global address: an IP literal that is
    one, or a name any of whose addresses given to the connection is (none recorded: counted global,
    so its redirects stay checked)."""
    host, port = _host_port(url)
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
        addresses = [host.strip("[]")]
    except ValueError:
        addresses = resolver.used.get(host, [])
        if not addresses:
            return True
    return any(public._counts_as_global(a, port) for a in addresses)  # noqa: SLF001 (the tests' one hook)


def rebound(exc: BaseException) -> str | None:
    """What to say of a connection refused because its host, which a global origin redirected to,
    resolved to no global address (DNS rebinding, `_RecordingResolver`), else None. Not tried again:
    each try is one more hop through a hostile origin (2026-12-07, review r72: six, over 31 s)."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, public.NotGlobalAddress):
        return f"the origin redirected to {exc.host}, which {exc.os_error.strerror}: not followed"
    return None


async def _async_on_start(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                          params: aiohttp.TraceRequestStartParams) -> None:
    ctx.first_url = params.url  # (once per request, its redirects not)


async def _async_on_redirect(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                             params: aiohttp.TraceRequestRedirectParams) -> None:
    """A redirect goes to a global host, or the request's first URL is not global (looked up only
    when it redirects, not for every range request)."""
    location = params.response.headers.get("Location") or params.response.headers.get("URI")
    if not location:
        return  # (aiohttp follows nothing then)
    try:
        target = params.url.join(URL(location))
    except ValueError:
        return  # (aiohttp refuses it itself)
    if not _connected_global(ctx.first_url, ctx.resolver):
        return  # (a LAN origin redirects where it likes)
    if not await _async_global(target):
        raise InwardRedirect(f"the origin redirected to {display_url(str(target))}, a host that is not "
                             "global (loopback, LAN, link-local): not followed")
    ctx.resolver.only_global(_host_port(target)[0])


async def _async_global(url: Any) -> bool:
    host, port = _host_port(url)
    try:
        return bool(host) and await public.async_host_global(host, port)
    except (OSError, UnicodeError):  # a name that does not resolve, or cannot (`evil..`: idna): not global
        return False


def origin_session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    """A session for a partial model's origin (see the module doc)."""
    resolver = _RecordingResolver()

    def context(trace_request_ctx: Any = None) -> SimpleNamespace:  # (one per request)
        return SimpleNamespace(resolver=resolver, trace_request_ctx=trace_request_ctx)

    trace = aiohttp.TraceConfig(trace_config_ctx_factory=context)
    trace.on_request_start.append(_async_on_start)
    trace.on_request_redirect.append(_async_on_redirect)
    return aiohttp.ClientSession(timeout=timeout, trace_configs=[trace], connector=aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False))
