"""Which downloads a node shares while they are not loaded (review of 2026-12-06): only a file from
a public origin, checked when the download completes (download/public.py) and recorded beside its
origin in the hash cache. A private Hugging Face repo's file (downloaded with the user's HF_TOKEN:
one HEAD without it is refused) and a signed URL's are neither listed in HELLO `files` nor handed
out, also after a restart; a public repo's is, though the user's token went with it too. Before,
every download with an origin was, a private fine-tune's included. A real node downloads from the
Hub stand-in (on 127.0.0.1: `public_lan_origins` lets that loopback host count, as a LAN mirror
would); a real TLS peer on 127.0.0.1 asks."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE
from node.models.download.public import async_origin_public
from node.models.partial.layout import part_of
from node.net import FrameType
from node.node import Node
from tests.net.rawclient import RawPeer
from tests.pipeline.test_held_file_changed import _ask, _files
from tests.support.hubserver import HubServer, use_hub
from tests.support.nodes import TINY, node_config, running_node
from tests.support.waiting import wait_until

MINE = dataclasses.replace(TINY, seed=21, name="mine")  # the user's fine-tune, in their private repo
SIGNED = dataclasses.replace(TINY, seed=22, name="signed")
TOKEN = "hf_usertoken"


def _checked(data_dir, name: str) -> object:
    """The hash cache's `public` for models/<name> (None: not checked yet)."""
    path = data_dir / HASH_CACHE_FILE
    records = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return records.get(str((data_dir / MODELS_DIR / name).resolve()), {}).get("public")


async def _download(node, data_dir, url: str, name: str) -> None:
    job = await node.downloads.async_start(url)
    await wait_until(lambda: job.state == "done", 60, 0.1, f"the download of {name}")
    await wait_until(lambda: _checked(data_dir, name) is not None, 30, 0.1, f"{name}'s origin check")


async def test_private_and_signed_downloads_are_shared_only_while_loaded(tmp_path, monkeypatch):
    blobs = {n: write_gguf(tmp_path / f"{n}.gguf", spec).read_bytes()
             for n, spec in (("mine", MINE), ("tiny", TINY), ("signed", SIGNED))}
    sha = {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}
    hub = HubServer(blobs["mine"], "/me/fine-tune/resolve/main/mine.gguf")
    hub.add_file("/org/tiny/resolve/main/tiny.gguf", blobs["tiny"])
    hub.add_file("/org/signed/resolve/main/signed.gguf", blobs["signed"])
    await hub.start()
    use_hub(monkeypatch, hub.hub, token=TOKEN)  # the user is logged in to Hugging Face
    data_dir = tmp_path / "data"
    config = node_config(data_dir, public_lan_origins=True)
    try:
        async with running_node(config) as node:
            hub.token = TOKEN  # the private repo: only the user's token reads it
            await _download(node, data_dir, "hf://me/fine-tune/mine.gguf", "mine.gguf")
            hub.token = None  # a public repo (the user's token is sent all the same)
            await _download(node, data_dir, "hf://org/tiny/tiny.gguf", "tiny.gguf")
            await _download(node, data_dir, hub.presigned("/org/signed/resolve/main/signed.gguf"), "signed.gguf")
            assert {n: _checked(data_dir, f"{n}.gguf") for n in blobs} == {"mine": False, "tiny": True, "signed": False}
            assert hub.hub_requests[-1].get("Authorization") is None  # the check's HEAD, without the token
            entry = node.catalog.by_sha(sha["mine"])
            part = part_of(next(t.name for t in entry.header.tensors if t.name.startswith("blk.0.")))
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == (sha["tiny"],)
            for private in (sha["mine"], sha["signed"]):
                refused = await asyncio.to_thread(_ask, peer, {"sha256": private, "op": "hashes", "parts": [part]})
                assert refused.type == FrameType.ERROR and refused.header.get("code") == "model_not_found", \
                    refused.header
            served = await asyncio.to_thread(_ask, peer, {"sha256": sha["tiny"], "op": "hashes", "parts": [part]})
            assert served.type == FrameType.MODEL_PART, served.header
        async with running_node(config) as node:  # the checks are kept: a restart shares no more
            peer = RawPeer(tmp_path / "peer2", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == (sha["tiny"],)
    finally:
        await hub.stop()


async def test_what_is_never_public():
    """Without asking anyone: a `user:pass@` URL, a signed one, a LAN, loopback or link-local host."""
    for url in ("https://user:pw@8.8.8.8/m.gguf", "https://8.8.8.8/m.gguf?X-Amz-Signature=x",
                "http://192.168.1.5/m.gguf", "http://127.0.0.1:8000/m.gguf", "http://[fe80::1]/m.gguf",
                "http://10.0.0.2/m.gguf", "http://[::ffff:192.168.0.1]/m.gguf"):
        assert await async_origin_public(url, sent_token=True) is False, url


async def _ended(job) -> None:
    await wait_until(lambda: not job.active, 60, 0.1, f"download {job.id} to end")


async def test_the_check_runs_on_the_url_that_fetched_the_file_not_an_earlier_jobs(tmp_path, monkeypatch):
    """A bare link refused (403) and then the signed link pasted; a restored signed download whose
    Resume was refused ("paste the link again") and then the signed link pasted: the check runs on
    the signed URL that finished, not on the bare one of the earlier job of the same file name
    (until 2026-12-06 it took the oldest job's: `public: true`, the signed file handed to peers)."""
    blobs = {n: write_gguf(tmp_path / f"{n}.gguf", dataclasses.replace(TINY, seed=30 + i, name=n)).read_bytes()
             for i, n in enumerate(("first", "second"))}
    paths = {n: f"/org/{n}/resolve/main/{n}.gguf" for n in blobs}
    hub = HubServer(blobs["first"], paths["first"])
    hub.add_file(paths["second"], blobs["second"])
    await hub.start()
    use_hub(monkeypatch, hub.hub, tmp_path / "hf-home")
    data_dir = tmp_path / "data"
    config = node_config(data_dir, public_lan_origins=True)
    try:
        async with running_node(config) as node:
            bare = await node.downloads.async_start(hub.presigned(paths["first"]).split("?")[0])
            await _ended(bare)
            assert bare.state == "failed" and "403" in (bare.error or ""), bare.error
            await _download(node, data_dir, hub.presigned(paths["first"]), "first.gguf")
            assert _checked(data_dir, "first.gguf") is False
            hub.stall_path, hub.stall_after = paths["second"], 4096
            job = await node.downloads.async_start(hub.presigned(paths["second"]))
            await wait_until(lambda: job.done_bytes >= 4096, 30, 0.05, "bytes arriving")
        hub.release.set()
        async with running_node(config) as node:  # the signed download comes back paused, its URL bare
            [restored] = [j for j in node.downloads.all() if j.file_name == "second.gguf"]
            refused = node.downloads.resume(restored.id)
            await _ended(refused)
            assert refused.state == "failed" and "paste the download link again" in refused.error, refused.error
            await _download(node, data_dir, hub.presigned(paths["second"]), "second.gguf")
            assert _checked(data_dir, "second.gguf") is False
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            assert await asyncio.to_thread(_files, peer) == ()
    finally:
        hub.release.set()
        await hub.stop()


async def test_an_origin_check_begun_while_the_node_starts_ends_with_its_stop(tmp_path, monkeypatch):
    """A download finishing while the node starts (after the API is up, the models loading) begins
    its origin check; the node's stop cancels and awaits it (until 2026-12-06 start() replaced the
    list that held it: it ran on after the stop, and could write model_hashes.json after the data
    dir's lock was released). The Hub stand-in holds the check's HEAD, so it is still under way."""
    blob = write_gguf(tmp_path / "tiny.gguf", TINY).read_bytes()
    hub = HubServer(blob, "/org/tiny/resolve/main/tiny.gguf")
    await hub.start()
    hub.hold_head = asyncio.Event()
    use_hub(monkeypatch, hub.hub, token=TOKEN)  # the check then asks the Hub without it
    node = Node(node_config(tmp_path / "data", public_lan_origins=True))
    load_all = node.models.async_load_all

    async def a_download_ends_meanwhile(*args, **kwargs):
        job = await node.downloads.async_start("hf://org/tiny/tiny.gguf")
        await wait_until(lambda: job.state == "done", 60, 0.05, "the download")
        await wait_until(lambda: any("Authorization" not in r for r in hub.hub_requests), 30, 0.05, "the check's HEAD")
        return await load_all(*args, **kwargs)

    monkeypatch.setattr(node.models, "async_load_all", a_download_ends_meanwhile)
    try:
        try:
            await node.start()
        finally:
            await node.stop()
        assert [t for t in asyncio.all_tasks() if t.get_name() == "download-origin-check" and not t.done()] == []
    finally:
        hub.hold_head.set()
        await hub.stop()


async def test_the_hubs_own_download_link_is_not_a_signed_one(tmp_path, monkeypatch):
    """The Hub's browser link `…/resolve/main/f.gguf?download=true` (its query is no signature) of a
    public repo is public; until 2026-12-06 any query counted as signed."""
    blob = write_gguf(tmp_path / "tiny.gguf", TINY).read_bytes()
    hub = HubServer(blob, "/org/tiny/resolve/main/tiny.gguf")
    await hub.start()
    use_hub(monkeypatch, hub.hub, tmp_path / "hf-home")
    data_dir = tmp_path / "data"
    try:
        async with running_node(node_config(data_dir, public_lan_origins=True)) as node:
            await _download(node, data_dir, hub.url + "?download=true", "tiny.gguf")
            assert _checked(data_dir, "tiny.gguf") is True
        assert await async_origin_public(hub.url + "?download=true&X-Amz-Signature=x", sent_token=False,
                                         lan_ok=True) is False
    finally:
        await hub.stop()
