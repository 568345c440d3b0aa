"""Fixtures for the peer-network tests: in-process managers on 127.0.0.1, fast timing."""

from __future__ import annotations

import itertools

import pytest

from node import const
from node.config import NodeConfig
from node.net import PeerManager, load_or_create_identity
from tests.support.swarm import join_test_swarm

# Timing for tests: short intervals so liveness, redial and rendezvous happen in a second or two.
FAST = {
    "PING_INTERVAL_S": 0.3,
    "RECONNECT_BACKOFF_MIN_S": 0.1,
    "RECONNECT_BACKOFF_MAX_S": 1.0,
    "DIAL_MAINTENANCE_INTERVAL_S": 0.1,
    "RELAY_LIST_INTERVAL_S": 0.3,
    "PEER_CACHE_SAVE_DELAY_S": 0.05,
}


@pytest.fixture
def fast_net(monkeypatch):
    """Patch node.const with test timing (modules read const at call time)."""
    for name, value in FAST.items():
        monkeypatch.setattr(const, name, value)
    return FAST


@pytest.fixture
async def make_manager(tmp_path):
    """Factory: `await make_manager(name, **NodeConfig fields)` → a started PeerManager on
    127.0.0.1 with its own data dir and an ephemeral peer port. All are stopped at teardown."""
    made: list[PeerManager] = []
    counter = itertools.count()

    async def make(name: str | None = None, *, start: bool = True, **fields) -> PeerManager:
        data_dir = join_test_swarm(tmp_path / (name or f"node{next(counter)}"))
        cfg = NodeConfig(data_dir=data_dir, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False)
        for key, value in fields.items():
            setattr(cfg, key, value)
        manager = PeerManager(cfg, load_or_create_identity(data_dir))
        made.append(manager)
        if start:
            await manager.async_start()
        return manager

    yield make
    for manager in reversed(made):
        await manager.async_stop()

