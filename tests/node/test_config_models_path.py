"""config.toml's `models` paths are the config file's folder's (the data dir's), not the working
directory's: the tray app started from the desktop (cwd $HOME or /) and `swarmllm run` from a shell
found different files (until 2026-12-06). --model and SWARMLLM_MODELS stay the shell's (cwd)."""

from __future__ import annotations

import dataclasses

import pytest

from node.config import load_config
from tests.support.nodes import node_config, openai_client, running_node, tiny_model

pytestmark = [pytest.mark.llama]


def test_relative_entries_are_the_config_folders(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text('models = ["mine/a.gguf", "/abs/b.gguf", "hf://owner/repo:Q4_K_M", "~/c.gguf"]\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config({"data_dir": str(data)}, environ={})
    assert cfg.models == [str(data / "mine" / "a.gguf"), "/abs/b.gguf", "hf://owner/repo:Q4_K_M", "~/c.gguf"]
    assert load_config({"data_dir": str(data)}, environ={"SWARMLLM_MODELS": "x.gguf"}).models == ["x.gguf"]
    assert load_config({"data_dir": str(data), "models": ["y.gguf"]}, environ={}).models == ["y.gguf"]


@pytest.fixture
def sdk_ready():  # (outside the loop: the SDK builds its types at first use)
    openai_client(type("N", (), {"api": type("A", (), {"port": 0}), "api_key": "unused"}))


@pytest.mark.asyncio
async def test_a_node_started_elsewhere_serves_the_config_files_model(tmp_path, monkeypatch, sdk_ready):
    """A node whose config.toml names `mine/tiny.gguf` (beside it in the data dir), started from
    another folder (the desktop's cwd), serves that model."""
    hermetic = node_config(tmp_path / "data")  # (joins the test swarm; its other fields, hermetic)
    tiny_model(tmp_path / "data" / "mine")
    (tmp_path / "data" / "config.toml").write_text('models = ["mine/tiny.gguf"]\n')
    elsewhere = tmp_path / "desktop"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_config({"data_dir": str(tmp_path / "data")}, environ={})
    config = dataclasses.replace(hermetic, models=loaded.models)
    async with running_node(config) as node:
        served = [m.id for m in (await openai_client(node).models.list()).data]
        assert any("tiny" in m for m in served), served
