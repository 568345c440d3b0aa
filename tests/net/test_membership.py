"""Private swarms on loopback: only members link; proofs cannot be replayed; a relay splices only
members; invites admit once; a removed member's links close and its old secret links nowhere."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import struct

import pytest

from node.config import NodeConfig
from node.errors import InvalidRequest, PeerError
from node.net import Frame, FrameType, PeerManager, load_or_create_identity
from node.net._connect import async_dial_relayed
from node.net._frames import frame_bytes
from node.net._membership import SWARM_FILE, Swarm
from node.net._messages import Hello
from node.net._preamble import HEAD_LEN, KIND_CONNECT, PREAMBLE_VERSION, encode_preamble

from .rawclient import RawPeer, read_frame, recv_exact
from .util import addr, wait_until


@pytest.fixture
async def swarms(tmp_path, fast_net):
    """Factory: `await swarms(name, group="A", **fields)` → a started PeerManager in swarm A (nodes
    given the same group share one swarm.json); all stopped at teardown."""
    made: list[PeerManager] = []
    files: dict[str, str] = {}

    async def make(name: str, group: str = "A", **fields) -> PeerManager:
        data_dir = tmp_path / name
        data_dir.mkdir()
        if group in files:
            shutil.copy(files[group], data_dir / SWARM_FILE)
        cfg = NodeConfig(data_dir=data_dir, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False)
        for key, value in fields.items():
            setattr(cfg, key, value)
        manager = PeerManager(cfg, load_or_create_identity(data_dir))
        made.append(manager)
        await manager.async_start()
        files.setdefault(group, str(data_dir / SWARM_FILE))
        return manager

    yield make
    for manager in reversed(made):
        await manager.async_stop()


def linked(x, y) -> bool:
    return x.link(y.node_id) is not None and y.link(x.node_id) is not None


async def test_two_swarms_never_link_and_refusals_are_counted_once(swarms, caplog):
    caplog.set_level(logging.INFO, logger="node.net")
    a1 = await swarms("a1", "A")
    a2 = await swarms("a2", "A", bootstrap=[addr(a1)])
    b1 = await swarms("b1", "B", bootstrap=[addr(a1)])
    b2 = await swarms("b2", "B", bootstrap=[addr(b1), addr(a2)])
    await wait_until(lambda: linked(a1, a2) and linked(b1, b2), what="each swarm linked within")
    await wait_until(lambda: b1.node_id in a1.membership.refusals and b2.node_id in a2.membership.refusals,
                     what="the strangers refused")
    assert a1.swarm_ops.status()["swarm"] == a2.swarm_ops.status()["swarm"] != b1.swarm_ops.status()["swarm"]
    rounds = b1.discovery.dialer.rounds
    await wait_until(lambda: b1.discovery.dialer.rounds >= rounds + 10, what="ten more dial rounds")
    for x, y in ((a1, b1), (a1, b2), (a2, b1), (a2, b2)):
        assert x.link(y.node_id) is None and y.link(x.node_id) is None
    assert a1.membership.refusals[b1.node_id].count == 1  # never redialled in a loop
    assert caplog.text.count(f"DIAG: refusing a peer that is not in this swarm peer_id={b1.short_id}") == 1
    status = a1.swarm_ops.status()
    assert status["members_connected"] == 1 and any(r["node_id"] == b1.node_id for r in status["refused"])


async def test_a_replayed_proof_is_refused(swarms, monkeypatch, tmp_path):
    """A member's proof captured on its link to A, replayed by a node with another identity."""
    captured: list[tuple[str, str]] = []  # (proof, the prover's nonce)
    real_proof = Swarm.proof

    def recording(self, prover, verifier, prover_nonce, verifier_nonce):
        proof = real_proof(self, prover, verifier, prover_nonce, verifier_nonce)
        captured.append((proof, prover_nonce))
        return proof

    monkeypatch.setattr(Swarm, "proof", recording)
    a = await swarms("a", "A")
    b = await swarms("b", "A", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b), what="a and b linked")
    monkeypatch.setattr(Swarm, "proof", real_proof)
    proof, nonce = captured[-1]
    swarm = a.membership.swarm
    thief = RawPeer(tmp_path / "thief", "127.0.0.1", a.listen_port)

    def replay() -> list[Frame]:  # a blocking client: in a thread, off the loop the node runs on
        sock, _ = thief.tls_socket(a.node_id)
        try:
            sock.sendall(frame_bytes(Hello(node_id=thief.identity.node_id, boot_id="x", agent="thief/1",
                                           listen_port=0, swarm=swarm.public_id, epoch=swarm.epoch,
                                           member_nonce=nonce).to_frame()))
            assert read_frame(sock).type == FrameType.HELLO
            sock.sendall(frame_bytes(Frame(FrameType.MEMBER, {"op": "proof", "proof": proof})))
            return [read_frame(sock) for _ in range(2)]  # A's own proof goes out first, then the refusal
        finally:
            sock.close()

    frames = await asyncio.to_thread(replay)
    errors = [f for f in frames if f.type == FrameType.ERROR]
    assert errors and errors[0].header["code"] == "not_a_member"
    await wait_until(lambda: thief.identity.node_id in a.membership.refusals, what="the thief refused")
    assert a.link(thief.identity.node_id) is None and linked(a, b)


async def test_a_relay_splices_only_members(swarms, tmp_path):
    r = await swarms("r", "A", relay=True)
    a = await swarms("a", "A", relays=[addr(r)], no_direct=True)
    b = await swarms("b", "A", relays=[addr(r)], no_direct=True)
    await wait_until(lambda: linked(a, b) and a.link(b.node_id).transport == "relayed", what="a-b relayed")
    # a stranger cannot link to the relay, so it cannot get a ticket; a circuit without one is refused
    x = await swarms("x", "X", relays=[addr(r)], no_direct=True)
    await wait_until(lambda: x.node_id in r.membership.refusals, what="the relay refusing the stranger")

    def connect_without_ticket() -> dict:
        sock = socket.create_connection(("127.0.0.1", r.listen_port), timeout=20)
        try:
            sock.sendall(encode_preamble(KIND_CONNECT, {"v": PREAMBLE_VERSION, "target": a.node_id,
                                                        "from": x.node_id, "ticket": "0" * 32}))
            head = recv_exact(sock, HEAD_LEN)
            return json.loads(recv_exact(sock, struct.unpack("!I", head[9:13])[0]))
        finally:
            sock.close()

    reply = await asyncio.to_thread(connect_without_ticket)
    assert reply.get("ok") is False and reply.get("error") == "not_a_member", reply
    with pytest.raises(PeerError, match="not_a_member"):
        await async_dial_relayed(x.tls, addr(r), a.node_id, x.node_id, "f" * 32)
    assert r.relay.refused_connects >= 2 and x.link(a.node_id) is None and x.link(r.node_id) is None


async def test_invite_join_and_restart_without_joining_again(swarms, tmp_path):
    a = await swarms("a", "A")
    c = await swarms("c", "C", bootstrap=[addr(a)])
    await wait_until(lambda: c.node_id in a.membership.refusals, what="c refused while in its own swarm")
    code, _expires = await a.swarm_ops.async_invite()
    assert code.startswith("swarmllm1-") and len(code) < 100
    assert await c.swarm_ops.async_join(code) == a.swarm_ops.status()["swarm"]
    await wait_until(lambda: linked(a, c), what="c linked to a as a member")
    d = await swarms("d", "D")
    with pytest.raises(InvalidRequest, match="refused the invite"):  # one time only
        await d.swarm_ops.async_join(code)
    data_dir = c.config.data_dir
    await c.async_stop()
    again = PeerManager(NodeConfig(data_dir=data_dir, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False),
                        load_or_create_identity(data_dir))
    try:
        await again.async_start()  # swarm.json and peers.json: no join, no bootstrap needed
        await wait_until(lambda: linked(a, again), what="the restarted node back in the swarm")
        assert again.swarm_ops.status()["swarm"] == a.swarm_ops.status()["swarm"]
    finally:
        await again.async_stop()


async def test_removing_a_member_closes_its_links_and_its_secret_links_nowhere(swarms):
    a = await swarms("a", "A")
    b = await swarms("b", "A", bootstrap=[addr(a)])
    c = await swarms("c", "A", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b) and linked(a, c) and linked(b, c), what="a full mesh of three")
    told = await a.swarm_ops.async_remove(c.node_id)
    assert told == 1  # b
    await wait_until(lambda: a.link(c.node_id) is None and b.link(c.node_id) is None, timeout_s=5,
                     what="c's links closed within seconds")
    await wait_until(lambda: b.membership.swarm.epoch == a.membership.swarm.epoch == 1, what="b got the new secret")
    assert c.membership.swarm.epoch == 0
    # c (old secret, same swarm id) dials both again: refused everywhere
    c.discovery.dialer.add_target(addr(b), "bootstrap")
    c.membership.refusals.clear()
    c.membership.refused_addrs.clear()
    for rec in c.table:
        rec.state, rec.next_dial_at = "gone", 0.0
    c.discovery.dialer.wake()
    await wait_until(lambda: c.node_id in b.membership.refusals, what="b refusing the removed node")
    assert a.link(c.node_id) is None and b.link(c.node_id) is None and linked(a, b)


async def test_the_open_swarm_is_opt_in_and_links_only_the_nodes_that_opted_in(swarms):
    o1 = await swarms("o1", "O1", swarm="open")
    o2 = await swarms("o2", "O2", swarm="open", bootstrap=[addr(o1)])
    p = await swarms("p", "P", bootstrap=[addr(o1)])
    await wait_until(lambda: linked(o1, o2), what="two open nodes linked without an invite")
    await wait_until(lambda: p.node_id in o1.membership.refusals, what="the private node refused")
    assert o1.swarm_ops.status()["swarm"] == "open" and o1.swarm_ops.status()["open"] is True
    assert p.link(o1.node_id) is None
    assert not (o1.config.data_dir / SWARM_FILE).exists()  # nothing secret to store
    # a node configured open is open again at every start: a join (or a leave) would not last, so
    # it is refused with what to do instead (it had said "joined", then reverted at the restart)
    code, _ = await p.swarm_ops.async_invite()
    with pytest.raises(InvalidRequest, match="configured into the open swarm.*restart it without"):
        await o1.swarm_ops.async_join(code)
    with pytest.raises(InvalidRequest, match="configured into the open swarm"):
        await o1.swarm_ops.async_leave()
    assert o1.swarm_ops.status()["swarm"] == "open" and not (o1.config.data_dir / SWARM_FILE).exists()
    with pytest.raises(InvalidRequest, match="made by this node"):  # a code pasted on its own maker
        await p.swarm_ops.async_join(code)


async def test_a_removed_members_secret_links_nowhere_even_under_a_new_identity(swarms, tmp_path):
    a = await swarms("a", "A")
    b = await swarms("b", "A", bootstrap=[addr(a)])
    c = await swarms("c", "A", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b) and linked(a, c), what="three members")
    stolen = (c.config.data_dir / SWARM_FILE).read_bytes()  # c's copy of the secret, epoch 0
    await a.swarm_ops.async_remove(c.node_id)
    await wait_until(lambda: b.membership.swarm.epoch == 1, what="b rotated")
    # a fresh identity with the removed node's swarm.json: not refused by id, but by its secret
    (tmp_path / "c2").mkdir()
    (tmp_path / "c2" / SWARM_FILE).write_bytes(stolen)
    c2 = PeerManager(NodeConfig(data_dir=tmp_path / "c2", port=0, peer_port=0, peer_host="127.0.0.1", mdns=False,
                                bootstrap=[addr(a), addr(b)]), load_or_create_identity(tmp_path / "c2"))
    try:
        await c2.async_start()
        await wait_until(lambda: c2.node_id in a.membership.refusals and c2.node_id in b.membership.refusals,
                         what="both members refusing the old secret")
        assert a.link(c2.node_id) is None and b.link(c2.node_id) is None
        # which side is behind, in the words `swarmllm swarm status` shows (it said "older or newer")
        assert a.membership.refusals[c2.node_id].reason == "holds an older swarm secret (epoch 0, ours 1)"
    finally:
        await c2.async_stop()


async def test_an_invite_stays_used_across_the_inviters_restart(swarms, tmp_path):
    a = await swarms("a", "A")
    code, _ = await a.swarm_ops.async_invite()
    c = await swarms("c", "C")
    await c.swarm_ops.async_join(code)
    await a.async_stop()
    a2 = PeerManager(NodeConfig(data_dir=a.config.data_dir, port=0, peer_port=a.listen_port, peer_host="127.0.0.1",
                                mdns=False), load_or_create_identity(a.config.data_dir))
    try:
        await a2.async_start()
        e = await swarms("e", "E")
        with pytest.raises(InvalidRequest, match="refused the invite"):
            await e.swarm_ops.async_join(code)
        assert e.membership.swarm.public_id != a2.membership.swarm.public_id
    finally:
        await a2.async_stop()


async def test_two_members_removing_at_once_converge_on_one_secret(swarms):
    a = await swarms("a", "A")
    b = await swarms("b", "A", bootstrap=[addr(a)])
    c = await swarms("c", "A", bootstrap=[addr(a)])
    x = await swarms("x", "A", bootstrap=[addr(a)])
    y = await swarms("y", "A", bootstrap=[addr(a)])
    members = (a, b, c)
    await wait_until(lambda: all(linked(m, n) for m in (a, b, c, x, y) for n in (a, b, c, x, y) if m is not n),
                     what="a full mesh of five")
    await asyncio.gather(a.swarm_ops.async_remove(x.node_id), b.swarm_ops.async_remove(y.node_id))
    await wait_until(lambda: len({m.membership.swarm.secret for m in members}) == 1
                     and all(m.membership.state.removed == {x.node_id, y.node_id} for m in members),
                     what="a, b and c on one secret, with both removals")
    await wait_until(lambda: all(m.link(x.node_id) is None and m.link(y.node_id) is None for m in members),
                     what="x and y unlinked everywhere")
    assert all(linked(m, n) for m in members for n in members if m is not n)
