"""Foreign peers: endpoints that turned out not to speak SwarmLLM, never dialled again.

An address whose far end is not a SwarmLLM node (HTTP, SSH, garbage, no preamble) is logged once
at INFO and remembered, in peers.json too, so a restart does not dial it again. A node id that
proved an identity but speaks another protocol version is remembered for this run: PEX, mDNS and
relay rendezvous then skip it (`Not dialling a peer that does not speak SwarmLLM` at DEBUG).
Each kind keeps at most `const.FOREIGN_PEERS_MAX` entries, the oldest dropped first (a forgotten
one is dialled once more and remembered again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from node import const
from node.logs import kv

from ._identity import short_id
from ._messages import NotSwarmPeer

log = logging.getLogger(__name__)

_NOT_DIALLING = "Not dialling a peer that does not speak SwarmLLM %s"


class ForeignPeers:
    """Foreign addresses (with the site that first met each) and foreign node ids."""

    def __init__(self, on_new_addr: Callable[[], None]) -> None:
        self.addrs: dict[str, str] = {}  # address -> site: bootstrap, relay, peer, api, cache
        self.ids: dict[str, None] = {}  # node ids, oldest first
        self._on_new_addr = on_new_addr  # e.g. save peers.json soon

    def load(self, addrs: Iterable[str]) -> None:
        """Addresses remembered in peers.json."""
        self.addrs.update({addr: "cache" for addr in addrs})
        _bound(self.addrs)

    def check_addr(self, addr: str, node_id: str | None, site: str) -> None:
        """Raise NotSwarmPeer (logged at DEBUG) if addr is known not to speak SwarmLLM."""
        if addr in self.addrs:
            log.debug(_NOT_DIALLING, kv(peer_id=short_id(node_id) if node_id else None, addr=addr, site=site))
            raise NotSwarmPeer(f"{addr} does not speak SwarmLLM")

    def skip(self, node_id: str, site: str) -> bool:
        """True (logged at DEBUG) if a peer learnt from site (pex, mdns) is a foreign node id."""
        if node_id not in self.ids:
            return False
        log.debug(_NOT_DIALLING, kv(peer_id=short_id(node_id), site=site))
        return True

    def note_addr(self, addr: str, exc: NotSwarmPeer, site: str) -> None:
        """A dial found a non-SwarmLLM endpoint at addr: INFO the first time, then remember it."""
        if addr in self.addrs:
            return
        self.addrs[addr] = site
        _bound(self.addrs)
        log.info("Ignoring a peer that does not speak SwarmLLM %s",
                 kv(addr=addr, protocol_version=exc.protocol_version, agent=exc.agent, site=site,
                    reason=exc.message))
        self._on_new_addr()

    def note_id(self, node_id: str) -> None:
        """node_id proved an identity but speaks another protocol."""
        self.ids[node_id] = None
        _bound(self.ids)

    def speaks_swarm(self, node_id: str) -> None:
        """A link to node_id came up: it speaks our protocol now."""
        self.ids.pop(node_id, None)


def _bound(entries: dict) -> None:
    """Drop the oldest entries past FOREIGN_PEERS_MAX (dicts keep insertion order)."""
    while len(entries) > const.FOREIGN_PEERS_MAX:
        del entries[next(iter(entries))]
