"""A member sending CANCEL / SESSION_END back to back for sessions it never opened here (made-up
ids on a model the node serves). Both are pipeline work, outside the link's control-frame budget,
and each cost a tombstone (SESSION_TOMBSTONE_S, 120 s) and a job on the slice's executor: 3,000
frames left 3,000 tombstones and queued 3,000 jobs before the slice's steps, without bound. Now
those are charged to a per-sender budget (SESSION_CONTROL_BURST, refilled at
SESSION_CONTROL_PER_S) and dropped past it; ending a session its sender has in use is free."""

from __future__ import annotations

import secrets
from types import SimpleNamespace

import pytest

from node import const
from node.inference.pipeline.wire import SessionControl
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.swarm import split_model, start_slice_node
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.slow]

FLOOD = 3000


def _stats(node) -> dict:
    import json
    status, body = node.get("/api/admin/stats")
    assert status == 200, body
    return json.loads(body)


def test_a_member_flooding_session_ends_is_held_to_a_budget(tmp_path):
    node = start_slice_node(tmp_path, "victim", split_model(tmp_path), "0-5")
    try:
        node.wait_ready()
        raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        sock, _ = raw.linked()
        sha = wait_until_sync(lambda: _served_sha(raw), 30,
                              0.2, "the node's HELLO to name its slice")
        frames = [frame_bytes(Frame(FrameType.SESSION_END if i % 2 else FrameType.CANCEL,
                                    {"sid": secrets.token_hex(8) + "/0", "model": sha, "reason": "end"}))
                  for i in range(FLOOD)]
        sock.sendall(b"".join(frames))
        sock.sendall(frame_bytes(Frame(FrameType.PING, {}, b"", 99)))  # answered after all of them
        while not ((frame := read_frame(sock)).is_response and frame.request_id == 99):
            pass
        stats = _stats(node)
        # the burst, plus what refilled while they arrived (well under the flood)
        assert stats["session_tombstones"] <= const.SESSION_CONTROL_BURST + FLOOD // 4, stats
        assert stats["session_controls_dropped"] >= FLOOD // 2, stats
        assert node.output().count("DIAG: session controls dropped, the sender is past its budget") == 1
        assert raw.ping_ok()  # the node still serves peers; the flooder's own link stays
        sock.sendall(frame_bytes(Frame(FrameType.PING, {}, b"", 100)))
        while not ((frame := read_frame(sock)).is_response and frame.request_id == 100):
            pass
        sock.close()
    finally:
        node.terminate()


def _served_sha(raw: RawPeer) -> str | None:
    """The model sha256 in the node's full HELLO (a fresh link: the slice may load after the first)."""
    sock, hello = raw.linked()
    sock.close()
    return next((m["sha256"] for m in hello.models if m.get("sha256")), None)


def test_a_node_serving_no_slice_charges_and_keeps_nothing_for_session_controls(tmp_path):
    """Found in review: a consumer-only node charged every CANCEL / SESSION_END to its sender's
    bucket (they end nothing there and cost nothing) and kept the buckets for ever (the sweep that
    drops refilled ones starts with the first slice): one bucket per distinct sender."""
    node = NodeProcess(tmp_path / "consumer", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        socks = [RawPeer(tmp_path / f"member{i}", "127.0.0.1", node.peer_port).linked()[0] for i in range(3)]
        model = secrets.token_hex(32)
        for sock in socks:
            sock.sendall(b"".join(frame_bytes(Frame(FrameType.SESSION_END if i % 2 else FrameType.CANCEL,
                                                    {"sid": secrets.token_hex(8) + "/0", "model": model,
                                                     "reason": "end"}))
                                  for i in range(const.SESSION_CONTROL_BURST * 2)))
            sock.sendall(frame_bytes(Frame(FrameType.PING, {}, b"", 99)))  # answered after all of them
            while not ((frame := read_frame(sock)).is_response and frame.request_id == 99):
                pass
        stats = _stats(node)
        assert stats["session_controls_dropped"] == 0, stats
        assert stats["session_control_senders"] == 0 and stats["session_tombstones"] == 0, stats
        assert "DIAG: session controls dropped" not in node.output()
        for sock in socks:
            sock.close()
    finally:
        node.terminate()


async def test_the_session_control_buckets_are_bounded_and_a_removed_peers_is_forgotten(worker):
    """Buckets were dropped only by the slice sweeper once refilled: senders past the table's size
    push out the refilled, then the least recently charged; a peer leaving the table takes its own."""
    w, entry, _peers = worker
    senders = [secrets.token_hex(32) for _ in range(const.SESSION_CONTROL_MAX_SENDERS * 2)]
    for sender in senders:
        w.on_cancel(SessionControl(secrets.token_hex(8) + "/0", entry.sha256, "cancel").to_header(), b"", sender)
    assert len(w.control_budget) <= const.SESSION_CONTROL_MAX_SENDERS
    w.on_cancel(SessionControl(secrets.token_hex(8) + "/0", entry.sha256, "cancel").to_header(), b"", senders[0])
    assert len(w.control_budget) <= const.SESSION_CONTROL_MAX_SENDERS
    before = len(w.control_budget)
    w._on_peer_event("removed", SimpleNamespace(node_id=senders[0], state="gone", boot_id=None))
    assert len(w.control_budget) == before - 1
