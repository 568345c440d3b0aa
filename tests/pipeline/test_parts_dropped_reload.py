"""A slice dropped because its parts proved altered is not revived by a load of its range asked for
before its unload ran (2026-12-07, found in the lifecycle hunt): the load kept the draining slice
("slice kept"), and the unload queued by the drop then freed it, leaving the range "loaded" with
no weights until the next layer choice. Now such a slice is put aside like one whose file changed
(`drained_changed`): the load reads the range afresh, and the unload frees only the old one."""

from __future__ import annotations

from tests.support.waiting import wait_until


async def test_a_load_of_a_dropped_slices_range_loads_it_afresh(worker):
    w, entry, _peers = worker
    host = w.host
    old = host.find(entry.sha256, 0, entry.n_layers)
    host._parts_dropped(entry, ["layer-0000"])  # (the partial model's check: its bytes were altered)
    assert old.state == "draining"
    new = await host.async_load(entry, 0, entry.n_layers)  # the layer choice, before the unload ran
    assert new is not old, "the dropped slice was revived"
    await wait_until(lambda: old.state == "unloaded" and not host._unloads, 30, what="the old slice freed")
    assert new.state == "loaded" and new.model is not None
    assert host.find(entry.sha256, 0, entry.n_layers) is new
