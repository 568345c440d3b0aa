"""A data-dir file left as it was because it could not be read, or moved, this moment (a Windows
sharing violation, simulated as the reviewer did: that one file's reads and moves raise
PermissionError) costs nothing the user cannot get back once the lock clears.

Found in review r38 (2026-12-07): with model_hashes.json locked at start, saving stayed off for the
whole run, so a download's origin record (and its public check) was never written: after a restart
that file was never shared again; a folder at model_hashes.json did the same at every start; a
damaged swarm.json another program held left a second name beside it, and another .broken-N at each
start, with advice to give another --data-dir; a swarm.json or model_hashes.json kept elsewhere
through a link was replaced by a plain file (the secret in plain text in the data dir) at the first
write."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from node.datadir import linked_target, write_atomic
from node.errors import NodeError
from node.models.hash_cache import HashCache
from node.net import Swarm, write_swarm_file
from node.net._membership import load_or_create, save
from tests.node.test_kept_state import ORIGIN, _locked, _origin_cache

NEW_ORIGIN = "https://huggingface.co/someone/new/resolve/main/new.gguf"


def _model(tmp_path: Path, name: str, extra: bytes = b"") -> Path:
    path = tmp_path / name
    path.write_bytes(b"GGUF" + bytes(64) + extra)
    return path


def test_a_download_during_a_locked_run_keeps_its_origin(tmp_path, monkeypatch, caplog):
    old, new = _model(tmp_path, "old.gguf"), _model(tmp_path, "new.gguf", b"new")
    _origin_cache(tmp_path, old)
    old.touch()  # hashed again this run: its record in memory has no origin
    os.utime(old, ns=(1, 1))
    _locked(monkeypatch, tmp_path / "model_hashes.json")
    with caplog.at_level(logging.INFO):
        cache = HashCache(tmp_path / "model_hashes.json")
        cache.get_or_compute(old)
        sha = cache.get_or_compute(new)
        cache.remember(new, sha, NEW_ORIGIN)  # a download finished while the file was held
        cache.remember(new, sha, NEW_ORIGIN)
    monkeypatch.undo()  # the lock cleared
    assert cache.set_public(new, sha, True)  # its origin check, saved now
    again = HashCache(tmp_path / "model_hashes.json")  # the next start
    assert again.origin_of(new).url == NEW_ORIGIN and again.public_of(new)
    assert again.origin_of(old).url == ORIGIN  # the record on disk of the same bytes kept its origin
    assert not list(tmp_path.glob("model_hashes.json.*"))
    assert caplog.text.count("origin record is not saved yet") == 1, caplog.text
    assert "close the program holding it" in caplog.text


@pytest.mark.parametrize("windows", [False, True])
def test_a_folder_where_model_hashes_json_belongs_is_moved_aside_and_saving_goes_on(tmp_path, monkeypatch, caplog,
                                                                                    windows):
    (tmp_path / "model_hashes.json").mkdir()
    if windows:  # open() of a folder is PermissionError there, not EISDIR
        _locked(monkeypatch, tmp_path / "model_hashes.json", moves=False)
    model = _model(tmp_path, "m.gguf")
    with caplog.at_level(logging.WARNING):
        cache = HashCache(tmp_path / "model_hashes.json")
        cache.load()
    assert "a directory where a file belongs" in caplog.text, caplog.text
    monkeypatch.undo()
    cache.remember(model, cache.get_or_compute(model), ORIGIN)
    assert (tmp_path / "model_hashes.json.broken").is_dir()
    assert HashCache(tmp_path / "model_hashes.json").origin_of(model).url == ORIGIN


@pytest.mark.parametrize("rename_first", [False, True])
def test_a_damaged_swarm_json_another_program_holds_is_one_file_and_one_line(tmp_path, monkeypatch, rename_first):
    write_swarm_file(tmp_path, Swarm.create())
    path = tmp_path / "swarm.json"
    path.write_bytes(path.read_bytes()[:-12])  # damaged (a crash cut it)
    damaged = path.read_bytes()
    held = os.stat(path).st_ino
    real_unlink, real_rename = os.unlink, os.rename

    def refused(name):  # Windows: no name of a file opened without sharing goes
        if os.path.exists(name) and os.stat(name).st_ino == held:
            raise PermissionError(errno.EACCES, "The process cannot access the file", str(name))

    monkeypatch.setattr(os, "unlink", lambda name, *a, **kw: (refused(name), real_unlink(name, *a, **kw))[1])
    monkeypatch.setattr(os, "rename", lambda src, dst, *a, **kw: (refused(src), real_rename(src, dst, *a, **kw))[1])
    monkeypatch.setattr("node.datadir._RENAME_FIRST", rename_first, raising=False)
    for _ in range(3):  # three starts
        with pytest.raises(NodeError, match="swarm.json is damaged and another program holds it .*: close it, "
                                            "then try again"):
            load_or_create(tmp_path)
    assert not list(tmp_path.glob("swarm.json.broken-*")), sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.undo()  # closed
    state = load_or_create(tmp_path)  # a new swarm; the damaged one kept once
    assert (tmp_path / "swarm.json.broken").read_bytes() == damaged
    assert not list(tmp_path.glob("swarm.json.broken-*"))
    assert load_or_create(tmp_path).swarm.swarm_id == state.swarm.swarm_id


def test_a_swarm_json_and_a_hash_cache_kept_through_links_stay_links(tmp_path):
    vault, data = tmp_path / "vault", tmp_path / "data"  # an encrypted or synced folder
    vault.mkdir()
    data.mkdir()
    write_swarm_file(vault, Swarm.create())
    (data / "swarm.json").symlink_to(vault / "swarm.json")
    (data / "model_hashes.json").symlink_to(vault / "model_hashes.json")
    (vault / "model_hashes.json").write_text("{}")
    state = load_or_create(data)
    state.members["a" * 64] = 1.0e9  # a roster change: written
    save(data, state)
    model = _model(tmp_path, "m.gguf")
    cache = HashCache(data / "model_hashes.json")
    cache.remember(model, cache.get_or_compute(model), ORIGIN)
    for name in ("swarm.json", "model_hashes.json"):
        assert (data / name).is_symlink(), name
    assert "a" * 64 in (vault / "swarm.json").read_text()
    assert ORIGIN in (vault / "model_hashes.json").read_text()
    assert sorted(p.name for p in data.iterdir()) == ["model_hashes.json", "swarm.json"]


def test_a_link_to_a_device_or_a_folder_is_never_written_through(tmp_path):
    (tmp_path / "full").symlink_to("/dev/full")
    assert linked_target(tmp_path / "full") == tmp_path / "full"  # (a file renamed over it replaced the device)
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "folder")
    write_atomic(tmp_path / "link", b"{}")
    assert (tmp_path / "folder").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["folder", "full", "link"]


def test_a_peers_json_locked_a_moment_is_read(tmp_path, monkeypatch):
    from node.net._peercache import CachedPeer, PeerCache, load_peer_cache, save_peer_cache

    save_peer_cache(tmp_path, PeerCache([CachedPeer("ab" * 32, ["192.0.2.1:8810"])]))
    path, left = tmp_path / "peers.json", [1]
    real_bytes, real_text = Path.read_bytes, Path.read_text

    def once(real):
        def read(self, *a, **kw):
            if self == path and left[0]:
                left[0] -= 1
                raise PermissionError(errno.EACCES, "The process cannot access the file", str(self))
            return real(self, *a, **kw)
        return read

    monkeypatch.setattr(Path, "read_bytes", once(real_bytes))
    monkeypatch.setattr(Path, "read_text", once(real_text))
    assert [p.node_id for p in load_peer_cache(tmp_path).peers] == ["ab" * 32]
