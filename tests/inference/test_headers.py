"""Fetching a model's header: from holders in chunks (HeaderServer's replies, checked against the
holder's advert), from the origin by one Range request, and falling back to a holder when the
origin fails or sends something else. The peer link itself is covered by the raw-peer test in
tests/pipeline/test_header_only.py; here the holder side is the real HeaderServer on a catalog."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web

from node import const
from node.errors import DownloadFailed, NodeError, PeerError
from node.inference.headers import HeaderFetcher, HeaderServer, on_this_machine, parse_advert
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog, readable_name
from node.models.download.ranged import async_fetch_prefix
from node.models.header import extract_header
from node.net import Frame, FrameType

SPEC = SynthSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=512, name="hdr")
HOLDER = "a" * 64
LIAR = "b" * 64


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    base = tmp_path_factory.mktemp("fetch")
    path = write_gguf(base / "hdr.gguf", SPEC)
    catalog = ModelCatalog(base)
    (entry,) = catalog.scan([(path, "cli")])
    return SimpleNamespace(path=path, catalog=catalog, entry=entry, header=extract_header(path)[0])


class Holders:
    """Stands in for PeerManager.async_request: each node id is answered by the real HeaderServer
    (LIAR's replies have one byte flipped), an ERROR answer raised as a link would."""

    def __init__(self, catalog):
        self.server = HeaderServer(catalog)
        self.requests: list[tuple[str, dict]] = []

    async def async_request(self, node_id, frame, timeout_s=None):
        self.requests.append((node_id, dict(frame.header)))
        link = SimpleNamespace(short_id=node_id[:8])
        try:
            reply = await self.server.async_handle(link, frame)
        except NodeError as exc:
            raise PeerError(f"peer answered ERROR {exc.code}: {exc.message}", code=exc.code) from exc
        if node_id == LIAR:
            data = bytearray(reply.payload)
            data[-1] ^= 0x01
            reply = Frame(reply.type, reply.header, bytes(data))
        return reply


def advert(entry, node_id=HOLDER, **over):
    m = {"sha256": entry.sha256, "name": entry.name, "n_layers": entry.n_layers, "start": 0, "end": 3,
         "architecture": entry.architecture, "header_sha256": entry.header_sha256,
         "header_bytes": entry.header_bytes, "size_bytes": entry.size_bytes, **over}
    parsed = parse_advert(node_id, m, local_peer=True)  # (the origins here are local mirrors)
    assert parsed is not None
    return parsed


class Origin:
    """The model file over HTTP with Range support, or misbehaving as told."""

    def __init__(self, data: bytes):
        self.data, self.status, self.ignore_range, self.body = data, None, False, None
        self.redirect, self.gzip = False, False
        self.ranges: list[str | None] = []

    async def __aenter__(self):
        app = web.Application()
        app.router.add_get("/m.gguf", self.handle)
        app.router.add_get("/real.gguf", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/m.gguf"  # noqa: SLF001
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    async def handle(self, request):
        rng = request.headers.get("Range")
        self.ranges.append(rng)
        if self.status:
            return web.Response(status=self.status, text="no")
        if self.redirect and request.path == "/m.gguf":
            raise web.HTTPFound(self.url.replace("/m.gguf", "/real.gguf"))
        data = self.body if self.body is not None else self.data
        if self.gzip:  # the right bytes, compressed although identity was asked: a decompression bomb's shape
            return web.Response(body=gzip.compress(data), headers={"Content-Encoding": "gzip"})
        if rng and not self.ignore_range:
            first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            part = data[first:last + 1]
            return web.Response(status=206, body=part, headers={
                "Content-Range": f"bytes {first}-{first + len(part) - 1}/{len(data)}"})
        return web.Response(body=data)


def test_parse_advert_rejects_garbled_fields(model):
    good = {"sha256": model.entry.sha256, "name": "hdr", "n_layers": 3, "header_sha256": model.entry.header_sha256,
            "header_bytes": 100}
    assert parse_advert(HOLDER, good) is not None
    for bad in ({"sha256": "XY"}, {"header_sha256": None}, {"name": "../etc"}, {"name": "A" * 300},
                {"n_layers": True}, {"n_layers": -1}, {"header_bytes": 0}, {"header_bytes": "100"}):
        assert parse_advert(HOLDER, {**good, **bad}) is None, bad
    odd = parse_advert(HOLDER, {**good, "origin_url": "file:///etc/passwd", "architecture": "x" * 999})
    assert odd.origin_url is None and odd.architecture is None
    signed = parse_advert(HOLDER, {**good, "origin_url": "https://cdn.example/m.gguf?X-Amz-Signature=s3cret"})
    assert signed.origin_url == "https://cdn.example/m.gguf"
    # plain http only to a local mirror: a member cannot point the swarm at LAN services
    for lan in ("http://192.168.1.1/admin.gguf", "http://router.lan/x.gguf", "http://10.0.0.5:8080/m.gguf",
                "http://[fe80::1]/m.gguf", "http:///m.gguf", "https:///m.gguf"):
        assert parse_advert(HOLDER, {**good, "origin_url": lan}).origin_url is None, lan
    for local in ("http://127.0.0.1:8000/m.gguf", "http://localhost/m.gguf", "http://[::1]:9/m.gguf",
                  "https://localhost:8443/m.gguf", "https://127.0.0.2/m.gguf", "http://localhost./m.gguf"):
        assert parse_advert(HOLDER, {**good, "origin_url": local}, local_peer=True).origin_url == local
        # from a peer on another machine its loopback is not ours: never fetched (2026-12-07)
        assert parse_advert(HOLDER, {**good, "origin_url": local}).origin_url is None, local


def test_on_this_machine_is_a_direct_link_from_loopback():
    assert on_this_machine("direct", "127.0.0.1:47300") and on_this_machine("direct", "[::1]:47300")
    for transport, address in (("relayed", "127.0.0.1:47300"), ("direct", "192.168.1.20:47300"), (None, None),
                               ("direct", "[fe80::1]:47300"), ("direct", "localhost:47300"), ("direct", "")):
        assert not on_this_machine(transport, address), (transport, address)


def test_parse_advert_refuses_a_header_over_the_cap(model):
    good = {"sha256": model.entry.sha256, "name": "hdr", "n_layers": 3, "header_sha256": model.entry.header_sha256,
            "header_bytes": const.MODEL_HEADER_MAX_BYTES, "origin_url": "https://cdn.example/m.gguf"}
    assert parse_advert(HOLDER, good) is not None
    for n in (const.MODEL_HEADER_MAX_BYTES + 1, 10**12):
        assert parse_advert(HOLDER, {**good, "header_bytes": n}) is None, n


def test_an_advert_over_the_cap_is_never_fetched_from_its_origin(model):
    holders = Holders(model.catalog)

    async def go():
        async with Origin(model.path.read_bytes()) as origin:
            huge = dataclasses.replace(advert(model.entry, origin_url=origin.url), header_bytes=10**12)
            with pytest.raises(DownloadFailed, match="cap"):
                await HeaderFetcher(holders).async_fetch([huge])
            return origin.ranges
    assert asyncio.run(go()) == []
    assert holders.requests == []


@pytest.mark.parametrize("fault", ["redirect", "gzip"])
def test_origin_redirect_or_encoding_is_a_failed_origin(model, fault):
    """A redirect is never followed (an https origin could bounce us to plain http on the LAN or
    169.254.169.254) and a compressed body is never inflated: the holder serves instead."""
    holders = Holders(model.catalog)

    async def go():
        async with Origin(model.path.read_bytes()) as origin:
            setattr(origin, fault, True)
            got = await HeaderFetcher(holders).async_fetch([advert(model.entry, origin_url=origin.url)])
            return got, origin.ranges
    (data, _, source, _), ranges = asyncio.run(go())
    assert data == model.header and source == HOLDER[:8] and holders.requests
    assert len(ranges) == 1  # the redirect's target was never asked


def test_origin_sending_more_than_asked_is_read_only_to_the_header(model):
    async def go():
        async with Origin(model.path.read_bytes()) as origin:
            origin.body = model.path.read_bytes() * 4  # a 206 whose body runs past the asked range
            return await async_fetch_prefix(origin.url, len(model.header), timeout_s=30)
    assert asyncio.run(go()) == model.header


def test_from_a_holder_in_chunks(model, monkeypatch):
    monkeypatch.setattr(const, "MODEL_HEADER_CHUNK_BYTES", 4096)  # several chunks for a 15 KB header
    holders = Holders(model.catalog)

    async def go():
        return await HeaderFetcher(holders).async_fetch([advert(model.entry)])
    data, header, source, used = asyncio.run(go())
    assert data == model.header and header.n_layers == 3 and source == HOLDER[:8] and used.node_id == HOLDER
    offsets = [h["offset"] for _, h in holders.requests]
    assert offsets == list(range(0, len(model.header), 4096)) and len(offsets) > 1


def test_tampered_bytes_refused_then_the_next_holder(model):
    holders = Holders(model.catalog)

    async def go():
        return await HeaderFetcher(holders).async_fetch([advert(model.entry, LIAR), advert(model.entry)])
    data, _, source, _ = asyncio.run(go())
    assert data == model.header and source == HOLDER[:8]
    assert [n for n, _ in holders.requests] == [LIAR, HOLDER]

    async def only_liar():
        await HeaderFetcher(holders).async_fetch([advert(model.entry, LIAR)])
    with pytest.raises(DownloadFailed, match="hash"):
        asyncio.run(only_liar())


def test_size_cap_refuses_before_asking(model):
    holders = Holders(model.catalog)

    async def go():
        await HeaderFetcher(holders, max_bytes=1024).async_fetch([advert(model.entry)])
    with pytest.raises(DownloadFailed, match="cap"):
        asyncio.run(go())
    assert holders.requests == []


def test_holder_without_the_file_or_a_lying_size(model):
    holders = Holders(ModelCatalog(None))  # holds nothing: ERROR model_not_found

    async def go(fetcher, adverts):
        await fetcher.async_fetch(adverts)
    with pytest.raises(DownloadFailed, match="model_not_found"):
        asyncio.run(go(HeaderFetcher(holders), [advert(model.entry)]))
    # an advert whose header_bytes disagrees with what the holder serves is refused
    with pytest.raises(DownloadFailed, match="does not match"):
        asyncio.run(go(HeaderFetcher(Holders(model.catalog)), [advert(model.entry, header_bytes=100)]))


def test_origin_range_request_is_preferred(model):
    holders = Holders(model.catalog)

    async def go():
        async with Origin(model.path.read_bytes()) as origin:
            got = await HeaderFetcher(holders).async_fetch([advert(model.entry, origin_url=origin.url)])
            return got, origin.ranges
    (data, _, source, _), ranges = asyncio.run(go())
    assert data == model.header and source == "origin" and holders.requests == []
    assert ranges == [f"bytes=0-{len(model.header) - 1}"]


def test_origin_ignoring_range_is_read_only_up_to_the_header(model):
    async def go():
        async with Origin(model.path.read_bytes()) as origin:
            origin.ignore_range = True
            return await HeaderFetcher(Holders(model.catalog)).async_fetch(
                [advert(model.entry, origin_url=origin.url)])
    data, _, source, _ = asyncio.run(go())
    assert data == model.header and source == "origin"


@pytest.mark.parametrize("fault", ["status", "other_file", "short"])
def test_origin_failure_falls_back_to_a_holder(model, tmp_path, fault):
    holders = Holders(model.catalog)
    other = write_gguf(tmp_path / "other.gguf", SynthSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128,
                                                          vocab=512, n_ctx=512, seed=99, name="other"))

    async def go():
        async with Origin(model.path.read_bytes()) as origin:
            if fault == "status":
                origin.status = 404
            elif fault == "other_file":
                origin.body = other.read_bytes()  # another model of the same shape: the hash refuses it
            else:
                origin.body = model.header[:100]
            return await HeaderFetcher(holders).async_fetch([advert(model.entry, origin_url=origin.url)])
    data, _, source, _ = asyncio.run(go())
    assert data == model.header and source == HOLDER[:8]
    assert holders.requests


def test_header_server_refuses_malformed_requests(model):
    server = HeaderServer(model.catalog)
    link = SimpleNamespace(short_id="raw")
    sha = model.entry.sha256

    async def ask(header):
        return await server.async_handle(link, Frame(FrameType.MODEL_HEADER, header, b"", 1))
    for header, code in (({}, "invalid_request"), ({"sha256": 5}, "invalid_request"),
                         ({"sha256": sha.upper()}, "invalid_request"), ({"sha256": sha, "offset": -1}, "invalid_request"),
                         ({"sha256": sha, "offset": "0"}, "invalid_request"),
                         ({"sha256": sha, "offset": len(model.header)}, "invalid_request"),
                         ({"sha256": "0" * 64}, "model_not_found")):
        with pytest.raises(NodeError) as info:
            asyncio.run(ask(header))
        assert info.value.code == code, header
    reply = asyncio.run(ask({"sha256": sha, "offset": 10}))
    assert reply.payload == model.header[10:] and reply.header["total"] == len(model.header)
    assert reply.header["header_sha256"] == hashlib.sha256(model.header).hexdigest()


def test_a_trickle_of_tiny_chunks_is_refused(model):
    class Trickle(Holders):
        async def async_request(self, node_id, frame, timeout_s=None):
            reply = await super().async_request(node_id, frame, timeout_s)
            return Frame(reply.type, reply.header, reply.payload[:10])

    holders = Trickle(model.catalog)

    async def go():
        await HeaderFetcher(holders).async_fetch([advert(model.entry)])
    with pytest.raises(DownloadFailed, match="chunk of 10 bytes"):
        asyncio.run(go())
    assert len(holders.requests) == 1


def test_parse_advert_says_whether_the_peer_serves_the_model(model):
    base = {"sha256": model.entry.sha256, "name": "hdr", "n_layers": 3, "header_sha256": model.entry.header_sha256,
            "header_bytes": 100}
    for served in ({"start": 0, "end": 3}, {"start": 2, "end": 3}, {"whole": True}):
        assert parse_advert(HOLDER, {**base, **served}).servable, served
    for not_served in ({}, {"whole": True, "paused": True}, {"whole": 1}, {"start": 0, "end": 4},
                       {"start": 2, "end": 2}, {"start": "0", "end": 3}, {"start": -1, "end": 3}):
        assert not parse_advert(HOLDER, {**base, **not_served}).servable, not_served


def test_every_name_the_catalog_makes_is_one_an_advert_may_carry(model):
    good = {"sha256": model.entry.sha256, "n_layers": 3, "header_sha256": model.entry.header_sha256,
            "header_bytes": 100}
    header = SimpleNamespace(get=lambda key, default=None: {"general.name": "Üñí"}.get(key, default))
    for stem in ("_private", ".hidden", "..", "-x-", "x" * 300, "a" * 127 + "-b", "ÜÜÜ", "Qwen2.5 7B_Q4", "__"):
        name = readable_name(Path(f"/m/{stem}.gguf"), header)
        assert len(name) <= 128 and parse_advert(HOLDER, {**good, "name": name}) is not None, (stem, name)
    assert readable_name(Path("/m/_x_.gguf"), header) == "x_"
    assert readable_name(Path("/m/Hello World.gguf"), header) == "hello-world"
