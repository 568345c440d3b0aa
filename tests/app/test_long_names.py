"""A model with a long file name (a 90-character GGUF name) in the Models tab: its column stopped at
nothing, so at the default window size the Device, Memory and State columns were off screen (a
horizontal scroll bar to find whether the model loaded). Columns now stop at MAX_COLUMN_PX, the name
elided in the middle (its hash suffix stays), the whole id in the cell's tooltip."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.ui.models_model import ModelsModel
from app.ui.widgets import table_view

pytestmark = pytest.mark.gui

LONG = "meta-llama-3.1-8b-instruct-abliterated-uncensored-imatrix-iq4_xs-merged-final-v2-q4_k_m-07cbbcc7"


def test_a_long_model_name_leaves_the_state_column_on_screen(qtbot):
    model = ModelsModel()
    model.upsert(LONG, {"id": LONG, "architecture": "llama", "quantization": "Q4_K_M", "size_bytes": 4 * 2**30,
                        "n_layers": 32, "layers_held": [0, 32], "state": "unloaded", "sha256": "07cbbcc7" * 8})
    view = table_view(model)
    qtbot.addWidget(view)
    view.resize(1100, 400)
    view.show()
    qtbot.waitExposed(view)
    state = [c.title for c in model.columns].index("State")
    header = view.horizontalHeader()
    assert header.sectionViewportPosition(state) + 40 <= view.viewport().width(), \
        (header.sectionSize(0), header.sectionViewportPosition(state), view.viewport().width())
    assert LONG in model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
