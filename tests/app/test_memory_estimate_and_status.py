"""Before pressing Load, the Models tab says what a model takes and whether that fits; the status
bar stays readable with many long model ids.

Seen: an unloaded model's Memory read "—" (and a loaded one its file size alone, without its KV
cache), so a user deciding whether to load a model could not tell what it costs; the status bar's
"serving: <every model id>; …" ran off the window's right edge.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.ui import fmt
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def _memory_cell(tab, model_id: str):
    column = [c.title for c in tab.model.columns].index("Memory")
    return tab.model.index(tab.model.row_of(model_id), column)


def test_an_unloaded_model_shows_what_a_load_takes_and_whether_it_fits(qtbot, run, data_dir, tiny_model,
                                                                        monkeypatch):
    async def body():
        async with running_app(node_config(data_dir, tiny_model, n_ctx=2048)) as tray_app:
            host, tab = tray_app.host, tray_app.window.models_tab
            (model_id,) = [m.id for m in host.node.models.whole_models()]
            estimate = host.node.models.get(model_id).summary()["memory_estimate"]
            # 2 layers x 2 KV heads x (16 + 16) dims x F16, over every sequence's 2048 tokens
            assert estimate["kv_bytes"] == estimate["kv_tokens"] * 2 * 2 * 32 * 2 > 0
            assert estimate["total_bytes"] == tiny_model.stat().st_size + estimate["kv_bytes"]
            await host.async_unload(model_id)
            cell = _memory_cell(tab, model_id)
            await wait_until(lambda: cell.data() == f"≈ {fmt.size(estimate['total_bytes'])} to load", DEADLINE_S,
                             what="the Memory column to say what a load takes")
            assert "KV cache" in cell.data(Qt.ItemDataRole.ToolTipRole)

            tab.view.clearSelection()
            tab.select(model_id)
            await wait_until(lambda: "of RAM is free" in tab.status.full_text, DEADLINE_S,
                             what="the free memory beside the estimate")

            monkeypatch.setattr("app.ui.models_tab.ram_available_bytes", lambda: 2**20)  # 1 MiB free
            tab.view.clearSelection()
            tab.select(model_id)
            await wait_until(lambda: "more than the 1.0 MiB of RAM free now" in tab.status.full_text, DEADLINE_S,
                             what="a load that does not fit to say so")
            tab.load_selected()
            await wait_until(lambda: tab.status.full_text.startswith(f"{model_id} loaded (") and
                             "may not fit" in tab.status.full_text, DEADLINE_S, what="the load, with its warning")
            assert _memory_cell(tab, model_id).data() == f"≈ {fmt.size(estimate['total_bytes'])}"

    run(body())


def test_the_status_bar_counts_models_and_lists_them_in_its_tooltip(qtbot, run, data_dir, tiny_model, long_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model, long_model)) as tray_app:
            host, window = tray_app.host, tray_app.window
            await wait_until(lambda: all(m.state == "loaded" for m in host.node.models.whole_models()), DEADLINE_S,
                             what="both models to load")
            ids = [m.id for m in host.node.models.whole_models()]
            await wait_until(lambda: "serving: 2 models at http" in window.state_label.full_text, DEADLINE_S,
                             what="the status bar to count the models")
            assert not any(i in window.state_label.full_text for i in ids)
            assert all(f"\n  {i}" in window.state_label.toolTip() for i in ids), window.state_label.toolTip()
            window.show()
            window.state_label.set_full_text("serving: " + "; ".join(ids * 20))  # longer than any screen
            assert window.state_label.text().endswith("…")
            assert window.minimumSizeHint().width() < 1120  # the line does not widen the window
            # a message ("API URL copied") shows in its place: the stretched label as a permanent widget
            # left it no room, so no message was ever seen (found in review, 2026-12-06)
            window.statusBar().showMessage("API URL copied to the clipboard", 6000)
            await wait_until(lambda: not window.state_label.isVisible(), DEADLINE_S, what="the message to show")
            window.statusBar().clearMessage()
            await wait_until(lambda: window.state_label.isVisible(), DEADLINE_S, what="the status line back")

    run(body())


def test_a_skipped_file_is_named_in_the_models_tab_while_another_model_serves(qtbot, run, data_dir, tiny_model):
    """The first-run banner names a truncated copy only while no model serves: with another one
    loaded, the window said nothing (the log alone: "skipping model broken-copy.gguf: …")."""
    models = data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    whole = tiny_model.read_bytes()
    (models / "broken-copy.gguf").write_bytes(whole[: len(whole) // 3])

    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as tray_app:
            tab = tray_app.window.models_tab
            await wait_until(lambda: tray_app.host.serving().whole_loaded, DEADLINE_S, what="the model to load")
            await wait_until(lambda: "Not served: broken-copy.gguf is truncated" in tab.skipped.text(), DEADLINE_S,
                             what="the skipped file named in the Models tab")
            assert not tab.skipped.isHidden()

    run(body())


def test_a_file_skipped_while_the_app_runs_is_named_and_forgotten_when_removed(qtbot, run, data_dir, tiny_model):
    """Found in review (2026-12-06): the line was refreshed on state changes only, and the folder
    watch skipping a truncated copy dropped in while a model serves changes no state: it was never
    named (nor cleared when the file went)."""
    async def body():
        async with running_app(node_config(data_dir, tiny_model, models_watch_s=0.1)) as tray_app:
            tab = tray_app.window.models_tab
            await wait_until(lambda: tray_app.host.serving().whole_loaded, DEADLINE_S, what="the model to load")
            broken = data_dir / "models" / "broken-copy.gguf"
            broken.parent.mkdir(parents=True, exist_ok=True)
            whole = tiny_model.read_bytes()
            broken.write_bytes(whole[: len(whole) // 3])
            await wait_until(lambda: "Not served: broken-copy.gguf is truncated" in tab.skipped.text(), DEADLINE_S,
                             what="the file skipped at run time named in the Models tab")
            broken.unlink()
            await wait_until(lambda: tab.skipped.isHidden(), DEADLINE_S, what="the line gone with the file")

    run(body())


def test_the_fit_and_the_tooltip_count_only_what_takes_ram():
    """A model on a GPU: its offloaded layers and their cache take VRAM; the fit compared all of
    it with the RAM free."""
    from app.ui.models_model import fit, memory_tip

    gib = 2**30
    row = {"id": "big-0123abcd", "memory_estimate": {"weights_bytes": 9 * gib, "kv_bytes": 1 * gib, "kv_tokens": 8192,
                                                     "total_bytes": 10 * gib, "ram_bytes": 1 * gib, "gpu_bytes": 9 * gib}}
    assert fit(row, 2 * gib)[0] is True
    assert "9.0 GiB of it on the GPU" in memory_tip(row)


def test_an_unloaded_model_a_gpu_would_take_fits_by_its_ram_part(qtbot, run, data_dir, tiny_model, monkeypatch):
    """Found in review (2026-12-07): an unloaded model's estimate was always made with no layers on
    a GPU, so the fit compared all of it with the RAM free and its tooltip named no GPU, on a
    machine whose GPU a load would use (24 GB VRAM, 16 GB RAM, a 14 GB model: "may not fit").
    The node's device detection is replaced by a fake GPU: no CUDA here."""
    from node.inference.devices import DeviceInventory, Gpu

    def gpu_with(free_mb: int):
        return lambda: DeviceInventory(gpus=(Gpu(0, "Fake GPU", 24576, free_mb, (8, 9)),), build_supports_gpu=True)

    async def body():
        async with running_app(node_config(data_dir, tiny_model, n_ctx=2048)) as tray_app:
            host, tab = tray_app.host, tray_app.window.models_tab
            (model_id,) = [m.id for m in host.node.models.whole_models()]
            await wait_until(lambda: host.node.models.get(model_id).state == "loaded", DEADLINE_S, what="the load")
            await host.async_unload(model_id)
            total = host.node.models.get(model_id).summary()["memory_estimate"]["total_bytes"]
            # less RAM free than the whole model: it fits only because most of it goes to the GPU
            monkeypatch.setattr("app.ui.models_tab.ram_available_bytes", lambda: total - 1)
            host.node.models.detect_devices = gpu_with(16384)
            tab.view.clearSelection()
            tab.select(model_id)
            await wait_until(lambda: "more on the GPU); " in tab.status.full_text and
                             "of RAM is free" in tab.status.full_text, DEADLINE_S,
                             what="the fit to count the RAM part only")
            cell = _memory_cell(tab, model_id)
            await wait_until(lambda: "of it on the GPU" in (cell.data(Qt.ItemDataRole.ToolTipRole) or ""),
                             DEADLINE_S, what="the tooltip to split the GPU part off")
            assert cell.data() == f"≈ {fmt.size(total)} to load"

            host.node.models.detect_devices = gpu_with(600)  # a GPU too full for it: the CPU, all in RAM
            tab.view.clearSelection()
            tab.select(model_id)
            await wait_until(lambda: "may not fit" in tab.status.full_text, DEADLINE_S,
                             what="all of it in RAM again")
            assert "on the GPU" not in (cell.data(Qt.ItemDataRole.ToolTipRole) or "")

    run(body())
