"""A download going on from what an earlier one left in models/ (a `.part` and its sidecar), against
local origins (tests/support/rangeserver.py, tests/support/hubserver.py): a partial file of another
version restarted from zero is not counted as space already used up, and a partial file already
complete (the origin's 416) is still checked against the Hub's X-Linked-Etag before it is served."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import pytest_asyncio

from node.models.download import ModelDownloader
from tests.support.hubserver import HubServer, serving_hub
from tests.support.rangeserver import ThreadedOrigin, other_bytes
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.usefixtures("fast_retries")]

DATA = b"GGUF" + os.urandom(2 << 20)


def _leave_part(models: Path, name: str, url: str, body: bytes, validator: str) -> Path:
    """What an earlier download of `url` left: `name.part` holding `body`, its sidecar naming `validator`."""
    models.mkdir(parents=True, exist_ok=True)
    part = models / (name + ".part")
    part.write_bytes(body)
    (models / (name + ".part.json")).write_text(json.dumps({"url": url, "validator": validator}), encoding="utf-8")
    return part


async def _download(models: Path, url: str):
    got = {}

    async def on_file(path, sha256, origin, _url=None):
        got.update(path=path, sha256=sha256)
        return "model-id"

    dl = ModelDownloader(models, on_file)
    job = dl.start(url)
    await wait_until(lambda: not job.active, timeout_s=30, what="the download to end")
    return job, got


async def test_a_changed_files_restart_counts_the_partial_file_it_overwrites_as_free(tmp_path, monkeypatch):
    """The file changed on the server since a paused download (If-Range: a 200, from zero): the old
    `.part` is overwritten, so its bytes are space the new version can use. They were not counted,
    and a disk with room for the file once the old bytes go was refused as too small, every time."""
    models = tmp_path / "models"
    with ThreadedOrigin(DATA) as origin:
        have = len(DATA) * 3 // 4
        _leave_part(models, "m.gguf", origin.url, b"GGUF" + bytes(have - 4), '"v0"')  # another version's
        usage = shutil.disk_usage(tmp_path)
        free = len(DATA) - have // 2  # less than the file, more than it once the old bytes are gone
        monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage._replace(free=free))
        job, got = await _download(models, origin.url)
        assert job.state == "done", job.error
        assert got["path"].read_bytes() == DATA
        assert origin.ranges == [f"bytes={have}-"]  # asked to resume; the origin answered the whole new file


@pytest_asyncio.fixture
async def hub(monkeypatch, tmp_path):
    srv = HubServer(DATA)
    async with serving_hub(srv, monkeypatch, tmp_path):
        yield srv


async def test_a_complete_partial_file_the_cdn_answers_416_for_is_checked_against_x_linked_etag(tmp_path, hub):
    """Every byte arrived, wrong (the node stopped while hashing them): the resume's Range starts at the
    file's end, the CDN answers 416, and the file was served without the Hub's hash being checked,
    which a download from zero would have refused."""
    models = tmp_path / "models"
    wrong = b"GGUF" + bytes(len(DATA) - 4)  # the right size, the wrong bytes
    part = _leave_part(models, "m.gguf", hub.url, wrong, hub.cdn_etag)
    job, got = await _download(models, hub.url)
    assert hub.cdn_requests and hub.cdn_requests[-1]["Range"] == f"bytes={len(DATA)}-"  # the 416 path
    assert job.state == "failed" and "X-Linked-Etag" in (job.error or ""), (job.state, job.error)
    assert not got and not (models / "m.gguf").exists() and not part.exists()
    assert hashlib.sha256(DATA).hexdigest() in job.error


async def test_the_rate_stays_true_when_a_resumed_download_restarts_from_zero(tmp_path):
    """A paused download resumed (206 from its kept bytes), its connection dropped, and the file changed
    on the server meanwhile (If-Range: a 200, from zero): the rate was (bytes now - bytes kept at the
    resume) / time, negative until the restart got past the kept bytes; the panel, the Models tab's
    line and `swarmllm download` showed it ("-0.4 MiB/s")."""
    models = tmp_path / "models"
    kept, cut = len(DATA) // 2, len(DATA) // 8
    newer = other_bytes(DATA, 4)  # the same header, other bytes: another version
    with ThreadedOrigin(DATA) as origin:
        _leave_part(models, "m.gguf", origin.url, DATA[:kept], origin.etag)
        origin.drop_after = cut  # the resume's answer ends early ...
        origin.change_after = (cut, newer)  # ... and the next request finds the file changed ("v2")
        rates = []

        async def on_file(_path, _sha256, _origin, _url=None):
            return "model-id"

        dl = ModelDownloader(models, on_file)
        dl.subscribe(lambda j: rates.append(j.summary()["mb_per_s"]) if j.state == "downloading" else None)
        job = dl.start(origin.url)
        await wait_until(lambda: not job.active, timeout_s=30, what="the download to end")
        assert job.state == "done", job.error
        assert (models / "m.gguf").read_bytes() == newer
        assert len(origin.ranges) == 2 and origin.ranges[0] == f"bytes={kept}-"  # the second answered 200 (v2)
        assert rates and all(r is not None and r >= 0 for r in rates), rates
        assert job.summary()["mb_per_s"] > 0



async def test_another_urls_download_under_a_paused_ones_name_is_refused_not_written_over_it(tmp_path):
    """A paused download of m.gguf (its bytes kept), then another URL's file also called m.gguf (a common
    name in many repos): the new download took the name and truncated the kept `.part`, gigabytes of
    another file gone without a word. It is refused now, saying how to go on; the paused one resumes."""
    from node.errors import Conflict

    models = tmp_path / "models"
    newer = other_bytes(DATA, 4)
    with ThreadedOrigin(DATA) as first, ThreadedOrigin(newer) as second:
        kept = len(DATA) // 2
        part = _leave_part(models, "m.gguf", first.url, DATA[:kept], first.etag)

        async def on_file(_path, _sha256, _origin, _url=None):
            return "model-id"

        dl = ModelDownloader(models, on_file)
        (paused,) = await dl.async_restore()
        with pytest.raises(Conflict) as refused:
            dl.start(second.url)
        assert "m.gguf" in refused.value.message and "filename" in refused.value.message, refused.value.message
        assert part.stat().st_size == kept and paused.resumable and second.requests == 0
        job = dl.resume(paused.id)  # the paused one goes on from its bytes
        await wait_until(lambda: not job.active, timeout_s=30, what="the resumed download to end")
        assert job.state == "done", job.error
        assert (models / "m.gguf").read_bytes() == DATA and first.ranges == [f"bytes={kept}-"]


async def test_a_login_page_answering_a_resume_leaves_the_kept_bytes_as_they_were(tmp_path):
    """A paused download resumed where a captive portal or a proxy answers with a page of its own (a
    200, no ETag): the `.part` was truncated and its sidecar rewritten before the first bytes were
    checked, then deleted as "not a GGUF file": every byte kept was gone. Now the page is refused
    before the partial file is touched, and the download resumes from it once the network is back."""
    models = tmp_path / "models"
    kept = len(DATA) // 2
    with ThreadedOrigin(DATA) as origin:
        part = _leave_part(models, "m.gguf", origin.url, DATA[:kept], origin.etag)
        origin.fail_from, origin.fail_page = 0, True  # every ranged request gets the page
        job, _got = await _download(models, origin.url)
        assert job.state == "failed" and "not a GGUF file" in job.error, job.error
        assert part.read_bytes() == DATA[:kept] and job.resumable and job.kept_bytes == kept
        origin.fail_from = None  # the network is back
        job, got = await _download(models, origin.url)
        assert job.state == "done", job.error
        assert got["path"].read_bytes() == DATA and origin.ranges[-1] == f"bytes={kept}-"


async def test_the_same_download_asked_again_with_a_sha256_it_is_not_checking_is_refused(tmp_path):
    """A download running without a hash, then the same URL asked again with `--sha256` (the CLI, the
    API): the second got the running job back and its hash was never checked, without a word. It is
    refused now (409, saying why); asked again as it runs, it is still the same job."""
    from node.errors import Conflict

    models = tmp_path / "models"
    with ThreadedOrigin(DATA) as origin:
        origin.stall_after = 256 << 10  # bytes flow, then the origin holds the rest

        async def on_file(_path, _sha256, _origin, _url=None):
            return "model-id"

        dl = ModelDownloader(models, on_file)
        job = dl.start(origin.url)
        await wait_until(lambda: job.done_bytes > 0, timeout_s=30, what="bytes arriving")
        assert dl.start(origin.url) is job  # the same download, joined
        with pytest.raises(Conflict) as refused:
            dl.start(origin.url, sha256="ab" * 32)
        assert "sha256" in refused.value.message, refused.value.message
        origin.release.set()
        await wait_until(lambda: not job.active, timeout_s=30, what="the download to end")
        assert job.state == "done", job.error
