"""A node's HELLO lists the whole files it holds (`files`: sha256 each), loaded or not, apart from the
models it serves; fetchers ask those holders after the slice holders and the loaded whole holders.
An older node's HELLO has no `files`: it reads as before (none); a malformed or oversized list is a
protocol error. What is listed: whole files only (not a partial model, not a split model's part 1,
not a model known by its header alone), at most ADVERT_FILES_MAX."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from node import const
from node.errors import ProtocolError
from node.inference.pipeline.wholeparts import held_files
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE, HashCache
from node.net._frames import decode_frame, frame_bytes
from node.net._messages import Hello
from node.node import Node
from tests.net.rawclient import RawPeer
from tests.pipeline.test_autoserve import AUTO8
from tests.support.processes import NodeProcess
from tests.support.swarm import TEST_SWARM
from tests.support.waiting import wait_until_sync

SHA = "5" * 64


def _hello(**overrides) -> Hello:
    fields = {"node_id": "a" * 64, "boot_id": "b00t", "agent": "swarmllm-py/test", "listen_port": 8810,
              "models": ({"sha256": "c" * 64, "name": "m", "n_layers": 4, "whole": True},),
              "swarm": "1a2b3c4d", "epoch": 3, "member_nonce": "ab" * 16}
    fields.update(overrides)
    return Hello(**fields)


def _wire(hello: Hello, **header) -> Hello:
    frame = hello.to_frame()
    frame.header.update(header)
    return Hello.from_frame(decode_frame(frame_bytes(frame)))


def test_an_older_nodes_hello_without_files_reads_as_before():
    old = _hello()
    assert "files" not in old.to_frame().header  # none held: the field is left out (as an older node sends)
    read = _wire(old)
    assert read.files == () and read.models == old.models
    held = _hello(files=(SHA, "6" * 64))
    assert held.to_frame().header["files"] == [SHA, "6" * 64]
    assert _wire(held).files == (SHA, "6" * 64)
    assert _wire(old, unknown_field=[1, 2]).files == ()  # a newer node's fields are ignored


@pytest.mark.parametrize("files", ["5" * 64, ["A" * 64], [SHA[:63]], [7], [SHA] * 257, {"a": SHA}])
def test_a_malformed_or_oversized_files_list_is_a_protocol_error(files):
    with pytest.raises(ProtocolError):
        _wire(_hello(), files=files)


def _entry(n: int, *, partial=False, split=1, has_file=True, changed=False, origin="https://hf.co/o/r/m.gguf",
           public=True):
    return SimpleNamespace(id=f"m{n:03d}", sha256=f"{n:064x}", whole_ok=has_file and not partial, split_count=split,
                           changed=changed, origin_url=origin, origin_public=public)


def test_only_whole_files_are_listed_and_at_most_the_cap():
    entries = [_entry(1), _entry(2, partial=True), _entry(3, split=3), _entry(4, has_file=False),
               _entry(5, changed=True),  # (overwritten since hashed: the watch saw it)
               _entry(6, origin=None),  # the user's own file (no public origin): not while unloaded
               _entry(7, public=False)]  # a private repo's or signed download (download/public.py): not either
    assert held_files(SimpleNamespace(entries={e.id: e for e in entries})) == [f"{1:064x}"]
    many = [_entry(n) for n in range(const.ADVERT_FILES_MAX + 10)]
    listed = held_files(SimpleNamespace(entries={e.id: e for e in many}))
    assert len(listed) == const.ADVERT_FILES_MAX and len(set(listed)) == len(listed)


def test_fetchers_ask_loaded_holders_then_holders_of_the_file_on_disk():
    advert = {"sha256": SHA, "name": "auto8", "n_layers": 8, "whole": True}
    peers = [SimpleNamespace(node_id="d" * 64, state="connected", models=(), files=(SHA,)),  # on disk only
             SimpleNamespace(node_id="a" * 64, state="connected", models=(advert,), files=(SHA,)),  # loaded
             SimpleNamespace(node_id="e" * 64, state="connected", models=({**advert, "paused": True},), files=()),
             SimpleNamespace(node_id="f" * 64, state="gone", models=(), files=(SHA,)),
             SimpleNamespace(node_id="c" * 64, state="connected", models=(advert,), files=()),  # older node
             SimpleNamespace(node_id="b" * 64, state="connected", models=(), files=("6" * 64,))]
    me = SimpleNamespace(node_id="b" * 64, peers=SimpleNamespace(peers=lambda: peers))
    assert Node._whole_holders(me, SHA) == ["a" * 64, "c" * 64, "d" * 64]


@pytest.mark.slow
def test_a_real_node_lists_its_file_and_reads_an_older_peers_hello_as_before(tmp_path):
    """A node with a downloaded GGUF in its models folder (its origin recorded, as a download leaves
    it) lists it in the HELLO its peer gets; an older peer's HELLO (a loaded whole model, no `files`)
    is read as before: its models, no files."""
    model = write_gguf(tmp_path / "node" / "models" / "auto8.gguf", AUTO8)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    cache = HashCache(tmp_path / "node" / HASH_CACHE_FILE)
    cache.remember(model, sha, "https://huggingface.co/org/auto8/resolve/main/auto8.gguf")
    assert cache.set_public(model, sha, True)
    node = NodeProcess(tmp_path / "node", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        sock, hello = raw.linked()
        assert hello.files == (sha,)
        me = raw.identity.node_id
        older = {"sha256": SHA, "name": "old", "n_layers": 4, "whole": True}
        frame = Hello(node_id=me, boot_id="fuzz", agent="swarmllm-py/older", listen_port=0, models=(older,),
                      swarm=TEST_SWARM.public_id, epoch=TEST_SWARM.epoch, member_nonce="0" * 32).to_frame()
        assert "files" not in frame.header
        sock.sendall(frame_bytes(frame))
        wait_until_sync(lambda: (node.peer(me) or {}).get("agent") == "swarmllm-py/older", 20, 0.1, "the HELLO")
        row = node.peer(me)
        assert row["models"] == [older] and row["files"] == []
        sock.close()
    finally:
        node.terminate()
