"""The app with the real peer network: a second node on loopback shows up in the Peers table, and
a request that runs across both nodes shows its distributed route, segment by segment."""

from __future__ import annotations

import openai
import pytest

from app.host import AppState
from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_a_peer_and_a_distributed_request(qtbot, run, tmp_path, tiny_model):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    async def body():
        # The app's node serves layer 0 of the 2-layer model; node B serves layer 1.
        async with running_app(node_config(tmp_path / "a", tiny_model, layers="0-0")) as app:
            assert app.host.state == AppState.SERVING  # it holds a slice for the swarm
            slice_key = next(k for k in app.feeds.models.keys() if "@" in k)
            assert app.feeds.models.cell_text(slice_key, "Layers held") == "0–0 of 2"
            peer_port = app.node.peers.listen_port
            b = Node(node_config(tmp_path / "b", tiny_model, layers="1-1",
                                 bootstrap=[f"127.0.0.1:{peer_port}"]))
            await b.start()
            try:
                peers = app.feeds.peers
                await wait_until(lambda: peers.cell_text(b.node_id, "State") == "connected",
                                 DEADLINE_S, what="peer B in the table")
                assert peers.cell_text(b.node_id, "Peer") == b.short_id
                assert peers.cell_text(b.node_id, "Link") == "direct"
                await wait_until(lambda: "tiny" in peers.cell_text(b.node_id, "Models and layers"),
                                 DEADLINE_S, what="peer B's models")
                assert peers.cell_text(b.node_id, "Models and layers") == "tiny [1–1 of 2]"
                assert app.feeds.overview.text("Peers") == "1 connected"
                await wait_until(lambda: app.host.serving().swarm,
                                 DEADLINE_S, what="the swarm to cover the model")
                # what this node holds and what the swarm adds: its layer, and the whole model via peers
                assert app.host.serving().describe() == "layers tiny[0-0]; via peers tiny"
                assert "serving: layers tiny[0-0]; via peers tiny at http://" in app.host.status_line()

                client = openai.AsyncOpenAI(base_url=app.node.api_url, api_key=app.node.api_key, max_retries=0)
                try:
                    reply = await client.chat.completions.with_raw_response.create(
                        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                finally:
                    await client.close()
                request_id = reply.headers["x-request-id"]
                rows = app.feeds.requests
                # (a reply max_tokens cut says so beside "ok")
                outcome = "ok" if reply.parse().choices[0].finish_reason == "stop" else "ok · cut at max tokens"
                await wait_until(lambda: rows.cell_text(request_id, "Outcome") == outcome,
                                 DEADLINE_S, what="the finished row")
                assert rows.cell_text(request_id, "Route") == reply.headers["x-swarm-route"] == "distributed"
                assert rows.cell_text(request_id, "Nodes") == f"{app.node.short_id},{b.short_id}"
                tab = app.window.requests_tab
                tab.select(request_id)
                assert tab.segments.rowCount() == 2
                assert tab.segments.cell_text(1, "Node") == b.short_id
                assert tab.segments.cell_text(1, "Layers") == "1–1"
                assert tab.segments.cell_text(1, "Transport") == "direct"
                assert "route=distributed" in tab.summary.toPlainText()
            finally:
                await b.stop()
            await wait_until(lambda: peers.cell_text(b.node_id, "State") != "connected",
                             DEADLINE_S, what="peer B to leave")

    run(body())
