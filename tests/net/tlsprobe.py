"""A peer whose TLS layer the test can see: OpenSSL over memory BIOs on a plain asyncio socket,
so a test learns how the node ended a link at the TLS level (a close_notify alert, or a bare TCP
FIN that OpenSSL reports as a ragged EOF) and can end one either way itself."""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import struct
from pathlib import Path

from node.net import Frame, FrameType, Identity, Swarm
from node.net._frames import PREFIX_LEN, decode_body, decode_prefix, frame_bytes
from node.net._messages import Hello
from node.net._preamble import HEAD_LEN, tls_preamble
from node.net._tls import TlsConfig, verify_peer
from tests.support.swarm import TEST_SWARM


class TlsProbe:
    """One TLS link to a node's peer port; `await TlsProbe.async_link(...)` runs preamble, TLS 1.3 and HELLO."""

    def __init__(self, workdir: Path):
        self.identity = Identity.generate()
        self.tls = TlsConfig(self.identity, workdir)
        self.tls.prepare()
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj: ssl.SSLObject | None = None
        self._plain = bytearray()
        self._tcp_eof = False
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @property
    def node_id(self) -> str:
        """The identity this probe proves."""
        return self.identity.node_id

    @classmethod
    async def async_link(cls, workdir: Path, port: int, host: str = "127.0.0.1",
                         swarm: Swarm = TEST_SWARM) -> tuple[TlsProbe, Hello]:
        """Connect, authenticate, exchange HELLOs and be admitted; the probe and the node's HELLO."""
        probe = cls(workdir)
        probe.reader, probe.writer = await asyncio.open_connection(host, port)
        probe.writer.write(tls_preamble(probe.tls.cert_der))
        head = await probe.reader.readexactly(HEAD_LEN)
        body = json.loads(await probe.reader.readexactly(struct.unpack("!I", head[9:13])[0]))
        assert head[8:9] == b"k" and body.get("ok") is True, body
        probe._obj = probe.tls.client_context().wrap_bio(probe._in, probe._out, server_side=False)
        while True:
            try:
                probe._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await probe._flush()
                await probe._receive()
        await probe._flush()
        node_id = verify_peer(probe._obj, None)
        nonce = secrets.token_hex(16)  # a member of the test swarm: HELLO, then the proofs both ways
        await probe.async_send(Hello(node_id=probe.node_id, boot_id="probe", agent="probe/1", listen_port=0,
                                     link_nonce="probe", swarm=swarm.public_id, epoch=swarm.epoch,
                                     member_nonce=nonce).to_frame())
        frame = await probe.async_read_frame()
        assert frame.type == FrameType.HELLO, frame.header
        hello = Hello.from_frame(frame)
        assert hello.node_id == node_id
        await probe.async_send(Frame(FrameType.MEMBER, {
            "op": "proof", "proof": swarm.proof(probe.node_id, node_id, nonce, hello.member_nonce)}))
        answer = await probe.async_read_frame()
        assert answer.type == FrameType.MEMBER and swarm.verify(
            answer.header.get("proof"), node_id, probe.node_id, hello.member_nonce, nonce), answer.header
        await probe.async_send(Hello(node_id=probe.node_id, boot_id="probe", agent="probe/1", listen_port=0,
                                     link_nonce="probe", swarm=swarm.public_id, epoch=swarm.epoch,
                                     member_nonce=nonce).to_frame())  # the full HELLO, after admission
        frame = await probe.async_read_frame()
        assert frame.type == FrameType.HELLO, frame.header
        return probe, Hello.from_frame(frame)

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _receive(self) -> bool:
        """Feed the next TCP bytes to OpenSSL; False at TCP EOF."""
        data = await self.reader.read(65536)
        if not data:
            self._tcp_eof = True
            return False
        self._in.write(data)
        return True

    def _decrypt(self) -> str | None:
        """Move decrypted bytes to the plaintext buffer; how TLS ended, or None while it is open."""
        try:
            while True:
                chunk = self._obj.read(65536)
                if not chunk:
                    return "close_notify"
                self._plain += chunk
        except ssl.SSLWantReadError:
            return None
        except ssl.SSLZeroReturnError:
            return "close_notify"
        except ssl.SSLEOFError:
            return "ragged_eof"

    async def async_send(self, frame: Frame) -> None:
        """One frame, encrypted."""
        await self.async_send_raw(frame_bytes(frame))

    async def async_send_raw(self, data: bytes) -> None:
        """Any bytes, encrypted (part of a frame, garbage)."""
        self._obj.write(data)
        await self._flush()

    async def async_read_frame(self) -> Frame:
        """The next frame from the node."""
        while True:
            if len(self._plain) >= PREFIX_LEN:
                prefix = decode_prefix(bytes(self._plain[:PREFIX_LEN]))
                total = PREFIX_LEN + prefix.header_len + prefix.payload_len
                if len(self._plain) >= total:
                    body = bytes(self._plain[PREFIX_LEN:total])
                    del self._plain[:total]
                    return decode_body(prefix, body)
            have = len(self._plain)
            ended = self._decrypt()
            if len(self._plain) > have:
                continue  # look at what was decrypted before waiting for more
            if ended is not None or not await self._receive():
                raise ConnectionError(f"link ended ({ended or 'tcp eof'}) before a whole frame")

    async def async_how_it_ends(self) -> str:
        """Read (and drop) everything until the node's TCP FIN: "close_notify" when a TLS
        close_notify came first, "ragged_eof" when the FIN came without one."""
        while True:
            ended = self._decrypt()
            if ended is not None:
                return ended
            if not await self._receive():
                self._in.write_eof()  # TCP is over: OpenSSL now tells a ragged EOF from a clean one
                return self._decrypt() or "ragged_eof"

    async def async_close_notify(self) -> None:
        """End the link cleanly: a TLS close_notify, then a FIN."""
        try:
            self._obj.unwrap()
        except ssl.SSLError:  # want-read, or unread data from the node: ours is written all the same
            pass
        assert self._out.pending, "no close_notify to send"
        await self._flush()
        self.writer.write_eof()

    async def async_bare_fin(self) -> None:
        """End the link with a TCP FIN and no close_notify (what a crash or a careless peer does)."""
        self.writer.write_eof()

    async def async_abort(self) -> None:
        """Drop the socket."""
        self.writer.transport.abort()
