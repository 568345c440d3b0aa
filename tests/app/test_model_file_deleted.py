"""A loaded whole model whose GGUF file is then deleted (or moved) serves on from memory until it is
unloaded, and then leaves: it cannot be loaded again. Until 2026-12-07 only the node's log said so;
the Models tab showed plain "loaded" (and /api/admin/models nothing), so an Unload lost the model for
good without a word. Its state now says the file is gone, and says it no more once the file is back."""

from __future__ import annotations

import json
import shutil

import aiohttp
import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


async def admin_models(app) -> dict[str, dict]:
    node = app.host.node
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}/api/admin/models",
                                                   headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        return {m["id"]: m for m in json.loads(await r.text())["models"]}


def test_a_loaded_model_whose_file_is_deleted_says_so(qtbot, run, data_dir, tiny_model, tmp_path):
    path = tmp_path / "kept.gguf"
    shutil.copyfile(tiny_model, path)
    aside = tmp_path / "aside.gguf"

    async def body():
        async with running_app(node_config(data_dir, path, models_watch_s=0.05)) as app:
            rows = app.feeds.models
            await wait_until(lambda: rows.keys() and rows.summary(rows.keys()[0])["state"] == "loaded",
                             DEADLINE_S, what="the model loaded")
            model_id = rows.keys()[0]
            assert rows.cell_text(model_id, "State") == "loaded"
            assert (await admin_models(app))[model_id]["file_gone"] is False

            path.rename(aside)  # moved away (a delete, as far as the node can tell)
            await wait_until(lambda: "file deleted" in (rows.cell_text(model_id, "State") or ""),
                             DEADLINE_S, what="the row to say its file is gone")
            assert rows.cell_text(model_id, "State") == "loaded — file deleted: it cannot be reloaded"
            assert (await admin_models(app))[model_id]["file_gone"] is True

            aside.rename(path)  # put back: it can be loaded again
            await wait_until(lambda: rows.cell_text(model_id, "State") == "loaded", DEADLINE_S,
                             what="the row to say plain loaded again")
            assert (await admin_models(app))[model_id]["file_gone"] is False

    run(body())
