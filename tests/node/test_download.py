"""Model downloads against a local HTTP server (no internet here; the code is the real one): a real
node downloads a GGUF through its admin API, resumes a dropped transfer with Range, restarts when
the file changed or the server ignores Range, refuses HTML and bad hashes, and the model it got
loads and answers through the OpenAI API."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import openai
import pytest
import pytest_asyncio

from node import const
from node.errors import InvalidRequest
from node.models.download import display_url, file_name_for, resolve_url
from tests.support.fileserver import serving_file
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama, pytest.mark.usefixtures("fast_retries")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("download")
    async with running_node(node_config(base / "data", tiny_model(base))) as n:
        yield n


@pytest_asyncio.fixture(loop_scope="module")
async def server(other_bytes):
    """tests/node/conftest.py's, on this module's loop (its node's)."""
    async with serving_file(other_bytes) as srv:
        yield srv


async def api(node, method, path, body=None):
    async with aiohttp.ClientSession() as s, s.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, await r.json()


async def finished(node, job_id):
    result = {}

    async def done():
        _, body = await api(node, "GET", f"/api/admin/downloads/{job_id}")
        result.update(body["download"])
        return result["state"] not in ("starting", "downloading", "verifying")
    await wait_until(done, timeout_s=60, what="download finished")
    return result


def _remove(node, name):
    for suffix in ("", ".part", ".part.json"):
        (node.data_dir / "models" / (name + suffix)).unlink(missing_ok=True)


async def test_download_registers_a_model_that_loads_and_answers(node, server, other_bytes):
    _remove(node, "other.gguf")
    status, body = await api(node, "POST", "/api/admin/models/download",
                             {"url": server.url, "filename": "other.gguf",
                              "sha256": hashlib.sha256(other_bytes).hexdigest()})
    assert status == 202, body
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "done", job
    assert job["done_bytes"] == job["total_bytes"] == len(other_bytes)
    model_id = job["model_id"]
    assert model_id.startswith("other-")
    path = node.data_dir / "models" / "other.gguf"
    assert path.read_bytes() == other_bytes
    assert not list((node.data_dir / "models").glob("*.part*"))
    _, models = await api(node, "GET", "/api/admin/models")
    assert model_id in [m["id"] for m in models["models"]]
    status, _ = await api(node, "POST", f"/api/admin/models/{model_id}/load")
    assert status == 200
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)
    reply = await client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, temperature=0)
    assert reply.model == model_id and reply.usage.completion_tokens >= 1
    await api(node, "POST", f"/api/admin/models/{model_id}/unload")


async def test_a_dropped_connection_resumes_with_range(node, server, other_bytes):
    _remove(node, "resumed.gguf")
    server.requests.clear()
    server.sent = 0
    server.drop_after = len(other_bytes) // 3
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "resumed.gguf"})
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "done", job
    assert job["attempts"] == 2
    assert server.requests[1] == {"range": f"bytes={len(other_bytes) // 3}-", "if_range": '"v1"'}
    assert server.sent == len(other_bytes)  # nothing fetched twice
    assert (node.data_dir / "models" / "resumed.gguf").read_bytes() == other_bytes


async def test_a_changed_file_or_a_server_without_range_restarts_from_zero(node, server, other_bytes):
    for change in ("etag", "ignore_range"):
        _remove(node, f"restart-{change}.gguf")
        server.requests.clear()
        server.drop_after = 1000
        server.etag, server.ignore_range = '"v1"', False
        _, body = await api(node, "POST", "/api/admin/models/download",
                            {"url": server.url, "filename": f"restart-{change}.gguf"})
        await wait_until(lambda: len(server.requests) >= 1, what="first request")
        if change == "etag":
            server.etag = '"v2"'  # the file changed on the server between the attempts
        else:
            server.ignore_range = True
        job = await finished(node, body["download"]["id"])
        assert job["state"] == "done", job
        assert server.requests[1]["range"] == "bytes=1000-"  # it asked to resume...
        assert (node.data_dir / "models" / f"restart-{change}.gguf").read_bytes() == other_bytes  # ...and got a whole file
    server.etag, server.ignore_range = '"v1"', False


async def test_server_errors_are_retried_then_reported(node, server, monkeypatch):
    _remove(node, "busy.gguf")
    monkeypatch.setattr(const, "DOWNLOAD_RETRIES", 3)
    server.fail_with = [503, 503, 503]
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "busy.gguf"})
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "failed" and job["attempts"] == 3
    assert "HTTP 503" in job["error"]
    server.fail_with = [503]
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "busy.gguf"})
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "done" and job["attempts"] == 2


@pytest.mark.parametrize(("setup", "expected"), [
    ("html", "is not a GGUF file"),
    ("sha", "sha256 mismatch"),
    ("404", "HTTP 404"),
])
async def test_bad_downloads_fail_clearly_and_leave_nothing(node, server, other_bytes, setup, expected):
    _remove(node, "bad.gguf")
    request = {"url": server.url, "filename": "bad.gguf"}
    if setup == "html":
        server.body_override = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>"
    elif setup == "sha":
        request["sha256"] = "0" * 64
    else:
        request["url"] = server.url.replace("/m.gguf", "/missing.gguf")
    try:
        _, body = await api(node, "POST", "/api/admin/models/download", request)
        job = await finished(node, body["download"]["id"])
    finally:
        server.body_override = None
    assert job["state"] == "failed"
    assert expected in job["error"]
    assert not list((node.data_dir / "models").glob("bad.gguf*"))
    _, models = await api(node, "GET", "/api/admin/models")
    assert not any("bad" in m["id"] for m in models["models"])


async def test_not_enough_disk_space_is_refused_before_downloading(node, server, monkeypatch):
    import shutil

    _remove(node, "big.gguf")
    usage = shutil.disk_usage(node.data_dir)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100))
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "big.gguf"})
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "failed" and "not enough disk space" in job["error"]


async def test_cancel_stops_and_removes_the_partial_file(node, server, other_bytes):
    _remove(node, "cancelled.gguf")
    server.stall_after, server.release = 100_000, asyncio.Event()  # part of the body, then nothing
    part = node.data_dir / "models" / "cancelled.gguf.part"
    try:
        _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "cancelled.gguf"})
        job_id = body["download"]["id"]

        async def receiving():
            _, got = await api(node, "GET", f"/api/admin/downloads/{job_id}")
            return got["download"]["done_bytes"] >= 100_000
        await wait_until(receiving, what="bytes arriving")
        assert part.exists()
        status, body = await api(node, "POST", f"/api/admin/downloads/{job_id}/cancel")
        assert status == 200
        job = await finished(node, job_id)
    finally:
        server.stall_after = None
        server.release.set()
    assert job["state"] == "cancelled"
    assert not list((node.data_dir / "models").glob("cancelled.gguf*"))


async def test_a_long_download_logs_its_progress(node, server, monkeypatch, caplog):
    """node.log says how a download goes between "started" and "complete" (a slow origin's hour
    was silence there), at most every DOWNLOAD_LOG_S."""
    import logging

    monkeypatch.setattr(const, "DOWNLOAD_LOG_S", 0.0)  # every progress event logs (the first comes with the bytes)
    caplog.set_level(logging.INFO, logger="node.models.download")
    _remove(node, "logged.gguf")
    server.stall_after, server.release = 100_000, asyncio.Event()
    try:
        _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "logged.gguf"})
        job_id = body["download"]["id"]

        def progress_lines():
            return [r.getMessage() for r in caplog.records
                    if "model download progress" in r.getMessage() and f"download={job_id}" in r.getMessage()]
        await wait_until(progress_lines, what="a progress line")
        line = progress_lines()[-1]
        assert "done_mb=0.1" in line and "total_mb=" in line and "mb_per_s=" in line, line
        await api(node, "POST", f"/api/admin/downloads/{job_id}/cancel")
        await finished(node, job_id)
    finally:
        server.stall_after = None
        server.release.set()


async def test_pause_keeps_the_part_a_discard_removes_it_and_never_under_a_resumed_download(node, server):
    """pause → paused (part kept) → resume is a new download of the same file; discarding the
    paused job then is refused (the resumed one writes the part: it used to be deleted under it)."""
    from node.errors import Conflict

    _remove(node, "paused.gguf")
    server.stall_after, server.release = 100_000, asyncio.Event()
    part = node.data_dir / "models" / "paused.gguf.part"
    downloads = node.downloads
    try:
        first = downloads.start(server.url, file_name="paused.gguf")
        await wait_until(lambda: first.done_bytes >= 100_000, what="bytes arriving")
        downloads.pause(first.id)
        await wait_until(lambda: first.state == "paused", what="the pause")
        kept = part.stat().st_size
        assert kept >= 100_000
        second = downloads.resume(first.id)
        assert second.id != first.id and second.active
        with pytest.raises(Conflict, match=f"resumed as {second.id}"):
            await downloads.async_discard(first.id)
        assert part.stat().st_size >= kept  # untouched
        downloads.pause(second.id)
        await wait_until(lambda: second.state == "paused", what="the second pause")
        await downloads.async_discard(second.id)
        assert second.state == "cancelled" and not part.exists()
    finally:
        server.stall_after = None
        server.release.set()


async def test_a_wrong_range_answer_restarts_from_zero(node, server, other_bytes):
    _remove(node, "wrongrange.gguf")
    server.requests.clear()
    server.drop_after = 200_000
    server.wrong_range_start = True
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "wrongrange.gguf"})
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "done", job
    assert [r["range"] for r in server.requests] == [None, "bytes=200000-", None]
    assert (node.data_dir / "models" / "wrongrange.gguf").read_bytes() == other_bytes


async def test_after_giving_up_the_partial_file_stays_and_the_next_download_resumes(node, server, other_bytes,
                                                                                   monkeypatch):
    _remove(node, "again.gguf")
    monkeypatch.setattr(const, "DOWNLOAD_RETRIES", 2)
    server.requests.clear()
    server.drop_after = 300_000
    server.fail_with = []
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "again.gguf"})
    await wait_until(lambda: len(server.requests) >= 1, what="first request")
    server.fail_with = [503]  # the resume attempt fails too: the job gives up
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "failed" and "partial file is kept" in job["error"], job
    assert (node.data_dir / "models" / "again.gguf.part").stat().st_size == 300_000
    _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "again.gguf"})
    job = await finished(node, body["download"]["id"])
    assert job["state"] == "done" and job["attempts"] == 1, job
    assert server.requests[-1]["range"] == "bytes=300000-"
    assert (node.data_dir / "models" / "again.gguf").read_bytes() == other_bytes


async def test_shutdown_keeps_the_partial_file_and_a_restarted_node_resumes(tmp_path, server, other_bytes):
    from node.models.download import ModelDownloader

    added = []

    async def on_file(path, sha256, origin_url, _url=None):
        added.append((path.name, sha256, origin_url))
        return "id-" + sha256[:8]

    models = tmp_path / "models"
    server.requests.clear()
    server.stall_after, server.release = 250_000, asyncio.Event()
    first = ModelDownloader(models, on_file)
    job = first.start(server.url, file_name="kept.gguf")
    await wait_until(lambda: job.done_bytes >= 250_000, what="bytes arriving")
    await first.async_close()  # the node stops mid-download
    server.stall_after = None
    server.release.set()
    assert job.state == "cancelled"
    assert (models / "kept.gguf.part").stat().st_size == 250_000
    sidecar = json.loads((models / "kept.gguf.part.json").read_text())
    assert sidecar == {"url": server.url, "validator": '"v1"', "job": job.id,  # no query, the job's id kept
                       "total": len(other_bytes)}  # its size (--list; 2026-12-07), no sha256 given

    second = ModelDownloader(models, on_file)  # the node started again
    job = second.start(server.url, file_name="kept.gguf")
    await wait_until(lambda: not job.active, what="the resumed download")
    assert job.state == "done", job.error
    assert server.requests[-1] == {"range": "bytes=250000-", "if_range": '"v1"'}
    assert job.resumed_from == 250_000
    assert (models / "kept.gguf").read_bytes() == other_bytes
    assert added == [("kept.gguf", hashlib.sha256(other_bytes).hexdigest(), server.url)]  # origin: no query
    assert sorted(p.name for p in models.iterdir()) == ["kept.gguf"]


async def test_a_complete_partial_file_is_finished_without_refetching(tmp_path, server, other_bytes):
    from node.models.download import ModelDownloader

    async def on_file(path, sha256, origin_url, _url=None):
        return "id"

    models = tmp_path / "models"
    models.mkdir()
    (models / "whole.gguf.part").write_bytes(other_bytes)  # every byte arrived; the rename did not happen
    (models / "whole.gguf.part.json").write_text(json.dumps({"url": server.url, "validator": '"v1"'}))
    server.requests.clear()
    server.sent = 0
    job = ModelDownloader(models, on_file).start(server.url, file_name="whole.gguf")
    await wait_until(lambda: not job.active, what="the download")
    assert job.state == "done", job.error
    n = len(other_bytes)  # its last byte asked under If-Range: the same version (2026-12-07)
    assert server.sent == 1 and [r["range"] for r in server.requests] == [f"bytes={n}-", f"bytes={n - 1}-{n - 1}"]
    assert (models / "whole.gguf").read_bytes() == other_bytes


async def test_a_job_cancelled_before_it_ran_is_not_left_active(tmp_path, server):
    from node.models.download import ModelDownloader

    async def on_file(path, sha256, origin_url, _url=None):
        return "id"

    downloader = ModelDownloader(tmp_path / "models", on_file)
    job = downloader.start(server.url, file_name="early.gguf")
    downloader.cancel(job.id)  # same loop turn: the task never started
    await wait_until(lambda: not job.active, what="the job settled")
    assert job.state == "cancelled"
    again = downloader.start(server.url, file_name="early.gguf")
    assert again.id != job.id
    downloader.cancel(again.id)
    await wait_until(lambda: not again.active, what="the second job settled")


async def test_bad_requests_get_clear_errors(node, server):
    _remove(node, "dup.gguf")
    cases = [
        ({}, 400, "url is required"),
        ({"url": 5}, 400, "url is required"),
        ({"url": "ftp://x/y.gguf"}, 400, "http(s)"),
        ({"url": server.url, "sha256": "abc"}, 400, "64 hex"),
        ({"url": server.url, "filename": "../../etc/passwd"}, 400, "cannot use"),
        ({"url": server.url, "bogus": 1}, 400, "unknown field"),
        ({"url": "hf://only-owner"}, 400, "hf://owner/repo"),
    ]
    for body, status, text in cases:
        got, reply = await api(node, "POST", "/api/admin/models/download", body)
        assert got == status, (body, reply)
        assert text in reply["error"]["message"], (body, reply)
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{node.api.port}/api/admin/models/download", data="{not json",
            headers={"Authorization": f"Bearer {node.api_key}", "Content-Type": "application/json"}) as r:
        assert r.status == 400 and "not valid JSON" in (await r.json())["error"]["message"]
    # an existing file is not overwritten; the same download twice is one job
    server.fail_with = [503] * 3
    try:
        _, first = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "dup.gguf"})
        _, second = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "dup.gguf"})
        assert first["download"]["id"] == second["download"]["id"]
        await finished(node, first["download"]["id"])
    finally:
        server.fail_with = []
    got, reply = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "dup.gguf"})
    assert got == 409 and "already exists" in reply["error"]["message"]
    got, _ = await api(node, "GET", "/api/admin/downloads/nope")
    assert got == 404


async def test_url_forms(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)  # a developer's mirror would move hf:// elsewhere
    assert resolve_url("hf://bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q4_K_M.gguf") == (
        "https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q4_K_M.gguf")
    assert resolve_url("hf://o/r/sub dir/m.gguf@v1.0").endswith("/o/r/resolve/v1.0/sub%20dir/m.gguf")
    assert display_url("https://cdn.example.com:8443/a/m.gguf?X-Amz-Signature=secret#x") == (
        "https://cdn.example.com:8443/a/m.gguf")
    assert file_name_for("https://h/a/model%2Bq8.gguf?sig=1", None) == "model+q8.gguf"
    assert file_name_for("https://h/a/weights", None) == "weights.gguf"
    assert json.dumps(file_name_for("https://h/x.gguf", "mine.gguf")) == '"mine.gguf"'
    assert resolve_url("http://bücher.example/m.gguf") == "http://bücher.example/m.gguf"
    # each was accepted (202), then the job failed with "internal error: UnicodeError" or worse
    for bad in ("http://" + "a" * 100_000 + "/m.gguf", "http://h:99999/m.gguf", "http://[::1/m.gguf", "http:///m.gguf"):
        with pytest.raises(InvalidRequest) as caught:
            resolve_url(bad)
        assert caught.value.param == "url"
