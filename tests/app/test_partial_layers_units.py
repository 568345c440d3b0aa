"""A slice of a partial model (layers fetched from the origin) read "layers 2–3 of 4, 25 MB of
49 MB" in the Models tab's Layers held, beside "47.1 MiB" in Size for the same file (seen under
Xvfb): the node's line in MB (10^6) next to the table's MiB. The cell now uses the table's units.
A real node serving layers 2-3 of a model from a local Range origin."""

from __future__ import annotations

import pytest

from app.ui import fmt
from node.inference.synth import SynthSpec, write_gguf
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]

# ~10 MiB: its MB and MiB figures differ
FOUR = SynthSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, n_ctx=512, name="four")


def test_layers_held_of_a_partial_model_in_the_size_columns_units(qtbot, run, tmp_path):
    path = tmp_path / "four.gguf"
    write_gguf(path, FOUR)

    async def body():
        with ThreadedOrigin(path.read_bytes(), "four.gguf") as origin:
            async with running_app(node_config(tmp_path / "a", layers="2-3", models=[origin.url])) as app:
                rows = app.feeds.models

                def slice_row():
                    return next((k for k in rows.keys() if (rows.summary(k) or {}).get("partial")
                                 and (rows.summary(k) or {}).get("state") == "loaded"), None)
                await wait_until(lambda: slice_row() is not None, DEADLINE_S, what="the slice loaded")
                key = slice_row()
                summary, held = rows.summary(key), rows.cell_text(key, "Layers held")
                assert rows.cell_text(key, "Size") == fmt.size(summary["size_bytes"])
                assert held == f"layers 2–3 of 4, {fmt.size(summary['held_bytes'])} of {fmt.size(summary['size_bytes'])}", \
                    (held, summary["partial"])

    run(body())
