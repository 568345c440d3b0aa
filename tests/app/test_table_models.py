"""Every table model of the app passes Qt's model tester: the tester stays attached and re-checks the
model on every insert, change, removal and reset the node events cause."""

from __future__ import annotations

import time

import pytest

from app.ui.models_model import ModelsModel
from app.ui.overview_model import OverviewModel
from app.ui.peers_model import PeersModel, split_address
from app.ui.requests_model import RequestsModel, SegmentsModel
from app.ui.table_model import ROW_KEY_ROLE
from node.trace import RequestTrace, SegmentTrace

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING")]


def _trace(n: int, *, done: bool = True, segments: int = 1) -> RequestTrace:
    t = RequestTrace(model="tiny-1234abcd", operation="chat.completions")
    t.mark_dequeued()
    assert t.route is None  # not chosen yet
    t.route = "local"
    started = t.begin_assembly()
    t.end_assembly(started, [SegmentTrace(f"{i:08x}", i * 2, i * 2 + 2, "local" if i == 0 else "direct",
                                          elapsed_ms=3.5 * (i + 1), activation_bytes=1024 * i,
                                          telemetry={"eval_us": 10 * i} if i else {})
                             for i in range(segments)])
    t.prompt_tokens = 10 + n
    for _ in range(5):
        t.mark_token()
    if done:
        t.finished = time.monotonic()
        t.outcome = "ok" if n % 3 else "error"
        t.error_type = None if n % 3 else "ModelUnavailable"
    return t


class _Served:
    """The ServedModel surface the models table reads (id, whole, summary())."""

    whole = True

    def __init__(self, model_id: str, state: str = "loaded", reason: str | None = "no_gpu"):
        self.id = model_id
        self.state = state
        self.reason = reason

    def summary(self):
        return {"id": self.id, "name": self.id, "sha256": "ab" * 32, "architecture": "llama",
                "n_layers": 22, "quantization": "Q8_0", "size_bytes": 1_234_567_890, "source": "cli",
                "state": self.state, "device": "cpu" if self.reason else "cuda",
                "cpu_placement_reason": self.reason, "busy": False, "waiting": 0, "layers_held": [0, 22],
                "error": "boom" if self.state == "failed" else None}


class _Snapshot:
    """A peer snapshot object (the peer network hands out frozen dataclasses with as_dict())."""

    def __init__(self, **fields):
        self.fields = fields

    def as_dict(self):
        return dict(self.fields)


def _peer(i: int, **extra):
    return {"node_id": f"{i:02x}" * 32, "short_id": f"{i:02x}" * 4, "state": "connected",
            "transport": "direct" if i % 2 else "relayed", "address": f"192.168.1.{i}:8810",
            "rtt_ms": 1.5 * i, "models": [{"name": "m", "layers": [0, 11], "n_layers": 22}],
            "last_seen": time.time() - i, "hardware": {"ms_per_layer": 2.0}, **extra}


@pytest.mark.parametrize("force_py", [False, True], ids=["qt-cpp", "python"])
def test_requests_model(qapp, qtmodeltester, force_py):
    model = RequestsModel(max_rows=4)
    qtmodeltester.check(model, force_py=force_py)
    traces = [_trace(i, done=False) for i in range(6)]
    for t in traces:
        model.on_trace_event("started", t)
    model.on_trace_event("first_token", traces[-1])
    for t in traces[:3]:
        t.finished = time.monotonic()
        t.outcome = "ok"
        model.on_trace_event("finished", t)
    assert model.rowCount() == 4  # trimmed to max_rows, newest first; trimmed rows stay away
    assert model.key_at(0) == traces[-1].request_id
    key = traces[-1].request_id
    assert model.cell_text(key, "Route") == "local"
    assert model.cell_text(key, "Outcome") == "in flight"
    assert model.cell_text(key, "TTFT").endswith("ms")
    assert model.index(0, 0).data(ROW_KEY_ROLE) == key
    # a request whose route is not chosen yet (queued), and one that failed before any route
    queued = RequestTrace(model="tiny-1234abcd", operation="chat.completions")
    model.on_trace_event("started", queued)
    assert model.cell_text(queued.request_id, "Route") == "choosing"
    queued.finished = time.monotonic()
    queued.outcome = "error"
    model.on_trace_event("finished", queued)
    assert model.cell_text(queued.request_id, "Route") == "—"


@pytest.mark.parametrize("force_py", [False, True], ids=["qt-cpp", "python"])
def test_segments_model(qapp, qtmodeltester, force_py):
    model = SegmentsModel()
    qtmodeltester.check(model, force_py=force_py)
    model.show_trace(_trace(1, segments=3))
    assert model.rowCount() == 3
    assert model.cell_text(1, "Layers") == "2–3"
    assert model.cell_text(1, "Transport") == "direct"
    model.show_trace(None)
    assert model.rowCount() == 0


@pytest.mark.parametrize("force_py", [False, True], ids=["qt-cpp", "python"])
def test_models_model(qapp, qtmodeltester, force_py):
    model = ModelsModel()
    qtmodeltester.check(model, force_py=force_py)
    a, b = _Served("a-11111111"), _Served("b-22222222", state="failed", reason=None)
    model.on_model_event("added", a)
    model.on_model_event("added", b)
    a.state = "unloaded"
    model.on_model_event("changed", a)
    assert model.cell_text("a-11111111", "State") == "unloaded"
    assert model.cell_text("a-11111111", "Device") == "CPU"
    assert model.cell_text("a-11111111", "Placement reason") == "no GPU found"
    assert model.cell_text("b-22222222", "Device") == "GPU (CUDA)"
    assert model.cell_text("a-11111111", "Layers held") == "0–21 of 22"
    model.on_model_event("removed", b)
    assert model.rowCount() == 1
    # a slice of a partial model file says what of the file is on disk
    model.set_slices({"s": {**a.summary(), "id": "a-11111111", "engine": "torch-slice", "layers_held": [4, 8],
                            "partial": "layers 4–7 of 22, 310 MB of 1235 MB"}})
    assert model.cell_text("s", "Layers held") == "layers 4–7 of 22, 310 MB of 1235 MB"
    # its layers arriving: the state says how far
    model.set_slices({"s": {**a.summary(), "id": "a-11111111", "engine": "torch-slice", "layers_held": [4, 8],
                            "state": "loading", "fetch": {"done_bytes": 3 * 2**20, "total_bytes": 12 * 2**20}}})
    assert model.cell_text("s", "State") == "fetching layers 25% (3.0 MiB of 12.0 MiB)"


@pytest.mark.parametrize("force_py", [False, True], ids=["qt-cpp", "python"])
def test_peers_model(qapp, qtmodeltester, force_py):
    model = PeersModel()
    qtmodeltester.check(model, force_py=force_py)
    model.on_peer_event("added", _peer(1))
    model.on_peer_event("added", _Snapshot(**_peer(2, via_relay="93.184.216.34:8810")))
    model.on_peer_event("changed", _peer(1, rtt_ms=9.0))
    model.on_peer_event("removed", _peer(3))  # unknown: ignored
    key = "01" * 32
    assert model.rowCount() == 2
    assert model.cell_text(key, "RTT") == "9.0 ms"
    assert model.cell_text(key, "Models and layers") == "m [0–10 of 22]"
    assert model.cell_text(key, "ms/layer") == "2.0 ms"
    shown = model.cell_text(key, "Address")
    assert "192.168.1.1" not in shown and shown.startswith("<private-ip-") and shown.endswith(":8810")
    model.set_show_addresses(True)
    assert model.cell_text(key, "Address") == "192.168.1.1:8810"
    model.set_show_addresses(False)
    assert model.cell_text(key, "Address") == shown  # the same tag for the life of the table
    model.on_peer_event("removed", _peer(1))
    assert model.rowCount() == 1


def test_peers_model_follows_a_real_peer_manager(qapp, qtmodeltester, run, tmp_path):
    """Attached to a real PeerManager: its snapshot, then its events (a peer connects, goes),
    until detach unsubscribes."""
    from node.config import NodeConfig
    from node.net import PeerManager, load_or_create_identity
    from tests.app.helpers import DEADLINE_S
    from tests.support.swarm import join_test_swarm
    from tests.support.waiting import wait_until

    def manager(name: str, **fields) -> PeerManager:
        cfg = NodeConfig(data_dir=join_test_swarm(tmp_path / name), port=0, peer_port=0, peer_host="127.0.0.1",
                         mdns=False, **fields)
        return PeerManager(cfg, load_or_create_identity(cfg.data_dir))

    async def go():
        a, b = manager("a"), manager("b")
        await a.async_start()
        model = PeersModel()
        qtmodeltester.check(model)
        try:
            own = len(a.observers)  # (the manager's own: its forgotten-peer bookkeeping)
            model.attach(a)
            assert model.rowCount() == 0 and len(a.observers) == own + 1
            b.config.bootstrap = [f"127.0.0.1:{a.listen_port}"]
            await b.async_start()
            await wait_until(lambda: model.rowCount() == 1 and model.cell_text(b.node_id, "State") == "connected",
                             DEADLINE_S, what="b's row, connected")
            await b.async_stop()
            await wait_until(lambda: model.cell_text(b.node_id, "State") == "gone",
                             DEADLINE_S, what="b's row to show it gone")
            model.detach()
            assert len(a.observers) == own
            model.attach(None)
            assert model.rowCount() == 1  # nothing to follow; rows stay
        finally:
            model.detach()
            await b.async_stop()
            await a.async_stop()

    run(go())


@pytest.mark.parametrize("force_py", [False, True], ids=["qt-cpp", "python"])
def test_overview_model(qapp, qtmodeltester, force_py):
    model = OverviewModel()
    qtmodeltester.check(model, force_py=force_py)
    t = _trace(1, done=False)
    model.on_trace_event("started", t)
    assert model.text("In flight") == "1"
    t.finished = time.monotonic()
    model.on_trace_event("finished", t)
    assert model.text("In flight") == "0"
    assert model.text("Requests/min") == "1"
    model.on_peer_count(0, 0, False)
    assert model.text("Peers") == "0 (peer network off)"
    model.on_peer_count(0, 0, False, starting=True)  # not up yet: not "off"
    assert model.text("Peers") == "— (starting)"
    model.on_peer_count(1, 2, True)
    assert model.text("Peers") == "1 connected (2 known)"


def test_split_address():
    assert split_address("10.0.0.1:8810") == ("10.0.0.1", 8810)
    assert split_address("[fe80::1]:8810") == ("fe80::1", 8810)
    assert split_address("fe80::1") == ("fe80::1", None)
    assert split_address("host.lan") == ("host.lan", None)


def test_every_column_header_has_a_tooltip(qapp):
    """Accessibility: every table's column headers say what the column means."""
    from PySide6.QtCore import Qt

    from app.ui.models_model import ModelsModel
    from app.ui.overview_model import OverviewModel
    from app.ui.peers_model import PeersModel
    from app.ui.requests_model import RequestsModel, SegmentsModel
    from app.ui.swarm_model import LayerMapModel

    for model in (ModelsModel(), PeersModel(), RequestsModel(), SegmentsModel(), OverviewModel(), LayerMapModel()):
        missing = [model.headerData(c, Qt.Orientation.Horizontal, Qt.ItemDataRole.DisplayRole)
                   for c in range(model.columnCount())
                   if not model.headerData(c, Qt.Orientation.Horizontal, Qt.ItemDataRole.ToolTipRole)]
        assert not missing, f"{type(model).__name__}: no header tooltip for {missing}"


def test_peers_model_takes_a_peer_s_ms_per_layer_as_its_word(qapp):
    """A member's advert is any JSON: ms_per_layer of mixed types (a string beside a number) made
    `min` raise in the Peers tab's cell for its row at every repaint (2026-12-07); what is no finite
    number is not one."""
    model = PeersModel()
    key = "05" * 32
    model.on_peer_event("added", _peer(5, hardware={}, models=[
        {"name": "m", "ms_per_layer": "fast"}, {"name": "n", "ms_per_layer": 3.0},
        {"name": "o", "ms_per_layer": True}, {"name": "p", "ms_per_layer": float("nan")}]))
    assert model.cell_text(key, "ms/layer") == "3.0 ms"
    model.on_peer_event("changed", _peer(5, hardware={"ms_per_layer": float("inf")}, models=[]))
    assert "inf" not in model.cell_text(key, "ms/layer")
    model.on_peer_event("changed", _peer(5, hardware={"ms_per_layer": 10 ** 400}, models=[]))  # review r61:
    assert "ms" not in model.cell_text(key, "ms/layer")  # OverflowError at every repaint
