"""The Responses store: least recently used out first, by count and by bytes; entries expire."""

from __future__ import annotations

from node import const
from node.api.response_store import ResponseStore


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_store_is_lru_by_count_bytes_and_time(monkeypatch):
    monkeypatch.setattr(const, "RESPONSE_STORE_MAX", 3)
    monkeypatch.setattr(const, "RESPONSE_STORE_MAX_BYTES", 10_000)
    monkeypatch.setattr(const, "RESPONSE_STORE_TTL_S", 100.0)
    clock = Clock()
    store = ResponseStore(clock)
    for name in "abc":
        store.put(name, {"id": name}, ({"role": "user", "content": name},))
    assert store.get("a") is not None  # a is now the most recently used
    store.put("d", {"id": "d"}, ())
    assert [k for k in "abcd" if store.get(k)] == ["a", "c", "d"]
    store.put("big", {"id": "big"}, ({"role": "user", "content": "x" * 9_950},))  # pushes the oldest out
    assert store.get("a") is None and store.get("big") is not None and store.bytes <= 10_000
    store.put("huge", {"id": "huge"}, ({"role": "user", "content": "x" * 20_000},))  # larger than the store
    assert store.get("huge") is None and store.get("big") is not None
    clock.now = 100.0
    assert store.get("big") is None and len(store) == 0 and store.bytes == 0
