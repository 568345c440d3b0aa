"""The peer network inside real nodes (`swarmllm run`, no model) on 127.0.0.1: admin API, CLI,
diagnostics, garbage at the peer port while the HTTP API keeps serving, SIGKILL and restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.processes import REPO, NodeProcess
from tests.support.waiting import wait_until_sync

from .rawclient import RawPeer, closed_by_peer

pytestmark = pytest.mark.slow

BARE = ["--no-default-model", "--no-mdns", "-v"]  # no model; -v: the DIAG lines on stdout


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    work = tmp_path_factory.mktemp("real")
    a = NodeProcess(work / "a", args=BARE)
    b = NodeProcess(work / "b", args=[*BARE, "--bootstrap", f"127.0.0.1:{a.peer_port}"])
    try:
        wait_until_sync(lambda: a.healthy() and b.healthy(), 120, 0.2, "both nodes up")
        a_id = json.loads(a.get("/api/admin/stats")[1])["node_id"]
        b_id = json.loads(b.get("/api/admin/stats")[1])["node_id"]
        wait_until_sync(lambda: (b.peer(a_id) or {}).get("state") == "connected"
                        and (a.peer(b_id) or {}).get("state") == "connected", 60, 0.2, "bootstrap link")
        yield {"a": a, "b": b, "a_id": a_id, "b_id": b_id, "work": work}
    finally:
        a.terminate()
        b.terminate()


def test_admin_peers_stats_and_cli(pair):
    a, b, a_id = pair["a"], pair["b"], pair["a_id"]
    row = b.peer(a_id)
    assert row["transport"] == "direct" and row["address"] == f"127.0.0.1:{a.peer_port}"
    # the other way (b dialled a): b's listen port, not the port its connection came from
    assert a.peer(pair["b_id"])["address"] == f"127.0.0.1:{b.peer_port}"
    assert {"node_id", "short_id", "state", "transport", "address", "rtt_ms", "models", "last_seen"} <= set(row)
    wait_until_sync(lambda: b.peer(a_id)["rtt_ms"] is not None, 30, 0.2, "an RTT sample")
    out = subprocess.run([sys.executable, "-m", "node.cli", "peers", "-p", str(b.port), "--data-dir", str(b.data_dir)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert a_id[:8] in out.stdout and "connected" in out.stdout and "direct" in out.stdout
    text = a.output()
    assert f"DIAG: connection established peer_id={pair['b_id'][:8]}" in text
    assert "is_loopback=True is_dialer=False" in text


def test_diagnostics_sections(pair):
    b, a_id = pair["b"], pair["a_id"]
    status, body = b.get("/api/admin/diagnostics")
    report = body.decode()
    assert status == 200
    assert "-- reachable at --" in report and "-- peers --" in report
    peers_section = report.split("-- peers --")[1].split("\n-- ")[0]
    assert a_id[:8] in peers_section and "transport=direct" in peers_section
    # addresses other than loopback are redacted by default and kept with ?full=1
    full = b.get("/api/admin/diagnostics?full=1")[1].decode()
    reach_full = full.split("-- reachable at --")[1].split("\n-- ")[0]
    reach = report.split("-- reachable at --")[1].split("\n-- ")[0]
    lan = [w for w in reach_full.split() if w.count(".") == 3 and not w.startswith("127.")]
    for addr in lan:
        assert addr not in reach
    if lan:
        assert "<private-ip-" in reach or "<public-ip-" in reach


def test_garbage_at_the_peer_port_keeps_peers_and_http_api(pair, tmp_path):
    a, b_id = pair["a"], pair["b_id"]
    before = a.peer(b_id)["connection_id"]
    raw = RawPeer(tmp_path, "127.0.0.1", a.peer_port)
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello", bytes(range(256))):
        sock = raw.raw()
        sock.sendall(junk)
        assert closed_by_peer(sock)
        sock.close()
    for junk in (b"\xff" * 64, b"SWRM\x01\x10\x00\x00" + b"\x00" * 8 + b"\xff\xff\xff\xff" * 2):
        sock, _ = raw.linked()
        sock.sendall(junk)
        assert closed_by_peer(sock)
        sock.close()
    assert a.healthy()
    assert raw.ping_ok()
    row = a.peer(b_id)
    assert row["state"] == "connected" and row["connection_id"] == before
    log = a.output()
    assert "Ignoring a peer that does not speak SwarmLLM" in log
    assert "DIAG: malformed frame, closing link" in log


def test_sigkill_gone_and_back(pair):
    a, b, b_id = pair["a"], pair["b"], pair["b_id"]
    deadline_s = a.peer(b_id)["liveness_deadline_s"]
    killed = time.monotonic()
    b.kill()
    wait_until_sync(lambda: (a.peer(b_id) or {}).get("state") == "gone", 60, 0.1, "a marks b gone")
    assert time.monotonic() - killed <= deadline_s + 5, deadline_s  # EOF: well inside the ping deadline
    assert a.peer(b_id)["transport"] is None
    out = subprocess.run([sys.executable, "-m", "node.cli", "peers", "-p", str(a.port), "--data-dir", str(a.data_dir)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "gone" in out.stdout, out.stderr
    b.start()
    wait_until_sync(lambda: b.healthy(), 120, 0.2, "b restarted")
    wait_until_sync(lambda: (a.peer(b_id) or {}).get("state") == "connected", 60, 0.2, "b back")
