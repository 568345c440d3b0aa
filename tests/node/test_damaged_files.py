"""Damaged files in the data dir, met by the real `swarmllm run` (and the client commands): one line
naming the file and what to do, exit 2 where the node cannot run, and nothing thrown away.

Found by hand on 2026-12-06: an `api_key` or `config.toml` that is not text (a crash, a bad copy)
gave a UnicodeDecodeError traceback; a damaged `peers.json` was ignored and overwritten by the
first save; on a full disk every log line came with logging's own ~20-line traceback for node.log
and the start failed with `[Errno 28] No space left on device`, naming no file or dir, leaving an
empty config.toml behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from node.net._peercache import load_peer_cache
from tests.support.processes import REPO, hermetic_env

GARBAGE = b"\xfa\x9c\x00\xd6binary\xff"


def _run(data_dir, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "run", "-p", "0", "--data-dir", str(data_dir),
                           "--no-mdns", "--no-default-model", *args], cwd=REPO, env=hermetic_env(),
                          capture_output=True, text=True, timeout=120)


def _errors(out: subprocess.CompletedProcess) -> list[str]:
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "Logging error" not in text, text[-3000:]
    return [line for line in text.splitlines() if " ERROR " in line or line.startswith("error:")]


def test_api_key_that_is_not_text_is_one_line_and_kept(tmp_path):
    (tmp_path / "api_key").write_bytes(GARBAGE)
    out = _run(tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = _errors(out)
    assert len(errors) == 1 and str(tmp_path / "api_key") in errors[0] and "move it away" in errors[0], errors
    assert (tmp_path / "api_key").read_bytes() == GARBAGE  # the clients' key is not replaced behind their back
    client = subprocess.run([sys.executable, "-m", "node.cli", "models", "-p", "1", "--data-dir", str(tmp_path)],
                            cwd=REPO, env=hermetic_env(), capture_output=True, text=True, timeout=60)
    assert client.returncode == 2 and "Traceback" not in client.stderr, client.stderr[-3000:]
    assert client.stderr.strip().splitlines() == [client.stderr.strip()] and "api_key" in client.stderr, client.stderr


def test_config_toml_that_is_not_text_is_one_line(tmp_path):
    (tmp_path / "config.toml").write_bytes(GARBAGE)
    out = _run(tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = _errors(out)
    assert len(errors) == 1 and "config.toml" in errors[0] and "not valid TOML" in errors[0], errors
    assert (tmp_path / "config.toml").read_bytes() == GARBAGE


@pytest.mark.parametrize("damage", [GARBAGE, b'{"version": 1, "peers": [', b'["a list"]'], ids=["bytes", "cut", "list"])
def test_damaged_peers_json_is_kept_aside(tmp_path, caplog, damage):
    (tmp_path / "peers.json").write_bytes(damage)
    assert load_peer_cache(tmp_path).peers == []
    assert not (tmp_path / "peers.json").exists()  # the next save writes a new one beside it
    assert (tmp_path / "peers.json.broken").read_bytes() == damage
    assert "peers.json.broken" in caplog.text


def test_good_peers_json_stays(tmp_path):
    good = {"version": 1, "peers": [{"node_id": "ab" * 32, "addrs": ["10.0.0.2:8810"]}], "foreign": []}
    (tmp_path / "peers.json").write_text(json.dumps(good))
    assert [p.node_id for p in load_peer_cache(tmp_path).peers] == ["ab" * 32]
    assert not (tmp_path / "peers.json.broken").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (writes fail with ENOSPC)")
def test_full_disk_at_first_start_is_one_line_naming_the_data_dir(tmp_path):
    # /dev/full stands for a full disk: node.log and the new api_key are written there (a 20 MB tmpfs
    # filled up gives the same lines)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "node.log").symlink_to("/dev/full")
    (data_dir / "api_key").symlink_to("/dev/full")
    (data_dir / "api_key.tmp").symlink_to("/dev/full")  # (the new key is written beside it, then renamed)
    out = _run(data_dir)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = _errors(out)
    assert len(errors) == 1, errors
    assert str(data_dir) in errors[0] and "No space left" in errors[0] and "--data-dir" in errors[0], errors
    said = [line for line in out.stderr.splitlines() if "node.log" in line]
    assert len(said) == 1 and "cannot write" in said[0], out.stderr[-3000:]  # said once, not per line
    assert (data_dir / "config.toml").read_text().startswith("# SwarmLLM node configuration")
    assert not (data_dir / "config.toml.tmp").exists()


def test_a_bad_log_call_is_not_taken_for_a_full_disk(tmp_path, capsys):
    """node.log's handler says a failed write once ("free some space there"); a log call with wrong
    arguments (a bug, not the disk) got that message too, and no traceback (found in review)."""
    import logging

    from node.logs import LogFileHandler

    handler = LogFileHandler(tmp_path / "node.log", maxBytes=1 << 20, backupCount=1, encoding="utf-8")
    try:
        bad = logging.LogRecord("node.test", logging.INFO, __file__, 1, "two values %s %s", (1,), None)
        handler.handle(bad)  # one argument short
    finally:
        handler.close()
    err = capsys.readouterr().err
    assert "free some space" not in err and "--- Logging error ---" in err, err
