"""A partial model's origin is followed through redirects (the Hub's to its CDN), but never from a
global host to one that is not (node/models/partial/session.py). The origin of a model the swarm
gives is the one its holders advertise: "Help serve" of it had the node follow whatever that origin
redirected to, so a member's https server answering 302 to http://192.168.1.1/... or to this
machine's own services had the node GET them, for the probe and every layer request (2026-12-07).
Here the redirecting origin is the one port `public._counts_as_global` lets count as global (as in
tests/pipeline/test_download_origin_notoken.py); the store it sends the node to, another port on
127.0.0.1, stands for the LAN or this machine's services."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import pytest
from aiohttp import web

from node.errors import DownloadFailed
from node.inference.pipeline.partials import PartialModels
from node.models.catalog import ModelCatalog
from node.models.download import public
from node.models.gguf_meta import read_header
from node.models.header import extract_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin

pytestmark = pytest.mark.usefixtures("fast_retries")


class Redirector:
    """`/m.gguf` answers 302 to `target` (any method, any range)."""

    def __init__(self, target: str):
        self.target, self.hits = target, 0

    async def __aenter__(self):
        async def redirect(_request: web.Request) -> web.Response:
            self.hits += 1
            raise web.HTTPFound(self.target)

        app = web.Application()
        app.router.add_get("/m.gguf", redirect)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
        self.url = f"http://127.0.0.1:{self.port}/m.gguf"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def _only_port_global(monkeypatch, port: int) -> None:
    monkeypatch.setattr(public, "_counts_as_global", lambda _address, p: p == port)


async def test_help_serve_never_follows_a_swarm_origin_into_the_lan(tmp_path, model, monkeypatch):  # noqa: F811
    (entry,) = ModelCatalog(tmp_path / "holder").scan([(model, "cli")])
    swarm_entry = dataclasses.replace(entry, source="swarm", path=tmp_path / "headers" / "x")  # known by its header
    swarm_entry.header_path.parent.mkdir(parents=True, exist_ok=True)
    swarm_entry.header_path.write_bytes(extract_header(model)[0])
    with ThreadedOrigin(model.read_bytes()) as lan:
        async with Redirector(lan.url) as origin:
            _only_port_global(monkeypatch, origin.port)
            (tmp_path / "models").mkdir()
            directory = await PartialModels(tmp_path / "models").async_open_swarm_model(swarm_entry, origin.url)
            assert origin.hits >= 1  # it was asked
            assert lan.requests == 0, lan.ranges  # and not followed into the LAN
            assert directory.exists()  # the layers come from peers only


async def test_layers_are_never_fetched_through_a_redirect_into_the_lan(tmp_path, model, monkeypatch):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as lan:
        store, manifest = await async_open_partial(lan.url, tmp_path / "m.partial")
        parts = parts_for(read_header(store.header_path), 2, 4)
        asked = lan.requests
        async with Redirector(lan.url) as origin:
            _only_port_global(monkeypatch, origin.port)
            manifest.origin_url = origin.url  # the same file, behind a global origin redirecting inward
            with pytest.raises(DownloadFailed) as failed:
                await async_fetch_parts(store, manifest, parts)
            assert "not global" in failed.value.message, failed.value.message
            assert lan.requests == asked, lan.ranges[asked:]
            assert not manifest.covers(parts)


async def test_a_lan_origin_redirects_where_it_likes(tmp_path, model, monkeypatch):  # noqa: F811
    """An origin that is itself not global (the user's LAN mirror) is followed as before."""
    monkeypatch.setattr(public, "_counts_as_global", lambda _address, _port: False)
    with ThreadedOrigin(model.read_bytes()) as lan:
        async with Redirector(lan.url) as mirror:
            store, manifest = await async_open_partial(mirror.url, tmp_path / "m.partial")
            parts = parts_for(read_header(store.header_path), 2, 4)
            await async_fetch_parts(store, manifest, parts)
            assert manifest.covers(parts) and mirror.hits >= 2 and lan.requests >= 2


@pytest.mark.parametrize("at_redirect", ["a private record too", "no answer"])
async def test_a_named_origin_is_judged_by_the_address_it_was_reached_at(tmp_path, model, monkeypatch,  # noqa: F811
                                                                       at_redirect):
    """Review r61: whether the origin was global was a fresh look-up of its name at the redirect, and
    every address had to be global: a name answering a private record beside its public one (an AAAA
    on an IPv4-only host), or not answering that second time, made a hostile origin a "LAN origin"
    whose 302 into the LAN was followed. Now the addresses its connection was given decide. Here
    evil.test's connection gets 127.0.0.1 on the origin's port (standing for a global address)."""
    with ThreadedOrigin(model.read_bytes()) as lan:
        store, manifest = await async_open_partial(lan.url, tmp_path / "m.partial")
        parts = parts_for(read_header(store.header_path), 2, 4)
        asked = lan.requests
        async with Redirector(lan.url) as origin:
            monkeypatch.setattr(public, "_counts_as_global", lambda a, p: p == origin.port and a == "127.0.0.1")
            loop = asyncio.get_running_loop()
            real = loop.getaddrinfo

            async def answers(host, port, *args, **kw):
                if host != "evil.test":
                    return await real(host, port, *args, **kw)
                connecting = bool(kw.get("flags", 0) & socket.AI_ADDRCONFIG)  # aiohttp's resolver's look-up
                if not connecting and at_redirect == "no answer":
                    raise socket.gaierror(socket.EAI_NONAME, "no answer")
                out = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
                if not connecting:
                    out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1", port, 0, 0)))
                return out
            monkeypatch.setattr(loop, "getaddrinfo", answers)
            manifest.origin_url = f"http://evil.test:{origin.port}/m.gguf"
            with pytest.raises(DownloadFailed) as failed:
                await async_fetch_parts(store, manifest, parts)
            assert "not global" in failed.value.message, failed.value.message
            assert origin.hits >= 1 and lan.requests == asked, lan.ranges[asked:]


async def test_a_redirect_target_rebinding_into_the_lan_is_not_connected_to(tmp_path, model, monkeypatch):  # noqa: F811
    """2026-12-07: a redirect's target was looked up before the hop (global) and again by its
    connection, which took whatever came: rebind.test answers a public address to the check and
    127.0.0.1 (standing for the LAN or this machine's services) to the connection. Now the connection
    of a host a global origin redirected to is given only its global addresses: none here."""
    with ThreadedOrigin(model.read_bytes()) as lan:
        store, manifest = await async_open_partial(lan.url, tmp_path / "m.partial")
        parts = parts_for(read_header(store.header_path), 2, 4)
        asked = lan.requests
        async with Redirector(lan.url.replace("127.0.0.1", "rebind.test")) as origin:
            public_address = "93.184.216.34"
            monkeypatch.setattr(public, "_counts_as_global", lambda a, p: p == origin.port or a == public_address)
            loop = asyncio.get_running_loop()
            real = loop.getaddrinfo
            lookups = {"check": 0, "connection": 0}

            async def answers(host, port, *args, **kw):
                if host != "rebind.test":
                    return await real(host, port, *args, **kw)
                connecting = bool(kw.get("flags", 0) & socket.AI_ADDRCONFIG)  # aiohttp's resolver's look-up
                lookups["connection" if connecting else "check"] += 1
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1" if connecting else public_address,
                                                                      port))]
            monkeypatch.setattr(loop, "getaddrinfo", answers)
            manifest.origin_url = origin.url
            with pytest.raises(DownloadFailed) as failed:
                await async_fetch_parts(store, manifest, parts)
            assert "rebind.test, which resolves to no global address" in failed.value.message, failed.value.message
            # both asked, as a rebinding needs; and not tried again (review r72: six hops through the origin)
            assert lookups["check"] == 1 and lookups["connection"] == 1, lookups
            assert origin.hits >= 1 and lan.requests == asked, lan.ranges[asked:]
            assert not manifest.covers(parts)


async def test_a_redirect_to_a_name_that_cannot_be_looked_up_is_not_followed(tmp_path, model, monkeypatch):  # noqa: F811
    """Review r72: a target named `evil..` made the look-up raise UnicodeError (idna), which nothing
    caught: the fetch failed with it rather than saying the redirect was not followed."""
    with ThreadedOrigin(model.read_bytes()) as lan:
        store, manifest = await async_open_partial(lan.url, tmp_path / "m.partial")
        parts = parts_for(read_header(store.header_path), 2, 4)
        async with Redirector(lan.url.replace("127.0.0.1", "evil..")) as origin:
            _only_port_global(monkeypatch, origin.port)
            manifest.origin_url = origin.url
            with pytest.raises(DownloadFailed) as failed:
                await async_fetch_parts(store, manifest, parts)
            assert "not global" in failed.value.message, failed.value.message
