"""A peer's ping changes nothing the Swarm tab shows, so it must not redraw the layer map.

Every RTT measurement is a peer "changed" event; the app rebuilt every model's map on each one and
refreshed every holder row (one dataChanged per row, and the tab re-read the picker, the map and
the Contribute panel on each). With 12 peers (one ping each every 2 s) and a 10-holder model on
screen that was ~6 rebuilds a second, ~200 000 Qt data() calls per 10 s and a quarter of a CPU
with nothing happening, and loop steps of 100-250 ms while a request ran. A map that did not
change now emits nothing. Real nodes: B serves layers 0-1 of a model from a local origin.
"""

from __future__ import annotations

import pytest

from node import const
from node.inference.synth import SynthSpec, write_gguf
from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]

PINGS = 8


def test_pings_alone_do_not_redraw_the_layer_map(run, tmp_path, monkeypatch):
    monkeypatch.setattr(const, "PING_INTERVAL_S", 0.2)  # many pings in a short test
    path = tmp_path / "four.gguf"
    write_gguf(path, SynthSpec(n_layers=4, hidden=64, n_ctx=256, name="four"))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()

    async def body():
        with ThreadedOrigin(path.read_bytes(), "four.gguf") as origin:
            b = Node(node_config(tmp_path / "b", layers="0-1", models=[origin.url]))
            await b.start()
            try:
                config = node_config(tmp_path / "a", bootstrap=[f"127.0.0.1:{b.peers.listen_port}"])
                async with running_app(config) as app:
                    app.window.show_tab("Swarm")
                    layer_map = app.feeds.layer_map
                    await wait_until(lambda: layer_map.current() is not None and layer_map.rowCount() == 1,
                                     DEADLINE_S, what="B's layers in the map")
                    await wait_until(lambda: app.window.swarm_tab.contribute.cost.get(layer_map.current().model_id),
                                     DEADLINE_S, what="the model sized")
                    pings, redraws = [], []
                    unsubscribe = app.node.peers.subscribe(lambda kind, _snap: pings.append(kind))
                    for signal in (layer_map.dataChanged, layer_map.modelReset, layer_map.rowsInserted):
                        signal.connect(lambda *_a: redraws.append(1))
                    try:
                        await wait_until(lambda: pings.count("changed") >= PINGS, DEADLINE_S,
                                         what=f"{PINGS} ping results")
                    finally:
                        unsubscribe()
                    assert layer_map.rowCount() == 1
                    assert len(redraws) <= 1, (
                        f"{pings.count('changed')} peer changes (pings) redrew an unchanged layer map "
                        f"{len(redraws)} times")
            finally:
                await b.stop()

    run(body())
