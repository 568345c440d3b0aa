"""Relay and rendezvous service (a node started with `--relay`), on its ordinary peer port.

Registration and rendezvous ride on normal authenticated peer links (RELAY frames):
    {"op": "register"}  → {"op": "ok", ...limits}   the relay may now announce circuits to you
    {"op": "list"}      → {"op": "list", "nodes": [{"node_id", "agent"}]}   who is registered
    {"op": "incoming", "circuit": token, "from": node_id}   relay → registered node, no reply
    {"op": "ticket", "target": node_id} → {"op": "ticket", "ticket": t}   one circuit, soon
A circuit: the dialler asks for a ticket over its own link (links are admitted members only, so
only members of the relay's swarm get one), then opens a raw TCP connection with a "C" preamble
naming the target and carrying the ticket; the relay sends "incoming" with a fresh unguessable token over the target's link; the target opens
its own raw connection with an "A" preamble carrying the token; the relay answers both and then
copies bytes between them. The two ends run TLS end to end over that splice, so the relay only
ever sees ciphertext. Circuits are capped in number, in all and per member (a member's open,
pending and ticketed circuits count: one member cannot take them all; no ticket to oneself),
rate-limited in bytes (a token bucket per circuit: past it the relay reads more slowly, it never
cuts a busy circuit), and dropped when idle.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from node import const
from node.errors import PeerUnreachable, ProtocolError
from node.logs import kv

from ._frames import Frame, FrameType
from ._identity import is_node_id, short_id
from ._link import PeerLink
from ._preamble import send_reply
from ._stream import Stream

log = logging.getLogger(__name__)

Tap = Callable[[str, str, bytes], None]  # (circuit id, direction "a>b"/"b>a", bytes forwarded)


@dataclass
class Circuit:
    """One spliced pair of streams."""

    circuit_id: str
    source: str  # dialler's claimed node id (unauthenticated: informative only)
    target: str
    started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    bytes_forwarded: int = 0
    close_cause: str | None = None
    tokens: float = field(default_factory=lambda: float(const.RELAY_CIRCUIT_BURST_BYTES))
    refilled: float = field(default_factory=time.monotonic)
    throttled_s: float = 0.0  # time the pumps waited for the bucket to refill

    def wait_for(self, nbytes: int) -> float:
        """Take nbytes from the circuit's bucket; the seconds to wait before forwarding them."""
        now = time.monotonic()
        burst, rate = float(const.RELAY_CIRCUIT_BURST_BYTES), float(const.RELAY_CIRCUIT_BYTES_PER_S)
        self.tokens = min(burst, self.tokens + (now - self.refilled) * rate)
        self.refilled = now
        self.tokens -= nbytes
        return -self.tokens / rate if self.tokens < 0 else 0.0


class RelayService:
    """Registrations, pending and active circuits of one relay node."""

    def __init__(self) -> None:
        self.registrations: dict[str, PeerLink] = {}
        self._pending: dict[str, tuple[str, str, asyncio.Future[Stream]]] = {}  # token → (source, target, …)
        self.circuits: dict[str, Circuit] = {}
        self.tap: Tap | None = None  # test hook: sees every byte the relay forwards
        self.circuits_total = 0
        self.bytes_total = 0
        self._tickets: dict[str, tuple[str, str, float]] = {}  # ticket → (member, target, expires)
        self.refused_connects = 0

    # --- control frames over peer links ---------------------------------------------------------

    def handle_frame(self, link: PeerLink, frame: Frame) -> None:
        """RELAY frames sent to this relay by registered (or registering) nodes."""
        op = frame.header.get("op")
        if op == "register":
            if link.node_id not in self.registrations and (
                len(self.registrations) >= const.RELAY_MAX_REGISTRATIONS
            ):
                link.send_error(frame, "relay_full", "relay has no room for more registrations")
                return
            self.registrations[link.node_id] = link
            log.info("DIAG: relay registration accepted %s",
                     kv(peer_id=link.short_id, registered=len(self.registrations)))
            link.send_nowait(frame.reply(FrameType.RELAY, {
                "op": "ok", "circuit_bytes_per_s": const.RELAY_CIRCUIT_BYTES_PER_S,
                "circuit_burst_bytes": const.RELAY_CIRCUIT_BURST_BYTES,
                "circuit_idle_s": const.RELAY_CIRCUIT_IDLE_S,
            }))
        elif op == "list":
            nodes = [{"node_id": node_id, "agent": reg.hello.agent}
                     for node_id, reg in self.registrations.items() if reg.is_open]
            link.send_nowait(frame.reply(FrameType.RELAY, {"op": "list", "nodes": nodes}))
        elif op == "ticket":
            target = frame.header.get("target")
            reg = self.registrations.get(target) if is_node_id(target) else None
            if reg is None or not reg.is_open:
                link.send_error(frame, "not_registered", "that node is not registered at this relay")
                return
            if target == link.node_id:
                link.send_error(frame, "self_circuit", "a circuit to oneself is refused")
                return
            now = time.monotonic()
            for t, (_, _, expires) in list(self._tickets.items()):
                if expires < now:
                    del self._tickets[t]
            held = self._held_by(link.node_id)
            if held >= const.RELAY_MAX_CIRCUITS_PER_MEMBER:
                link.send_error(frame, "too_many_circuits", "this member holds its share of the relay's circuits")
                log.info("DIAG: relay ticket refused %s", kv(
                    peer_id=link.short_id, reason="too_many_circuits", held=held))
                return
            ticket = secrets.token_hex(16)
            self._tickets[ticket] = (link.node_id, target, now + const.RELAY_CIRCUIT_SETUP_TIMEOUT_S)
            link.send_nowait(frame.reply(FrameType.RELAY, {"op": "ticket", "ticket": ticket}))
        elif op == "unregister":
            if self.registrations.get(link.node_id) is link:
                del self.registrations[link.node_id]
            link.send_nowait(frame.reply(FrameType.RELAY, {"op": "ok"}))
        else:
            link.send_error(frame, "unsupported", f"relay op {op!r} is not supported")

    def link_closed(self, link: PeerLink) -> None:
        """Drop the registration carried by a link that closed."""
        if self.registrations.get(link.node_id) is link:
            del self.registrations[link.node_id]
            log.info("DIAG: relay registration dropped %s",
                     kv(peer_id=link.short_id, cause=link.close_cause, registered=len(self.registrations)))

    # --- circuits -----------------------------------------------------------------------------

    async def async_handle_connect(self, stream: Stream, body: dict) -> None:
        """A "C" preamble: connect this stream to a registered node, then splice."""
        target = body.get("target")
        if not is_node_id(target):
            raise ProtocolError("relay connect names no valid target")
        granted = self._tickets.pop(body.get("ticket"), None) if isinstance(body.get("ticket"), str) else None
        if granted is None or granted[1] != target or granted[2] < time.monotonic():
            self.refused_connects += 1
            log.info("DIAG: relay circuit refused %s", kv(target=short_id(target), reason="no ticket from a member"))
            send_reply(stream, False, "not_a_member")
            stream.close()
            return
        source = granted[0]  # the member the ticket was issued to, over its admitted link
        link = self.registrations.get(target)
        if link is None or not link.is_open:
            send_reply(stream, False, "not_registered")
            stream.close()
            return
        held = self._held_by(source)  # its other tickets, pending and open circuits (this one's ticket is used)
        if len(self.circuits) + len(self._pending) >= const.RELAY_MAX_CIRCUITS or (
                held >= const.RELAY_MAX_CIRCUITS_PER_MEMBER):
            send_reply(stream, False, "too_many_circuits")
            stream.close()
            log.warning("DIAG: relay circuit refused %s", kv(
                source=short_id(source), target=short_id(target), reason="too_many_circuits", held=held))
            return
        token = secrets.token_hex(16)
        future: asyncio.Future[Stream] = asyncio.get_running_loop().create_future()
        self._pending[token] = (source, target, future)
        try:
            link.send_nowait(Frame(FrameType.RELAY, {"op": "incoming", "circuit": token, "from": source}))
            async with asyncio.timeout(const.RELAY_CIRCUIT_SETUP_TIMEOUT_S):
                other = await future
        except (TimeoutError, PeerUnreachable):
            send_reply(stream, False, "target_did_not_answer")
            stream.close()
            return
        finally:
            self._pending.pop(token, None)
        circuit = Circuit(token[:8], source, target)
        self.circuits[circuit.circuit_id] = circuit
        self.circuits_total += 1
        log.info("DIAG: relay circuit opened %s",
                 kv(circuit=circuit.circuit_id, source=short_id(source), target=short_id(target),
                    active=len(self.circuits)))
        try:
            send_reply(other)
            send_reply(stream)
            await self._async_splice(circuit, stream, other)
        except (ConnectionError, OSError) as exc:
            circuit.close_cause = circuit.close_cause or type(exc).__name__
        finally:
            self.circuits.pop(circuit.circuit_id, None)
            stream.abort()
            other.abort()
            log.info("DIAG: relay circuit closed %s",
                     kv(circuit=circuit.circuit_id, cause=circuit.close_cause,
                        bytes=circuit.bytes_forwarded, throttled_s=round(circuit.throttled_s, 1) or None,
                        active=len(self.circuits)))

    def handle_accept(self, stream: Stream, body: dict) -> bool:
        """An "A" preamble: the target's half of a pending circuit. False if unknown."""
        token = body.get("circuit")
        entry = self._pending.get(token) if isinstance(token, str) else None
        if entry is None or entry[2].done():
            send_reply(stream, False, "unknown_circuit")
            stream.close()
            return False
        entry[2].set_result(stream)
        return True

    def _held_by(self, member: str) -> int:
        """Circuits `member` holds here: unexpired tickets, circuits being set up, open circuits."""
        now = time.monotonic()
        return (sum(1 for m, _, expires in self._tickets.values() if m == member and expires >= now)
                + sum(1 for source, _, _ in self._pending.values() if source == member)
                + sum(1 for c in self.circuits.values() if c.source == member))

    async def _async_splice(self, circuit: Circuit, a: Stream, b: Stream) -> None:
        pumps = [
            asyncio.create_task(self._async_pump(circuit, a, b, "a>b")),
            asyncio.create_task(self._async_pump(circuit, b, a, "b>a")),
            asyncio.create_task(self._async_idle_watch(circuit)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _async_pump(self, circuit: Circuit, src: Stream, dst: Stream, direction: str) -> None:
        try:
            while True:
                data = await src.read_some()
                if not data:
                    circuit.close_cause = circuit.close_cause or "eof"
                    return
                circuit.last_activity = time.monotonic()
                circuit.bytes_forwarded += len(data)
                self.bytes_total += len(data)
                wait_s = circuit.wait_for(len(data))
                if wait_s > 0:  # past its rate: read no more until the bucket refills (TCP pushes back)
                    if circuit.throttled_s == 0.0:
                        log.info("DIAG: relay circuit throttled %s", kv(
                            circuit=circuit.circuit_id, bytes=circuit.bytes_forwarded,
                            bytes_per_s=const.RELAY_CIRCUIT_BYTES_PER_S))
                    circuit.throttled_s += wait_s
                    await asyncio.sleep(wait_s)
                    circuit.last_activity = time.monotonic()
                if self.tap is not None:
                    self.tap(circuit.circuit_id, direction, data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError) as exc:
            circuit.close_cause = circuit.close_cause or f"{type(exc).__name__}"

    async def _async_idle_watch(self, circuit: Circuit) -> None:
        while True:
            idle = time.monotonic() - circuit.last_activity
            if idle >= const.RELAY_CIRCUIT_IDLE_S:
                circuit.close_cause = "idle"
                return
            await asyncio.sleep(const.RELAY_CIRCUIT_IDLE_S - idle + 0.01)

    def stats(self) -> dict[str, int]:
        """Counters for diagnostics."""
        return {"registered": len(self.registrations), "circuits_active": len(self.circuits),
                "circuits_total": self.circuits_total, "bytes_forwarded": self.bytes_total}
