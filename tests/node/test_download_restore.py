"""A download interrupted by a node's stop is still there after it (2026-12-06): a real node stopped
mid-download and started again on the same data dir lists it paused with its bytes (a split set as
one job), resumes it with Range (nothing fetched twice) and serves the model; Cancel deletes the
partial file; a `.part` without a sidecar is said in the log, not listed; a failed download whose
partial file is kept resumes; a signed link, kept without its query, says to paste the link again.
Until then the job lived in the node's memory only: after a restart nothing mentioned the bytes kept."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
import pytest_asyncio

from node import const
from tests.node.test_model_file_kinds import rewrite
from tests.support.hubserver import HubServer, serving_hub
from tests.support.nodes import TINY, _build_sdk_models, node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.llama, pytest.mark.usefixtures("fast_retries")]

REPO = "/org/model/resolve/main/"


@pytest.fixture
def sdk():
    """The official openai client, made outside the node's loop (its types took its CPU there);
    `with_options(base_url=, api_key=)` points it at a node."""
    import openai

    _build_sdk_models("openai.types", "openai.types.chat")
    return openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="-", max_retries=0)


def at(sdk, node):
    return sdk.with_options(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key)


async def api(node, method, path, body=None):
    async with aiohttp.ClientSession() as s, s.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, await r.json()


async def job_of(node, job_id):
    _, body = await api(node, "GET", f"/api/admin/downloads/{job_id}")
    return body["download"]


async def finished(node, job_id):
    async def done():
        return (await job_of(node, job_id))["state"] not in ("starting", "downloading", "verifying")
    await wait_until(done, timeout_s=60, what="the download to end")
    return await job_of(node, job_id)


async def stopped_mid_download(config, url, filename, bytes_in, what=lambda job: True):
    """A real node starts a download and is stopped once `bytes_in` arrived: the job's last view."""
    async with running_node(config) as node:
        status, body = await api(node, "POST", "/api/admin/models/download", {"url": url, "filename": filename})
        assert status == 202, body
        job_id = body["download"]["id"]

        async def arrived():
            job = await job_of(node, job_id)
            return job["done_bytes"] >= bytes_in and what(job)
        await wait_until(arrived, timeout_s=30, what="bytes arriving")
    return job_id


async def listed(node):
    _, body = await api(node, "GET", "/api/admin/downloads")
    return body["downloads"]


async def test_a_node_stopped_mid_download_lists_it_paused_and_resumes_it(tmp_path, server, other_bytes, caplog,
                                                                         sdk):
    data = tmp_path / "data"
    server.stall_after = 250_000
    await stopped_mid_download(node_config(data), server.url, "kept.gguf", 250_000)
    server.stall_after = None
    server.release.set()
    (data / "models" / "stray.gguf.part").write_bytes(b"x" * 1000)  # no sidecar: cannot be resumed
    server.requests.clear()
    caplog.set_level(logging.INFO, logger="node.models.download")
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)  # the stray .part is not a job
        assert job["file"] == "kept.gguf" and job["state"] == "paused" and job["resumable"] and job["restored"]
        assert job["done_bytes"] == 250_000 and job["url"] == server.url
        assert any("cannot be resumed" in r.message and "stray.gguf.part" in r.message for r in caplog.records)
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        assert server.requests == [{"range": "bytes=250000-", "if_range": '"v1"'}]  # nothing fetched twice
        assert (data / "models" / "kept.gguf").read_bytes() == other_bytes
        assert (await job_of(node, job["id"]))["resumed_as"] == done["id"]
        model_id = done["model_id"]
        status, _ = await api(node, "POST", f"/api/admin/models/{model_id}/load")
        assert status == 200
        reply = await at(sdk, node).chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)
        assert reply.model == model_id and reply.usage.completion_tokens >= 1


async def test_cancel_of_a_download_an_earlier_run_left_deletes_its_partial_file(tmp_path, server):
    data = tmp_path / "data"
    server.stall_after = 100_000
    await stopped_mid_download(node_config(data), server.url, "gone.gguf", 100_000)
    server.stall_after = None
    server.release.set()
    part = data / "models" / "gone.gguf.part"
    assert part.exists()
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/cancel")
        assert status == 200 and body["download"]["state"] == "cancelled", body
        assert not part.exists() and not part.with_name("gone.gguf.part.json").exists()
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 409, body
    async with running_node(node_config(data)) as node:  # nothing comes back
        assert await listed(node) == []


async def test_a_failed_download_whose_partial_file_is_kept_resumes(tmp_path, server, other_bytes, monkeypatch):
    monkeypatch.setattr(const, "DOWNLOAD_RETRIES", 1)
    server.drop_after = 200_000
    async with running_node(node_config(tmp_path / "data")) as node:
        status, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "f.gguf"})
        failed = await finished(node, body["download"]["id"])
        assert failed["state"] == "failed" and "kept" in failed["error"], failed
        assert failed["resumable"] and failed["kept_bytes"] == 200_000
        server.requests.clear()
        status, body = await api(node, "POST", f"/api/admin/downloads/{failed['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        assert server.requests == [{"range": "bytes=200000-", "if_range": '"v1"'}]
        assert (node.data_dir / "models" / "f.gguf").read_bytes() == other_bytes
        assert not (await job_of(node, failed["id"]))["resumable"]  # it went on as the new one


@pytest.fixture
def parts(tmp_path):
    src = tiny_model(tmp_path, TINY, "src.gguf")
    rewrite(src, tmp_path / "big.gguf", split_max_tensors=8)
    return {p.name: p.read_bytes() for p in sorted(tmp_path.glob("big-0000?-of-00003.gguf"))}


@pytest_asyncio.fixture
async def hub(monkeypatch, tmp_path, parts):
    names = list(parts)
    srv = HubServer(parts[names[0]], REPO + names[0])
    for name in names[1:]:
        srv.add_file(REPO + name, parts[name])
    async with serving_hub(srv, monkeypatch, tmp_path):
        yield srv
        srv.release.set()  # a stalled CDN answer ends before the stop


async def test_a_split_set_stopped_in_part_2_comes_back_as_one_job(tmp_path, hub, parts, sdk):
    names = list(parts)
    sizes = [len(b) for b in parts.values()]
    data = tmp_path / "data"
    hub.stall_path, hub.stall_after = REPO + names[1], sizes[1] // 2
    await stopped_mid_download(node_config(data), f"hf://org/model/{names[0]}", None, sizes[0] + sizes[1] // 2,
                               what=lambda job: job["part"] == 2)
    hub.release.set()
    served_before = dict(hub.served)
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        assert job["file"] == names[0] and job["parts"] == 3 and job["state"] == "paused", job
        assert job["done_bytes"] == sizes[0] + sizes[1] // 2
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        for name, data_ in parts.items():
            assert (data / "models" / name).read_bytes() == data_
        fetched = {p: hub.served.get(p, 0) - served_before.get(p, 0) for p in hub.served}
        assert fetched.get(REPO + names[0], 0) == 0  # part 1 was complete: checked, not fetched again
        assert fetched[REPO + names[1]] == sizes[1] - sizes[1] // 2
        assert fetched[REPO + names[2]] == sizes[2]
        reply = await at(sdk, node).chat.completions.create(
            model=done["model_id"], messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)
        assert reply.usage.completion_tokens >= 1


async def test_a_signed_link_kept_without_its_query_says_to_paste_it_again(tmp_path, hub, parts):
    names = list(parts)
    one = REPO + names[0]
    data = tmp_path / "data"
    hub.stall_path, hub.stall_after = one, 4096
    await stopped_mid_download(node_config(data), hub.presigned(one), None, 4096)
    hub.release.set()
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        assert job["state"] == "paused" and job["done_bytes"] == 4096 and "?" not in job["url"], job
        _, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        failed = await finished(node, body["download"]["id"])
        assert failed["state"] == "failed" and "403" in failed["error"], failed
        assert "paste the download link again" in failed["error"] and "signed" in failed["error"]
        assert "Signature" not in failed["error"]
        assert (data / "models" / (names[0] + ".part")).stat().st_size == 4096  # still there
        served = hub.served.get(one, 0)
        _, body = await api(node, "POST", "/api/admin/models/download", {"url": hub.presigned(one)})  # pasted again
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        assert hub.served[one] - served == len(parts[names[0]]) - 4096  # it resumed


async def test_a_sidecar_with_an_invalid_url_does_not_stop_the_node(tmp_path, caplog):
    """A damaged or edited sidecar (a port past 65535, an unclosed IPv6 bracket, not http) is an
    orphan, said once in the log and not listed; until 2026-12-06 its ValueError stopped Node.start."""
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    for name, url in (("a", "https://example.com:99999/a.gguf"), ("b", "https://[::1/b.gguf"),
                      ("c", "ftp://example.com/c.gguf")):
        (models / f"{name}.gguf.part").write_bytes(b"x" * 100)
        (models / f"{name}.gguf.part.json").write_text(json.dumps({"url": url, "validator": '"v1"'}))
    caplog.set_level(logging.INFO, logger="node.models.download")
    async with running_node(node_config(tmp_path / "data")) as node:
        assert await listed(node) == []
        said = [r.message for r in caplog.records if "cannot be resumed" in r.message]
        assert len(said) == 3 and all("no valid URL" in m for m in said), said


async def test_a_newer_download_of_the_same_file_supersedes_the_older_resumable_one(tmp_path, server, other_bytes,
                                                                                 monkeypatch):
    """A failed download whose partial file is kept, then the same file downloaded again and paused:
    the old job is no longer resumable and its Cancel deletes nothing (until 2026-12-06 it stayed
    listed resumable, and its Cancel deleted the newer paused download's partial file)."""
    monkeypatch.setattr(const, "DOWNLOAD_RETRIES", 1)
    server.drop_after = 200_000
    async with running_node(node_config(tmp_path / "data")) as node:
        _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "f.gguf"})
        old = await finished(node, body["download"]["id"])
        assert old["state"] == "failed" and old["resumable"], old
        server.stall_after = 300_000
        _, body = await api(node, "POST", "/api/admin/models/download", {"url": server.url, "filename": "f.gguf"})
        new_id = body["download"]["id"]
        await wait_until(lambda: node.downloads.get(new_id).done_bytes >= 300_000, 30, 0.05, "bytes arriving")
        node.downloads.pause(new_id)
        await wait_until(lambda: node.downloads.get(new_id).state == "paused", 30, 0.05, "the pause")
        server.release.set()
        server.stall_after = None
        stale = await job_of(node, old["id"])
        assert not stale["resumable"] and stale["resumed_as"] == new_id, stale
        part = node.data_dir / "models" / "f.gguf.part"
        kept = part.stat().st_size
        assert kept > 200_000
        status, body = await api(node, "POST", f"/api/admin/downloads/{old['id']}/cancel")
        assert status == 409, body
        assert part.stat().st_size == kept  # the newer download's bytes are still there
        status, body = await api(node, "POST", f"/api/admin/downloads/{new_id}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
        assert done["state"] == "done", done
        assert (node.data_dir / "models" / "f.gguf").read_bytes() == other_bytes


async def test_a_split_set_comes_back_under_its_latest_jobs_id():
    """Found in review (2026-12-06): job B resuming a set past its complete part 1 (the origin's 416)
    rewrote only part 2's sidecar, so part 1 still named job A; the set came back as A while the CLI
    had told the user `--resume B`. Parts are fetched in order: the latest part with an id names it."""
    from node.models.download.restore import Kept, restored_jobs

    url = "https://huggingface.co/org/model/resolve/main/big-00001-of-00003.gguf"
    kept = [Kept("big-00001-of-00003.gguf", url, False, 100, "aaaaaaaaaaaa"),
            Kept("big-00002-of-00003.gguf", url.replace("00001-of", "00002-of"), False, 50, "bbbbbbbbbbbb")]
    [job] = restored_jobs(kept)
    assert job.id == "bbbbbbbbbbbb" and len(job.parts) == 3
