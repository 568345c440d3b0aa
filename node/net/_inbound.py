"""Inbound connections on the peer port: read the preamble, then route the connection.

`T` → TLS server handshake and the manager's `Establish` (a direct peer, or the far end of a relay
circuit we accepted); on a relay, `C` (connect me to X) and `A` (I accept circuit N) → the
`RelayService`; anything else is refused. Handshakes are capped (`MAX_PENDING_HANDSHAKES`, and
`MAX_HANDSHAKES_PER_HOST` of them from one remote host) and time-limited; a failure costs that one
connection and is logged at INFO once per host and reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl

from node import const
from node.errors import AdmissionEnded, NodeError, NotAMember, SelfConnection
from node.logs import kv

from ._addr import is_loopback, parse_addr
from ._connect import Establish, async_accept_tls, peer_address
from ._link import PeerLink, Transport
from ._messages import NotSwarmPeer
from ._preamble import KIND_ACCEPT, KIND_CONNECT, KIND_TLS, read_preamble, send_reply
from ._relay import RelayService
from ._stream import Stream
from ._tasks import Tasks
from ._tls import TlsConfig

log = logging.getLogger(__name__)

_MAX_LOGGED_HOSTS = 1024


class InboundRouter:
    """Serves every inbound connection: the listener's, and our end of relay circuits."""

    def __init__(self, tls: TlsConfig, relay: RelayService | None, tasks: Tasks, establish: Establish):
        self._tls = tls
        self._relay = relay
        self._tasks = tasks
        self._establish = establish
        self._handshakes = asyncio.Semaphore(const.MAX_PENDING_HANDSHAKES)
        self._per_host: collections.Counter[str] = collections.Counter()  # direct handshakes under way
        self._logged_hosts: set[str] = set()

    def on_connect(self, stream: Stream) -> None:
        """The listener accepted a TCP connection."""
        if self._tasks.stopping:
            stream.abort()
            return
        self._tasks.spawn(self.async_serve(stream), name="peer-inbound")

    async def async_serve(self, stream: Stream, *, transport: Transport = "direct",
                          via_relay: str | None = None) -> PeerLink | None:
        """Serve one inbound connection: a TLS peer, or (on a relay) a circuit request."""
        addr = peer_address(stream)
        host = parse_addr(addr)[0] if addr != "?" else addr
        # one host may hold a few of the handshake slots, never all: connections that open and
        # say nothing until the timeout must not lock every other peer out (loopback is this
        # machine; a relay's circuits all come from the relay)
        limited = transport == "direct" and not is_loopback(host)
        if self._handshakes.locked() or (limited and self._per_host[host] >= const.MAX_HANDSHAKES_PER_HOST):
            reason = "too_many_handshakes" if self._handshakes.locked() else "too_many_handshakes_from_host"
            level = logging.WARNING if self._first_time(f"refused:{host}:{reason}") else logging.DEBUG
            log.log(level, "DIAG: inbound connection refused %s", kv(remote_addr=addr, reason=reason))
            stream.abort()
            return None
        relay = self._relay if transport == "direct" else None  # no circuits inside circuits
        try:
            async with self._handshakes:
                with self._host_slot(host if limited else None):
                    async with asyncio.timeout(const.HANDSHAKE_TIMEOUT_S):
                        kind, body = await read_preamble(stream)
                        if kind == KIND_TLS:
                            node_id = await async_accept_tls(stream, self._tls, body)
                        elif kind == KIND_ACCEPT and relay is not None:
                            if not relay.handle_accept(stream, body):
                                log.info("DIAG: relay accept for an unknown circuit %s", kv(remote_addr=addr))
                            return None  # the stream now belongs to the circuit
                        elif kind != KIND_CONNECT or relay is None:
                            send_reply(stream, False, "unsupported")
                            stream.close()
                            return None
                    if kind == KIND_TLS:
                        return await self._establish(
                            stream, node_id, is_dialer=False, transport=transport,
                            address=via_relay or addr, via_relay=via_relay)
            assert relay is not None
            await relay.async_handle_connect(stream, body)
        except NotSwarmPeer as exc:
            self._note_foreign(addr, exc)
            stream.abort()
        except (NotAMember, AdmissionEnded):
            stream.close()  # logged once per peer by the membership (or a join handed over)
        except SelfConnection:
            stream.abort()
        except (NodeError, TimeoutError, asyncio.IncompleteReadError, OSError, ssl.SSLError) as exc:
            self._note_failure(addr, exc)
            stream.abort()
        except Exception:  # a bug must cost one connection, never leave it hanging
            log.exception("inbound connection from %s failed unexpectedly", addr)
            stream.abort()
        return None

    @contextlib.contextmanager
    def _host_slot(self, host: str | None):
        """One of `host`'s handshake slots while the block runs (None: not counted)."""
        if host is None:
            yield
            return
        self._per_host[host] += 1
        try:
            yield
        finally:
            self._per_host[host] -= 1
            if self._per_host[host] <= 0:
                del self._per_host[host]

    # --- logging once per host ----------------------------------------------------------------

    def _first_time(self, key: str) -> bool:
        """True the first time `key` is seen; once `_MAX_LOGGED_HOSTS` are remembered, never (a flood
        from ever new addresses must not turn every refusal into an INFO or WARNING line)."""
        if key in self._logged_hosts or len(self._logged_hosts) >= _MAX_LOGGED_HOSTS:
            return False
        self._logged_hosts.add(key)
        return True

    def _note_foreign(self, addr: str, exc: NotSwarmPeer) -> None:
        """Something that is not a SwarmLLM node connected to us: INFO once per host."""
        host = parse_addr(addr)[0] if addr != "?" else addr
        level = logging.INFO if self._first_time("foreign:" + host) else logging.DEBUG
        log.log(level, "Ignoring a peer that does not speak SwarmLLM %s",
                kv(addr=addr, protocol_version=exc.protocol_version, agent=exc.agent, direction="inbound",
                   reason=exc.message))

    def _note_failure(self, addr: str, exc: BaseException) -> None:
        """An inbound connection failed during set-up: INFO once per host and reason, then DEBUG."""
        reason = exc.message if isinstance(exc, NodeError) else f"{type(exc).__name__}: {exc}"
        host = parse_addr(addr)[0] if addr != "?" else addr
        level = logging.INFO if self._first_time(f"fail:{host}:{type(exc).__name__}") else logging.DEBUG
        log.log(level, "DIAG: inbound connection closed during set-up %s", kv(remote_addr=addr, error=reason))
