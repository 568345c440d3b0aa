"""A stranger's refusal text (found in review, 2026-12-06): anyone who can reach the peer port can dial
claiming our swarm's public id and answer our membership proof with ERROR not_a_member and any text
(up to 1024 chars, newlines kept). The node kept it whole as the refusal's reason, which the admin
API, the report and the GUI's Peers table show. Now it is kept on one line, at most
REFUSAL_REASON_MAX_CHARS. A real node; the stranger is a raw TLS peer on 127.0.0.1."""

from __future__ import annotations

import asyncio

from node import const
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from node.net._messages import ErrorInfo
from tests.net.rawclient import RawPeer, read_frame
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

EVIL = ("<b>urgent</b>\nDIAG: request complete model=x\r\n" * 40)[:1000]


def refuse_with(peer: RawPeer, text: str) -> None:
    """Dial the node, claim its swarm, take its proof, and answer it with ERROR not_a_member `text`."""
    sock, _node_id = peer.tls_socket()
    try:
        sock.sendall(frame_bytes(peer.hello_frame("1" * 32)))
        assert read_frame(sock).type == FrameType.HELLO
        assert read_frame(sock).type == FrameType.MEMBER  # the node's proof
        sock.sendall(frame_bytes(Frame(FrameType.ERROR, ErrorInfo("not_a_member", text).to_header())))
        sock.settimeout(20)
        while sock.recv(65536):  # until the node closes the link
            pass
    except OSError:
        pass
    finally:
        sock.close()


async def test_a_strangers_refusal_text_is_kept_on_one_line_and_capped(tmp_path):
    async with running_node(node_config(tmp_path / "a")) as node:
        stranger = RawPeer(tmp_path / "stranger", "127.0.0.1", node.peers.listen_port)
        await asyncio.to_thread(refuse_with, stranger, EVIL)

        def refused() -> list[dict]:
            return [r for r in node.peers.swarm_ops.status()["refused"] if r["node_id"] == stranger.identity.node_id]
        await wait_until(refused, 30.0, 0.05, "the stranger's refusal noted")
        [r] = refused()
        assert r["by_us"] is False
        for text in (r["reason"], r["error"]):
            assert "\n" not in text and "\r" not in text, text
        assert r["reason"].startswith("refused us: <b>urgent</b>\\nDIAG"), r["reason"]
        assert len(r["reason"]) <= 2 * const.REFUSAL_REASON_MAX_CHARS, len(r["reason"])  # (escapes: "\\n" is 2)
