"""Peer nodes as separate processes on 127.0.0.1: killed, frozen, restarted."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.waiting import wait_until

from .util import PeerProc

pytestmark = pytest.mark.slow

# Liveness at test speed inside the peer processes (the watcher's constants are what matter).
FAST = ["--const", "PING_INTERVAL_S=0.5", "--const", "RECONNECT_BACKOFF_MIN_S=0.2",
        "--const", "RECONNECT_BACKOFF_MAX_S=1.0", "--const", "DIAL_MAINTENANCE_INTERVAL_S=0.2"]


def state(proc: PeerProc, node_id: str) -> str | None:
    peer = proc.peer(node_id)
    return peer["state"] if peer else None


@pytest.fixture
def procs(tmp_path):
    started: list[PeerProc] = []

    def start(name: str, *args: str) -> PeerProc:
        proc = PeerProc(tmp_path, name, [*FAST, *args])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


async def _pair(procs):
    a = procs("a")
    a_status = await a.async_ready()
    b = procs("b", "--bootstrap", f"127.0.0.1:{a_status['peer_port']}")
    b_status = await b.async_ready()
    await wait_until(lambda: state(a, b_status["node_id"]) == "connected"
                     and state(b, a_status["node_id"]) == "connected", 60, 0.1, "a and b linked")
    await wait_until(lambda: (a.peer(b_status["node_id"]) or {}).get("rtt_ms") is not None, 30, 0.1,
                     "an RTT sample")
    return a, a_status, b, b_status


async def test_sigkilled_peer_is_gone_within_the_deadline_and_comes_back(procs):
    a, a_status, b, b_status = await _pair(procs)
    b_id, b_port = b_status["node_id"], b_status["peer_port"]
    deadline_s = a.peer(b_id)["liveness_deadline_s"]
    assert deadline_s is not None and deadline_s > 0
    killed = time.monotonic()
    b.kill()
    await wait_until(lambda: state(a, b_id) == "gone", deadline_s + 10, 0.05, "a to mark b gone")
    detected_s = time.monotonic() - killed
    # SIGKILL closes the socket: the link sees EOF long before the ping deadline.
    assert detected_s <= deadline_s + 5, (detected_s, deadline_s)
    assert a.peer(b_id)["transport"] is None
    b.args += ["--peer-port", str(b_port)]
    b.start()  # same data dir: same identity, same port; a redials it, b redials a from its cache
    await wait_until(lambda: state(a, b_id) == "connected", 60, 0.1, "b back after restart")
    assert "DIAG: connection closed peer_id=" in a.output()
    assert f"DIAG: identity key loaded from disk path={b.data_dir}" in b.output()


async def test_frozen_peer_misses_pings_and_is_gone_within_the_rto_deadline(procs):
    a, a_status, b, b_status = await _pair(procs)
    b_id = b_status["node_id"]
    deadline_s = a.peer(b_id)["liveness_deadline_s"]  # ping interval + 3 backed-off RTOs
    stopped = time.monotonic()
    b.signal(signal.SIGSTOP)  # the TCP connection stays up; nothing answers
    try:
        await wait_until(lambda: state(a, b_id) == "gone", deadline_s + 15, 0.05, "a to mark b gone")
        detected_s = time.monotonic() - stopped
        # Generous slack for a loaded 2-core machine; the estimate itself is what is checked.
        assert detected_s <= deadline_s * 1.5 + 3, (detected_s, deadline_s)
        assert "DIAG: peer missed pings, closing link" in a.output()
        assert "cause=ping_timeout" in a.output()
    finally:
        b.signal(signal.SIGCONT)
    await wait_until(lambda: state(a, b_id) == "connected", 60, 0.1, "b back after SIGCONT")
