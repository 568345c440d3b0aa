"""A failed automatic choice, then a budget that fits no layer (2026-12-07, review r27).

Seen: after a "Help serve" model's layers failed to load, the user moved its budget down to one
that fits no layer: nothing would load again, yet the app stayed "error" with the first-run banner's
"… failed to load: …; chosen again at <a time now past>" and the Swarm tab said the same instead of
"The budget fits no layer". A new budget now ends the old choice's failure."""

from __future__ import annotations

import pytest

from app.host import AppState
from node.inference.synth import SynthSpec, write_gguf
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def wide_wrong_layer_count(path):
    """~4 M weights a layer (1 MB fits none at any slice dtype), its header claiming one layer more than it has tensors for."""
    write_gguf(path, SynthSpec(n_layers=2, hidden=512, n_heads=4, n_kv_heads=2, ffn=2048, vocab=512, n_ctx=256,
                               name="widewrong"))
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.block_count") + len(b"llama.block_count")
    data[at + 4:at + 8] = (3).to_bytes(4, "little")  # after the value type (u32)
    path.write_bytes(bytes(data))
    return path


def test_a_budget_fitting_no_layer_after_a_failure_says_so_not_the_old_failure(qtbot, run, data_dir, tmp_path):
    model = wide_wrong_layer_count(tmp_path / "widewrong.gguf")

    async def body():
        async with running_app(node_config(data_dir, model, serve="auto")) as tray_app:
            host = tray_app.host
            node = host.node
            model_id = node.catalog.resolve("widewrong").id
            await host.async_help_serve(model_id, 200)
            await wait_until(lambda: node.autoserve.failures() and host.state == AppState.ERROR, DEADLINE_S,
                             what="the choice to fail and the app to say so")
            panel = tray_app.window.swarm_tab.contribute
            panel.set_model(model_id)
            await host.async_help_serve(model_id, 1)  # the user moves the slider down: 1 MB fits no layer
            await wait_until(lambda: (panel.refresh() or "fits no layer" in panel.status.text()), DEADLINE_S,
                             what=f"the Swarm tab to say the budget fits no layer (it says {panel.status.text()!r})")
            assert host.state != AppState.ERROR and not node.autoserve.failures(), host.state
            banner = host.first_run_text() or ""
            assert "failed to load" not in banner, banner

    run(body())
