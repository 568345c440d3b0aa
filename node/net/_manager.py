"""PeerManager: the listener, link set-up and HELLO, one link per peer, the public API.

This module owns the links; the records are the `PeerTable`'s (`_table.py`), inbound connections
are routed by `_inbound.py`, a link's frames are dispatched by `_control.py`, and finding and
dialling peers is `_discovery.py`'s and its parts'.
Exactly one link per peer pair survives even when both ends dial at once: the rules for
duplicate links (which is kept, what becomes of the others) are `_duplicates.py`'s.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from node import AGENT, const
from node.config import NodeConfig
from node.errors import (
    AdmissionEnded,
    NodeError,
    NotAMember,
    PeerError,
    PeerIdentityMismatch,
    PeerUnreachable,
    ProtocolError,
    SelfConnection,
    SetupTimedOut,
)
from node.logs import kv
from node.observe import Observers

from ._addr import format_addr, is_loopback, listen_where, parse_addr
from ._admission import Membership, async_admit
from ._clock import Clock
from ._control import RESERVED, ControlFrames
from ._discovery import Discovery
from ._duplicates import close_retired, preferred, retire_loser
from ._frames import Frame, FrameType, encode_frame, type_name
from ._handlers import Handler, Handlers, InlineHandler
from ._identity import Identity, short_id
from ._inbound import InboundRouter
from ._lacks import PeerLacks
from ._link import PeerLink, Transport, async_read_frame
from ._mdns import local_ipv4_addresses
from ._membership import new_nonce
from ._messages import FEATURE_PEX, FEATURE_PIPELINE, FEATURE_RELAY, Hello
from ._relay import RelayService
from ._rto import RtoEstimator
from ._stream import Stream
from ._swarmops import SwarmOps
from ._table import PeerObserver, PeerSnapshot, PeerTable
from ._tasks import Tasks
from ._tls import TlsConfig

log = logging.getLogger(__name__)


class PeerManager:
    """Owns this node's peer links. Create, `await async_start()`, `await async_stop()`."""

    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        *,
        models_provider: Callable[[], list[Mapping[str, Any]]] | None = None,
        hardware_provider: Callable[[], Mapping[str, Any]] | None = None,
        files_provider: Callable[[], list[str]] | None = None,
        sampling_provider: Callable[[], frozenset[str] | None] | None = None,
        agent: str = AGENT,
    ):
        self.config = config
        self.identity = identity
        self.node_id = identity.node_id
        self.short_id = identity.short_id
        self.agent = agent
        self.boot_id = secrets.token_hex(8)
        self.tls = TlsConfig(identity, config.data_dir)
        self.listen_port = 0
        self.listen_addrs: list[str] = []
        self.relay: RelayService | None = RelayService() if config.relay else None
        self.links: set[PeerLink] = set()
        if config.swarm not in ("private", "open"):
            raise NodeError(f"swarm must be 'private' or 'open', not {config.swarm!r}", code="bad_config")
        self.membership = Membership(config.data_dir, open_swarm=config.swarm == "open")
        self.table = PeerTable(self.connection_count)
        self.tasks = Tasks()
        self._models_provider = models_provider
        self._hardware_provider = hardware_provider
        self._files_provider = files_provider
        self._sampling_provider = sampling_provider  # the sampling features this node decodes
        self.handlers = Handlers(self.tasks.spawn)
        # frame types a peer's (older) process does not serve, by its live link's boot_id
        self.lacks = PeerLacks(lambda node_id: (link.hello.boot_id if (link := self.table.link(node_id)) else None))
        self.inbound = InboundRouter(self.tls, self.relay, self.tasks, self.async_establish)
        self.clock = Clock()  # what peers see of our time (tests shift `clock.offset_s`)
        self.table.observers.subscribe(lambda kind, snap: self._on_forgotten(snap.node_id) if kind == "removed" else None)
        self.discovery = Discovery(config, self.node_id, self.tls, self.table, self.tasks,
                                   self.async_establish, self.inbound.async_serve, self.membership, self.clock)
        self.swarm_ops = SwarmOps(self.node_id, self.membership, self.table, self.tasks, self.discovery,
                                  self.tls, self.async_establish, self._live_links, self.listen_addresses,
                                  all_links=lambda: list(self.links))
        self.control = ControlFrames(self.handlers, self.table, self.discovery, self.swarm_ops, self.relay,
                                     self.lacks)
        self._server: asyncio.Server | None = None
        self._started = False

    # --- lifecycle ----------------------------------------------------------------------------

    async def async_start(self) -> None:
        """Write the certificate, listen on the peer port, start discovery."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.tls.prepare)
        await self.membership.async_load()
        try:
            self._server = await loop.create_server(
                lambda: Stream(on_connect=self.inbound.on_connect), **listen_where(self.config))
        except OSError as exc:
            # the default peer port is the API port + 10: taken, most often, by another node on the same -p
            in_use = exc.errno == errno.EADDRINUSE
            what = "--peer-port" if self.config.peer_port else \
                f"-p{f' (another node on port {self.config.port}?)' if in_use else ''}, or give a --peer-port"
            port = self.config.effective_peer_port
            why = exc.strerror or exc if exc.errno not in (errno.EACCES, errno.EPERM) else \
                "permission denied: " + ("ports below 1024 need administrator rights" if port < 1024 else
                                         "the system reserves or forbids this port")
            if isinstance(exc, socket.gaierror):  # a peer_host name that does not resolve
                what = "peer_host set to an IP address, or 0.0.0.0"
                why = f"this machine cannot find the address {self.config.peer_host}: {exc.strerror or exc}"
            raise NodeError(f"cannot listen for peers on {self.config.peer_host}:{self.config.effective_peer_port}"
                            f" ({why}); choose another with {what}", code="peer_port_unavailable") from exc
        self.listen_port = self._server.sockets[0].getsockname()[1]
        host = self.config.peer_host
        if host in ("", "0.0.0.0", "::"):
            ips = await loop.run_in_executor(None, local_ipv4_addresses)
            self.listen_addrs = [format_addr(ip, self.listen_port) for ip in ips]
            self.listen_addrs.append(format_addr("127.0.0.1", self.listen_port))
        else:
            self.listen_addrs = [format_addr(host, self.listen_port)]
        self._started = True
        log.info("DIAG: peer listener started %s",
                 kv(node_id=self.short_id, peer_port=self.listen_port, relay=self.config.relay,
                    mdns=self.config.mdns, no_direct=self.config.no_direct))
        self.discovery.on_addresses = self._on_addresses
        await self.discovery.async_start(self.listen_addrs, self.listen_port)

    def _on_addresses(self, ips: list[str]) -> None:
        """The host's addresses changed (listening everywhere): peers learn the new ones from our
        next HELLO and PEX (after a move the old ones were sent for ever: a relayed link could not
        be upgraded by dialling this node's new address)."""
        self.listen_addrs = [format_addr(ip, self.listen_port) for ip in ips]
        self.listen_addrs.append(format_addr("127.0.0.1", self.listen_port))
        self.discovery.pex.set_own(self.listen_addrs)
        log.info("DIAG: peer listen addresses changed %s", kv(addrs=",".join(self.listen_addrs)))
        self.tasks.spawn(self.async_announce(), name="announce-addresses")

    async def async_stop(self) -> None:
        """Stop discovery, close every link and the listener, save the peer cache."""
        if not self._started:
            return
        self.tasks.stopping = True
        await self.discovery.async_stop()
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.close("shutdown")
        await self.tasks.async_cancel_all()
        await self.discovery.async_save_cache()
        self._started = False
        log.info("DIAG: peer network stopped %s", kv(node_id=self.short_id))

    # --- public API ---------------------------------------------------------------------------

    def register_handler(self, frame_type: int, handler: Handler | InlineHandler, *,
                         ordered: bool = False) -> None:
        """Serve frames of one type (WORK, ACK, ...): handler(link, frame) -> reply frame or None.

        A coroutine function runs in its own task (ordered=True: one frame at a time per link, in
        arrival order). A plain function is called inline by the link's reader, in arrival order,
        with no task: it must not block (ACK bookkeeping, CANCEL; hand real work to a task).
        A returned frame is sent back when the frame was a request; a raised NodeError is sent
        back as ERROR with its code."""
        if int(frame_type) in RESERVED:
            raise ValueError(f"{type_name(frame_type)} is handled by the network itself")
        self.handlers.register(frame_type, handler, ordered=ordered)

    def subscribe(self, callback: PeerObserver) -> Callable[[], None]:
        """Observe peers: callback(kind, snapshot), kind in added/changed/removed. Returns an
        unsubscribe function. Called on the loop; must not block."""
        return self.table.observers.subscribe(callback)

    @property
    def observers(self) -> Observers[[str, PeerSnapshot]]:
        """The peer observers (`subscribe` adds one)."""
        return self.table.observers

    def link(self, node_id: str) -> PeerLink | None:
        """The live link to a peer (never a retired duplicate), or None."""
        return self.table.link(node_id)

    def peers(self) -> list[PeerSnapshot]:
        """Snapshot of the peer table, connected first."""
        return self.table.snapshots()

    def peer(self, node_id: str) -> PeerSnapshot | None:
        """Snapshot of one peer."""
        rec = self.table.get(node_id)
        return self.table.snapshot(rec) if rec else None

    def rto(self, node_id: str) -> RtoEstimator | None:
        """The peer's RFC 6298 estimator (shared by pings and pipeline ACKs), None if unknown."""
        rec = self.table.get(node_id)
        return rec.rto if rec else None

    def connection_count(self, node_id: str | None = None) -> int:
        """Open links (including retiring duplicates), to one peer or in total."""
        return sum(1 for link in self.links if link.is_open and (node_id is None or link.node_id == node_id))

    def reachable_at(self) -> list[str]:
        """Where peers can reach this node: direct addresses, then relays it is registered at."""
        out = [f"direct {addr}" for addr in self.listen_addrs]
        out += [f"relayed via {addr}" for addr in self.discovery.registered_relays()]
        return out

    async def async_send(self, node_id: str, frame: Frame) -> None:
        """Send a frame on the live link to node_id (PeerUnreachable if there is none)."""
        await self._require_link(node_id).async_send(frame)

    async def async_request(self, node_id: str, frame: Frame, timeout_s: float | None = None) -> Frame:
        """Send a request to node_id and wait for its reply (see PeerLink.async_request)."""
        return await self._require_link(node_id).async_request(frame, timeout_s)

    async def async_connect(self, address: str, node_id: str | None = None) -> PeerLink:
        """Dial a peer directly now (node_id: the identity it must prove; None accepts any)."""
        return await self.discovery.async_connect(address, node_id, site="api")

    async def async_announce(self) -> None:
        """Send a fresh HELLO on every link (served models or hardware changed)."""
        for link in list(self.links):
            if link.is_open and not link.retired:
                try:
                    await link.async_send(self._hello().to_frame())
                except PeerError:
                    pass

    def _live_links(self) -> list[PeerLink]:
        return [link for link in self.links if link.is_open and not link.retired]

    def listen_addresses(self) -> list[str]:
        """Where this node accepts peers: its direct addresses."""
        return list(self.listen_addrs)

    def _require_link(self, node_id: str) -> PeerLink:
        link = self.link(node_id)
        if link is None:
            raise PeerUnreachable(f"no link to peer {short_id(node_id)}")
        return link

    # --- HELLO --------------------------------------------------------------------------------

    def _hello(self, link_nonce: str | None = None, *, member_nonce: str | None = None, joining: bool = False,
               minimal: bool = False) -> Hello:
        """Our HELLO; `minimal` (before admission): no models, files, hardware, addresses or region."""
        features = FEATURE_PEX
        if self.relay is not None:
            features |= FEATURE_RELAY
        if self.config.contribute:
            features |= FEATURE_PIPELINE
        return Hello(
            node_id=self.node_id, boot_id=self.boot_id, agent=self.agent, listen_port=self.listen_port,
            listen=() if minimal else tuple(self.listen_addrs), features=features,
            models=() if minimal else tuple(self._call_provider(self._models_provider, [])),
            hardware={} if minimal else self._call_provider(self._hardware_provider, {}),
            files=() if minimal else tuple(self._call_provider(self._files_provider, [])),
            region=None if minimal else self.config.region, link_nonce=link_nonce,
            swarm=self.membership.swarm.public_id, epoch=self.membership.swarm.epoch,
            member_nonce=member_nonce or new_nonce(), joining=joining,
            time=None if minimal else self.clock.now(),
            sampling=None if minimal else self._call_provider(self._sampling_provider, None),
        )

    @staticmethod
    def _call_provider(provider: Callable[[], Any] | None, default: Any) -> Any:
        if provider is None:
            return default
        try:
            return provider()
        except Exception:
            log.exception("HELLO provider %r failed; advertising nothing for it", provider)
            return default

    # --- link set-up --------------------------------------------------------------------------

    async def async_establish(self, stream: Stream, node_id: str, *, is_dialer: bool,
                              transport: Transport, address: str, via_relay: str | None = None,
                              source: str | None = None, join_token: bytes | None = None) -> PeerLink:
        """Exchange HELLOs on an authenticated stream, admit the peer into the swarm (or be
        admitted), and register the link. `join_token`: join the peer's swarm with an invite (the
        link closes after the hand-over and AdmissionEnded is raised)."""
        if node_id == self.node_id:
            stream.abort()
            raise SelfConnection("connected to ourselves")
        nonce = secrets.token_hex(8) if is_dialer else None
        member_nonce = new_nonce()
        # Before admission a peer learns only who we are and which swarm we say we are in: what we
        # serve, our hardware and addresses go in the full HELLO that follows admission.
        sent = self._hello(nonce, member_nonce=member_nonce, joining=join_token is not None, minimal=True)
        try:
            stream.writelines(encode_frame(sent.to_frame()))
            hello = await self._async_read_hello(stream, node_id)
            admission = await async_admit(stream, self.membership, me=self.node_id, peer=node_id,
                                          my_nonce=member_nonce, hello=hello, join_token=join_token,
                                          timeout_s=const.HANDSHAKE_TIMEOUT_S)
            if admission.kind == "member":
                if admission.swarm is not self.membership.swarm or node_id in self.membership.state.removed:
                    # the swarm changed (rotation, leave, removal) while this admission ran
                    raise NotAMember("admitted under a swarm state that changed meanwhile", node_id=node_id,
                                     swarm=hello.swarm, by_us=True)
                full = self._hello(nonce, member_nonce=member_nonce)
                stream.writelines(encode_frame(full.to_frame()))
                hello = await self._async_read_hello(stream, node_id)
                # ... or while we waited for its full HELLO (a removal closes only the links it can
                # see: this one is not registered yet). A member caught by someone else's rotation is
                # not refused for good: the next attempt runs admission under the new state.
                if node_id in self.membership.state.removed:
                    raise NotAMember("removed from this swarm", node_id=node_id, swarm=hello.swarm, by_us=True)
                if admission.swarm is not self.membership.swarm:
                    raise PeerUnreachable(f"the swarm changed while {short_id(node_id)} was being admitted")
        except NotAMember as exc:
            stream.close()  # after our ERROR not_a_member, if we sent one
            if join_token is not None:
                raise  # the inviter refused our invite, not our membership: async_join reports it
            self._note_refused(exc, address if is_dialer and via_relay is None else None, is_dialer)
            raise
        except TimeoutError as exc:  # an OSError too: it was "closed the connection", which it never did
            stream.abort()
            raise SetupTimedOut(f"{short_id(node_id)} did not answer within {const.HANDSHAKE_TIMEOUT_S:g} s "
                             "(HANDSHAKE_TIMEOUT_S) during set-up: timed out") from exc
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            stream.abort()
            raise PeerUnreachable(f"{short_id(node_id)} closed the connection during set-up") from exc
        except BaseException:
            stream.abort()
            raise
        self.membership.refusals.pop(node_id, None)  # admitted now (it may have joined since)
        if admission.kind in ("member", "welcomed") and self.membership.note_member(node_id):
            self.tasks.spawn(self.membership.async_save(), name="swarm-save")  # the roster
        if admission.kind != "member":
            stream.close()
            await self.swarm_ops.async_admission_ended(admission, node_id, address)
            raise AdmissionEnded(f"{admission.kind} via {short_id(node_id)}")
        link = PeerLink(
            stream, node_id=node_id, hello=hello, link_nonce=nonce or hello.link_nonce or "",
            transport=transport, is_dialer=is_dialer, address=address,
            rto=self.table.record(node_id, source or ("inbound" if not is_dialer else "dial")).rto,
            dispatch=self.control.dispatch, via_relay=via_relay,
        )
        link.on_rtt = self._on_rtt
        self._register(link)
        fresh = self._hello()
        if link.is_open and (fresh.models, fresh.hardware, fresh.files) != (full.models, full.hardware, full.files):
            link.send_nowait(fresh.to_frame())  # what we serve changed during the handshake
        return link

    async def _async_read_hello(self, stream: Stream, node_id: str) -> Hello:
        try:
            async with asyncio.timeout(const.HANDSHAKE_TIMEOUT_S):
                frame = await async_read_frame(stream, const.HANDSHAKE_FRAME_MAX_BYTES)
        except TimeoutError:
            raise SetupTimedOut(f"{short_id(node_id)} sent no HELLO within {const.HANDSHAKE_TIMEOUT_S:g} s "
                             "(HANDSHAKE_TIMEOUT_S) of link set-up: timed out") from None
        if frame.type != FrameType.HELLO:
            raise ProtocolError(f"expected HELLO, got {type_name(frame.type)}")
        hello = Hello.from_frame(frame)
        if hello.node_id != node_id:
            raise PeerIdentityMismatch(
                f"HELLO claims {short_id(hello.node_id)} but the certificate proves {short_id(node_id)}")
        return hello

    def _note_refused(self, exc: NotAMember, address: str | None, dialled: bool) -> None:
        """Count the refusal; the peer's record says so and what to do (GUI, `peers`, report)."""
        ref = self.membership.note_refusal(exc, address, dialled=dialled)
        rec = self.table.get(exc.node_id)
        if rec is not None and rec.link is None:
            rec.state = "refused"
            rec.last_error = ref.describe()
            self.table.emit_changed(rec)

    def _register(self, link: PeerLink) -> None:
        self.discovery.foreign.speaks_swarm(link.node_id)
        rec = self.table.record(link.node_id)
        self.links.add(link)
        link.closed.add_done_callback(lambda _f, link=link: self._on_link_closed(link))
        current = rec.link if rec.link is not None and rec.link.is_open else None
        winner = link if current is None else preferred(current, link, me=self.node_id, ended_boots=rec.ended_boots)
        log.info("DIAG: connection established %s", kv(
            peer_id=link.short_id, connection_id=link.connection_id,
            count=self.connection_count(link.node_id), remote_addr=link.address,
            is_loopback=is_loopback(parse_addr(link.address)[0]) if ":" in link.address else None,
            is_dialer=link.is_dialer, transport=link.transport,
            total_established=self.connection_count(),
            total_peers=self.table.linked_count() + (current is None)))
        if current is not None:
            loser = current if winner is link else link
            log.info("DIAG: duplicate link to one peer, retiring one %s", kv(
                peer_id=link.short_id, keep=winner.connection_id, retire=loser.connection_id,
                keep_dialer=winner.is_dialer, keep_transport=winner.transport,
                peer_restarted=(current.hello.boot_id != link.hello.boot_id) or None))
            retire_loser(rec, loser, winner, self.links)
        if winner is link:
            rec.rto.restart()
            rec.link = link
            rec.hello = link.hello
            rec.state = "connected"
            rec.gone_since = None
            rec.last_error = None
            rec.backoff_s = 0.0
            rec.dial_failures = 0
            # where it can be dialled (its listen port), not the port an inbound connection came
            # from: a gone peer's row showed that ephemeral port (the Peers tab, /api/admin/peers)
            rec.last_address = link.dial_address
            self.table.emit_changed(rec)
            self.clock.note_hello(link.node_id, link.hello.time)
            self.discovery.on_link_up(link)
        # Frames that came in with the HELLO are delivered by start(): only now, so that a handler
        # answering one (`link(node_id)`, the pipeline's transport) finds this link in the table.
        link.start()

    def _on_rtt(self, link: PeerLink) -> None:
        rec = self.table.get(link.node_id)
        if rec is not None and rec.link is link:
            self.table.emit_changed(rec)

    def _on_forgotten(self, node_id: str) -> None:
        """The table forgot a peer: what was kept of it goes (one entry per peer met, for weeks)."""
        self.clock.drop(node_id)
        self.lacks.forget(node_id)

    def _on_link_closed(self, link: PeerLink) -> None:
        self.links.discard(link)
        if self.relay is not None:
            self.relay.link_closed(link)
        rec = self.table.get(link.node_id)
        was_active = rec is not None and rec.link is link
        log.info("DIAG: connection closed %s", kv(
            peer_id=link.short_id, connection_id=link.connection_id, cause=link.close_cause,
            remaining=self.connection_count(link.node_id), transport=link.transport,
            total_peers=self.table.linked_count() - int(was_active)))
        if rec is None or not was_active:
            return
        # a link retired in this one's favour waits for the peer to say it is drained, which a peer
        # that never retired it (its end of this link half-open: it roamed and dialled again) never
        # does: it believed itself linked through the retired one while this node had no link to it
        # for DUPLICATE_LINK_DRAIN_MAX_S (review r66). Closed now, the peer sees it go and redials.
        close_retired(self.links, link.node_id)
        rec.link = None
        self.clock.forget(link.node_id)
        rec.last_seen = time.time() - (time.monotonic() - link.last_seen)
        rec.last_error = link.close_cause
        if not self.tasks.stopping:
            # the roster's time is when a member was last linked: now, not when this link came up
            # (a member linked for weeks then gone counts as away for `swarm remove`'s guard)
            if link.node_id in self.membership.state.members and self.membership.note_member(link.node_id):
                self.tasks.spawn(self.membership.async_save(), name="swarm-save")
            # a link closed because its peer was removed leaves the peer refused, not gone: gone, the
            # Peers tab showed it as away, and a request with no route waited for it to come back
            # (`LayerHolders.regain`) (2026-12-07: only a redial of the removed node, refused, said so)
            refusal = self.membership.refusals.get(link.node_id)
            if refusal is not None:
                rec.last_error = refusal.describe()
            # (removed: review r77, any refusal made a live member's closing link "refused", one a
            # duplicate handshake was refused across a rotation, and nothing redialled it)
            rec.state = "refused" if refusal is not None and link.node_id in self.membership.state.removed else "gone"
            rec.gone_since = time.monotonic()
            log.info("DIAG: peer gone %s", kv(peer_id=link.short_id, cause=link.close_cause,
                                              deadline_s=round(link.liveness_deadline_s(), 2)))
            self.table.emit_changed(rec)
        self.discovery.on_link_down(link)
