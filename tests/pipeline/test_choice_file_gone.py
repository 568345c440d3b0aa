"""A "Help serve" model whose file was deleted (2026-12-07, review r27): the folder's watch dropped
it from the catalog, but its layer choice went on retrying the missing file for ever, its failure
shown everywhere (state error, the banner, diagnostics, /api/admin/contribute), and unticking
"Help serve" did not stop it (async_stop looked the model up in the catalog, which had forgotten
it). The choice now ends when the catalog drops the model, or when helping it stops, by the
sha256 chosen; the choice kept in config.toml is taken up again when the file is back."""

from __future__ import annotations

import pytest

from node import const
from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


def wrong_layer_count(path):
    """A GGUF whose header claims one more layer than it has tensors for: catalogued (the header
    reads fine), its slice fails on the missing layer (as tests/app/test_slice_load_failed.py's)."""
    write_gguf(path, SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256,
                               name="wrongcount"))
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.block_count") + len(b"llama.block_count")
    data[at + 4:at + 8] = (3).to_bytes(4, "little")  # after the value type (u32)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(const, "AUTO_SERVE_LOOK_S", 0.0)
    monkeypatch.setattr(const, "AUTO_SERVE_START_DELAY_S", 0.0)
    monkeypatch.setattr(const, "AUTO_SERVE_REACT_S", 0.01)
    monkeypatch.setattr(const, "AUTO_SERVE_RETRY_MIN_S", 0.2)


async def test_stopping_help_for_a_model_the_catalog_forgot_ends_its_choice(tmp_path, quick):
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    path = wrong_layer_count(data / "models" / "wrongcount.gguf")
    async with running_node(node_config(data, models_watch_s=3600.0)) as node:
        entry = node.catalog.resolve("wrongcount")
        await node.contributions.async_help(entry.id, 0)
        await wait_until(lambda: node.autoserve.failures(), 20.0, what="the choice's load to fail")
        path.unlink()
        node.catalog.remove_file_entry(entry)  # (the folder's watch does this; its own drop: the next test)
        await node.contributions.async_stop(entry.id)
        assert node.autoserve.model(entry.sha256) is None
        assert node.autoserve.failures() == [] and node.contributions.summary() == {
            "paused": False, "models": [], "failures": []}


async def test_a_help_serve_models_deleted_file_ends_its_choice_until_the_file_is_back(tmp_path, quick):
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    path = wrong_layer_count(data / "models" / "wrongcount.gguf")
    kept = path.read_bytes()
    async with running_node(node_config(data, models_watch_s=0.2)) as node:
        entry = node.catalog.resolve("wrongcount")
        await node.contributions.async_help(entry.id, 0)
        await wait_until(lambda: node.autoserve.failures(), 20.0, what="the choice's load to fail")
        path.unlink()
        await wait_until(lambda: entry.id not in node.catalog.entries, 20.0, what="the watch to drop the model")
        await wait_until(lambda: node.autoserve.model(entry.sha256) is None and not node.autoserve.failures(), 10.0,
                         what="the choice of the deleted model to end")
        [row] = node.contributions.summary()["models"]
        assert row["error"] == "the model is not on this machine now" and row["last_failure"] is None, row
        path.write_bytes(kept)  # the file is back: the "Help serve" kept in config.toml is taken up again
        await wait_until(lambda: node.autoserve.model(entry.sha256) is not None, 20.0,
                         what="the choice to take the model up again")
