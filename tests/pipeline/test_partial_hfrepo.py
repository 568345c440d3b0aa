"""A partial model's origin named as a Hugging Face repo and quant (2026-12-06): `swarmllm run --model
hf://owner/repo:Q4_K_M --layers A-B` (or `--serve auto`, config.toml's `models`), `hf.co/owner/repo:QUANT`
as Ollama's docs write it, a repo's page pasted from a browser. Until then only `swarmllm download`
looked a repo up on the Hub: `--model hf://owner/repo:Q4_K_M` stopped the node ("hf:// URLs are
hf://owner/repo/path/to/file.gguf"), `hf.co/…` was read as a file path that does not exist, and a
repo's page was fetched as if it were the GGUF. Against the Hub stand-in (tests/support/hubserver.py,
its tree listing) and real nodes."""

from __future__ import annotations

import logging

import pytest
import pytest_asyncio

from node import const
from node.errors import SplitModelServedWhole
from node.inference.pipeline.partials import PartialModels
from node.inference.synth import SynthSpec, write_gguf
from tests.support.hubserver import HubServer, serving_hub
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128, name="hfrepo")
REPO = "/org/Tiny-GGUF/resolve/main/"
Q4 = "Tiny-Q4_K_M.gguf"


@pytest_asyncio.fixture
async def hub(monkeypatch, tmp_path):
    """A repo with the model in two quants (other bytes each) and a projector."""
    q4 = write_gguf(tmp_path / "q4.gguf", SPEC).read_bytes()
    q8 = write_gguf(tmp_path / "q8.gguf", SynthSpec(**{**SPEC.__dict__, "name": "other"})).read_bytes()
    srv = HubServer(q4, REPO + Q4)
    srv.add_file(REPO + "Tiny-Q8_0.gguf", q8)
    srv.add_file(REPO + "mmproj-Tiny-f16.gguf", q8)
    srv.tree_page_size = 2
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    async with serving_hub(srv, monkeypatch, tmp_path):
        yield srv


async def test_a_repo_and_quant_serves_layers_and_its_file_is_the_origin(tmp_path, hub):
    config = node_config(tmp_path / "data", models=["hf://org/Tiny-GGUF:Q4_K_M"], layers="1-2", slice_dtype="f32",
                         slice_kv_dtype="f32")
    async with running_node(config) as node:
        await wait_until(lambda: any(s.state == "loaded" for s in node.slice_host.slices.values()), 30.0, 0.05,
                         "layers 1-2 of the repo's Q4_K_M file")
        [hosted] = node.slice_host.slices.values()
        # the file looked up is what the partial model keeps and advertises: peers fetch it, not the repo
        assert hosted.entry.sha256 == hub.sha256
        assert hosted.entry.origin_url == hosted.entry.partial.origin_url == hub.hub + REPO + Q4
        assert len(hub.api_requests) == 2  # the listing (two pages), looked up once


async def test_every_spelling_users_paste_opens_the_one_file(tmp_path, hub):
    """Ollama's `hf.co/…` (any case of the quant), the repo's page from a browser (no quant: Q4_K_M,
    as llama.cpp), and hf://: one partial model, opened once at a time."""
    partials = PartialModels(tmp_path / "models")
    (tmp_path / "models").mkdir()
    urls = ["hf.co/org/Tiny-GGUF:q4_k_m", f"{hub.hub}/org/Tiny-GGUF", "hf://org/Tiny-GGUF:Q4_K_M",
            f"{hub.hub}/org/Tiny-GGUF/blob/main/{Q4}"]
    dirs, later, pending = await partials.async_open_all(urls, later_ok=False)
    assert len(dirs) == 1 and not later and not pending
    assert {partials.origins.shown(u) for u in urls} == {hub.hub + REPO + Q4}


async def test_a_split_quant_is_refused_before_anything_is_fetched(tmp_path, monkeypatch):
    data = write_gguf(tmp_path / "m.gguf", SPEC).read_bytes()
    srv = HubServer(data, REPO + "Q4_K_M/Tiny-Q4_K_M-00001-of-00002.gguf")
    srv.add_file(REPO + "Q4_K_M/Tiny-Q4_K_M-00002-of-00002.gguf", data)
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    async with serving_hub(srv, monkeypatch, tmp_path):
        config = node_config(tmp_path / "data", models=["hf.co/org/Tiny-GGUF:Q4_K_M"], layers="0-1")
        with pytest.raises(SplitModelServedWhole, match=r"split model \(2 parts.*served whole.*swarmllm download"):
            async with running_node(config):
                pass
        assert srv.hub_requests == []  # no probe of part 1: said from the listing


async def test_a_hub_not_answering_at_start_is_looked_up_again(tmp_path, hub, monkeypatch, caplog):
    """`--serve auto`: the node starts without the model, says it waits for it, and serves it once
    the Hub answers (as for a file URL whose origin is down)."""
    for name, value in (("AUTO_SERVE_LOOK_S", 0.0), ("AUTO_SERVE_START_DELAY_S", 0.0), ("AUTO_SERVE_REACT_S", 0.01),
                        ("PARTIAL_OPEN_RETRY_MIN_S", 0.2), ("HF_LISTING_ATTEMPTS", 1)):
        monkeypatch.setattr(const, name, value)
    hub.api_fail_with = [(503, {})]
    caplog.set_level(logging.INFO)
    config = node_config(tmp_path / "data", models=["hf://org/Tiny-GGUF:Q4_K_M"], serve="auto", slice_budget_mb=64,
                         slice_dtype="f32", slice_kv_dtype="f32")
    async with running_node(config) as node:
        assert node.waiting_on() == ["model hf://org/Tiny-GGUF:Q4_K_M: waiting for its origin"]
        await wait_until(lambda: any(s.state == "loaded" for s in node.slice_host.slices.values()), 30.0, 0.05,
                         "the model's layers, once the Hub answers")
        assert [m.entry.sha256 for m in node.models.all()] == [hub.sha256]


async def test_a_repo_on_the_command_line_is_a_url_not_a_missing_file(tmp_path):
    from node.commands.run import _check_models
    from node.models.sources import model_sources

    models = ["hf.co/org/Tiny-GGUF:Q4_K_M", "huggingface.co/org/Tiny-GGUF", "hf://org/Tiny-GGUF:Q8_0"]
    _check_models(models, as_slices=True)  # was: "no such file hf.co/org/Tiny-GGUF:Q4_K_M"
    assert model_sources(tmp_path, models, include_default=False) == []


def _loaded(node) -> bool:
    return any(s.state == "loaded" for s in node.slice_host.slices.values())


async def test_a_repo_served_before_is_served_at_once_with_the_hub_down(tmp_path, hub, monkeypatch):
    """Day 2, the Hub answering 503 to everything: the file the first run found is remembered
    (models/repo-files.json), its partial model opens from what it holds and its layers load (the
    start used to stop: the repo could not be looked up, `--layers` refuses to wait)."""
    monkeypatch.setattr(const, "HF_LISTING_ATTEMPTS", 1)
    config = node_config(tmp_path / "data", models=["hf://org/Tiny-GGUF:Q4_K_M"], layers="1-2", slice_dtype="f32",
                         slice_kv_dtype="f32")
    async with running_node(config) as node:
        await wait_until(lambda: _loaded(node), 30.0, 0.05, "layers 1-2, the Hub answering")
    hub.api_fail_with = hub.hub_fail_with = [(503, {})] * 1000
    async with running_node(config) as node:
        await wait_until(lambda: _loaded(node), 30.0, 0.05, "layers 1-2 held, the Hub down")
        [hosted] = node.slice_host.slices.values()
        assert (hosted.entry.sha256, hosted.entry.source) == (hub.sha256, "cli")
        assert node.waiting_on() == []
    # another spelling of the repo finds the same remembered file, offline too
    config = node_config(tmp_path / "data", models=["hf.co/org/Tiny-GGUF:q4_k_m"], layers="1-2", slice_dtype="f32",
                         slice_kv_dtype="f32")
    async with running_node(config) as node:
        await wait_until(lambda: _loaded(node), 30.0, 0.05, "layers 1-2 held, spelt hf.co/…")
    assert len(hub.hub_fail_with) < 1000  # (the Hub was asked, and refused)


async def test_a_remembered_file_whose_folder_is_gone_is_looked_up_again(tmp_path, hub):
    """repo-files.json names a file the Hub no longer has (the quant renamed) and its folder is gone
    (deleted to free space): the start looks the repo up again and serves the file it names now
    (every `--layers` start was a 404 for a file the user never named: found in review)."""
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "repo-files.json").write_text(
        '{"repos": {"org/Tiny-GGUF:Q4_K_M@/": "hf://org/Tiny-GGUF/Old-Q4_K_M.gguf"}}')
    config = node_config(tmp_path / "data", models=["hf://org/Tiny-GGUF:Q4_K_M"], layers="1-2", slice_dtype="f32",
                         slice_kv_dtype="f32")
    async with running_node(config) as node:
        await wait_until(lambda: _loaded(node), 30.0, 0.05, "layers 1-2 of the file the repo names now")
        [hosted] = node.slice_host.slices.values()
        assert hosted.entry.sha256 == hub.sha256
    assert "Old-Q4_K_M" not in (models / "repo-files.json").read_text()


async def test_a_repo_whose_lookup_ends_after_the_start_serves_its_folder_of_models(tmp_path, hub, monkeypatch):
    """A data dir where the repo's file is not remembered (an earlier version's, the file deleted) and
    the Hub answers only on the second try: the start catalogs the partial model as a folder of
    models/; once the lookup ends, that model is the URL's and is served (it was left unserved,
    though the node said "reachable: serving it")."""
    for name, value in (("AUTO_SERVE_LOOK_S", 0.0), ("AUTO_SERVE_START_DELAY_S", 0.0), ("AUTO_SERVE_REACT_S", 0.01),
                        ("PARTIAL_OPEN_RETRY_MIN_S", 0.2), ("HF_LISTING_ATTEMPTS", 1)):
        monkeypatch.setattr(const, name, value)
    config = node_config(tmp_path / "data", models=["hf://org/Tiny-GGUF:Q4_K_M"], serve="auto", slice_budget_mb=64,
                         slice_dtype="f32", slice_kv_dtype="f32")
    async with running_node(config) as node:
        await wait_until(lambda: _loaded(node), 30.0, 0.05, "the model's layers, the Hub answering")
    (tmp_path / "data" / "models" / "repo-files.json").unlink(missing_ok=True)
    hub.api_fail_with = [(503, {})]
    async with running_node(config) as node:
        assert [m.entry.source for m in node.models.all()] == ["data_dir"]
        await wait_until(lambda: _loaded(node), 30.0, 0.05, "the model's layers, once the Hub answers")
        assert [(m.entry.sha256, m.entry.source) for m in node.models.all()] == [(hub.sha256, "cli")]


async def test_a_remembered_repo_file_is_looked_up_again_and_a_new_one_remembered(tmp_path, hub, caplog):
    """The repo's quant is another file now (renamed on the Hub): the running node goes on with the file
    remembered; the next start opens the new one (another partial model, another model id)."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "repo-files.json").write_text('{"repos": {"org/Tiny-GGUF:Q4_K_M@/": "hf://org/Tiny-GGUF/Old-Q4_K_M.gguf"}}')
    partials = PartialModels(models)
    await partials.origins.async_load()
    url = "hf.co/org/Tiny-GGUF:Q4_K_M"
    assert partials.origins.remembered(url) and partials.origins.file_of(url) == "hf://org/Tiny-GGUF/Old-Q4_K_M.gguf"
    caplog.set_level(logging.INFO)
    await partials.origins.async_refresh(url)
    assert partials.origins.file_of(url) == f"hf://org/Tiny-GGUF/{Q4}" and not partials.origins.remembered(url)
    assert "names another file now" in caplog.text
    again = PartialModels(models)
    await again.origins.async_load()
    assert again.origins.file_of("hf://org/Tiny-GGUF:q4_k_m") == f"hf://org/Tiny-GGUF/{Q4}"
