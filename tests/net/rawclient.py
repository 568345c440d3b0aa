"""A blocking, hand-driven peer client for fuzzing: every step of the handshake is explicit, so a
test can stop anywhere and write whatever bytes it likes."""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import struct
from pathlib import Path

from node.net import Frame, FrameType, Identity, Swarm
from node.net._frames import PREFIX_LEN, decode_body, decode_prefix, frame_bytes
from node.net._messages import Hello
from node.net._preamble import HEAD_LEN, tls_preamble
from node.net._tls import TlsConfig, verify_peer
from tests.support.swarm import TEST_SWARM


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly n bytes, or ConnectionError if the other side closes first."""
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def closed_by_peer(sock: socket.socket, timeout_s: float = 20.0) -> bool:
    """True once the other side closes (EOF or reset); reads and discards what comes before."""
    sock.settimeout(timeout_s)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionError, ssl.SSLError, OSError) as exc:
        return not isinstance(exc, TimeoutError)


class RawPeer:
    """One identity that can open raw TCP or authenticated TLS connections to a node."""

    def __init__(self, workdir: Path, host: str, port: int, swarm: Swarm = TEST_SWARM):
        self.swarm = swarm
        self.identity = Identity.generate()
        self.tls = TlsConfig(self.identity, workdir)
        self.tls.write_files()
        self.host, self.port = host, port

    def raw(self) -> socket.socket:
        """A plain TCP connection to the peer port."""
        sock = socket.create_connection((self.host, self.port), timeout=20)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def tls_socket(self, expected_node_id: str | None = None) -> tuple[ssl.SSLSocket, str]:
        """Preamble + TLS 1.3 handshake; returns the socket and the node id the server proved."""
        sock = self.raw()
        sock.sendall(tls_preamble(self.tls.cert_der))
        head = recv_exact(sock, HEAD_LEN)
        body = json.loads(recv_exact(sock, struct.unpack("!I", head[9:13])[0]))
        assert head[8:9] == b"k" and body.get("ok") is True, body
        ssock = self.tls.client_context().wrap_socket(sock)
        return ssock, verify_peer(ssock, expected_node_id)

    def hello_frame(self, nonce: str = "0" * 32) -> Frame:
        """Our HELLO, as a member of the swarm (the test swarm unless told otherwise)."""
        return Hello(node_id=self.identity.node_id, boot_id="fuzz", agent="fuzzer/1", listen_port=0,
                     link_nonce="fuzz", swarm=self.swarm.public_id, epoch=self.swarm.epoch,
                     member_nonce=nonce).to_frame()

    def linked(self) -> tuple[ssl.SSLSocket, Hello]:
        """A full link: TLS, HELLO exchange and admission (membership proofs both ways). Returns the
        socket and the node's HELLO."""
        sock, node_id = self.tls_socket()
        nonce = secrets.token_hex(16)
        sock.sendall(frame_bytes(self.hello_frame(nonce)))
        frame = read_frame(sock)
        assert frame.type == FrameType.HELLO
        hello = Hello.from_frame(frame)
        assert hello.node_id == node_id
        me = self.identity.node_id
        sock.sendall(frame_bytes(Frame(FrameType.MEMBER, {
            "op": "proof", "proof": self.swarm.proof(me, node_id, nonce, hello.member_nonce)})))
        answer = read_frame(sock)
        assert answer.type == FrameType.MEMBER, answer.header
        assert self.swarm.verify(answer.header.get("proof"), node_id, me, hello.member_nonce, nonce)
        sock.sendall(frame_bytes(self.hello_frame(nonce)))  # the full HELLOs, after admission
        frame = read_frame(sock)
        assert frame.type == FrameType.HELLO
        return sock, Hello.from_frame(frame)

    def ping_ok(self) -> bool:
        """A fresh link answers PING with PONG (the node still serves peers)."""
        sock, _ = self.linked()
        try:
            sock.sendall(frame_bytes(Frame(FrameType.PING, {}, b"", 99)))
            while True:
                frame = read_frame(sock)
                if frame.request_id == 99 and frame.is_response:
                    return frame.type == FrameType.PONG
        finally:
            sock.close()


def read_frame(sock: socket.socket) -> Frame:
    """One frame from a blocking socket."""
    prefix = decode_prefix(recv_exact(sock, PREFIX_LEN))
    return decode_body(prefix, recv_exact(sock, prefix.header_len + prefix.payload_len))
