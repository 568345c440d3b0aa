"""Layer slices that load or fail after the node started, with nothing else served: the app's
state follows the slice host (`SliceHost.subscribe`), as it follows the model manager.

Seen: NodeHost listened to the model manager, peers and contributions only, and `--serve auto`'s
slices (the Swarm tab's "Help serve" likewise) load in the background after the node started: a
node that served its chosen layers kept saying "no model can serve" with the first-run banner (or
"loading" when another event came while the slice loaded: a spinner for ever); only the Models tab
followed. A `--layers` slice the tray's Resume loads that fails is shown as whole models' failures
are (state "error", the banner naming it, the Models tab's row "failed").
"""

from __future__ import annotations

import pytest

from app.host import AppState
from node.inference.synth import SynthSpec, write_gguf
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import TINY, node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def wrong_layer_count(path):
    """A GGUF whose header claims one more layer than it has tensors for: it is catalogued (the
    header reads fine) and the slice engine fails on the missing layer's tensors."""
    write_gguf(path, SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256,
                               name="wrongcount"))
    data = bytearray(path.read_bytes())
    key = b"llama.block_count"
    at = data.index(key) + len(key)
    assert int.from_bytes(data[at + 4:at + 8], "little") == 2  # value type (u32), then the value
    data[at + 4:at + 8] = (3).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def slice_rows(tray_app) -> list[dict]:
    models = tray_app.window.models_tab.model
    return [r for r in (models.value(k) for k in models.keys()) if r.get("engine") == "torch-slice"]


def test_layers_chosen_after_start_make_the_app_serving(qtbot, run, data_dir, tmp_path):
    model = tmp_path / "tiny.gguf"
    write_gguf(model, TINY)

    async def body():
        async with running_app(node_config(data_dir, model, serve="auto")) as tray_app:
            host = tray_app.host
            assert not host.serving().slices_loaded  # the automatic choice waits AUTO_SERVE_LOOK_S first
            await wait_until(lambda: host.serving().slices_loaded, DEADLINE_S,
                             what="the automatic choice's slice to load")
            await wait_until(lambda: host.state == AppState.SERVING, DEADLINE_S,
                             what=f"the app to say it serves (it says {host.state})")
            assert "layers" in host.status_line(), host.status_line()
            assert host.first_run_text() is None
            await wait_until(lambda: not tray_app.window.overview_tab.banner.isVisible(), DEADLINE_S,
                             what="the first-run banner to go")
            assert any(r.get("state") == "loaded" for r in slice_rows(tray_app)), slice_rows(tray_app)

    run(body())


def test_a_layers_slice_that_fails_on_resume_shows_as_an_error_with_its_reason(qtbot, run, data_dir, tmp_path):
    model = wrong_layer_count(tmp_path / "wrongcount.gguf")

    async def body():
        async with running_app(node_config(data_dir, model, layers="0-2", contribute=False)) as tray_app:
            host = tray_app.host
            slice_host = host.node.slice_host
            host.set_contributing(True)  # the tray's "Resume contributing": the --layers slice loads now
            await wait_until(lambda: any(s.state == "failed" for s in slice_host.slices.values()), DEADLINE_S,
                             what="the --layers slice to fail to load")
            failed = next(s for s in slice_host.slices.values() if s.state == "failed")
            await wait_until(lambda: host.state == AppState.ERROR, DEADLINE_S,
                             what=f"the app's state to say the failure (it says {host.state})")
            banner = tray_app.window.overview_tab.banner
            await wait_until(lambda: banner.isVisible() and "failed to load" in banner.text.text(), DEADLINE_S,
                             what="the first-run banner to name the failure")
            said = banner.text.text()
            assert f"of {failed.entry.id} failed to load: {failed.error}" in said, said
            assert any(r.get("state") == "failed" for r in slice_rows(tray_app)), slice_rows(tray_app)

    run(body())
