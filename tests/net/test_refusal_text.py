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
        assert len(r["reason"]) <= const.REFUSAL_REASON_MAX_CHARS + 20, len(r["reason"])  # (escaped, then bounded)


class _Bytes:
    """A stream reading from bytes (what _read_member reads the peer's answer from)."""

    def __init__(self, data: bytes):
        self.data = data

    async def read_exactly(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


async def test_a_peers_admission_error_text_is_kept_on_one_line_and_capped():
    """Found in review (2026-12-06): a peer we dial answering admission with another ERROR code put
    its text, newlines and all (up to 1024 chars), into the link's last_error, which the admin API
    and the GUI show; and the escapes of a capped text could make it ten times the cap."""
    from node.errors import ProtocolError
    from node.net._admission import _read_member

    frame = frame_bytes(Frame(FrameType.ERROR, ErrorInfo("busy\nDIAG: x", EVIL).to_header()))
    try:
        await _read_member(_Bytes(frame), "b" * 16, "s" * 16)
    except ProtocolError as exc:
        message = exc.message
    else:
        raise AssertionError("no error")
    assert "\n" not in message and "\r" not in message, message
    assert len(message) <= 100 + const.REFUSAL_REASON_MAX_CHARS, len(message)


def test_clean_text_escapes_before_it_bounds():
    from node.logs import clean_text

    tagged = "\U000e0001" * 500  # (escaped, each is 10 characters: \U000e0001)
    assert len(clean_text(tagged, 160)) <= 160 + len("…(+340 chars)")
    assert clean_text("a\nb", 160) == "a\\nb" and clean_text("x" * 10, 4) == "xxxx…(+6 chars)"
