"""A download's origin check that could not be made (the Hub answered 503, a connection refused, a
timeout, DNS) is recorded `unchecked`, not `public: false` (2026-12-07: a momentary failure kept
that download from ever being shared while unloaded): not shared meanwhile (privacy first), and
checked again once at the next start, in the background. A record checked not public, and an older
one without `public`, are not asked again. A real node downloads from the Hub stand-in (on
127.0.0.1: `public_lan_origins`); a real TLS peer on 127.0.0.1 reads its HELLO's `files`."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import pytest

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE
from node.models.download.public import async_origin_public
from node.models.hash_cache import HashCache
from tests.net.rawclient import RawPeer
from tests.pipeline.test_download_origin_public import TOKEN, _checked
from tests.pipeline.test_held_file_changed import _files
from tests.support.hubserver import HubServer, use_hub
from tests.support.nodes import TINY, node_config, running_node
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

PATH = "/org/tiny/resolve/main/tiny.gguf"


def _unauthenticated_heads(hub: HubServer) -> int:
    return sum(1 for r in hub.hub_requests if "Authorization" not in r)


def _recorded(data_dir, name: str, spec, origin: str, public: object) -> str:
    """models/<name> as a download recorded it: its origin (on the Hub stand-in: a check made again
    would ask it), `public` as given (None: absent, an older record). Its sha256."""
    path = write_gguf(data_dir / MODELS_DIR / name, spec)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = HashCache(data_dir / HASH_CACHE_FILE)
    cache.remember(path, sha, origin)
    if public is not None:
        assert cache.set_public(path, sha, public)
    return sha


async def test_a_check_the_hub_could_not_answer_is_made_again_at_the_next_start(tmp_path, monkeypatch):
    blob = write_gguf(tmp_path / "tiny.gguf", TINY).read_bytes()
    sha = hashlib.sha256(blob).hexdigest()
    hub = HubServer(blob, PATH)
    await hub.start()
    hub.hold_head = asyncio.Event()
    use_hub(monkeypatch, hub.hub, tmp_path / "hf-home", token=TOKEN)  # the check then asks the Hub without it (a HEAD)
    data_dir = tmp_path / "data"
    config = node_config(data_dir, public_lan_origins=True)
    try:
        async with running_node(config) as node:
            job = await node.downloads.async_start("hf://org/tiny/tiny.gguf")
            await wait_until(lambda: job.state == "done", 60, 0.05, "the download")
            await wait_until(lambda: _unauthenticated_heads(hub) == 1, 30, 0.05, "the check's HEAD")
            hub.hub_fail_with = [(503, {})]  # the Hub is busy for a moment: its answer to that HEAD
            hub.hold_head.set()
            await wait_until(lambda: _checked(data_dir, "tiny.gguf") is not None, 30, 0.05, "the check's record")
            assert _checked(data_dir, "tiny.gguf") == "unchecked"
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == ()  # not shared meanwhile
        # two more downloads' records: one checked not public, one from before the check (no `public`)
        private = _recorded(data_dir, "private.gguf", dataclasses.replace(TINY, seed=41), hub.hub + PATH, False)
        older = _recorded(data_dir, "older.gguf", dataclasses.replace(TINY, seed=42), hub.hub + PATH, None)
        heads = _unauthenticated_heads(hub)
        async with running_node(config) as node:  # the Hub answers again
            await wait_until(lambda: _checked(data_dir, "tiny.gguf") is True, 30, 0.05, "the check made again")
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == (sha,)
            assert _unauthenticated_heads(hub) == heads + 1  # the other two were not asked again
            assert _checked(data_dir, "private.gguf") is False and _checked(data_dir, "older.gguf") is None
            assert {private, older}.isdisjoint(await asyncio.to_thread(_files, peer))
    finally:
        hub.hold_head.set()
        await hub.stop()


async def test_a_refused_connection_is_unchecked_not_private(monkeypatch, tmp_path):
    """Nothing listens at the Hub's address: the check could not be made (None), it did not find
    the file private (False)."""
    hub = f"http://127.0.0.1:{free_port()}"
    use_hub(monkeypatch, hub, tmp_path / "hf-home", token=TOKEN)
    assert await async_origin_public(hub + PATH, sent_token=True, lan_ok=True) is None
    assert await async_origin_public(hub + PATH + "?X-Amz-Signature=x", sent_token=True, lan_ok=True) is False  # signed: for good


async def test_a_private_repos_file_stays_unshared_when_checked_again_without_the_token(tmp_path, monkeypatch):
    """The download sent HF_TOKEN (a private repo: the Hub answers 401 without it), its check met a
    503: unchecked. The next start has no HF_TOKEN and another HF_ENDPOINT (the desktop app, another
    shell): the check made again asks the Hub without a token all the same, finds it private, and the
    file is not shared. 2026-12-07: that start's environment said "no token was sent", and the file
    was recorded public without a request and listed in HELLO's `files`."""
    blob = write_gguf(tmp_path / "tiny.gguf", TINY).read_bytes()
    hub = HubServer(blob, PATH)
    hub.token = TOKEN  # private: a request without it is refused
    await hub.start()
    hub.hold_head = asyncio.Event()
    use_hub(monkeypatch, hub.hub, tmp_path / "hf-home", token=TOKEN)  # no token file there
    data_dir = tmp_path / "data"
    config = node_config(data_dir, public_lan_origins=True)
    try:
        async with running_node(config) as node:
            job = await node.downloads.async_start("hf://org/tiny/tiny.gguf")
            await wait_until(lambda: job.state == "done", 60, 0.05, "the download")
            await wait_until(lambda: _unauthenticated_heads(hub) == 1, 30, 0.05, "the check's HEAD")
            hub.hub_fail_with = [(503, {})]
            hub.hold_head.set()
            await wait_until(lambda: _checked(data_dir, "tiny.gguf") is not None, 30, 0.05, "the check's record")
            assert _checked(data_dir, "tiny.gguf") == "unchecked"
        use_hub(monkeypatch, f"http://127.0.0.1:{free_port()}")  # no token, another Hub now (nothing there)
        async with running_node(config) as node:
            await wait_until(lambda: _checked(data_dir, "tiny.gguf") is not None
                             and _checked(data_dir, "tiny.gguf") != "unchecked", 30, 0.05, "the check made again")
            assert _checked(data_dir, "tiny.gguf") is False
            assert _unauthenticated_heads(hub) == 2  # it asked the Hub the file came from, without a token
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == ()
    finally:
        hub.hold_head.set()
        await hub.stop()
