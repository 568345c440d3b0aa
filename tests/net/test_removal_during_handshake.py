"""A member removed while its link is between admission and the full HELLO must not end up linked:
the removal closes the links it can see, and one still setting up has to be refused when it finishes."""

from __future__ import annotations

import asyncio
import secrets

from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from node.net._messages import Hello

from .rawclient import RawPeer, closed_by_peer, read_frame


async def test_a_member_removed_during_its_handshake_is_not_linked(make_manager, fast_net, tmp_path):
    a = await make_manager("a")
    c = RawPeer(tmp_path / "c", "127.0.0.1", a.listen_port)  # a member (the test swarm's secret)
    me = c.identity.node_id
    admitted = asyncio.Event()
    go_on = asyncio.Event()
    loop = asyncio.get_running_loop()

    def member_that_stalls_its_full_hello() -> bool:
        sock, node_id = c.tls_socket()
        try:
            nonce = secrets.token_hex(16)
            sock.sendall(frame_bytes(c.hello_frame(nonce)))
            hello = Hello.from_frame(read_frame(sock))
            sock.sendall(frame_bytes(Frame(FrameType.MEMBER, {
                "op": "proof", "proof": c.swarm.proof(me, node_id, nonce, hello.member_nonce)})))
            assert read_frame(sock).type == FrameType.MEMBER  # admitted: a's proof
            assert read_frame(sock).type == FrameType.HELLO  # a's full HELLO
            loop.call_soon_threadsafe(admitted.set)
            asyncio.run_coroutine_threadsafe(go_on.wait(), loop).result(timeout=20)
            sock.sendall(frame_bytes(c.hello_frame(nonce)))  # the full HELLO, after the removal
            return closed_by_peer(sock, timeout_s=2)  # a live link would answer nothing and ping us
        finally:
            sock.close()

    client = asyncio.ensure_future(asyncio.to_thread(member_that_stalls_its_full_hello))
    await asyncio.wait_for(admitted.wait(), 20)
    await a.swarm_ops.async_remove(me)  # c is removed while its link is still setting up
    go_on.set()
    closed = await asyncio.wait_for(client, 20)
    assert closed, "the removed member's connection stayed open"
    assert me not in {link.node_id for link in a.links}, "a removed member's link came up after its removal"
    assert a.peer(me) is None or a.peer(me).state == "refused"


async def test_a_member_caught_by_a_rotation_during_its_handshake_is_not_refused_for_good(make_manager, fast_net,
                                                                                          tmp_path):
    """The same window for a member that is not the one removed: its link is not registered (it was
    admitted under the old secret), but it is not remembered as refused either, which would stop
    this node from ever dialling it again."""
    a = await make_manager("a")
    c = RawPeer(tmp_path / "c", "127.0.0.1", a.listen_port)
    me = c.identity.node_id
    admitted = asyncio.Event()
    go_on = asyncio.Event()
    loop = asyncio.get_running_loop()

    def member_that_stalls_its_full_hello() -> bool:
        sock, node_id = c.tls_socket()
        try:
            nonce = secrets.token_hex(16)
            sock.sendall(frame_bytes(c.hello_frame(nonce)))
            hello = Hello.from_frame(read_frame(sock))
            sock.sendall(frame_bytes(Frame(FrameType.MEMBER, {
                "op": "proof", "proof": c.swarm.proof(me, node_id, nonce, hello.member_nonce)})))
            assert read_frame(sock).type == FrameType.MEMBER
            assert read_frame(sock).type == FrameType.HELLO
            loop.call_soon_threadsafe(admitted.set)
            asyncio.run_coroutine_threadsafe(go_on.wait(), loop).result(timeout=20)
            sock.sendall(frame_bytes(c.hello_frame(nonce)))
            return closed_by_peer(sock, timeout_s=2)
        finally:
            sock.close()

    client = asyncio.ensure_future(asyncio.to_thread(member_that_stalls_its_full_hello))
    await asyncio.wait_for(admitted.wait(), 20)
    await a.swarm_ops.async_remove("ab" * 32)  # someone else is removed: the secret rotates
    go_on.set()
    assert await asyncio.wait_for(client, 20), "a link admitted under the old secret came up"
    assert me not in {link.node_id for link in a.links}
    assert me not in a.membership.refusals, a.membership.refusals[me].reason
