"""A model file in the models folder that cannot be served (a truncated copy) is named in the
first-run banner and in "Copy diagnostics", not only in a log line.

Seen: a user copies a .gguf into the models folder, the copy is cut short, the app starts and
its banner says "No model can serve requests yet … copy a .gguf file into <models folder> and
restart" — what they had just done; the Models tab was empty and the diagnostics report said
"(no models)". The only mention was the log's "skipping model broken.gguf: … is truncated".
"""

from __future__ import annotations

import pytest

from app.host import AppState
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def test_a_truncated_file_in_the_models_folder_is_named_in_the_banner_and_the_report(
        qtbot, run, data_dir, tiny_model):
    models = data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    whole = tiny_model.read_bytes()
    (models / "broken-copy.gguf").write_bytes(whole[: len(whole) // 3])

    async def body():
        async with running_app(node_config(data_dir)) as tray_app:
            assert tray_app.host.state == AppState.NO_MODEL
            banner = tray_app.window.overview_tab.banner
            assert banner.isVisible()
            said = banner.text.text()
            assert "broken-copy.gguf is truncated" in said, said
            report = await tray_app.actions.async_report()
            models_section = report.split("-- models --", 1)[1].split("--", 1)[0]
            assert "skipped: broken-copy.gguf is truncated" in models_section, models_section
            assert "(no models)" not in models_section

    run(body())
