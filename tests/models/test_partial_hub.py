"""Layers of a model fetched from a Hugging Face stand-in (tests/support/hubserver.py): every
range goes through the resolve URL's 302 to a signed CDN URL that answers once, a range dropped
midway resumes through a fresh redirect, the model is named by the sha256 the Hub states on its
redirect (X-Linked-Etag: until 2026-12-06 it was read from the CDN's answer, which never carries
it, so a partial holder named it by the derived id and never chained with whole-file holders),
and a gated repo's token goes to the Hub only."""

from __future__ import annotations

import logging

import pytest
import pytest_asyncio

from node import const
from node.errors import DownloadFailed
from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.hubserver import HubServer, serving_hub

TOKEN = "hf_PartialSecret42"


@pytest_asyncio.fixture
async def hub(model, monkeypatch, tmp_path):  # noqa: F811
    srv = HubServer(model.read_bytes())
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    async with serving_hub(srv, monkeypatch, tmp_path):
        yield srv


async def test_layers_come_through_fresh_redirects_and_the_model_is_named_by_the_hubs_sha256(
        tmp_path, hub, model):  # noqa: F811
    store, manifest = await async_open_partial(hub.url, tmp_path / "m.partial")
    assert manifest.sha256 == hub.sha256
    hub.drop_after = 100_000
    parts = parts_for(read_header(store.header_path), 0, 2)
    await async_fetch_parts(store, manifest, parts, url=hub.url)
    assert hub.drop_after is None  # a range was cut off midway, and resumed
    data = model.read_bytes()
    for t in manifest.tensors.values():
        if t.part in parts:
            got = store.part_path(t.part).read_bytes()[t.local:t.local + t.n_bytes]
            assert got == data[t.offset:t.offset + t.n_bytes], t.name


async def test_a_gated_repos_token_goes_to_the_hub_only(tmp_path, hub, monkeypatch, caplog):
    hub.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    store, manifest = await async_open_partial("hf://org/model/m.gguf", tmp_path / "m.partial")
    await async_fetch_parts(store, manifest, parts_for(read_header(store.header_path), 0, 1),
                            url="hf://org/model/m.gguf")
    assert len(hub.hub_requests) >= 2  # the probe and the range
    assert all(r.get("Authorization") == f"Bearer {TOKEN}" for r in hub.hub_requests)
    assert not any("Authorization" in r for r in hub.cdn_requests)
    assert TOKEN not in caplog.text


async def test_a_gated_repo_without_a_token_says_to_set_hf_token(tmp_path, hub):
    hub.token = TOKEN
    with pytest.raises(DownloadFailed, match="HF_TOKEN"):
        await async_open_partial("hf://org/model/m.gguf", tmp_path / "m.partial")


async def test_a_503s_retry_after_is_honoured_within_its_cap(tmp_path, hub, monkeypatch, caplog):
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_AFTER_MAX_S", 0.3)
    store, manifest = await async_open_partial(hub.url, tmp_path / "m.partial")
    hub.hub_fail_with = [(503, {"Retry-After": "86400"})]
    caplog.set_level(logging.INFO)
    await async_fetch_parts(store, manifest, parts_for(read_header(store.header_path), 0, 1))
    line = next(r.getMessage() for r in caplog.records if "layer fetch interrupted" in r.getMessage())
    assert "retry_after_s=0.3" in line and "retry_in_s=0.3" in line


async def test_the_header_probe_waits_out_a_rate_limit(tmp_path, hub, monkeypatch, caplog):
    """A 429 on the first look at the model (a `--layers` node's start) is asked again after its
    Retry-After; until 2026-12-06 it failed the open at once."""
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_AFTER_MAX_S", 0.2)
    hub.hub_fail_with = [(429, {"Retry-After": "30"}), (503, {})]
    caplog.set_level(logging.INFO)
    store, manifest = await async_open_partial(hub.url, tmp_path / "m.partial")
    assert manifest.sha256 == hub.sha256 and store.header_path.exists()
    lines = [r.getMessage() for r in caplog.records if "model header probe interrupted" in r.getMessage()]
    assert len(lines) == 2 and "retry_after_s=0.2" in lines[0] and "HTTP 429" in lines[0]
    # busy every time: a clear failure after the retries, not a hang
    monkeypatch.setattr(const, "DOWNLOAD_RETRIES", 2)
    hub.hub_fail_with = [(429, {"Retry-After": "1"})] * 3
    with pytest.raises(DownloadFailed, match="429.*2 attempts"):
        await async_open_partial(hub.url, tmp_path / "other.partial")
