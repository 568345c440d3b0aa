"""A download resumed against a server that honours Range but ignores If-Range (it names the
file's new version in its ETag all the same): the file changed between the attempts, and the
resume spliced the new version's tail onto the old version's head. The result, neither file,
passed the size check and was registered as a model (found by driving a real node against a local
origin, 2026-12-06). A 206 naming another version than the one resumed must restart from zero."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import pytest
from aiohttp import web

from node.models.download import ModelDownloader
from node.models.download.job import DownloadJob
from tests.support.fileserver import serving_file
from tests.support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("fast_retries")


class IgnoresIfRange:
    """Serves `data` at /m.gguf: Range honoured whatever If-Range says; the first answer breaks off."""

    def __init__(self, data: bytes, drop_after: int):
        self.data, self.etag, self.drop_after = data, '"v1"', drop_after
        self.requests: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"range": request.headers.get("Range"), "if_range": request.headers.get("If-Range")})
        rng = request.headers.get("Range")
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        if start >= len(self.data):
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(self.data)}"})
        resp = web.StreamResponse(status=206 if start else 200)
        resp.headers["ETag"] = self.etag
        if start:
            resp.headers["Content-Range"] = f"bytes {start}-{len(self.data) - 1}/{len(self.data)}"
        resp.content_length = len(self.data) - start
        await resp.prepare(request)
        body = self.data[start:]
        if self.drop_after is not None:
            cut, self.drop_after = self.drop_after, None
            await resp.write(body[:cut])
            await asyncio.sleep(0.5)
            request.transport.close()
            return resp
        await resp.write(body)
        await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def serving(server: IgnoresIfRange):
    """`server` answering at a free port on 127.0.0.1: yields its file's URL; stopped on the way out."""
    app = web.Application()
    app.router.add_get("/m.gguf", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/m.gguf"  # noqa: SLF001
    finally:
        await runner.cleanup()


def leave_part(models: Path, body: bytes, **sidecar) -> None:
    """What an earlier download left in `models`: `m.gguf.part` holding `body`, its sidecar (if given)."""
    models.mkdir(exist_ok=True)
    (models / "m.gguf.part").write_bytes(body)
    if sidecar:
        (models / "m.gguf.part.json").write_text(json.dumps(sidecar))


def download(models: Path, url: str) -> tuple[DownloadJob, list[bytes]]:
    """A download of `url` to models/m.gguf, started: its job and the files it adds (their bytes)."""
    added = []

    async def on_file(path, sha256, origin_url, _url=None):
        added.append(path.read_bytes())
        return "id"

    return ModelDownloader(models, on_file).start(url, file_name="m.gguf"), added


async def test_a_resume_answered_with_another_version_restarts_from_zero(tmp_path):
    v1 = b"GGUF" + os.urandom(3_000_000)
    v2 = b"GGUF" + os.urandom(3_000_000)
    server = IgnoresIfRange(v1, drop_after=1_000_000)
    async with serving(server) as url:
        job, added = download(tmp_path / "models", url)
        await wait_until(lambda: len(server.requests) >= 1, what="the first request")
        server.data, server.etag = v2, '"v2"'  # the file changed at the origin before the resume
        await wait_until(lambda: not job.active, 30.0, what="the download")
        assert server.requests[1] == {"range": "bytes=1000000-", "if_range": '"v1"'}  # it asked to resume v1
        assert job.state == "done", job.error
        assert added == [v2], "a file spliced of two versions was kept"


async def test_a_partial_file_longer_than_the_new_version_restarts_instead_of_failing_for_ever(tmp_path):
    """The file at the URL became shorter than the .part kept from an earlier download: the
    server answered the resume 416, the download failed with 'HTTP 416' and kept the .part, so
    every later download of the URL failed the same way until the user found and deleted it."""
    v2 = b"GGUF" + os.urandom(500_000)
    models = tmp_path / "models"
    server = IgnoresIfRange(v2, drop_after=None)
    server.etag = '"v2"'
    async with serving(server) as url:
        leave_part(models, b"GGUF" + os.urandom(1_000_000), url=url, validator='"v1"')  # of v1, which was longer
        job, added = download(models, url)
        await wait_until(lambda: not job.active, 30.0, what="the download")
        assert server.requests[0]["range"] == "bytes=1000004-"
        assert job.state == "done", job.error
        assert added == [v2]


async def test_bytes_kept_from_an_earlier_download_are_not_counted_as_fetched_after_a_503(tmp_path):
    """A resumed download whose first attempt was a 503: the bytes of the .part kept from an
    earlier download counted as fetched this time (resumed_from was set by attempt 1 only), so
    its rate (the GUI's MB/s and time left, the log's mb_per_s) came out twice the real one."""
    data = b"GGUF" + os.urandom(2_000_000)
    models = tmp_path / "models"
    async with serving_file(data) as server:
        leave_part(models, data[:1_500_000], url=server.url, validator='"v1"')  # an earlier download's
        server.fail_with = [503]
        job, _ = download(models, server.url)
        await wait_until(lambda: not job.active, 30.0, what="the download")
        assert job.state == "done" and job.attempts == 2, job.error
        assert job.resumed_from == 1_500_000


async def test_a_complete_part_of_an_older_version_answered_416_is_not_kept_as_the_file(tmp_path):
    """A `.part` holding every byte of version 1 (the download stopped before its check and rename),
    the file at the URL since replaced by a version 2 of the same size, and a server that ignores
    If-Range: the resume from the `.part`'s end is answered 416 `bytes */size`, which until 2026-12-07
    was taken as "every byte already here": version 1 was finished and served as the URL's file, with
    no word that the origin now holds other bytes. The 416 is now confirmed by asking for the last
    byte under If-Range: another version (a 200, or a 206 naming it) downloads the file again."""
    v1 = b"GGUF" + os.urandom(800_000)
    v2 = b"GGUF" + os.urandom(800_000)
    models = tmp_path / "models"
    server = IgnoresIfRange(v2, drop_after=None)
    server.etag = '"v2"'
    async with serving(server) as url:
        leave_part(models, v1, url=url, validator='"v1"', total=len(v1))
        job, added = download(models, url)
        await wait_until(lambda: not job.active, 30.0, what="the download")
        assert server.requests[0]["range"] == f"bytes={len(v1)}-"  # the resume, answered 416
        assert job.state == "done", job.error
        assert added == [v2], "the older version was kept as the URL's file"
        assert not (models / "m.gguf.part").exists()


async def test_a_complete_part_of_the_same_version_answered_416_is_finished_without_downloading(tmp_path):
    """The same, the file at the URL unchanged: the `.part` is the file, finished with one byte asked."""
    v1 = b"GGUF" + os.urandom(800_000)
    models = tmp_path / "models"
    server = IgnoresIfRange(v1, drop_after=None)
    async with serving(server) as url:
        leave_part(models, v1, url=url, validator='"v1"', total=len(v1))
        job, added = download(models, url)
        await wait_until(lambda: not job.active, 30.0, what="the download")
        assert job.state == "done", job.error
        assert added == [v1]
        assert job.fetched_bytes <= 1, job.fetched_bytes
