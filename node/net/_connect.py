"""Connection set-up below the link: preamble, TLS in the right role, identity check.

Three ways a TLS stream comes to be:
- `async_dial_direct`: TCP to the peer, "T" preamble, TLS client, certificate key must hash to
  the expected node id (or, for a bootstrap address, is recorded as whatever it proves);
- `async_dial_relayed`: TCP to a relay, "C" (connect me to X) preamble, then the same as direct
  over the spliced stream: the relay only ever forwards TLS records;
- `async_accept_tls`: the server side of a "T" preamble (direct inbound, or the far end of a
  relay circuit), which trusts exactly the certificate the dialler announced.
The step after these, HELLOs that turn the stream into a registered link, is the manager's
(`Establish`, which the dialer and the inbound router are given).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from typing import TYPE_CHECKING, Protocol

from node import const
from node.errors import PeerError, PeerIdentityMismatch, PeerUnreachable, ProtocolError

from ._addr import format_addr, parse_addr
from ._messages import NotSwarmPeer
from ._preamble import (
    KIND_ACCEPT,
    KIND_CONNECT,
    PREAMBLE_VERSION,
    announced_cert,
    encode_preamble,
    read_reply,
    send_reply,
    tls_preamble,
)
from ._stream import Stream, open_stream
from ._tls import TlsConfig, verify_peer

if TYPE_CHECKING:
    from ._link import PeerLink, Transport

log = logging.getLogger(__name__)


class Establish(Protocol):
    """Exchange HELLOs on an authenticated stream and register the link (PeerManager's)."""

    async def __call__(self, stream: Stream, node_id: str, *, is_dialer: bool, transport: Transport,
                       address: str, via_relay: str | None = None, source: str | None = None,
                       join_token: bytes | None = None) -> PeerLink:
        """The registered link; raises PeerError (SelfConnection, ProtocolError, ...) otherwise."""
        ...


def peer_address(stream: Stream) -> str:
    """"host:port" of the other end of a stream."""
    peer = stream.extra("peername")
    if not peer:
        return "?"
    host = str(peer[0])
    try:  # a dual-stack listener (peer_host "::") sees IPv4 peers as ::ffff:a.b.c.d: the IPv4 they are
        mapped = ipaddress.IPv6Address(host.split("%", 1)[0]).ipv4_mapped
    except ValueError:
        mapped = None
    return format_addr(str(mapped) if mapped is not None else host, int(peer[1]))


async def _async_client_tls(stream: Stream, tls: TlsConfig, expected_node_id: str | None) -> str:
    """Send the T preamble, run the TLS client handshake, check the proven identity."""
    stream.write(tls_preamble(tls.cert_der))
    await read_reply(stream)
    try:
        await stream.start_tls(tls.client_context(), server_side=False)
    except ssl.SSLError as exc:
        raise PeerError(f"TLS handshake failed: {exc.reason or exc}", code="tls_failed") from exc
    return verify_peer(stream.extra("ssl_object"), expected_node_id)


def _classify(exc: BaseException, addr: str) -> BaseException:
    """Turn low-level dial failures into the error tree (NotSwarmPeer and identity pass through)."""
    if isinstance(exc, NotSwarmPeer | PeerIdentityMismatch | PeerError):
        return exc
    if isinstance(exc, TimeoutError):
        silent = PeerUnreachable(f"{addr}: timed out")
        silent.timed_out = True
        return silent
    if isinstance(exc, asyncio.IncompleteReadError):
        return PeerUnreachable(f"{addr}: connection closed during set-up")
    if isinstance(exc, OSError):
        return PeerUnreachable(f"{addr}: {exc.strerror or exc}")
    return PeerUnreachable(f"{addr}: {type(exc).__name__}: {exc}")


async def async_dial_direct(tls: TlsConfig, addr: str, expected_node_id: str | None) -> tuple[Stream, str]:
    """A TLS stream straight to addr; returns it with the node id the peer proved."""
    host, port = parse_addr(addr)
    stream: Stream | None = None
    try:
        stream = await open_stream(host, port, timeout_s=const.CONNECT_TIMEOUT_S)
        async with asyncio.timeout(const.HANDSHAKE_TIMEOUT_S):
            node_id = await _async_client_tls(stream, tls, expected_node_id)
    except (Exception, asyncio.CancelledError) as exc:
        if stream is not None:
            stream.abort()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise _classify(exc, addr) from exc
    return stream, node_id


async def async_dial_first(tls: TlsConfig, addrs: list[str], expected_node_id: str | None,
                           ) -> tuple[tuple[str, Stream, str] | None, list[tuple[str, PeerError]]]:
    """Dial a peer's addresses racing, as Happy Eyeballs does (RFC 8305): the next one starts
    `DIAL_ATTEMPT_DELAY_S` after the last or as soon as it fails, the first TLS stream up wins and
    the rest are cancelled. A multi-homed peer announces addresses nobody else can reach (a docker
    bridge, a VPN): tried one after the other, each cost a whole connect timeout before the LAN
    address. Returns ((addr, stream, proven node id) or None, [(addr, error) of the failed ones]).
    """
    failures: list[tuple[str, PeerError]] = []
    queue = list(addrs)
    pending: dict[asyncio.Task[tuple[Stream, str]], str] = {}
    try:
        while queue or pending:
            if queue:
                addr = queue.pop(0)
                pending[asyncio.create_task(async_dial_direct(tls, addr, expected_node_id))] = addr
            done, _ = await asyncio.wait(pending, timeout=const.DIAL_ATTEMPT_DELAY_S if queue else None,
                                         return_when=asyncio.FIRST_COMPLETED)
            winner = None
            for task in done:
                addr = pending.pop(task)
                exc = task.exception()
                if exc is None and winner is None:
                    winner = (addr, *task.result())
                elif exc is None:
                    task.result()[0].abort()
                else:
                    failures.append((addr, exc if isinstance(exc, PeerError) else _classify(exc, addr)))
            if winner is not None:
                return winner, failures
        return None, failures
    finally:
        for task in pending:
            task.cancel()
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, tuple):  # finished while being cancelled
                result[0].abort()


async def async_dial_relayed(tls: TlsConfig, relay_addr: str, target_node_id: str,
                             own_node_id: str, ticket: str) -> Stream:
    """A TLS stream to target through the relay at relay_addr (end-to-end: the relay sees
    ciphertext only). The target's certificate must prove target_node_id. `ticket`: what the relay
    issued us for this circuit over our link to it (members only)."""
    host, port = parse_addr(relay_addr)
    stream: Stream | None = None
    try:
        stream = await open_stream(host, port, timeout_s=const.CONNECT_TIMEOUT_S)
        async with asyncio.timeout(const.HANDSHAKE_TIMEOUT_S + const.RELAY_CIRCUIT_SETUP_TIMEOUT_S):
            stream.write(encode_preamble(KIND_CONNECT, {"v": PREAMBLE_VERSION, "target": target_node_id,
                                                        "from": own_node_id, "ticket": ticket}))
            try:
                await read_reply(stream)  # the relay has the circuit; what follows is the target
            except ProtocolError:
                raise
            except PeerError as exc:  # the relay's no (full, target gone): say it was the relay
                raise PeerError(f"relay {relay_addr} refused the circuit: {exc.code}",
                                code=exc.code) from exc
            await _async_client_tls(stream, tls, target_node_id)
    except (Exception, asyncio.CancelledError) as exc:
        if stream is not None:
            stream.abort()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise _classify(exc, f"{relay_addr} (relay)") from exc
    return stream


async def async_open_circuit_end(relay_addr: str, circuit: str) -> Stream:
    """The target's half of a relay circuit: a raw stream on which the dialler's T preamble
    arrives next (the caller then runs `async_accept_tls` on it)."""
    host, port = parse_addr(relay_addr)
    stream: Stream | None = None
    try:
        stream = await open_stream(host, port, timeout_s=const.CONNECT_TIMEOUT_S)
        async with asyncio.timeout(const.HANDSHAKE_TIMEOUT_S):
            stream.write(encode_preamble(KIND_ACCEPT, {"v": PREAMBLE_VERSION, "circuit": circuit}))
            await read_reply(stream)
    except (Exception, asyncio.CancelledError) as exc:
        if stream is not None:
            stream.abort()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise _classify(exc, f"{relay_addr} (relay)") from exc
    return stream


async def async_accept_tls(stream: Stream, tls: TlsConfig, body: dict) -> str:
    """Server side of a T preamble already read: reply, TLS server handshake, proven node id."""
    cert = announced_cert(body)
    ctx = tls.server_context_for(cert)
    send_reply(stream)
    try:
        await stream.start_tls(ctx, server_side=True)
    except ssl.SSLError as exc:
        raise ProtocolError(f"TLS handshake failed: {exc.reason or exc}") from exc
    return verify_peer(stream.extra("ssl_object"), None, announced_cert=cert)
