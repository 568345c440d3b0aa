"""`peers.json` in the data dir: peers seen before (dialled at start-up) and foreign addresses.

`load_peer_cache` / `save_peer_cache` are blocking file I/O, run in an executor. Writes are atomic
(temp file + rename) so a crash never leaves half a cache; a damaged cache is logged and kept aside
(peers.json.broken).
`PeerCacheKeeper` is the glue on the loop: it fills the peer table and the foreign addresses at
start, and saves (debounced, `PEER_CACHE_SAVE_DELAY_S`) when links come and go, and at stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from node import const
from node.datadir import keep_aside, read_data_file
from node.logs import kv

from ._foreign import ForeignPeers
from ._identity import is_node_id
from ._table import PeerTable
from ._tasks import Tasks

log = logging.getLogger(__name__)

PEER_CACHE_FILE = "peers.json"
_VERSION = 1


@dataclass
class CachedPeer:
    """One remembered peer."""

    node_id: str
    addrs: list[str] = field(default_factory=list)
    relays: list[str] = field(default_factory=list)
    last_seen: float | None = None
    failing: dict[str, list[float]] = field(default_factory=dict)  # addr -> [failing since (unix), failed dials]
    relay: bool = False  # it runs a relay service (a --no-direct node still dials it directly)


@dataclass
class PeerCache:
    """Contents of peers.json."""

    peers: list[CachedPeer] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # addresses that do not speak SwarmLLM


def _str_list(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)][:16] if isinstance(value, list) else []


def _failing(value: object, addrs: list[str]) -> dict[str, list[float]]:
    if not isinstance(value, dict):
        return {}
    return {a: [float(v[0]), float(v[1])] for a, v in value.items()
            if a in addrs and isinstance(v, list) and len(v) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)}


def load_peer_cache(data_dir: Path) -> PeerCache:
    """Read peers.json (read again briefly when locked a moment: 2026-12-07, review r38); an absent or
    unreadable file gives an empty cache."""
    path = data_dir / PEER_CACHE_FILE
    try:
        data = json.loads(read_data_file(path).decode("utf-8"))
    except FileNotFoundError:
        return PeerCache()
    except OSError as exc:
        log.warning("peer cache %s is unreadable, ignoring it: %s", path, exc)
        return PeerCache()
    except ValueError as exc:  # damaged: kept aside (the next save would overwrite it), as swarm.json is
        _keep_aside(path, exc)
        return PeerCache()
    if not isinstance(data, dict):
        _keep_aside(path, "not a JSON object")
        return PeerCache()
    peers = []
    for item in data.get("peers", []) if isinstance(data.get("peers"), list) else []:
        if isinstance(item, dict) and is_node_id(item.get("node_id")):
            seen = item.get("last_seen")
            addrs = _str_list(item.get("addrs"))
            peers.append(CachedPeer(item["node_id"], addrs, _str_list(item.get("relays")),
                                    float(seen) if isinstance(seen, int | float) else None,
                                    _failing(item.get("failing"), addrs), item.get("relay") is True))
    cache = PeerCache(peers, _str_list(data.get("foreign")))
    log.debug("DIAG: peer cache loaded %s", kv(count=len(cache.peers), foreign=len(cache.foreign)))
    return cache


def _keep_aside(path: Path, why: object) -> None:
    """Move a damaged peers.json to peers.json.broken (-2, -3... never over an earlier one): the peers
    it named stay for the user to look at (until 2026-12-06 the first save overwrote it)."""
    try:
        broken = keep_aside(path)
    except OSError as exc:
        log.warning("peer cache %s is damaged, ignoring it: %s (could not move it aside: %s)", path, why,
                    exc.strerror or exc)
        return
    log.warning("peer cache %s is damaged, starting without it (the old file is %s): %s", path, broken.name, why)


def save_peer_cache(data_dir: Path, cache: PeerCache) -> None:
    """Write peers.json atomically."""
    path = data_dir / PEER_CACHE_FILE
    data = {
        "version": _VERSION,
        "peers": [{"node_id": p.node_id, "addrs": p.addrs, "relays": p.relays, "last_seen": p.last_seen,
                   "failing": p.failing, **({"relay": True} if p.relay else {})} for p in cache.peers],
        "foreign": cache.foreign,
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a full disk: the old file stays whole, and no empty .tmp is left beside it
        tmp.unlink(missing_ok=True)
        raise
    log.debug("DIAG: peer cache saved %s", kv(count=len(cache.peers)))


class PeerCacheKeeper:
    """Keeps peers.json in step with the peer table and the foreign addresses."""

    def __init__(self, data_dir: Path, node_id: str, table: PeerTable, tasks: Tasks,
                 foreign: ForeignPeers, self_addrs: set[str]):
        self._data_dir = data_dir
        self._node_id = node_id
        self._table = table
        self._tasks = tasks
        self._foreign = foreign
        self._self_addrs = self_addrs  # never saved as a peer's address
        self._save_handle: asyncio.TimerHandle | None = None

    async def async_load(self) -> None:
        """Read peers.json (in an executor) into the table (source "cache") and the foreign list."""
        cache = await asyncio.get_running_loop().run_in_executor(None, load_peer_cache, self._data_dir)
        self._foreign.load(cache.foreign)
        for peer in cache.peers:
            if peer.node_id == self._node_id:
                continue
            rec = self._table.record(peer.node_id, "cache")
            rec.last_seen = peer.last_seen
            for addr in peer.addrs:
                rec.add_addr(addr)
            for addr, entry in peer.failing.items():  # how long each has failed counts across restarts
                if addr in rec.addrs:
                    rec.addr_failing.setdefault(addr, list(entry))
            for relay in peer.relays:
                rec.add_relay(relay)
            rec.was_relay = peer.relay

    def schedule_save(self) -> None:
        """Save peers.json soon (debounced)."""
        if self._save_handle is None and not self._tasks.stopping:
            loop = asyncio.get_running_loop()
            self._save_handle = loop.call_later(
                const.PEER_CACHE_SAVE_DELAY_S,
                lambda: self._tasks.spawn(self.async_save(), name="peer-cache-save"))

    def cancel_scheduled(self) -> None:
        """Drop a pending debounced save (the stop path saves once itself)."""
        if self._save_handle is not None:
            self._save_handle.cancel()

    async def async_save(self) -> None:
        """Write peers.json now (in an executor)."""
        self._save_handle = None
        now = time.time()
        recs = sorted(self._table, key=lambda r: -(now if r.link else (r.last_seen or 0)))
        peers = []
        for r in recs:
            if (r.addrs or r.relays) and r.node_id not in self._foreign.ids:
                addrs = [a for a in r.addrs if a not in self._self_addrs][:8]
                peers.append(CachedPeer(r.node_id, addrs, r.relays[:4], now if r.link else r.last_seen,
                                        {a: list(r.addr_failing[a]) for a in addrs if a in r.addr_failing},
                                        r.is_relay))
        cache = PeerCache(peers[: const.PEER_CACHE_MAX], list(self._foreign.addrs))  # bounded there, oldest first
        try:
            await asyncio.get_running_loop().run_in_executor(None, save_peer_cache, self._data_dir, cache)
        except OSError as exc:
            log.warning("DIAG: peer cache save failed %s", kv(error=exc))
