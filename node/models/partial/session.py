"""The HTTP session every request of a partial model's origin goes through (its probe, its layers,
the spot checks of peers' bytes, the adoption of an origin by a model the swarm gave): redirects
are followed, as the Hub's to its CDN must be, but never from a global host to one that is not
(loopback, a LAN, link-local: download/public.py's rule of what is global).

2026-12-07: the origin of a model known from the swarm is the one its holders advertise (any https
URL), and "Help serve" of it had the node follow whatever that origin redirected to: an https server
of a hostile member answering 302 to http://192.168.1.1/... or http://127.0.0.1:PORT/... had the node
GET its LAN's or its own services, as often as the fetch and its checks asked. An origin that is
itself not global (a user's LAN mirror, a local one) redirects where it likes: the user chose it.
A name is looked up before the hop; the connection looks it up again (a rebinding name is not
caught here)."""

from __future__ import annotations

import urllib.parse
from types import SimpleNamespace
from typing import Any

import aiohttp
from yarl import URL

from node.models.download.public import async_host_global
from node.models.download.urls import display_url


class InwardRedirect(aiohttp.ClientError):
    """A global origin redirected to a host that is not global: not followed (an origin failure)."""


def _host_port(url: Any) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(str(url))
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


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
    if not await _async_global(target) and await _async_global(ctx.first_url):
        raise InwardRedirect(f"the origin redirected to {display_url(str(target))}, a host that is not "
                             "global (loopback, LAN, link-local): not followed")


async def _async_global(url: Any) -> bool:
    host, port = _host_port(url)
    try:
        return bool(host) and await async_host_global(host, port)
    except OSError:  # a name that does not resolve: not global (the request would fail on it anyway)
        return False


def origin_session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    """A session for a partial model's origin (see the module doc)."""
    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_async_on_start)
    trace.on_request_redirect.append(_async_on_redirect)
    return aiohttp.ClientSession(timeout=timeout, trace_configs=[trace])
