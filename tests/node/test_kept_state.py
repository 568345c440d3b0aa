"""A data-dir file that merely could not be read this moment (a Windows sharing violation, an
antivirus' lock, a rename under way, a link to a folder not mounted yet) is never moved aside,
overwritten or replaced by a new swarm, identity or cache; only one whose bytes are damaged is kept
aside, and never over an earlier kept-aside copy. A sharing violation is simulated as the reviewer
did: the read (and the move) of that one file raise PermissionError.

Found in review r33 (2026-12-07): a locked model_hashes.json was loaded as no records and overwritten
by the first save once the lock cleared (every origin record gone: those files never shared again);
a read failing once moved a good cache aside; a second damaged swarm.json overwrote the first one's
swarm.json.broken (its secret gone for good); a momentary lock stopped the start "give this user the
right to read it"; a folder where swarm.json belongs was not said so on Windows (PermissionError, not
EISDIR); a swarm.json linked into a folder not mounted yet silently became a new swarm."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import openai
import pytest

from node.datadir import data_dir_error
from node.errors import NodeError
from node.models.hash_cache import HashCache
from node.net import Swarm, write_swarm_file
from node.net._identity import load_or_create_identity
from node.net._membership import load_or_create, write_json
from tests.support.nodes import node_config, running_node, tiny_model

ORIGIN = "https://huggingface.co/someone/tiny/resolve/main/tiny.gguf"


def _locked(monkeypatch, target: Path, *, reads: int | None = None, moves: bool = True) -> None:
    """`target` held by another program: its reads (the first `reads` of them; all when None) and its
    moves raise PermissionError, as Windows does for a file opened without sharing."""
    real_read, real_replace, real_rename = Path.read_bytes, os.replace, os.rename
    left = [reads]

    def read_bytes(self):
        if self == target and (left[0] is None or left[0] > 0):
            if left[0] is not None:
                left[0] -= 1
            raise PermissionError(errno.EACCES, "The process cannot access the file", str(self))
        return real_read(self)

    def moved(real):
        def move(src, dst, *args, **kw):
            if moves and Path(src) == target:
                raise PermissionError(errno.EACCES, "The process cannot access the file", str(src))
            return real(src, dst, *args, **kw)
        return move

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(os, "replace", moved(real_replace))
    monkeypatch.setattr(os, "rename", moved(real_rename))
    monkeypatch.setattr(Path, "replace", lambda self, dst: os.replace(self, dst))


def _origin_cache(data: Path, model: Path) -> bytes:
    cache = HashCache(data / "model_hashes.json")
    cache.get_or_compute(model)
    cache.remember(model, cache.get_or_compute(model), ORIGIN)
    return (data / "model_hashes.json").read_bytes()


@pytest.mark.llama
async def test_a_locked_model_hashes_json_is_neither_moved_nor_overwritten(tmp_path, monkeypatch, caplog):
    data = tmp_path / "data"
    data.mkdir()
    model = tiny_model(tmp_path)
    other = tmp_path / "other.gguf"
    other.write_bytes(model.read_bytes() + b"\0")  # a file the node hashes (and would save) at start
    before = _origin_cache(data, other)
    _locked(monkeypatch, data / "model_hashes.json")
    with caplog.at_level(logging.INFO):
        async with running_node(node_config(data, model)) as node:
            served = [m.id for m in node.models.all()]
            assert len(served) == 1, caplog.text[-3000:]
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                                        max_retries=0)
            reply = await client.chat.completions.create(model=served[0], max_tokens=2,
                                                         messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].finish_reason in ("length", "stop")
    monkeypatch.undo()  # the lock cleared
    assert (data / "model_hashes.json").read_bytes() == before  # the origin record is still there
    assert not list(data.glob("model_hashes.json.broken*"))
    assert caplog.text.count("nothing is saved over it") == 1, caplog.text[-3000:]
    assert HashCache(data / "model_hashes.json").origin_of(other).url == ORIGIN


def test_a_model_hashes_json_locked_a_moment_is_read(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    before = _origin_cache(tmp_path, model)
    _locked(monkeypatch, tmp_path / "model_hashes.json", reads=1)
    cache = HashCache(tmp_path / "model_hashes.json")
    assert cache.origin_of(model).url == ORIGIN  # read again, not moved aside as damaged
    assert (tmp_path / "model_hashes.json").read_bytes() == before
    assert not list(tmp_path.glob("model_hashes.json.broken*"))


def test_a_model_hashes_json_damaged_twice_keeps_both_copies(tmp_path):
    path = tmp_path / "model_hashes.json"
    path.write_text('{"/a.gguf": {"size": 1, "sha')
    HashCache(path).load()
    path.write_text('{"/b.gguf": {"size": 2')
    HashCache(path).load()
    assert (tmp_path / "model_hashes.json.broken").read_text() == '{"/a.gguf": {"size": 1, "sha'
    assert (tmp_path / "model_hashes.json.broken-2").read_text() == '{"/b.gguf": {"size": 2'


def test_a_swarm_json_damaged_twice_keeps_both_secrets(tmp_path):
    first = Swarm.create()
    write_swarm_file(tmp_path, first)
    path = tmp_path / "swarm.json"
    path.write_bytes(path.read_bytes()[:-12])  # cut short (a crash); its secret still in it
    second = load_or_create(tmp_path).swarm
    assert second.swarm_id != first.swarm_id
    path.write_bytes(path.read_bytes()[:-12])
    load_or_create(tmp_path)
    assert first.secret.hex() in (tmp_path / "swarm.json.broken").read_text()
    assert second.secret.hex() in (tmp_path / "swarm.json.broken-2").read_text()


def test_swarm_json_is_on_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    done: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (done.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (done.append(f"replace {Path(b).name}"), real_replace(a, b))[1])
    write_json(tmp_path, {"swarm_id": "x"})
    assert done == ["fsync", "replace swarm.json"], done


@pytest.mark.parametrize("error", [PermissionError, FileNotFoundError])
def test_a_swarm_json_locked_a_moment_keeps_its_swarm(tmp_path, monkeypatch, error):
    swarm = Swarm.create()
    write_swarm_file(tmp_path, swarm)
    real_read, left = Path.read_bytes, [1]

    def read_bytes(self):  # a lock, or a rename between the look and the read, once
        if self.name == "swarm.json" and left[0]:
            left[0] -= 1
            raise error(errno.EACCES if error is PermissionError else errno.ENOENT, "busy", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert load_or_create(tmp_path).swarm.swarm_id == swarm.swarm_id
    assert not list(tmp_path.glob("swarm.json.broken*"))


def test_a_folder_where_swarm_json_belongs_is_said_so_on_windows_too(tmp_path, monkeypatch):
    (tmp_path / "swarm.json").mkdir()
    _locked(monkeypatch, tmp_path / "swarm.json")  # Windows: open() of a folder is PermissionError, not EISDIR
    with pytest.raises(NodeError, match="swarm.json is a directory where a file belongs: move it away"):
        load_or_create(tmp_path)
    (tmp_path / "node.lock").mkdir()
    said = data_dir_error(tmp_path, PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "node.lock")))
    assert said is not None and "node.lock is a directory where a file belongs" in said, said


def test_a_swarm_json_locked_throughout_is_not_said_as_a_missing_right(tmp_path, monkeypatch):
    write_swarm_file(tmp_path, Swarm.create())
    before = (tmp_path / "swarm.json").read_bytes()
    _locked(monkeypatch, tmp_path / "swarm.json")
    with pytest.raises(NodeError, match="another program holds it") as raised:
        load_or_create(tmp_path)
    assert "try again" in str(raised.value)
    monkeypatch.undo()
    assert (tmp_path / "swarm.json").read_bytes() == before


@pytest.mark.parametrize("name", ["swarm.json", "identity.key"])
def test_a_link_to_a_folder_not_mounted_is_said_not_replaced(tmp_path, name):
    target = tmp_path / "vault" / name  # an encrypted or synced folder, not mounted yet
    (tmp_path / "data").mkdir()
    link = tmp_path / "data" / name
    link.symlink_to(target)
    with pytest.raises(NodeError, match=f"it links to {target}, which is not there"):
        (load_or_create if name == "swarm.json" else load_or_create_identity)(tmp_path / "data")
    assert link.is_symlink() and os.readlink(link) == str(target) and not target.exists()
    assert json.dumps(sorted(p.name for p in (tmp_path / "data").iterdir())) == json.dumps([name])


def test_the_api_key_and_config_are_on_disk_before_they_take_the_files_name(tmp_path, monkeypatch):
    """api_key was written in place without an fsync (a power cut could leave it empty, and the next
    start made a new key every configured app lacked); config.toml's temporary file was renamed
    over it unsynced (2026-12-07)."""
    from node.datadir import ensure_data_dir, load_or_create_api_key, save_desktop_settings

    done: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (done.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (done.append(f"replace {Path(b).name}"), real_replace(a, b))[1])
    ensure_data_dir(tmp_path)
    assert done == ["fsync", "replace config.toml"], done
    done.clear()
    key = load_or_create_api_key(tmp_path)
    assert done == ["fsync", "replace api_key"], done
    assert (tmp_path / "api_key").read_text().strip() == key
    done.clear()
    save_desktop_settings(tmp_path, {"paused": True})
    assert done == ["fsync", "replace config.toml"], done
