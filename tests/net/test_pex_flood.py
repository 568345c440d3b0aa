"""A member sending PEX frames (or, posing as a relay, `list` replies) full of made-up peers (node
ids cost nothing to make up).

Found by hand: 20 PEX frames of 256 made-up peers each (100 KB, well inside the control-frame
budget) from one member of the open swarm had a node create 5,120 peer records and dial every
one at once (a file descriptor each, 500 open for two frames), and each new record ran the peer
observers, which snapshot the whole table: the node's loop stalled 22, 24, 10 and 54 s, the API
answered nothing for 90 s and its other peers' links were dropped. Peers learnt only from PEX and
never linked are now held at most PEX_MAX_UNLINKED.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time

import pytest

from node import const
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from node.net._messages import FEATURE_PEX, FEATURE_RELAY, Hello
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until_sync

from .rawclient import RawPeer, read_frame

pytestmark = pytest.mark.slow


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_member_flooding_pex_with_made_up_peers_does_not_stall_the_node(tmp_path):
    node = NodeProcess(tmp_path / "victim", args=["--no-default-model", "--no-mdns"])
    keeper = NodeProcess(tmp_path / "keeper",
                         args=["--no-default-model", "--no-mdns", "--bootstrap", f"127.0.0.1:{node.peer_port}"])
    try:
        node.wait_ready(path="/health")
        keeper.wait_ready(path="/health")
        linked = wait_until_sync(lambda: [p for p in node.peers() if p["state"] == "connected"], 60, 0.2,
                                 "the keeper linked")
        keeper_id, conn_id = linked[0]["node_id"], linked[0]["connection_id"]

        raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        sock, _ = raw.linked()
        for _ in range(8):  # 2,048 made-up peers on unroutable addresses (TEST-NET-1: connects hang)
            peers = [{"node_id": secrets.token_hex(32), "addrs": [f"192.0.2.{j % 250 + 1}:9"], "relays": []}
                     for j in range(256)]
            sock.sendall(frame_bytes(Frame(FrameType.PEX, {"peers": peers})))

        # the node keeps answering its API promptly while it learns and dials what it was sent
        deadline = time.monotonic() + 8.0
        worst = 0.0
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert node.healthy(), "the API stopped answering"
            worst = max(worst, time.monotonic() - started)
        assert worst < 5.0, f"the API took {worst:.1f} s to answer /health"  # the stalls were 10-54 s
        rows = node.peers()
        assert len(rows) <= const.PEX_MAX_UNLINKED + 2, f"{len(rows)} peer records from one member's PEX"
        assert _open_fds(node.proc.pid) < const.PEX_MAX_UNLINKED + 100
        assert node.peer(keeper_id)["connection_id"] == conn_id, "the keeper's link was dropped"
        wait_until_sync(lambda: "DIAG: peers from PEX not learnt, too many unlinked ones" in node.output(),
                        20, 0.2, "the WARNING naming the cap")
        sock.close()
    finally:
        node.terminate()
        keeper.terminate()


def _serve_as_relay(raw: RawPeer, stop: threading.Event, ids_per_list: int) -> threading.Thread:
    """A member whose HELLO says it is a relay: it answers `list` with made-up node ids."""
    sock, node_id = raw.tls_socket()
    nonce = secrets.token_hex(16)

    def hello() -> bytes:
        return frame_bytes(Hello(node_id=raw.identity.node_id, boot_id="fuzz", agent="fuzzer/1", listen_port=0,
                                 features=FEATURE_PEX | FEATURE_RELAY, swarm=raw.swarm.public_id,
                                 epoch=raw.swarm.epoch, member_nonce=nonce).to_frame())

    sock.sendall(hello())
    theirs = Hello.from_frame(read_frame(sock))
    proof = raw.swarm.proof(raw.identity.node_id, node_id, nonce, theirs.member_nonce)
    sock.sendall(frame_bytes(Frame(FrameType.MEMBER, {"op": "proof", "proof": proof})))
    read_frame(sock)
    sock.sendall(hello())
    read_frame(sock)
    sock.settimeout(0.5)

    def serve() -> None:
        while not stop.is_set():
            try:
                frame = read_frame(sock)
            except TimeoutError:
                continue
            except (ConnectionError, OSError):
                return
            if frame.type == FrameType.PING and not frame.is_response:
                sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
            elif frame.type == FrameType.RELAY and frame.header.get("op") == "register":
                sock.sendall(frame_bytes(frame.reply(FrameType.RELAY, {"ok": True})))
            elif frame.type == FrameType.RELAY and frame.header.get("op") == "list":
                nodes = [{"node_id": secrets.token_hex(32)} for _ in range(ids_per_list)]
                sock.sendall(frame_bytes(frame.reply(FrameType.RELAY, {"nodes": nodes})))
        sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_member_posing_as_a_relay_with_made_up_peers_does_not_stall_the_node(tmp_path):
    """Found by hand: one `list` reply of 5,000 made-up node ids from a member whose HELLO says it is
    a relay stalled the node's loop for 294 s (API silent, every link dropped)."""
    node = NodeProcess(tmp_path / "victim", args=["--no-default-model", "--no-mdns"])
    stop = threading.Event()
    try:
        node.wait_ready(path="/health")
        thread = _serve_as_relay(RawPeer(tmp_path, "127.0.0.1", node.peer_port), stop, 3000)
        wait_until_sync(lambda: len(node.peers()) > 1, 30, 0.2, "the node to learn peers from the relay's list")
        deadline = time.monotonic() + 8.0
        worst = 0.0
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert node.healthy(), "the API stopped answering"
            worst = max(worst, time.monotonic() - started)
        assert worst < 5.0, f"the API took {worst:.1f} s to answer /health"  # the stalls were 10-54 s
        rows = node.peers()
        assert len(rows) <= const.RELAY_MAX_UNLINKED + 2, f"{len(rows)} peer records from one relay's list"
        assert "DIAG: peers from a relay's list not learnt, too many unlinked ones" in node.output()
    finally:
        stop.set()
        node.terminate()
    thread.join(5)


def _lan_address() -> str | None:
    """An address of this machine other than loopback (the default route's source), or None."""
    import socket
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))  # no packet is sent: only the route is looked up
        addr = s.getsockname()[0]
        return None if addr.startswith("127.") else addr
    return None


def test_a_remote_member_cannot_have_the_node_dial_its_own_loopback_or_non_addresses(tmp_path):
    """PEX from a member on another machine naming 127.0.0.1:<a local service>, 0.0.0.0 or a
    multicast address had this node dial them (its own local services, for one); only a member on
    this machine may introduce loopback addresses, and nobody the others."""
    lan = _lan_address()
    if lan is None:
        pytest.skip("this machine has no address but loopback")
    node = NodeProcess(tmp_path / "victim", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        raw = RawPeer(tmp_path, lan, node.peer_port)  # a link from a non-loopback address
        sock, _ = raw.linked()
        bad, good = secrets.token_hex(32), secrets.token_hex(32)
        sock.sendall(frame_bytes(Frame(FrameType.PEX, {"peers": [
            {"node_id": bad, "addrs": [f"127.0.0.1:{node.port}", "0.0.0.0:9", "[::]:9", "224.0.0.251:5353",
                                       "localhost:22", "127.1:22", "2130706433:22", "0x7f000001:22",
                                       "[::ffff:127.0.0.1]:22", "localtest.me:22"], "relays": []},
            {"node_id": good, "addrs": ["127.0.0.1:9", "198.51.100.7:9"], "relays": []}]})))
        row = wait_until_sync(lambda: node.peer(good), 20, 0.1, "the plausible peer learnt")
        assert row["address"] == "198.51.100.7:9"  # its loopback address left out
        assert node.peer(bad) is None  # nothing left to dial: no record at all
        sock.close()
    finally:
        node.terminate()


def test_one_member_cannot_fill_the_pex_pool_for_the_others(tmp_path):
    """Found in review: one member's PEX of 128 made-up peers filled PEX_MAX_UNLINKED, shared by
    all, and every peer another member introduced afterwards was not learnt. A full pool now makes
    room for another member's peer by forgetting one the largest sharer taught."""
    node = NodeProcess(tmp_path / "victim", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        hostile, _ = RawPeer(tmp_path / "hostile", "127.0.0.1", node.peer_port).linked()
        made_up = [{"node_id": secrets.token_hex(32), "addrs": [f"192.0.2.{j % 250 + 1}:9"], "relays": []}
                   for j in range(const.PEX_MAX_UNLINKED + 8)]
        hostile.sendall(frame_bytes(Frame(FrameType.PEX, {"peers": made_up})))
        wait_until_sync(lambda: "DIAG: peers from PEX not learnt, too many unlinked ones" in node.output(),
                        20, 0.2, "the hostile member's share to be full")
        honest, _ = RawPeer(tmp_path / "honest", "127.0.0.1", node.peer_port).linked()
        real = secrets.token_hex(32)
        honest.sendall(frame_bytes(Frame(FrameType.PEX, {"peers": [
            {"node_id": real, "addrs": ["198.51.100.7:9"], "relays": []}]})))
        wait_until_sync(lambda: node.peer(real), 20, 0.1, "the honest member's peer to be learnt")
        learnt = {p["node_id"] for p in node.peers()} & {e["node_id"] for e in made_up}
        assert len(learnt) == const.PEX_MAX_UNLINKED - 1
        hostile.close()
        honest.close()
    finally:
        node.terminate()
