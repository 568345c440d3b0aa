"""The layer map after a peer of the last request's chain leaves: the line under the chain counted
the hops it could still draw, so a request that ran B → this node read "last request: 1 hop" under
a hop numbered 2 once B had stopped (seen under Xvfb: B serving layers 0-3, this node 4-7, B's
process gone). It now says the request's hops and that one ran on a node no longer serving it.
Real swarm on loopback: B serves layers 0-1 of a 4-layer model from a local origin, the app's node
layers 2-3 (`--layers`); a chat runs on the chain, then B stops."""

from __future__ import annotations

import openai
import pytest

from node.inference.synth import SynthSpec, write_gguf
from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui, pytest.mark.slow]

FOUR = SynthSpec(n_layers=4, hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_ctx=512, name="four")


def test_the_chain_line_keeps_the_hops_of_a_peer_gone(qtbot, run, tmp_path):
    path = tmp_path / "four.gguf"
    write_gguf(path, FOUR)

    async def body():
        with ThreadedOrigin(path.read_bytes(), "four.gguf") as origin:
            b = Node(node_config(tmp_path / "b", layers="0-1", models=[origin.url]))
            await b.start()
            stopped = False
            try:
                config = node_config(tmp_path / "a", layers="2-3", models=[origin.url],
                                     bootstrap=[f"127.0.0.1:{b.peers.listen_port}"])
                async with running_app(config) as app:
                    layer_map, view = app.feeds.layer_map, app.window.swarm_tab.map_view

                    def both_loaded() -> bool:
                        m = layer_map.current()
                        return m is not None and not m.gaps and len(m.holders) == 2 \
                            and not any(h.loading for h in m.holders)
                    await wait_until(both_loaded, DEADLINE_S, what="both holders in the map, loaded")
                    model_id = layer_map.current().model_id
                    await wait_until(lambda: model_id in [m["id"] for m in app.node.list_openai_models()],
                                     DEADLINE_S, what="the split model served")
                    client = openai.AsyncOpenAI(base_url=app.node.api_url, api_key=app.node.api_key, max_retries=0)
                    try:
                        await client.chat.completions.create(
                            model=model_id, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
                    finally:
                        await client.close()
                    await wait_until(lambda: sum(h.hop is not None for h in layer_map.current().holders) == 2,
                                     DEADLINE_S, what="the chain drawn")
                    assert "last request: 2 hops," in view.describe()
                    await b.stop()
                    stopped = True
                    await wait_until(lambda: len(layer_map.current().holders) == 1, DEADLINE_S,
                                     what="B gone from the map")
                    m = view.map
                    assert [h.hop for h in m.holders] == [1]  # this node's hop, still numbered 2
                    line = m.chain_text()
                    assert line.startswith("last request: 2 hops (1 on a node no longer serving it"), line
                    assert line in view.describe()
            finally:
                if not stopped:
                    await b.stop()

    run(body())
