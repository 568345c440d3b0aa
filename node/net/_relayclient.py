"""The relay client: register at relay peers, learn who else is there, accept circuits.

When a direct link to a relay (HELLO feature RELAY) comes up we register (`register`), then ask
it every `RELAY_LIST_INTERVAL_S` who else is registered (`list`): each such node is reachable
through that relay and is dialled through it if it has no link. The relay announces a circuit
someone opened to us with `incoming`; we open our end (an `A` preamble) and serve it like any
inbound connection, TLS end to end. The relay service itself is `_relay.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from node import const
from node.errors import NodeError, PeerError, PeerUnreachable, ProtocolError
from node.logs import kv

from ._connect import async_open_circuit_end
from ._dialer import dial_address
from ._foreign import ForeignPeers
from ._frames import Frame, FrameType
from ._link import PeerLink, Transport
from ._messages import FEATURE_RELAY
from ._stream import Stream
from ._table import PeerRecord, PeerTable
from ._tasks import Tasks

log = logging.getLogger(__name__)


class ServeInbound(Protocol):
    """Serve an inbound connection like the listener's (InboundRouter.async_serve)."""

    async def __call__(self, stream: Stream, *, transport: Transport = "direct",
                       via_relay: str | None = None) -> PeerLink | None:
        """The link it became, or None."""
        ...


class RelayClient:
    """Registrations at relays (relay node id -> the relay's address as we reach it)."""

    def __init__(self, node_id: str, table: PeerTable, tasks: Tasks, foreign: ForeignPeers,
                 dial_soon: Callable[[PeerRecord], None], serve_inbound: ServeInbound):
        self._node_id = node_id
        self._table = table
        self._tasks = tasks
        self._foreign = foreign
        self._dial_soon = dial_soon
        self._serve_inbound = serve_inbound
        self._registered: dict[str, str] = {}

    def registered_relays(self) -> list[str]:
        """Relay addresses this node holds a registration at."""
        return list(self._registered.values())

    def on_link_up(self, link: PeerLink) -> None:
        """A direct link to a relay came up: register there."""
        if link.hello.features & FEATURE_RELAY and link.transport == "direct":
            self._tasks.spawn(self._async_use_relay(link), name=f"relay-client-{link.short_id}")

    def on_link_down(self, link: PeerLink) -> None:
        """The link to a peer closed: a registration there is lost."""
        if self._registered.pop(link.node_id, None) is not None:
            log.info("DIAG: relay registration lost %s", kv(peer_id=link.short_id, cause=link.close_cause))

    async def _async_register(self, link: PeerLink, relay_addr: str) -> bool:
        """Register at a relay peer; one that refuses (full) is asked again every
        RELAY_REGISTER_RETRY_S while its link lasts. False once the link is gone."""
        attempts = 0
        while link.is_open and not link.retired and not self._tasks.stopping:
            try:
                await link.async_request(Frame(FrameType.RELAY, {"op": "register"}),
                                         timeout_s=const.HANDSHAKE_TIMEOUT_S)
                return True
            except NodeError as exc:
                if not link.is_open:
                    return False  # the link went: on_link_up registers again on the next one
                attempts += 1
                log.log(logging.WARNING if attempts == 1 else logging.DEBUG,
                        "DIAG: relay registration failed %s",
                        kv(peer=link.short_id, addr=relay_addr, error=exc.message, attempts=attempts,
                           retry_in_s=const.RELAY_REGISTER_RETRY_S))
            await asyncio.sleep(const.RELAY_REGISTER_RETRY_S)
        return False

    async def _async_use_relay(self, link: PeerLink) -> None:
        """Register at a relay peer, then ask it who else is registered, periodically."""
        relay_addr = dial_address(link)
        if not await self._async_register(link, relay_addr):
            return
        self._registered[link.node_id] = relay_addr
        log.debug("DIAG: relay reservation %s", kv(peer=link.short_id, addr=relay_addr))
        capped = False
        fresh = True  # the first list after (re)registering: its nodes are a route that just came back
        while link.is_open and not link.retired and not self._tasks.stopping:
            try:
                reply = await link.async_request(Frame(FrameType.RELAY, {"op": "list"}),
                                                 timeout_s=const.HANDSHAKE_TIMEOUT_S)
            except NodeError:
                return
            nodes = reply.header.get("nodes")
            # peers known only from relays' lists and never linked: at most RELAY_MAX_UNLINKED (a
            # list of 5,000 made-up ids from one member claiming to be a relay stalled the loop 294 s)
            unlinked = self._table.never_linked("relay")
            skipped = 0
            for node in nodes if isinstance(nodes, list) else []:
                node_id = node.get("node_id") if isinstance(node, dict) else None
                if node_id in (None, self._node_id, link.node_id) or node_id in self._foreign.ids:
                    continue
                if not isinstance(node_id, str) or len(node_id) != 64:
                    continue
                if self._table.get(node_id) is None:
                    if unlinked >= const.RELAY_MAX_UNLINKED:
                        skipped += 1
                        continue
                    unlinked += 1
                rec = self._table.record(node_id, "relay")
                # a relay that came back (restarted, or our link to it dropped) is a route again:
                # dial its nodes now, not when a backoff grown while it was away (up to
                # RECONNECT_BACKOFF_MAX_S) runs out
                if rec.add_relay(relay_addr) or fresh:
                    self._dial_soon(rec)
            if skipped:
                log.log(logging.WARNING if not capped else logging.DEBUG,
                        "DIAG: peers from a relay's list not learnt, too many unlinked ones %s",
                        kv(peer_id=link.short_id, skipped=skipped, max_unlinked=const.RELAY_MAX_UNLINKED))
            capped = bool(skipped)
            fresh = False
            await asyncio.sleep(const.RELAY_LIST_INTERVAL_S)

    async def async_ticket(self, relay_addr: str, target: str) -> str:
        """A one-time ticket for a circuit to `target` through the relay at relay_addr, asked for
        over our (admitted) link to that relay."""
        for relay_id, addr in list(self._registered.items()):
            link = self._table.link(relay_id)
            if addr != relay_addr or link is None:
                continue
            reply = await link.async_request(Frame(FrameType.RELAY, {"op": "ticket", "target": target}),
                                             timeout_s=const.HANDSHAKE_TIMEOUT_S)
            ticket = reply.header.get("ticket")
            if not isinstance(ticket, str) or len(ticket) > 64:
                raise ProtocolError("the relay sent a malformed ticket")
            return ticket
        raise PeerUnreachable(f"not registered at the relay {relay_addr}")

    def handle_incoming(self, link: PeerLink, frame: Frame) -> None:
        """A relay we registered at announces a circuit: open our end and serve TLS on it."""
        circuit = frame.header.get("circuit")
        relay_addr = self._registered.get(link.node_id)
        if relay_addr is None or not isinstance(circuit, str) or len(circuit) > 64:
            log.debug("DIAG: relay circuit ignored %s", kv(peer=link.short_id, reason="not registered there"))
            return
        self._tasks.spawn(self._async_accept_circuit(relay_addr, circuit), name="relay-circuit")

    async def _async_accept_circuit(self, relay_addr: str, circuit: str) -> None:
        try:
            stream = await async_open_circuit_end(relay_addr, circuit)
        except PeerError as exc:
            log.info("DIAG: relay circuit failed %s", kv(relay=relay_addr, error=exc.message))
            return
        await self._serve_inbound(stream, transport="relayed", via_relay=relay_addr)
