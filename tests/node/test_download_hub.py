"""Downloads as Hugging Face serves them, against a local stand-in (tests/support/hubserver.py):
the resolve URL's 302 to a signed CDN URL (absolute or relative), a dropped connection resumed
through a fresh redirect after the signed URL expired, the file's sha256 from X-Linked-Etag
checked, a gated repo's 401 naming HF_TOKEN, the token sent to the Hub only, and a 429's
Retry-After honoured within a cap."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest
import pytest_asyncio

from node import const
from node.models.download import ModelDownloader
from tests.support.hubserver import HubServer, serving_hub
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

DATA = b"GGUF" + os.urandom(3 << 20)
TOKEN = "hf_SeCrEtToKeN123"


@pytest_asyncio.fixture
async def hub(monkeypatch, tmp_path):
    srv = HubServer(DATA)
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    async with serving_hub(srv, monkeypatch, tmp_path):
        yield srv


async def _download(tmp_path, url):
    got = {}

    async def on_file(path, sha256, origin, _url=None):
        got.update(path=path, sha256=sha256, origin=origin)
        return "model-id"

    dl = ModelDownloader(tmp_path / "models", on_file)
    job = dl.start(url)
    await wait_until(lambda: not job.active, timeout_s=30, what="the download to end")
    return job, got


@pytest.mark.parametrize("relative", [False, True])
async def test_a_drop_resumes_through_a_fresh_redirect_after_the_signed_url_expired(tmp_path, hub, relative):
    hub.relative_location = relative
    hub.drop_after = len(DATA) // 2  # and each signed URL answers once: the resume needs a new one
    job, got = await _download(tmp_path, "hf://org/model/m.gguf")
    assert job.state == "done", job.error
    assert got["path"].read_bytes() == DATA and got["sha256"] == hub.sha256
    assert hub.sent == len(DATA)  # nothing fetched twice
    assert len(hub.hub_requests) == 2 and hub.hub_requests[1]["Range"] == f"bytes={len(DATA) // 2}-"
    assert got["origin"] == hub.url  # no signature kept


async def test_bytes_that_do_not_hash_to_the_hubs_x_linked_etag_are_refused(tmp_path, hub):
    hub.body_override = b"GGUF" + bytes(len(DATA) - 4)  # the right size, the wrong bytes
    job, _got = await _download(tmp_path, hub.url)
    assert job.state == "failed" and "X-Linked-Etag" in job.error and hub.sha256 in job.error
    assert not list((tmp_path / "models").iterdir())


async def test_a_gated_repo_without_a_token_says_to_set_hf_token(tmp_path, hub):
    hub.token = TOKEN
    job, _got = await _download(tmp_path, hub.url)
    assert job.state == "failed" and "401" in job.error and "HF_TOKEN" in job.error, job.error


@pytest.mark.parametrize("where", ["env", "file"])
async def test_the_token_goes_to_the_hub_never_to_the_cdn_nor_the_logs(tmp_path, hub, monkeypatch, caplog, where):
    hub.token = TOKEN
    hub.drop_after = len(DATA) // 3
    if where == "env":
        monkeypatch.setenv("HF_TOKEN", TOKEN)
    else:  # what `huggingface-cli login` writes
        (tmp_path / "hf-home").mkdir()
        (tmp_path / "hf-home" / "token").write_text(TOKEN + "\n")
    caplog.set_level(logging.DEBUG)
    job, got = await _download(tmp_path, "hf://org/model/m.gguf")
    assert job.state == "done", job.error
    assert all(r.get("Authorization") == f"Bearer {TOKEN}" for r in hub.hub_requests) and len(hub.hub_requests) == 2
    assert not any("Authorization" in r for r in hub.cdn_requests)
    assert TOKEN not in caplog.text and TOKEN not in str(job.summary())


async def test_a_token_without_access_says_so(tmp_path, hub, monkeypatch):
    hub.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", "hf_another")
    job, _got = await _download(tmp_path, hub.url)
    assert job.state == "failed" and "403" in job.error and "no access" in job.error, job.error
    assert "hf_another" not in job.error


async def test_retry_after_is_honoured_within_its_cap_and_logged(tmp_path, hub, monkeypatch, caplog):
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_AFTER_MAX_S", 0.3)
    hub.hub_fail_with = [(429, {"Retry-After": "3600"}), (503, {"Retry-After": "0.2"})]
    caplog.set_level(logging.INFO)
    job, got = await _download(tmp_path, hub.url)
    assert job.state == "done", job.error
    assert hashlib.sha256(got["path"].read_bytes()).hexdigest() == hub.sha256
    lines = [r.getMessage() for r in caplog.records if "interrupted, resuming" in r.getMessage()]
    assert "retry_after_s=0.3" in lines[0] and "retry_in_s=0.3" in lines[0]
    assert "retry_after_s=0.2" in lines[1] and "retry_in_s=0.2" in lines[1]
