"""Finding and (re)dialling peers: bootstrap, mDNS, PEX, relay rendezvous, the peer cache.

One maintenance loop decides what to dial: anonymous addresses (bootstrap, configured relays)
until they are connected, and every known peer without a live link, each with its own
exponential backoff. A peer is tried on its direct addresses first (unless `no_direct`), then
through the relays it is registered at. Addresses that turn out not to speak SwarmLLM are
logged once and never dialled again (remembered in peers.json).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from node import const
from node.errors import NodeError, PeerError, PeerIdentityMismatch, PeerUnreachable, SelfConnection
from node.logs import kv

from ._connect import (
    async_dial_direct,
    async_dial_relayed,
    async_open_circuit_end,
    format_addr,
    is_loopback,
    parse_addr,
)
from ._frames import Frame, FrameType
from ._identity import short_id
from ._link import PeerLink
from ._mdns import MdnsDiscovery
from ._messages import FEATURE_RELAY, NotSwarmPeer, PexEntry, parse_pex, pex_frame
from ._peercache import CachedPeer, PeerCache, load_peer_cache, save_peer_cache
from ._table import PeerRecord

if TYPE_CHECKING:
    from ._manager import PeerManager

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


def _next_backoff(current: float) -> float:
    return min(max(current * 2, const.RECONNECT_BACKOFF_MIN_S), const.RECONNECT_BACKOFF_MAX_S)


def _jitter(seconds: float) -> float:
    return seconds * random.uniform(0.8, 1.2)


class Discovery:
    """The manager's dialling brain (see module docstring)."""

    def __init__(self, manager: PeerManager):
        self.m = manager
        self.targets: dict[str, AddrTarget] = {}
        self.foreign_addrs: dict[str, str] = {}
        self.foreign_ids: set[str] = set()
        self.self_addrs: set[str] = set()
        self._dialing: dict[str, asyncio.Task[None]] = {}
        self._registered: dict[str, str] = {}  # relay node id -> relay address as we reach it
        self._wake = asyncio.Event()
        self._mdns: MdnsDiscovery | None = None
        self._save_handle: asyncio.TimerHandle | None = None
        self.rounds = 0  # maintenance passes so far (tests wait on it instead of sleeping)

    # --- lifecycle ----------------------------------------------------------------------------

    async def async_start(self) -> None:
        """Load the cache, set up targets, start mDNS and the loops."""
        cfg = self.m.config
        loop = asyncio.get_running_loop()
        cache = await loop.run_in_executor(None, load_peer_cache, cfg.data_dir)
        self.foreign_addrs.update({a: "cache" for a in cache.foreign})
        for peer in cache.peers:
            if peer.node_id == self.m.node_id:
                continue
            rec = self.m.table.record(peer.node_id, "cache")
            rec.last_seen = peer.last_seen
            for addr in peer.addrs:
                rec.add_addr(addr)
            for relay in peer.relays:
                rec.add_relay(relay)
        if cfg.no_direct and cfg.bootstrap:
            log.info("DIAG: bootstrap addresses not dialled %s", kv(reason="no_direct: peers via relays only",
                                                                   count=len(cfg.bootstrap)))
        for addr in [] if cfg.no_direct else cfg.bootstrap:
            self._add_target(addr, "bootstrap")
        for addr in cfg.relays:
            self._add_target(addr, "relay")
        if cfg.mdns:
            ips = [parse_addr(a)[0] for a in self.m.listen_addrs if not is_loopback(parse_addr(a)[0])]
            if not ips:
                log.info("DIAG: mdns not started %s", kv(reason="no non-loopback IPv4 address"))
            else:
                mdns = MdnsDiscovery(self.m.node_id, self.m.listen_port, self._on_mdns_found, ips)
                try:
                    await mdns.async_start()
                    self._mdns = mdns
                except (OSError, NodeError) as exc:  # a node without multicast still works
                    log.warning("DIAG: mdns failed to start %s", kv(error=exc))
        self.m.tasks.spawn(self._async_maintain(), name="peer-maintain")
        self.m.tasks.spawn(self._async_pex_loop(), name="peer-pex")

    async def async_stop(self) -> None:
        """Stop mDNS (the manager cancels the loops)."""
        if self._save_handle is not None:
            self._save_handle.cancel()
        if self._mdns is not None:
            await self._mdns.async_stop()
            self._mdns = None

    def _add_target(self, addr: str, site: str) -> None:
        try:
            parse_addr(addr)
        except ValueError as exc:
            log.warning("DIAG: ignoring a malformed %s address %s", site, kv(addr=addr, error=exc))
            return
        self.targets.setdefault(addr, AddrTarget(addr, site))

    def wake(self) -> None:
        """Run the maintenance loop now."""
        self._wake.set()

    def registered_relays(self) -> list[str]:
        """Relay addresses this node holds a registration at."""
        return list(self._registered.values())

    # --- the maintenance loop -----------------------------------------------------------------

    async def _async_maintain(self) -> None:
        while not self.m.tasks.stopping:
            now = time.monotonic()
            for target in list(self.targets.values()):
                key = "addr:" + target.addr
                if (target.is_self or target.addr in self.foreign_addrs or key in self._dialing
                        or now < target.next_at or (target.node_id and self.m.link(target.node_id))):
                    continue
                self._dialing[key] = self.m.tasks.spawn(self._async_dial_target(target, key), name="dial-target")
            for rec in self.m.table:
                if rec.link is not None or rec.node_id in self._dialing or now < rec.next_dial_at:
                    continue
                if rec.node_id in self.foreign_ids:
                    continue
                if rec.gone_since is not None and now - rec.gone_since > const.PEER_FORGET_S:
                    self.m.table.forget(rec)
                    continue
                if not self._routes(rec):
                    continue
                self._dialing[rec.node_id] = self.m.tasks.spawn(self._async_dial_record_task(rec), name="dial-peer")
            for rec in self.m.table:
                link = rec.link
                key = "upgrade:" + rec.node_id
                if (link is None or link.transport != "relayed" or not link.is_open or link.retired
                        or key in self._dialing or now < rec.upgrade_at):
                    continue
                candidates = self._upgrade_candidates(rec, link)
                if candidates:
                    self._dialing[key] = self.m.tasks.spawn(self._async_upgrade(rec, link, candidates, key),
                                                      name="upgrade-link")
            self.rounds += 1
            self._wake.clear()
            try:
                async with asyncio.timeout(const.DIAL_MAINTENANCE_INTERVAL_S):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _is_relay(self, rec: PeerRecord) -> bool:
        if rec.hello is not None and rec.hello.features & FEATURE_RELAY:
            return True
        return any(t.node_id == rec.node_id for t in self.targets.values() if t.site == "relay")

    def _direct_addrs(self, rec: PeerRecord) -> list[str]:
        if self.m.config.no_direct and not self._is_relay(rec):
            return []
        return [a for a in rec.addrs if a not in self.foreign_addrs and a not in self.self_addrs]

    def _routes(self, rec: PeerRecord) -> bool:
        return bool(self._direct_addrs(rec) or rec.relays)

    async def _async_dial_target(self, target: AddrTarget, key: str) -> None:
        try:
            link = await self.async_connect(target.addr, None, site=target.site)
            target.node_id = link.node_id
            target.failures = 0
            target.backoff_s = 0.0
        except NotSwarmPeer:
            pass  # logged once by _note_foreign_dial; never dialled again
        except SelfConnection:
            target.is_self = True
            log.info("DIAG: %s address is this node, not dialling it %s", target.site, kv(addr=target.addr))
        except PeerError as exc:
            target.failures += 1
            target.backoff_s = _next_backoff(target.backoff_s)
            target.next_at = time.monotonic() + _jitter(target.backoff_s)
            log.warning("DIAG: %s dial failed %s", target.site, kv(
                addr=target.addr, peer_id=short_id(target.node_id) if target.node_id else None,
                error=exc.message, connected_peers=self.m.table.linked_count(),
                retry_in_s=round(target.backoff_s, 1)))
        finally:
            self._dialing.pop(key, None)

    # --- relayed -> direct ----------------------------------------------------------------------

    def _upgrade_candidates(self, rec: PeerRecord, link: PeerLink) -> list[str]:
        """Direct addresses worth trying for a peer we reach through a relay: what discovery knows,
        then the listen addresses its HELLO announced (a wrong one fails the identity check)."""
        if self.m.config.no_direct:
            return []
        seen: list[str] = []
        for addr in [*rec.addrs, *link.hello.listen]:
            if addr not in seen and addr not in self.foreign_addrs and addr not in self.self_addrs:
                seen.append(addr)
        return seen

    async def _async_upgrade(self, rec: PeerRecord, link: PeerLink, candidates: list[str], key: str) -> None:
        """Try a direct link to a peer linked through a relay; the duplicate-link rule then keeps
        the direct one on both ends and retires the relayed one once its requests drain."""
        errors: list[str] = []
        try:
            for addr in candidates:
                if rec.link is not link or not link.is_open or self.m.tasks.stopping:
                    return  # replaced or gone meanwhile
                try:
                    stream, _ = await async_dial_direct(self.m.tls, addr, rec.node_id)
                    await self.m.async_establish(stream, rec.node_id, is_dialer=True, transport="direct",
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

    async def _async_dial_record_task(self, rec: PeerRecord) -> None:
        try:
            await self._async_dial_record(rec)
        except PeerError as exc:
            rec.dial_failures += 1
            rec.backoff_s = _next_backoff(rec.backoff_s)
            rec.next_dial_at = time.monotonic() + _jitter(rec.backoff_s)
            rec.last_error = exc.message
            if rec.link is None and rec.state != "gone":
                rec.state = "gone"
                rec.gone_since = time.monotonic()
                self.m.table.emit_changed(rec)
            log.debug("DIAG: dial failed %s", kv(peer_id=rec.short_id, error=exc.message,
                                                 retry_in_s=round(rec.backoff_s, 1)))
        finally:
            self._dialing.pop(rec.node_id, None)

    async def _async_dial_record(self, rec: PeerRecord) -> PeerLink:
        errors: list[str] = []
        for addr in self._direct_addrs(rec):
            if self.m.link(rec.node_id):
                return self.m.link(rec.node_id)  # type: ignore[return-value]
            try:
                return await self.async_connect(addr, rec.node_id, site="peer")
            except PeerIdentityMismatch as exc:
                rec.addrs.remove(addr)  # someone else lives there now
                errors.append(exc.message)
            except PeerError as exc:
                errors.append(exc.message)
        for relay_addr in list(rec.relays):
            if self.m.link(rec.node_id):
                return self.m.link(rec.node_id)  # type: ignore[return-value]
            try:
                stream = await async_dial_relayed(self.m.tls, relay_addr, rec.node_id, self.m.node_id)
                return await self.m.async_establish(stream, rec.node_id, is_dialer=True, transport="relayed",
                                                    address=relay_addr, via_relay=relay_addr, source="relay")
            except PeerError as exc:
                errors.append(exc.message)
        raise PeerUnreachable("; ".join(errors) or "no address known")

    async def async_connect(self, addr: str, node_id: str | None, *, site: str) -> PeerLink:
        """Dial addr directly (node_id: identity it must prove, None for any) and set up the link."""
        if node_id is not None and (link := self.m.link(node_id)) is not None:
            return link
        if addr in self.foreign_addrs:
            log.debug("Not dialling a peer that does not speak SwarmLLM %s",
                      kv(peer_id=short_id(node_id) if node_id else None, addr=addr, site=site))
            raise NotSwarmPeer(f"{addr} does not speak SwarmLLM")
        try:
            stream, proven = await async_dial_direct(self.m.tls, addr, node_id)
            if proven in self.foreign_ids:
                stream.abort()
                raise NotSwarmPeer(f"{short_id(proven)} does not speak SwarmLLM")
            try:
                link = await self.m.async_establish(stream, proven, is_dialer=True, transport="direct",
                                                    address=addr, source=site)
            except NotSwarmPeer:
                self.foreign_ids.add(proven)  # it proved an identity but speaks another protocol
                rec = self.m.table.get(proven)
                if rec is not None and rec.link is None:
                    self.m.table.forget(rec)
                raise
        except NotSwarmPeer as exc:
            self._note_foreign_dial(addr, exc, site)
            raise
        except SelfConnection:
            self.self_addrs.add(addr)
            raise
        rec = self.m.table.get(link.node_id)
        if rec is not None:
            rec.add_addr(addr, front=True)
        return link

    # --- link events --------------------------------------------------------------------------

    def addr_of(self, link: PeerLink) -> str:
        """Where we can dial the peer of a direct link: the dialled address, or (inbound) its
        observed host with the listen port it announced."""
        if link.is_dialer or link.transport != "direct":
            return link.address
        host = parse_addr(link.address)[0]
        return format_addr(host, link.hello.listen_port)

    def on_link_up(self, link: PeerLink) -> None:
        """A link won registration: remember its address, share peers, register at relays."""
        rec = self.m.table.record(link.node_id)
        if link.transport == "direct" and link.hello.listen_port:
            rec.add_addr(self.addr_of(link), front=True)
        elif link.via_relay:
            rec.add_relay(link.via_relay)
            rec.upgrade_backoff_s = 0.0
            rec.upgrade_at = time.monotonic() + const.UPGRADE_FIRST_S
        try:
            link.send_nowait(pex_frame(self._pex_entries(link)))
        except PeerError:
            pass
        if link.hello.features & FEATURE_RELAY and link.transport == "direct":
            self.m.tasks.spawn(self._async_use_relay(link), name=f"relay-client-{link.short_id}")
        self.schedule_cache_save()

    def on_link_down(self, link: PeerLink) -> None:
        """The live link to a peer closed: forget its relay role, redial soon."""
        if self._registered.pop(link.node_id, None) is not None:
            log.info("DIAG: relay registration lost %s", kv(peer_id=link.short_id, cause=link.close_cause))
        rec = self.m.table.get(link.node_id)
        if rec is not None and not self.m.tasks.stopping:
            rec.backoff_s = 0.0
            rec.next_dial_at = time.monotonic() + _jitter(const.RECONNECT_BACKOFF_MIN_S)
            self.wake()
        self.schedule_cache_save()

    # --- PEX ----------------------------------------------------------------------------------

    def _pex_entries(self, to: PeerLink) -> list[PexEntry]:
        keep_loopback = is_loopback(parse_addr(to.address)[0]) if to.transport == "direct" else False
        entries = []
        for rec in self.m.table:
            link = rec.link
            if link is None or rec.node_id == to.node_id:
                continue
            addrs = [a for a in rec.addrs[:8] if keep_loopback or not is_loopback(parse_addr(a)[0])]
            entries.append(PexEntry(rec.node_id, tuple(addrs), tuple(rec.relays[:4])))
        return entries[: const.PEX_MAX_PEERS]

    async def _async_pex_loop(self) -> None:
        while not self.m.tasks.stopping:
            await asyncio.sleep(const.PEX_INTERVAL_S)
            for link in list(self.m.links):
                if link.is_open and not link.retired:
                    try:
                        link.send_nowait(pex_frame(self._pex_entries(link)))
                    except PeerError:
                        pass

    def handle_pex(self, link: PeerLink, frame: Frame) -> None:
        """Learn peers from a PEX frame (a malformed one closes the link)."""
        entries = parse_pex(frame)
        own = set(self.m.listen_addrs)
        for entry in entries:
            if entry.node_id == self.m.node_id:
                continue
            if entry.node_id in self.foreign_ids:
                log.debug("Not dialling a peer that does not speak SwarmLLM %s",
                          kv(peer_id=short_id(entry.node_id), site="pex"))
                continue
            rec = self.m.table.record(entry.node_id, "pex")
            new = False
            for addr in entry.addrs:
                if addr not in own and addr not in self.self_addrs:
                    new |= rec.add_addr(addr)
            for relay in entry.relays:
                new |= rec.add_relay(relay)
            if new and rec.link is None:
                rec.next_dial_at = min(rec.next_dial_at, time.monotonic())
                self.wake()

    # --- relay client -------------------------------------------------------------------------

    async def _async_use_relay(self, link: PeerLink) -> None:
        """Register at a relay peer, then ask it who else is registered, periodically."""
        relay_addr = self.addr_of(link)
        try:
            await link.async_request(Frame(FrameType.RELAY, {"op": "register"}),
                                     timeout_s=const.HANDSHAKE_TIMEOUT_S)
        except NodeError as exc:
            log.info("DIAG: relay registration failed %s", kv(peer=link.short_id, error=exc.message))
            return
        self._registered[link.node_id] = relay_addr
        log.debug("DIAG: relay reservation %s", kv(peer=link.short_id, addr=relay_addr))
        while link.is_open and not self.m.tasks.stopping:
            try:
                reply = await link.async_request(Frame(FrameType.RELAY, {"op": "list"}),
                                                 timeout_s=const.HANDSHAKE_TIMEOUT_S)
            except NodeError:
                return
            nodes = reply.header.get("nodes")
            for node in nodes if isinstance(nodes, list) else []:
                node_id = node.get("node_id") if isinstance(node, dict) else None
                if node_id in (None, self.m.node_id, link.node_id) or node_id in self.foreign_ids:
                    continue
                if not isinstance(node_id, str) or len(node_id) != 64:
                    continue
                rec = self.m.table.record(node_id, "relay")
                if rec.add_relay(relay_addr) and rec.link is None:
                    rec.next_dial_at = min(rec.next_dial_at, time.monotonic())
                    self.wake()
            await asyncio.sleep(const.RELAY_LIST_INTERVAL_S)

    def handle_relay_incoming(self, link: PeerLink, frame: Frame) -> None:
        """A relay we registered at announces a circuit: open our end and serve TLS on it."""
        circuit = frame.header.get("circuit")
        relay_addr = self._registered.get(link.node_id)
        if relay_addr is None or not isinstance(circuit, str) or len(circuit) > 64:
            log.debug("DIAG: relay circuit ignored %s", kv(peer=link.short_id, reason="not registered there"))
            return
        self.m.tasks.spawn(self._async_accept_circuit(relay_addr, circuit), name="relay-circuit")

    async def _async_accept_circuit(self, relay_addr: str, circuit: str) -> None:
        try:
            stream = await async_open_circuit_end(relay_addr, circuit)
        except PeerError as exc:
            log.info("DIAG: relay circuit failed %s", kv(relay=relay_addr, error=exc.message))
            return
        await self.m.inbound.async_serve(stream, transport="relayed", via_relay=relay_addr)

    # --- foreign peers and failures -----------------------------------------------------------

    def _note_foreign_dial(self, addr: str, exc: NotSwarmPeer, site: str) -> None:
        if addr in self.foreign_addrs:
            return
        self.foreign_addrs[addr] = site
        log.info("Ignoring a peer that does not speak SwarmLLM %s",
                 kv(addr=addr, protocol_version=exc.protocol_version, agent=exc.agent, site=site,
                    reason=exc.message))
        self.schedule_cache_save()

    def _on_mdns_found(self, node_id: str, addrs: list[str]) -> None:
        if node_id in self.foreign_ids:
            log.debug("Not dialling a peer that does not speak SwarmLLM %s",
                      kv(peer_id=short_id(node_id), site="mdns"))
            return
        rec = self.m.table.record(node_id, "mdns")
        new = any([rec.add_addr(a) for a in addrs])
        if new and rec.link is None:
            rec.next_dial_at = min(rec.next_dial_at, time.monotonic())
            self.wake()

    # --- peer cache ---------------------------------------------------------------------------

    def schedule_cache_save(self) -> None:
        """Save peers.json soon (debounced)."""
        if self._save_handle is None and not self.m.tasks.stopping:
            loop = asyncio.get_running_loop()
            self._save_handle = loop.call_later(
                const.PEER_CACHE_SAVE_DELAY_S,
                lambda: self.m.tasks.spawn(self.async_save_cache(), name="peer-cache-save"))

    async def async_save_cache(self) -> None:
        """Write peers.json now (in an executor)."""
        self._save_handle = None
        now = time.time()
        recs = sorted(self.m.table, key=lambda r: -(now if r.link else (r.last_seen or 0)))
        peers = [CachedPeer(r.node_id, [a for a in r.addrs if a not in self.self_addrs][:8], r.relays[:4],
                            now if r.link else r.last_seen)
                 for r in recs if (r.addrs or r.relays) and r.node_id not in self.foreign_ids]
        cache = PeerCache(peers[: const.PEER_CACHE_MAX], sorted(self.foreign_addrs)[:1024])
        try:
            await asyncio.get_running_loop().run_in_executor(None, save_peer_cache, self.m.config.data_dir, cache)
        except OSError as exc:
            log.warning("DIAG: peer cache save failed %s", kv(error=exc))
