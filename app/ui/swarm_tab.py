"""Swarm tab: per model the layer map (who holds which layers, gaps, the last request's chain),
the live throughput plot, and the "Help serve this model" controls (a memory budget slider, the
pause switch). The controls act through the node's Contributions (the same calls as the admin
API's /api/admin/contribute); what the node then serves comes back through its events.
"""

from __future__ import annotations

import asyncio
import time

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.host import NodeHost
from app.tasks import spawn
from app.ui import fmt
from app.ui.layer_map import AXIS_H, COVERAGE_H, PAD, ROW_H, LayerMapView, RatePlot
from app.ui.swarm_model import LayerMapModel, RateSeries
from app.ui.widgets import table_view
from node.inference.pipeline.layerchoice import layers_for_budget

SLIDER_STEP_MB = 64
SLIDER_MIN_MB = 16


def _free_mb() -> int:
    """Memory this machine could give now (what the OS calls available), in MiB."""
    import psutil

    return int(psutil.virtual_memory().available // 2**20)


class _MapScroll(QScrollArea):
    """The layer map's scroll area: as tall as the map when there is room (QScrollArea's own size
    hint is the map's first one, cached)."""

    def sizeHint(self) -> QSize:
        widget = self.widget()
        return widget.sizeHint() if widget is not None else super().sizeHint()


class ContributePanel(QGroupBox):
    """Help serve the selected model within a budget; pause contributing altogether."""

    def __init__(self, host: NodeHost, parent: QWidget | None = None):
        super().__init__("Contribute", parent)
        self.host = host
        self.model_id: str | None = None
        self.cost: dict[str, dict] = {}  # model id -> async_layer_cost()
        self.help_box = QCheckBox("Help serve this model")
        self.help_box.setToolTip("Let this machine serve layers of the model for the swarm: the node chooses which "
                                 "layers (where coverage is thinnest) within the memory set below")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setAccessibleName("Memory budget for this model's layers, MiB")
        self.slider.setToolTip("Memory this model's layers may take on this machine (weights and KV reserve)")
        self.slider.setSingleStep(SLIDER_STEP_MB)
        self.slider.setPageStep(SLIDER_STEP_MB * 4)
        self.slider.setRange(SLIDER_MIN_MB, 8192)
        self.slider.setValue(1024)
        self.budget_label = QLabel()
        self.budget_label.setMinimumWidth(260)
        self.pause_box = QCheckBox("Pause contributing")
        self.pause_box.setToolTip("Take no work for other nodes and free the memory of every slice served for them "
                                  "(the tray menu has the same switch)")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row = QHBoxLayout()
        row.addWidget(self.help_box)
        row.addWidget(QLabel("Memory:"))
        row.addWidget(self.slider, 1)
        row.addWidget(self.budget_label)
        row.addWidget(self.pause_box)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.status)
        self.help_box.toggled.connect(self._on_help_toggled)
        self.slider.valueChanged.connect(lambda _v: self._show_budget())
        # a new budget frees the slice and chooses again: applied once the slider has rested 0.8 s
        # (a drag, arrow keys or a wheel gesture make one change, not one per step)
        self._apply_timer = QTimer(self)
        self._apply_timer.setSingleShot(True)
        self._apply_timer.setInterval(800)
        self._apply_timer.timeout.connect(self._apply_budget)
        self.slider.valueChanged.connect(lambda _v: None if self.slider.isSliderDown() else self._apply_timer.start())
        self.slider.sliderReleased.connect(self._apply_timer.start)
        self.pause_box.toggled.connect(lambda on: host.set_contributing(not on))
        spawn(self._async_range(), what="reading this machine's memory")

    async def _async_range(self) -> None:
        """The slider spans the memory available now (what is free, not the machine's total: a
        budget beyond it would push other programs into swap); a budget already set above it
        widens it (see refresh)."""
        free = await asyncio.get_running_loop().run_in_executor(None, _free_mb)
        self.slider.setMaximum(max(SLIDER_MIN_MB * 2, free - free % SLIDER_STEP_MB, self.slider.value()))

    # --- the selected model ---

    def set_model(self, model_id: str | None) -> None:
        self.model_id = model_id
        self.refresh()

    def _known(self) -> bool:
        """The selected model is in the catalog (a swarm model: once its header is here)."""
        return self.model_id is not None and self.model_id in self.host.node.catalog.entries

    def _split_parts(self) -> int:
        """The selected model's number of files when it is a split model (its layers are not served
        as slices: the box stays off and says why), else 0."""
        entry = self.host.node.catalog.entries.get(self.model_id) if self.model_id is not None else None
        return entry.split_count if entry is not None and entry.split_count > 1 else 0

    async def _async_cost(self, model_id: str) -> None:
        self.cost[model_id] = await self.host.node.contributions.async_layer_cost(model_id)
        self._show_budget()

    def _choice(self) -> dict | None:
        summary = self.host.node.contributions.summary()
        return next((m for m in summary["models"] if m["model"] == self.model_id), None)

    def _show_budget(self) -> None:
        mb = self.slider.value()
        cost = self.cost.get(self.model_id or "")
        if cost and cost["per_layer_mb"] > 0:
            # the node's own count (a range that ends at the last layer holds the output head too):
            # the label said "≈ 3 of 12" while the node served 4 layers that did not
            fit = layers_for_budget(mb * 2**20, int(cost["per_layer_mb"] * 2**20), 0, int(cost["head_mb"] * 2**20),
                                    n_layers=cost["n_layers"])
            head = f", {fit.with_head} with the output head" if fit.with_head != fit.layers else ""
            self.budget_label.setText(f"{fmt.mib(mb)} ≈ {fit.layers} of {cost['n_layers']} layers{head} "
                                      f"({fmt.mib(cost['per_layer_mb'], 1)} each)")
        else:
            self.budget_label.setText(fmt.mib(mb))

    def refresh(self) -> None:
        """Show the node's choices (called on contributions, slice and trace events)."""
        contributions = self.host.node.contributions
        choice = self._choice() if self.model_id else None
        for widget, value in ((self.help_box, choice is not None), (self.pause_box, contributions.paused)):
            widget.blockSignals(True)
            widget.setChecked(value)
            widget.blockSignals(False)
        known = self._known()
        parts = self._split_parts()
        self.help_box.setEnabled(known and not parts and self.host.node.autoserve is not None)
        # sized once the panel is seen (showEvent): sizing imports torch (1.5 s, ~180 MB), which a tray
        # app serving whole models, its window closed, never needs (2026-12-07: every start sized)
        if known and not parts and self.model_id not in self.cost and self.isVisible():
            self.cost[self.model_id] = {}  # asked once (an empty cost shows the budget in MiB only)
            spawn(self._async_cost(self.model_id), what=f"sizing the layers of {self.model_id}")
        # not while the user holds the slider or a budget they set waits to be applied: the
        # node's old budget would undo their move before _apply_budget sees it
        if choice is not None and choice["budget_mb"] and not self.slider.isSliderDown() \
                and not self._apply_timer.isActive():
            self.slider.blockSignals(True)
            self.slider.setMaximum(max(self.slider.maximum(), choice["budget_mb"]))
            self.slider.setValue(choice["budget_mb"])
            self.slider.blockSignals(False)
        self._show_budget()
        self.status.setText(self._status_text(choice, contributions.paused))

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh()  # (the selected model sized now, if it was not)

    def _status_text(self, choice: dict | None, paused: bool) -> str:
        if paused:
            return "Contributing is paused: this node takes no work for others and holds no slice for them."
        if self.model_id is None:
            return "Select a model to help serve it."
        if choice is None and not self._known():
            return "Learning this model's header from its holders…"
        parts = self._split_parts()
        if parts:
            return (f"This model is split in {parts} files: it is served whole on this node only, not as layers "
                    "for the swarm. To help serve its layers, merge its parts into one file "
                    "(llama-gguf-split --merge).")
        failure = choice.get("last_failure") if choice is not None else None
        if choice is None:
            return "Not helping serve this model. Tick “Help serve this model” to let the node choose layers for it."
        if choice.get("error"):
            return f"Cannot serve it: {choice['error']}"
        serving = choice["serving"]
        failed = ""
        if failure is not None:  # (the failed slice is gone: this is all that says why nothing serves)
            when = f"choosing again at {time.strftime('%H:%M:%S', time.localtime(failure['retry_at']))}"
            failed = (f"Layers {fmt.layers([failure['layers'][0], failure['layers'][1] + 1])} failed to load: "
                      f"{failure['reason']}; {when}" + ("…" if not serving else " — "))
        if not serving:
            if failed:
                return failed
            fits = choice.get("budget_layers")
            return ("Choosing layers…" if fits is None else
                    f"The budget fits {fits} layer{'s' if fits != 1 else ''}; choosing where the swarm needs them…"
                    if fits else "The budget fits no layer of this model: move the slider right.")
        parts = []
        for s in serving:
            layers = fmt.layers([s["layers"][0], s["layers"][1] + 1])
            if s["state"] == "loading":
                fetch = s.get("fetch")
                pct = f" {fetch['done_bytes'] * 100 // fetch['total_bytes']}%" if fetch and fetch["total_bytes"] else ""
                parts.append(f"fetching layers {layers}{pct}")
                continue
            others = s["for_others"]
            parts.append(f"serving layers {layers} ({s['state']}) — for others: {others['sessions']} sessions, "
                         f"{others['tokens']} tokens, {others['coordinators']} node"
                         f"{'s' if others['coordinators'] != 1 else ''}")
        return failed + "; ".join(parts).capitalize()

    # --- actions ---

    def _on_help_toggled(self, on: bool) -> None:
        model = self.model_id
        if model is None:
            return
        if on:
            spawn(self.host.async_help_serve(model, self.slider.value()), what=f"helping serve {model}",
                  on_error=self._failed)
        else:
            spawn(self.host.async_stop_helping(model), what=f"stopping serving {model}", on_error=self._failed)

    def _apply_budget(self) -> None:
        choice = self._choice() if self.model_id else None
        if choice is not None and choice["budget_mb"] != self.slider.value():
            spawn(self.host.async_help_serve(self.model_id, self.slider.value()),
                  what=f"changing the budget for {self.model_id}", on_error=self._failed)

    def _failed(self, message: str) -> None:
        self.status.setText(message)
        self.refresh()


class SwarmTab(QWidget):
    """The layer map of a chosen model over its table, the throughput plot, the contribute panel."""

    def __init__(self, host: NodeHost, layer_map: LayerMapModel, rates: RateSeries, parent: QWidget | None = None):
        super().__init__(parent)
        self.host = host
        self.model = layer_map
        self.rates = rates
        self.picker = QComboBox()
        self.picker.setAccessibleName("Model")
        self.picker.setToolTip("The model whose layers are drawn")
        self.picker.setMinimumContentsLength(28)
        self.coverage = QLabel()
        self.map_view = LayerMapView()
        # in a scroll area: the map is one row per holder, and a swarm of many holders must not make
        # the window taller than the screen (the tab's minimum height was the whole map's)
        self.map_scroll = _MapScroll()
        self.map_scroll.setWidget(self.map_view)
        self.map_scroll.setWidgetResizable(True)
        self.map_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.map_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table = table_view(layer_map)
        self.table.setMaximumHeight(170)
        self.plot = RatePlot()
        self.contribute = ContributePanel(host)
        top = QHBoxLayout()
        top.addWidget(QLabel("Model:"))
        top.addWidget(self.picker)
        top.addWidget(self.coverage, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.map_scroll)
        layout.addWidget(self.table)
        layout.addWidget(self.contribute)
        layout.addWidget(self.plot)
        layout.addStretch(1)
        self.picker.currentIndexChanged.connect(self._on_pick)
        layer_map.modelReset.connect(self._on_maps)
        layer_map.dataChanged.connect(self._on_maps)
        layer_map.rowsInserted.connect(self._on_maps)
        self._on_maps()
        self.plot_timer = QTimer(self)  # the plot scrolls with time (new points come from traces)
        self.plot_timer.setInterval(2000)
        self.plot_timer.timeout.connect(self.update_plot)
        self.plot_timer.start()
        self.update_plot()

    def choices(self) -> list[tuple[str, str]]:
        """(model id, sha256) of the picker: models the swarm serves, then this node's other models."""
        out = [(m.model_id, m.sha256) for m in self.model.maps]
        shown = {sha for _, sha in out}
        for entry in sorted(self.host.node.catalog.entries.values(), key=lambda e: e.id):
            if entry.sha256 not in shown and (entry.has_file or entry.partial is not None):
                out.append((entry.id, entry.sha256))
                shown.add(entry.sha256)
        return out

    def _on_maps(self, *_args) -> None:
        choices = self.choices()
        if [self.picker.itemData(i) for i in range(self.picker.count())] != [sha for _, sha in choices]:
            self.picker.blockSignals(True)
            self.picker.clear()
            for model_id, sha in choices:
                self.picker.addItem(model_id, sha)
            index = self.picker.findData(self.model.selected) if self.model.selected else 0
            self.picker.setCurrentIndex(max(0, index))
            self.picker.blockSignals(False)
        current = self.model.current()
        self.map_view.set_map(current)
        # the map shrinks to three holders' rows at most (then scrolls), never below its own height
        self.map_scroll.setMinimumHeight(min(self.map_view.sizeHint().height(),
                                             AXIS_H + COVERAGE_H + 3 * ROW_H + 2 * PAD))
        self.map_scroll.updateGeometry()  # its size hint is the map's, which the layout cached
        self.coverage.setText(current.coverage_text() if current else
                              ("not served in the swarm yet" if self.picker.count() else ""))
        self.contribute.set_model(self.picker.currentText() or None)

    def sync_picker(self) -> None:
        """On every swarm event: the picker also lists this node's files, which change (a download,
        a file added) without any map changing (then the map model emits nothing)."""
        if [self.picker.itemData(i) for i in range(self.picker.count())] != [sha for _, sha in self.choices()]:
            self._on_maps()

    def _on_pick(self, index: int) -> None:
        self.model.select(self.picker.itemData(index))
        self._on_maps()

    def update_plot(self) -> None:
        tokens, requests = self.rates.series()
        self.plot.set_series(tokens, requests, self.rates.window_s)
