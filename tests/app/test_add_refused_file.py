"""A file refused by "Add model file…" (not a GGUF, a truncated copy) from outside the models
folder: the status line said why, and then "Not served: junk.gguf is not a GGUF file" stayed under
the Models tab's table, in the first-run banner and in the report's models section for the rest of
the session (the folder watch forgets refused files of the models folder only), deleted or not.
The refusal is the add's answer now: the status line, and the banner's "Not added: …" (where the
Overview's own "Add model file…" was clicked) until the next add; a refused file in the models
folder is still listed as not served."""

from __future__ import annotations

import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_a_refused_add_is_said_as_the_adds_outcome_not_listed_as_not_served(qtbot, run, tmp_path, tiny_model):
    junk = tmp_path / "elsewhere" / "junk.gguf"
    junk.parent.mkdir()
    junk.write_bytes(b"not a gguf at all" * 100)

    async def body():
        async with running_app(node_config(tmp_path / "data")) as app:
            tab = app.window.models_tab
            banner = app.window.overview_tab.banner
            tab.add_model_file(junk)
            await wait_until(lambda: "adding junk.gguf failed" in tab.status.full_text, DEADLINE_S,
                             what="the add to fail")
            assert "not a GGUF file" in tab.status.full_text, tab.status.full_text
            tab._show_skipped()  # (what the folder-watch timer does)  # noqa: SLF001
            banner.update_from_host()
            assert not tab.skipped.isVisibleTo(tab), tab.skipped.text()
            assert app.node.catalog.skipped_reasons() == []
            said = banner.text.text()
            assert said.count("junk.gguf") == 1 and "Not added: junk.gguf is not a GGUF file" in said, said
            # a good file added next serves; nothing of the junk one lingers
            tab.add_model_file(tiny_model)
            await wait_until(lambda: "added for this session" in tab.status.full_text, DEADLINE_S,
                             what="the good file to be added")
            assert app.host.add_error is None
            report = await app.actions.async_report()
            assert "junk.gguf" not in report

    run(body())


def test_a_refused_add_of_a_file_in_the_models_folder_is_said_once(qtbot, run, tmp_path):
    async def body():
        async with running_app(node_config(tmp_path / "data")) as app:
            junk = app.host.models_dir / "junk.gguf"
            junk.write_bytes(b"not a gguf at all" * 100)
            tab = app.window.models_tab
            tab.add_model_file(junk)
            await wait_until(lambda: "adding junk.gguf failed" in tab.status.full_text, DEADLINE_S,
                             what="the add to fail")
            banner = app.window.overview_tab.banner
            banner.update_from_host()
            said = banner.text.text()
            # listed as not served (the folder's file stays refused until it changes or goes), not twice
            assert said.count("junk.gguf") == 1 and "Not served: junk.gguf is not a GGUF file" in said, said

    run(body())
