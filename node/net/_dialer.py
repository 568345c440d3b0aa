"""The dialer: one maintenance loop that keeps peers and addresses dialled.

It dials anonymous addresses (bootstrap, configured relays) until they are connected, and every
known peer without a live link, each with its own exponential backoff and jitter. A peer is tried
on its direct addresses first (unless `no_direct`), then through the relays it is registered at.
A peer linked only through a relay keeps being tried directly (relayed → direct upgrade): a
direct link that comes up wins the duplicate-link rule on both ends and the relayed one retires.
Addresses that turn out not to speak SwarmLLM go to `ForeignPeers` and are never dialled again;
addresses that turn out to be this node go to `self_addrs`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from node import const
from node.config import NodeConfig
from node.errors import NotAMember, PeerError, PeerIdentityMismatch, PeerUnreachable, SelfConnection
from node.logs import kv

from ._addr import dialable, parse_addr
from ._admission import Membership
from ._connect import Establish, async_dial_direct, async_dial_first, async_dial_relayed
from ._foreign import ForeignPeers
from ._hints import no_answer_since
from ._identity import short_id
from ._link import PeerLink
from ._messages import NotSwarmPeer
from ._stream import Stream
from ._table import PeerRecord, PeerTable
from ._tasks import Tasks
from ._tls import TlsConfig

log = logging.getLogger(__name__)


@dataclass
class AddrTarget:
    """An address to keep dialled whose node id is not known in advance (bootstrap, relays)."""

    addr: str
    site: str  # "bootstrap" | "relay"
    node_id: str | None = None
    backoff_s: float = 0.0
    next_at: float = 0.0
    failures: int = 0
    is_self: bool = False
    warned: str | None = None  # the error this run of failures was logged at WARNING with
    warned_at: float = 0.0  # monotonic


def _next_backoff(current: float, *, relay: bool = False) -> float:
    cap = min(const.RECONNECT_BACKOFF_MAX_S, const.RELAY_RECONNECT_BACKOFF_MAX_S) if relay else const.RECONNECT_BACKOFF_MAX_S
    return min(max(current * 2, const.RECONNECT_BACKOFF_MIN_S), cap)


def _jitter(seconds: float) -> float:
    return seconds * random.uniform(0.8, 1.2)


def dial_address(link: PeerLink) -> str:
    """Where we can dial the peer of a link (PeerLink.dial_address)."""
    return link.dial_address


async def _no_relay_client(relay_addr: str, target: str) -> str:
    raise PeerUnreachable(f"no relay client to ask {relay_addr} for a ticket")


class Dialer:
    """Decides what to dial and dials it (see module docstring)."""

    def __init__(self, config: NodeConfig, node_id: str, tls: TlsConfig, table: PeerTable, tasks: Tasks,
                 foreign: ForeignPeers, self_addrs: set[str], establish: Establish, membership: Membership):
        self._config = config  # read live: no_direct may change at run time
        self._membership = membership  # refused peers and addresses are not dialled again
        self.ticket: Callable[[str, str], Awaitable[str]] = _no_relay_client  # set by Discovery
        self._node_id = node_id
        self._tls = tls
        self._table = table
        self._tasks = tasks
        self._foreign = foreign
        self._self_addrs = self_addrs
        self._establish = establish
        self.targets: dict[str, AddrTarget] = {}
        self._dialing: dict[str, asyncio.Task[None]] = {}  # "addr:…", node id, "upgrade:…" -> dial
        self._wake = asyncio.Event()
        self.rounds = 0  # maintenance passes so far (tests wait on it instead of sleeping)

    def start(self) -> None:
        """Add the configured bootstrap and relay addresses and start the maintenance loop."""
        cfg = self._config
        if cfg.no_direct and cfg.bootstrap:
            log.info("DIAG: bootstrap addresses not dialled %s", kv(reason="no_direct: peers via relays only",
                                                                   count=len(cfg.bootstrap)))
        for addr in [] if cfg.no_direct else cfg.bootstrap:
            self.add_target(addr, "bootstrap")
        for addr in cfg.relays:
            self.add_target(addr, "relay")
        self._tasks.spawn(self._async_maintain(), name="peer-maintain")

    def add_target(self, addr: str, site: str) -> None:
        """Keep addr dialled until it is connected (site: "bootstrap" or "relay")."""
        try:
            parse_addr(addr)
        except ValueError as exc:
            log.warning("DIAG: ignoring a malformed %s address %s", site, kv(addr=addr, error=exc))
            return
        self.targets.setdefault(addr, AddrTarget(addr, site))

    def wake(self) -> None:
        """Run the maintenance loop now."""
        self._wake.set()

    def dialing(self, node_id: str) -> bool:
        """Whether a dial of that peer's record is under way (PEX leaves it in the pool)."""
        return node_id in self._dialing

    def dial_soon(self, rec: PeerRecord) -> None:
        """A new route to rec was learnt: dial it now if it has no link."""
        if rec.link is None:
            rec.next_dial_at = min(rec.next_dial_at, time.monotonic())
            self.wake()

    # --- link events --------------------------------------------------------------------------

    def on_link_up(self, link: PeerLink) -> None:
        """A link won registration: remember the address it came by; a relayed one gets its first
        direct try after UPGRADE_FIRST_S."""
        rec = self._table.record(link.node_id)
        if link.transport == "direct" and link.hello.listen_port:
            rec.add_addr(dial_address(link), front=True)
        elif link.via_relay:
            rec.add_relay(link.via_relay)
            rec.upgrade_backoff_s = 0.0
            rec.upgrade_at = time.monotonic() + const.UPGRADE_FIRST_S

    def on_link_down(self, link: PeerLink) -> None:
        """The live link to a peer closed: redial soon."""
        rec = self._table.get(link.node_id)
        if rec is not None and not self._tasks.stopping:
            rec.backoff_s = 0.0
            rec.next_dial_at = time.monotonic() + _jitter(const.RECONNECT_BACKOFF_MIN_S)
            self.wake()

    # --- the maintenance loop -----------------------------------------------------------------

    async def _async_maintain(self) -> None:
        spawn = self._tasks.spawn
        while not self._tasks.stopping:
            now = time.monotonic()
            for target in list(self.targets.values()):
                key = "addr:" + target.addr
                if (target.is_self or target.addr in self._foreign.addrs or key in self._dialing
                        or target.addr in self._membership.refused_addrs
                        or now < target.next_at or (target.node_id and self._table.link(target.node_id))):
                    continue
                self._dialing[key] = spawn(self._async_dial_target(target, key), name="dial-target")
            for rec in self._table:
                if rec.link is not None or rec.node_id in self._dialing or now < rec.next_dial_at:
                    continue
                if rec.node_id in self._foreign.ids or self._membership.is_refused(rec.node_id):
                    continue
                if rec.gone_since is not None and now - rec.gone_since > const.PEER_FORGET_S:
                    self._table.forget(rec)
                    continue
                if not self._routes(rec):
                    self._no_route(rec)
                    continue
                self._dialing[rec.node_id] = spawn(self._async_dial_record_task(rec), name="dial-peer")
            for rec in self._table:
                link = rec.link
                key = "upgrade:" + rec.node_id
                if (link is None or link.transport != "relayed" or not link.is_open or link.retired
                        or key in self._dialing or now < rec.upgrade_at):
                    continue
                candidates = self._upgrade_candidates(rec, link)
                if candidates:
                    self._dialing[key] = spawn(self._async_upgrade(rec, link, candidates, key), name="upgrade-link")
            self.rounds += 1
            self._wake.clear()
            try:
                async with asyncio.timeout(const.DIAL_MAINTENANCE_INTERVAL_S):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _is_relay(self, rec: PeerRecord) -> bool:
        if rec.is_relay:  # its HELLO said so, or peers.json remembers it did
            return True
        return any(t.node_id == rec.node_id for t in self.targets.values() if t.site == "relay")

    def _no_route(self, rec: PeerRecord) -> None:
        """A peer with nothing to dial shows why, not "connecting" for ever. It is not gone (not
        forgotten after PEER_FORGET_S): a relay that lists it, or dialling directly again, is a route."""
        if rec.link is not None:
            return
        if self._config.no_direct and self._dialable(rec.addrs):
            why = "not dialled: --no-direct (peers only through relays) and no relay it is registered at is known"
        else:
            why = "not dialled: no address or relay known"
        if rec.state == "connecting" or (rec.state == "gone" and rec.last_error != why):
            rec.state, rec.last_error = "gone", why
            self._table.emit_changed(rec)

    def _dialable(self, addrs: list[str]) -> list[str]:
        return [a for a in addrs if a not in self._foreign.addrs and a not in self._self_addrs]

    def _direct_addrs(self, rec: PeerRecord) -> list[str]:
        if self._config.no_direct and not self._is_relay(rec):
            return []
        return self._dialable(rec.addrs)

    def _routes(self, rec: PeerRecord) -> bool:
        return bool(self._direct_addrs(rec) or rec.relays)

    async def _async_dial_target(self, target: AddrTarget, key: str) -> None:
        try:
            link = await self.async_connect(target.addr, None, site=target.site)
            target.node_id = link.node_id
            target.failures = 0
            target.backoff_s = 0.0
            target.warned = None
        except NotSwarmPeer:
            pass  # logged once by ForeignPeers.note_addr; never dialled again
        except NotAMember:
            pass  # logged once by Membership.note_refusal; the address is not dialled again
        except SelfConnection:
            target.is_self = True
            log.info("DIAG: %s address is this node, not dialling it %s", target.site, kv(addr=target.addr))
        except PeerError as exc:
            # WARNING once per run of failures (and when the error changes), the retries at DEBUG: a
            # bootstrap or relay that is down put a WARNING in node.log every retry, for ever
            # (120 an hour at the 30 s cap, 720 for a relay at 5 s), burying what else happened.
            # A link to its node since (whoever dialled) ended the last run.
            rec = self._table.get(target.node_id) if target.node_id else None
            if rec is not None and rec.gone_since is not None and rec.gone_since > target.warned_at:
                target.warned, target.failures = None, 0
            target.failures += 1
            target.backoff_s = _next_backoff(target.backoff_s, relay=target.site == "relay")
            target.next_at = time.monotonic() + _jitter(target.backoff_s)
            level = logging.DEBUG if target.warned == exc.message else logging.WARNING
            if level == logging.WARNING:
                target.warned, target.warned_at = exc.message, time.monotonic()
            log.log(level, "DIAG: %s dial failed %s", target.site, kv(
                addr=target.addr, peer_id=short_id(target.node_id) if target.node_id else None,
                error=exc.message, connected_peers=self._table.linked_count(),
                retry_in_s=round(target.backoff_s, 1), failures=target.failures))
        finally:
            self._dialing.pop(key, None)

    async def _async_dial_record_task(self, rec: PeerRecord) -> None:
        try:
            await self._async_dial_record(rec)
        except NotAMember:
            pass  # the record says refused now; the maintenance loop leaves it alone
        except PeerError as exc:
            rec.dial_failures += 1
            rec.backoff_s = _next_backoff(rec.backoff_s, relay=self._is_relay(rec))
            rec.next_dial_at = time.monotonic() + _jitter(rec.backoff_s)
            rec.last_error = exc.message
            if isinstance(exc, PeerUnreachable) and exc.timed_out and rec.last_seen is not None:
                rec.last_error = no_answer_since(rec.last_seen, exc.message)  # it went silent: say when
            if rec.link is None and rec.state != "gone":
                rec.state = "gone"
                rec.gone_since = time.monotonic()
                self._table.emit_changed(rec)
            log.debug("DIAG: dial failed %s", kv(peer_id=rec.short_id, error=exc.message,
                                                 retry_in_s=round(rec.backoff_s, 1)))
        finally:
            self._dialing.pop(rec.node_id, None)

    async def _async_dial_record(self, rec: PeerRecord) -> PeerLink:
        errors: list[str] = []
        silent: list[bool] = []  # per failure: it timed out (nothing answered)
        addrs = self._direct_addrs(rec)
        while addrs:  # racing (async_dial_first): a dead address first no longer costs a connect timeout
            if link := self._table.link(rec.node_id):
                return link
            won, failures = await async_dial_first(self._tls, addrs, rec.node_id)
            self._dials_failed(rec, failures, "peer")
            errors += [exc.message for _addr, exc in failures]
            silent += [isinstance(exc, PeerUnreachable) and exc.timed_out for _addr, exc in failures]
            if won is None:
                break
            addr, stream, proven = won
            tried = {addr, *(a for a, _ in failures)}
            addrs = [a for a in addrs if a not in tried]
            try:
                return await self._async_setup(stream, proven, addr, "peer")
            except NotAMember:
                raise  # not in our swarm: no other address or relay will change that
            except PeerError as exc:
                errors.append(exc.message)
                silent.append(isinstance(exc, PeerUnreachable) and exc.timed_out)
        for relay_addr in list(rec.relays):
            if link := self._table.link(rec.node_id):
                return link
            try:
                ticket = await self.ticket(relay_addr, rec.node_id)
                stream = await async_dial_relayed(self._tls, relay_addr, rec.node_id, self._node_id, ticket)
                return await self._establish(stream, rec.node_id, is_dialer=True, transport="relayed",
                                             address=relay_addr, via_relay=relay_addr, source="relay")
            except NotAMember:
                raise
            except PeerError as exc:
                errors.append(exc.message)
                silent.append(isinstance(exc, PeerUnreachable) and exc.timed_out)
        failed = PeerUnreachable("; ".join(errors) or "no address known")
        failed.timed_out = bool(silent) and all(silent)
        raise failed

    def _dials_failed(self, rec: PeerRecord, failures: list[tuple[str, PeerError]], site: str) -> None:
        """What failed dials of a peer's addresses teach, on every path that dials them: an address
        where another node answers is not the peer's any more, one that is no SwarmLLM node is
        foreign, any other failure counts towards the address going stale."""
        for addr, exc in failures:
            if isinstance(exc, PeerIdentityMismatch):
                rec.remove_addr(addr)  # someone else lives there now
            elif isinstance(exc, NotSwarmPeer):
                self._foreign.note_addr(addr, exc, site)
            else:
                self._addr_failed(rec, addr, exc)

    def _addr_failed(self, rec: PeerRecord, addr: str, exc: PeerError) -> None:
        if rec.addr_failed(addr, time.time()):
            log.info("DIAG: dropping a peer address that stopped working %s", kv(
                peer_id=rec.short_id, addr=addr, error=exc.message, kept=",".join(rec.addrs[:4])))

    async def async_connect(self, addr: str, node_id: str | None, *, site: str) -> PeerLink:
        """Dial addr directly (node_id: identity it must prove, None for any) and set up the link."""
        if node_id is not None and (link := self._table.link(node_id)) is not None:
            return link
        self._foreign.check_addr(addr, node_id, site)
        try:
            stream, proven = await async_dial_direct(self._tls, addr, node_id)
        except NotSwarmPeer as exc:
            self._foreign.note_addr(addr, exc, site)
            raise
        return await self._async_setup(stream, proven, addr, site)

    async def _async_setup(self, stream: Stream, proven: str, addr: str, site: str) -> PeerLink:
        """HELLO and admission on a stream dialled to addr whose peer proved `proven`."""
        try:
            if proven in self._foreign.ids:
                stream.abort()
                raise NotSwarmPeer(f"{short_id(proven)} does not speak SwarmLLM")
            try:
                link = await self._establish(stream, proven, is_dialer=True, transport="direct",
                                             address=addr, source=site)
            except NotSwarmPeer:
                self._foreign.note_id(proven)  # it proved an identity but speaks another protocol
                rec = self._table.get(proven)
                if rec is not None and rec.link is None:
                    self._table.forget(rec)
                raise
        except NotSwarmPeer as exc:
            self._foreign.note_addr(addr, exc, site)
            raise
        except SelfConnection:
            self._self_addrs.add(addr)
            raise
        rec = self._table.get(link.node_id)
        if rec is not None:
            rec.add_addr(addr, front=True)
        return link

    # --- relayed -> direct --------------------------------------------------------------------

    def _upgrade_candidates(self, rec: PeerRecord, link: PeerLink) -> list[str]:
        """Direct addresses worth trying for a peer we reach through a relay: what discovery knows,
        then the listen addresses its HELLO announced (a wrong one fails the identity check) that a
        peer on another machine may have this node dial (`dialable`: IP literals, not our loopback;
        2026-12-07: its 127.0.0.1 or `localhost` had this node dial its own local services)."""
        if self._config.no_direct:
            return []
        announced = [a for a in link.hello.listen if dialable(a, from_loopback=False)]
        return self._dialable(list(dict.fromkeys([*rec.addrs, *announced])))

    async def _async_upgrade(self, rec: PeerRecord, link: PeerLink, candidates: list[str], key: str) -> None:
        """Try a direct link to a peer linked through a relay; the duplicate-link rule then keeps
        the direct one on both ends and retires the relayed one once its requests drain."""
        errors: list[str] = []
        try:
            while candidates:
                if rec.link is not link or not link.is_open or self._tasks.stopping:
                    return  # replaced or gone meanwhile
                won, failures = await async_dial_first(self._tls, candidates, rec.node_id)
                errors += [f"{addr}: {exc.message}" for addr, exc in failures]
                self._dials_failed(rec, failures, "upgrade")
                if won is None:
                    break
                addr, stream, _ = won
                tried = {addr, *(a for a, _ in failures)}
                candidates = [a for a in candidates if a not in tried]
                try:
                    await self._establish(stream, rec.node_id, is_dialer=True, transport="direct",
                                          address=addr, source="upgrade")
                except PeerError as exc:
                    errors.append(f"{addr}: {exc.message}")
                    continue
                rec.upgrade_backoff_s = 0.0
                log.info("DIAG: relayed link upgraded to direct %s", kv(peer_id=rec.short_id, addr=addr,
                                                                       relay=link.via_relay))
                return
            rec.upgrade_backoff_s = min(const.UPGRADE_BACKOFF_MAX_S,
                                        max(const.UPGRADE_BACKOFF_MIN_S, rec.upgrade_backoff_s * 2))
            rec.upgrade_at = time.monotonic() + _jitter(rec.upgrade_backoff_s)
            log.debug("DIAG: no direct link to a relayed peer yet %s", kv(
                peer_id=rec.short_id, tried=len(candidates), retry_in_s=round(rec.upgrade_backoff_s),
                error="; ".join(errors)[:300]))
        finally:
            self._dialing.pop(key, None)
