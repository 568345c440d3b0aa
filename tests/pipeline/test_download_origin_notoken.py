"""A download that sent no token is checked as one that did (review r31, 2026-12-07): the downloader
follows redirects, so a company mirror on a globally resolving name that redirects to a store on
the LAN (`https://models.corp.example/x.gguf` → `http://10.1.2.3/x.gguf`) had the node fetch the
file from the LAN, and the check, with no token sent, made no request: `public: true`, the file
listed in HELLO `files` and handed to peers who could never fetch it. Records written under that
rule (2) are checked again at start. The mirror is the Hub stand-in's port on 127.0.0.1, the only
one `_counts_as_global` lets count as global (not `public_lan_origins`); its CDN, another port on
127.0.0.1, stands for the LAN store. A real node downloads; a real TLS peer reads its `files`."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE
from node.models.download import public
from node.models.download.public import async_origin_public
from tests.net.rawclient import RawPeer
from tests.pipeline.test_download_origin_public import _checked, _download
from tests.pipeline.test_download_origin_unchecked import PATH, _recorded
from tests.pipeline.test_held_file_changed import _files
from tests.support.hubserver import HubServer, use_hub
from tests.support.nodes import TINY, node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]


async def _mirror(tmp_path, monkeypatch, seed: int) -> HubServer:
    """The mirror (its port the only global host) redirecting to its LAN store (the CDN port)."""
    hub = HubServer(write_gguf(tmp_path / "m.gguf", dataclasses.replace(TINY, seed=seed)).read_bytes(), PATH)
    await hub.start()
    mirror_port = int(hub.hub.rpartition(":")[2])

    def only_the_mirror_is_global(address: str, port: int) -> bool:
        return port == mirror_port

    monkeypatch.setattr(public, "_counts_as_global", only_the_mirror_is_global)
    use_hub(monkeypatch, None, tmp_path / "hf-home")  # the Hub's own address; no token file: none is sent
    return hub


async def test_a_no_token_origin_redirecting_to_a_lan_store_is_not_public(tmp_path, monkeypatch):
    hub = await _mirror(tmp_path, monkeypatch, 61)
    try:
        assert await async_origin_public(hub.url, sent_token=False, size=len(hub.data)) is False
        assert [r for r in hub.hub_requests if "Authorization" not in r], "the mirror was not asked"
        assert hub.cdn_requests == [], "the check asked the host that is not global"
        # the control: told LAN origins count, the same file is public (asked, not taken on trust)
        assert await async_origin_public(hub.url, sent_token=False, size=len(hub.data), lan_ok=True) is True
        assert await async_origin_public(hub.url, sent_token=False, size=len(hub.data) + 1, lan_ok=True) is False
    finally:
        await hub.stop()


async def test_a_node_does_not_share_a_no_token_download_that_came_from_a_lan_store(tmp_path, monkeypatch):
    hub = await _mirror(tmp_path, monkeypatch, 62)
    data_dir = tmp_path / "data"
    try:
        async with running_node(node_config(data_dir)) as node:
            await _download(node, data_dir, hub.url, "tiny.gguf")
            assert hub.cdn_requests, "the download did not come from the LAN store"
            assert _checked(data_dir, "tiny.gguf") is False
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == ()
    finally:
        await hub.stop()


async def test_a_public_record_of_the_no_token_shortcut_is_checked_again_at_start(tmp_path, monkeypatch):
    """A `public: true, rule: 2` record (written by the rule that asked nobody when no token went)
    is not shared and is checked again at start: the mirror's redirect to the LAN store, not public."""
    hub = await _mirror(tmp_path, monkeypatch, 63)
    data_dir = tmp_path / "data"
    try:
        sha = _recorded(data_dir, "m.gguf", dataclasses.replace(TINY, seed=63), hub.url, True)
        path = data_dir / HASH_CACHE_FILE
        records = json.loads(path.read_text(encoding="utf-8"))
        (record,) = records.values()
        record.update(public=True, rule=2)  # as the shortcut wrote it (no `token`: a public record keeps none)
        path.write_text(json.dumps(records), encoding="utf-8")
        async with running_node(node_config(data_dir)) as node:
            await wait_until(lambda: _checked(data_dir, "m.gguf") is False, 30, 0.05, "the record checked again")
            assert hub.cdn_requests == []
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert sha not in await asyncio.to_thread(_files, peer)
    finally:
        await hub.stop()
