"""A download that completes, but whose file the catalog then refuses (a GGUF cut short at its origin,
or damaged there: the magic is right, the rest cannot be read). Until 2026-12-07 the job failed with the
scan's reason and the file stayed in models/ as NAME.gguf: beside the served models, looking like one,
refused again at every start and listed "Not served" for good. Now it is moved aside to
NAME.gguf.broken, as the node keeps damaged data-dir files aside (`datadir.keep_aside`,
tests/node/test_damaged_files.py), and the job's error says where it is."""

from __future__ import annotations

import pytest

from tests.node.test_download_restore import api, finished
from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.rangeserver import ThreadedOrigin

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.usefixtures("fast_retries")]


async def test_a_downloaded_file_the_catalog_refuses_is_kept_aside_and_said(tmp_path):
    whole = tiny_model(tmp_path, TINY, "whole.gguf").read_bytes()
    cut = whole[: len(whole) // 2]  # the origin's copy is cut short: a GGUF header, half the tensors
    data = tmp_path / "data"
    with ThreadedOrigin(cut, "cut.gguf") as origin:
        async with running_node(node_config(data)) as node:
            status, body = await api(node, "POST", "/api/admin/models/download", {"url": origin.url, "filename": "cut.gguf"})
            assert status == 202, body
            job = await finished(node, body["download"]["id"])
            assert job["state"] == "failed", job
            assert "truncated" in job["error"] and "kept aside as models/cut.gguf.broken" in job["error"], job["error"]
            models = data / "models"
            assert not (models / "cut.gguf").exists(), "the unreadable download stayed in models/ as a .gguf"
            assert (models / "cut.gguf.broken").read_bytes() == cut  # kept, not deleted
            assert node.catalog.skipped_reasons() == []
            _, listed = await api(node, "GET", "/api/admin/models")
            assert not any(m["id"].startswith("cut") for m in listed["models"])
        async with running_node(node_config(data)) as node:  # the next start does not meet it again
            assert node.catalog.skipped_reasons() == []
