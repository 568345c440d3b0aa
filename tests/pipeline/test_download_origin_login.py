"""A redirect to another host is not enough to call an origin public (2026-12-07): an origin that
sends a reader without the token to a login page on another host (an SSO before a private
HF_ENDPOINT mirror or server) counted as public, so the private file was handed to peers. The check
follows the redirects without credentials and calls it public only when what comes back is the
file: a 2xx, no web page, the downloaded file's size. The Hub stand-in on 127.0.0.1 (`lan_ok`)."""

from __future__ import annotations

import asyncio
import dataclasses

from node.inference.synth import write_gguf
from node.models.download.public import async_origin_public
from tests.net.rawclient import RawPeer
from tests.pipeline.test_download_origin_public import _checked, _download
from tests.pipeline.test_held_file_changed import _files
from tests.support.hubserver import HubServer, use_hub
from tests.support.nodes import TINY, node_config, running_node

TOKEN = "hf_usertoken"


async def _hub(tmp_path) -> HubServer:
    hub = HubServer(write_gguf(tmp_path / "m.gguf", dataclasses.replace(TINY, seed=41)).read_bytes())
    await hub.start()
    return hub


async def test_a_private_origin_sending_strangers_to_a_login_page_is_not_public(tmp_path):
    hub = await _hub(tmp_path)
    try:
        hub.token, hub.login_redirect = TOKEN, True
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data), lan_ok=True) is False
        assert any("/login" in str(r) or r.get("Range") == "bytes=0-0" for r in hub.cdn_requests), \
            "the login page was not asked for: the redirect was not followed"
        assert all("Authorization" not in r for r in hub.hub_requests + hub.cdn_requests)
    finally:
        await hub.stop()


async def test_the_hubs_302_to_its_cdn_is_public_for_the_file_of_that_size_only(tmp_path):
    hub = await _hub(tmp_path)
    try:
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data), lan_ok=True) is True
        hub.relative_location = True  # the Hub's own host serves it: still the file
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data), lan_ok=True) is True
        hub.relative_location = False
        # another file under that name (the repo changed since), or the size not known: not public
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data) + 1, lan_ok=True) is False
        assert await async_origin_public(hub.url, sent_token=True, lan_ok=True) is False
        hub.body_override = b"x" * 10  # the CDN's own size counts over the Hub's X-Linked-Size
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data), lan_ok=True) is False
        hub.body_override = None
        hub.token = TOKEN  # a private repo: 401 to a stranger
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data), lan_ok=True) is False
    finally:
        await hub.stop()


async def test_a_node_does_not_share_a_file_whose_origin_sends_strangers_to_a_login_page(tmp_path, monkeypatch):
    """The user downloads with their token from a private mirror behind an SSO: the node's check,
    without the token, lands on the login page; the file is recorded not public and not listed."""
    hub = await _hub(tmp_path)
    hub.token, hub.login_redirect = TOKEN, True
    use_hub(monkeypatch, hub.hub, token=TOKEN)
    data_dir = tmp_path / "data"
    try:
        async with running_node(node_config(data_dir, public_lan_origins=True)) as node:
            await _download(node, data_dir, "hf://org/model/m.gguf", "m.gguf")
            assert _checked(data_dir, "m.gguf") is False
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == ()
    finally:
        await hub.stop()


async def test_a_redirect_to_a_host_that_is_not_global_is_not_followed(tmp_path, monkeypatch):
    """A private mirror on a global address sending readers without the token to a LAN storage host
    that serves anyone inside the LAN: the node, inside, would get the file there, yet no peer
    outside could. Only the Hub's port counts as global here; its CDN (another port on 127.0.0.1)
    stands for the LAN host. Until 2026-12-07 every hop after the first was asked whatever its host:
    public, and the node made a request to its own loopback service on any origin's word."""
    from node.models.download import public

    hub = await _hub(tmp_path)
    try:
        hub_port = int(hub.hub.rpartition(":")[2])

        def only_the_hub_is_global(address: str, port: int) -> bool:
            return port == hub_port

        monkeypatch.setattr(public, "_counts_as_global", only_the_hub_is_global)
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data)) is False
        assert hub.cdn_requests == [], "the check asked the host that is not global"
        # told LAN origins count (a mirror every member reaches), the same redirect is the file
        assert await async_origin_public(hub.url, sent_token=True, size=len(hub.data), lan_ok=True) is True
    finally:
        await hub.stop()
