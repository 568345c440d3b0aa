"""Files written whole or not at all (datadir.write_atomic): a write that fails on a full disk (a
1 MB tmpfs) leaves the old file and no `.tmp` beside it; the TLS certificate written at every start
(identity.crt) is left alone when it holds the same bytes, else replaced whole, and a write that
fails names the file, not its temporary. Found 2026-12-06: a failed write left `<name>.tmp` behind, and
identity.crt was rewritten in place (a crash mid-write, or a full disk, left it cut short)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from node.datadir import data_dir_error
from node.models.header import write_atomic
from node.net._identity import load_or_create_identity
from node.net._tls import CERT_FILE, TlsConfig
from tests.support.nodes import node_config, running_node

needs_root = pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0 or not shutil.which("mount"),
                                reason="needs root to mount a small tmpfs")


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MB tmpfs (`fill` takes what space is left)."""
    where = tmp_path / "full"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where) -> None:
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            try:
                os.write(fd, bytes(4096))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return
    finally:
        os.close(fd)


@needs_root
def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(full_disk):
    path = full_disk / "manifest.json"
    write_atomic(path, b"old")
    fill(full_disk)
    with pytest.raises(OSError) as caught:
        write_atomic(path, bytes(64 * 1024))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "manifest.json"]


@needs_root
def test_a_write_on_a_read_only_mount_names_the_file(tmp_path):
    """A read-only data dir (EROFS): the temporary's cleanup failed too (unlink is refused there even
    for a file that does not exist) and its error, naming `manifest.json.tmp`, escaped instead
    (found in review, 2026-12-06)."""
    where = tmp_path / "ro"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(where)], check=True)
    try:
        with pytest.raises(OSError) as caught:
            write_atomic(where / "manifest.json", b"x")
        assert caught.value.errno == errno.EROFS and caught.value.filename == str(where / "manifest.json")
        assert "manifest.json.tmp" not in (data_dir_error(where, caught.value) or "")
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@needs_root
def test_the_certificate_on_a_full_disk(full_disk):
    """The certificate a start writes: one already there (the same bytes every start) is left
    alone, so a full disk does not stop the start; one missing is an OSError naming identity.crt
    (what the start says: data_dir_error), with no temporary file left."""
    identity = load_or_create_identity(full_disk)
    TlsConfig(identity, full_disk).prepare()
    cert = full_disk / CERT_FILE
    written = cert.read_bytes()
    fill(full_disk)
    TlsConfig(identity, full_disk).prepare()
    assert cert.read_bytes() == written
    cert.unlink()
    fill(full_disk)
    with pytest.raises(OSError) as caught:
        TlsConfig(identity, full_disk).prepare()
    assert caught.value.filename == str(cert)
    assert data_dir_error(full_disk, caught.value) == (
        f"cannot write {cert} (No space left on device): free some space there, or give another --data-dir")
    assert not list(full_disk.glob("*.tmp"))


async def test_a_certificate_cut_short_is_written_whole_at_the_next_start(tmp_path):
    """A crash while identity.crt was written leaves part of it: the next start writes it whole,
    with the same identity."""
    config = node_config(tmp_path / "data")
    async with running_node(config) as node:
        node_id = node.node_id
    cert = tmp_path / "data" / CERT_FILE
    whole = cert.read_bytes()
    cert.write_bytes(whole[: len(whole) // 2])
    async with running_node(config) as node:
        assert node.node_id == node_id
        assert cert.read_bytes() == whole
