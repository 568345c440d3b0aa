"""`peers.json` in the data dir: peers seen before (dialled at start-up) and foreign addresses.

Blocking file I/O; the manager calls these through an executor. Writes are atomic (temp file +
rename) so a crash never leaves half a cache; a corrupt cache is logged and ignored.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from node.logs import kv

from ._identity import is_node_id

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


@dataclass
class PeerCache:
    """Contents of peers.json."""

    peers: list[CachedPeer] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # addresses that do not speak SwarmLLM


def _str_list(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)][:16] if isinstance(value, list) else []


def load_peer_cache(data_dir: Path) -> PeerCache:
    """Read peers.json; an absent or unreadable file gives an empty cache."""
    path = data_dir / PEER_CACHE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return PeerCache()
    except (OSError, ValueError) as exc:
        log.warning("peer cache %s is unreadable, ignoring it: %s", path, exc)
        return PeerCache()
    if not isinstance(data, dict):
        return PeerCache()
    peers = []
    for item in data.get("peers", []) if isinstance(data.get("peers"), list) else []:
        if isinstance(item, dict) and is_node_id(item.get("node_id")):
            seen = item.get("last_seen")
            peers.append(CachedPeer(item["node_id"], _str_list(item.get("addrs")),
                                    _str_list(item.get("relays")),
                                    float(seen) if isinstance(seen, int | float) else None))
    cache = PeerCache(peers, _str_list(data.get("foreign")))
    log.debug("DIAG: peer cache loaded %s", kv(count=len(cache.peers), foreign=len(cache.foreign)))
    return cache


def save_peer_cache(data_dir: Path, cache: PeerCache) -> None:
    """Write peers.json atomically."""
    path = data_dir / PEER_CACHE_FILE
    data = {
        "version": _VERSION,
        "peers": [{"node_id": p.node_id, "addrs": p.addrs, "relays": p.relays, "last_seen": p.last_seen}
                  for p in cache.peers],
        "foreign": cache.foreign,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    log.debug("DIAG: peer cache saved %s", kv(count=len(cache.peers)))
