"""Review r36, 4 (2026-12-07): on Windows (no os.preadv) a first slice's embedding rows are read
through the mapping, which shows a write in place, and nothing checked the file's stat: the new
bytes were read as the old model. And a file system numbering no inodes (st_ino 0: some FUSE and
network mounts) made any two files one."""

from __future__ import annotations

import os

import numpy as np
import pytest

from node.inference.synth import write_gguf
from node.inference.weights.gguf_file import FileChangedWhileOpen, GgufFile
from node.models.changed import same_file
from tests.pipeline.test_held_file_changed import OTHER, _overwrite
from tests.support.nodes import TINY


def test_without_preadv_a_file_written_over_in_place_is_refused_not_read(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "preadv", raising=False)
    path = write_gguf(tmp_path / "tiny.gguf", TINY)
    f = GgufFile(path)
    ids = np.array([1, 2, 3])
    before = f.lookup("token_embd.weight", ids)
    assert np.array_equal(f.lookup("token_embd.weight", ids), before)
    _overwrite(path, OTHER)
    with pytest.raises(FileChangedWhileOpen):
        f.lookup("token_embd.weight", ids)  # (OTHER's rows)


def _numbered(st: os.stat_result, ino: int) -> os.stat_result:
    fields = list(st[:10])
    fields[1] = ino
    return os.stat_result(fields)


def test_two_files_without_inode_numbers_are_not_taken_for_one(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    assert same_file(a.stat(), a.stat()) and not same_file(a.stat(), b.stat())
    assert not same_file(_numbered(a.stat(), 0), _numbered(b.stat(), 0))
