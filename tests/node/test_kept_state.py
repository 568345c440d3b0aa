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
import os
from pathlib import Path

import pytest

from node.datadir import data_dir_error
from node.errors import NodeError
from node.net import Swarm, write_swarm_file
from node.net._identity import load_or_create_identity
from node.net._membership import load_or_create, write_json


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
