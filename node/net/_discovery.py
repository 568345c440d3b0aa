"""Finding and (re)dialling peers: the parts, wired together, and what the manager tells them.

Sources of peers: `--bootstrap` and `--relays` addresses, mDNS (`_mdns.py`), PEX (`_pex.py`), relay
rendezvous (`_relayclient.py`) and peers.json (`_peercache.py`). All of them add to the
`PeerTable`; the `Dialer` (`_dialer.py`) dials what has no link. Endpoints that do not speak
SwarmLLM are remembered in `ForeignPeers` (`_foreign.py`); addresses that turned out to be this
node in `self_addrs`. Each part gets only what it uses: the table, the task set, the config,
the foreign peers, and the manager's `Establish` / the inbound router's `ServeInbound`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from node import const
from node.config import NodeConfig
from node.errors import NodeError
from node.logs import kv

from ._addr import dialable, is_loopback, parse_addr
from ._admission import Membership
from ._clock import Clock
from ._connect import Establish
from ._dialer import Dialer
from ._foreign import ForeignPeers
from ._frames import Frame
from ._link import PeerLink
from ._mdns import MdnsDiscovery, local_ipv4_addresses
from ._peercache import PeerCacheKeeper
from ._pex import Pex
from ._relayclient import RelayClient, ServeInbound
from ._table import PeerTable
from ._tasks import Tasks
from ._tls import TlsConfig

log = logging.getLogger(__name__)


class Discovery:
    """The discovery parts of one node, started and stopped with its PeerManager."""

    def __init__(self, config: NodeConfig, node_id: str, tls: TlsConfig, table: PeerTable, tasks: Tasks,
                 establish: Establish, serve_inbound: ServeInbound, membership: Membership, clock: Clock):
        self._config = config
        self._clock = clock
        self._node_id = node_id
        self._table = table
        self.self_addrs: set[str] = set()  # addresses that turned out to be this node
        self.foreign = ForeignPeers(on_new_addr=self._on_foreign_addr)
        self.cache = PeerCacheKeeper(config.data_dir, node_id, table, tasks, self.foreign, self.self_addrs)
        self._membership = membership
        self._tasks = tasks
        self.dialer = Dialer(config, node_id, tls, table, tasks, self.foreign, self.self_addrs, establish,
                             membership)
        self.pex = Pex(node_id, table, tasks, self.foreign, self.self_addrs, self.dialer.dial_soon)
        self.pex.dialing = self.dialer.dialing  # a peer being dialled is not pushed out of the PEX pool
        self.relays = RelayClient(node_id, table, tasks, self.foreign, self.dialer.dial_soon, serve_inbound)
        self.dialer.ticket = self.relays.async_ticket
        self._mdns: MdnsDiscovery | None = None
        self._mdns_capped = False  # the mDNS pool was full with every record being dialled (said once)
        # called with the host's new IPv4 addresses when they change (the manager's listen addresses,
        # what HELLO and PEX tell peers, follow them)
        self.on_addresses: Callable[[list[str]], None] = lambda ips: None

    async def async_start(self, listen_addrs: list[str], listen_port: int) -> None:
        """Load the cache, set up targets, start mDNS and the loops."""
        self.pex.start(listen_addrs)
        await self.cache.async_load()
        ips = [parse_addr(a)[0] for a in listen_addrs if not is_loopback(parse_addr(a)[0])]
        if self._config.mdns:
            if not ips:
                log.info("DIAG: mdns not started %s", kv(reason="no non-loopback IPv4 address"))
            else:
                await self._async_start_mdns(ips, listen_port)
            self._tasks.spawn(self._async_retag_daily(), name="mdns-retag")
        if self._config.peer_host in ("", "0.0.0.0", "::"):  # listening everywhere: follow the host's addresses
            self._tasks.spawn(self._async_follow_addresses(ips, listen_port), name="follow-addresses")
        self.dialer.start()

    async def _async_start_mdns(self, ips: list[str], listen_port: int) -> None:
        mdns = MdnsDiscovery(self._node_id, listen_port, self._on_mdns_found, ips,
                             tag=self._mdns_tag, accept=self._accept_mdns_tag)
        try:
            await mdns.async_start()
            self._mdns = mdns
        except (OSError, NodeError) as exc:  # a node without multicast still works
            log.warning("DIAG: mdns failed to start %s", kv(error=exc))

    async def _async_follow_addresses(self, ips: list[str], listen_port: int) -> None:
        """A laptop changes networks (new DHCP lease, another Wi-Fi, offline at start): the listen
        addresses peers are told (HELLO, PEX) follow the host's (`on_addresses`), and zeroconf, bound
        to the addresses it saw at start and announcing those, starts again on the new ones (else the
        node is deaf and mute on the new LAN); a start that failed (the interface not ready yet) is
        tried again at the next check."""
        loop = asyncio.get_running_loop()
        current = list(ips)  # most likely reachable first (local_ipv4_addresses), as at start
        while True:
            await asyncio.sleep(const.MDNS_ADDRESS_CHECK_S)
            try:
                now = await loop.run_in_executor(None, local_ipv4_addresses)
            except OSError:
                continue
            changed = set(now) != set(current)  # what mDNS announces (a new order alone does not restart it)
            if now != current:  # the order too: the default route moved (Ethernet plugged in)
                log.info("DIAG: host addresses changed %s", kv(old=",".join(current), new=",".join(now)))
                current = now
                self.on_addresses(now)
            down = self._mdns is None or self._mdns.failed  # not started, or its registration failed
            if not self._config.mdns or not (changed or (down and now)):
                continue
            if self._mdns is not None:
                log.info("DIAG: mdns restarting after an address change %s", kv(addresses=",".join(now)))
                old, self._mdns = self._mdns, None
                try:
                    await old.async_stop()
                except Exception:  # the old interfaces may be gone; a failed goodbye changes nothing
                    log.debug("mdns stop after an address change failed", exc_info=True)
            if now:
                await self._async_start_mdns(now, listen_port)

    async def async_stop(self) -> None:
        """Stop mDNS and the pending cache save (the manager cancels the loops)."""
        self.cache.cancel_scheduled()
        if self._mdns is not None:
            await self._mdns.async_stop()
            self._mdns = None

    async def async_swarm_changed(self) -> None:
        """This node's swarm changed (join, leave): announce the new mDNS tag."""
        if self._mdns is not None:
            await self._mdns.async_update_tag()

    def _mdns_tag(self) -> tuple[str, int]:
        day = self._clock.day()
        return self._membership.swarm.mdns_tag(day), day

    def _accept_mdns_tag(self, node_id: str, tag: str, day: str | None) -> bool:
        return self._clock.accept_mdns(self._membership.swarm, node_id, tag, day)

    async def _async_retag_daily(self) -> None:
        """The tag rotates daily (a stranger cannot follow one swarm's announcements for long)."""
        while True:
            now = self._clock.now()
            await asyncio.sleep(const.MDNS_DAY_S - now % const.MDNS_DAY_S + 1)
            if self._mdns is not None:
                try:
                    await self._mdns.async_update_tag()
                except Exception:  # a failed update must not end the daily retag
                    log.warning("DIAG: mdns retag failed", exc_info=True)

    async def async_save_cache(self) -> None:
        """Write peers.json now."""
        await self.cache.async_save()

    # --- what the manager tells discovery -----------------------------------------------------

    def on_link_up(self, link: PeerLink) -> None:
        """A link won registration: remember its address, share peers, register at relays."""
        self.dialer.on_link_up(link)
        self.pex.send(link)
        self.relays.on_link_up(link)
        self.cache.schedule_save()

    def on_link_down(self, link: PeerLink) -> None:
        """The live link to a peer closed: forget its relay role, redial soon."""
        self.relays.on_link_down(link)
        self.dialer.on_link_down(link)
        self.cache.schedule_save()

    def handle_pex(self, link: PeerLink, frame: Frame) -> None:
        """A PEX frame (a malformed one closes the link)."""
        self.pex.handle(link, frame)

    def handle_relay_incoming(self, link: PeerLink, frame: Frame) -> None:
        """A relay announces a circuit to us."""
        self.relays.handle_incoming(link, frame)

    def registered_relays(self) -> list[str]:
        """Relay addresses this node holds a registration at."""
        return self.relays.registered_relays()

    async def async_connect(self, addr: str, node_id: str | None, *, site: str) -> PeerLink:
        """Dial addr directly now (node_id: the identity it must prove; None accepts any)."""
        return await self.dialer.async_connect(addr, node_id, site=site)

    # --- callbacks from the parts -------------------------------------------------------------

    def _mdns_room(self) -> bool:
        """Room for one more never-linked peer from mDNS: the oldest not being dialled makes it when
        the pool is full (a member announcing itself after a flood is still learnt); False (a WARNING
        once per episode) when every one is being dialled."""
        unlinked = self._table.never_linked_records("mdns")
        if len(unlinked) < const.MDNS_MAX_UNLINKED:
            self._mdns_capped = False
            return True
        victim = next((rec for rec in unlinked if not self.dialer.dialing(rec.node_id)), None)
        if victim is not None:
            self._table.forget(victim)
            return True
        if not self._mdns_capped:
            self._mdns_capped = True
            log.warning("DIAG: peers from mdns not learnt, too many unlinked ones being dialled %s",
                        kv(unlinked=len(unlinked), max_unlinked=const.MDNS_MAX_UNLINKED))
        return False

    def _on_foreign_addr(self) -> None:
        self.cache.schedule_save()

    def _on_mdns_found(self, node_id: str, addrs: list[str]) -> None:
        """An announcement with our swarm's tag. The tag is public on the LAN, so its node id and
        addresses are a stranger's word: never this machine's loopback (mDNS runs on other
        interfaces; a LAN host announcing 127.0.0.1 had this node dial its own services), and at
        most MDNS_MAX_UNLINKED never-linked peers from it (2026-12-07: made-up ids were learnt and
        dialled without bound)."""
        if self.foreign.skip(node_id, "mdns"):
            return
        addrs = [a for a in addrs if dialable(a, from_loopback=False)]
        if not addrs or (self._table.get(node_id) is None and not self._mdns_room()):
            return
        rec = self._table.record(node_id, "mdns")
        if any([rec.add_addr(a) for a in addrs]):
            self.dialer.dial_soon(rec)
