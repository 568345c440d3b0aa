"""A local stand-in for Hugging Face: the Hub's resolve URL answers 302 to a signed URL on a CDN
(another port, or a relative Location), with X-Linked-Size / X-Linked-Etag (the file's sha256,
quoted) / ETag / x-repo-commit; the CDN serves Range and If-Range (416 past the file's end), refuses an expired signed URL
with 403, and misbehaves on request. Both record each request's headers. More files of the repo
(a split model's parts) are served with `add_file` before `start`; `served` counts each file's
body bytes sent. `presigned(path)` is an S3-style URL of one file on the CDN, its signature valid
for that object only (another object's answers 403).

The repo's listing, as the Hub answers `GET /api/models/{owner}/{repo}/tree/{revision}?recursive=true`
(huggingface_hub's list_repo_tree, llama.cpp's -hf): a JSON array of `{"type": "file", "oid",
"size", "path", "lfs": {"oid": sha256, "size", "pointerSize"}}` and `{"type": "directory", …}`,
paged with `Link: <…?cursor=…>; rel="next"` (`tree_page_size`); a repo it has no file of answers
401 with `X-Error-Code: RepoNotFound` to a stranger and 404 to a token holder, a gated one (`token`)
401/403 with `X-Error-Code: GatedRepo`, an unknown revision 404 `RevisionNotFound`. `api_requests`
records each listing request's headers; `api_fail_with` answers (status, headers) first.

`use_hub` points a test's Hugging Face environment at a stand-in (and away from the user's token);
`serving_hub` starts one, points the environment at it, and stops it after."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web


def use_hub(monkeypatch: pytest.MonkeyPatch, endpoint: str | None, home: Path | None = None, *,
            token: str | None = None) -> None:
    """Set the environment the node reads Hugging Face's settings from, for one test (monkeypatch
    restores it): HF_ENDPOINT `endpoint` (None: unset, the real Hub's), HF_TOKEN `token` (None:
    unset), and with `home` HF_HOME there and no HF_TOKEN_PATH (never the real user's token file)."""
    for name, value in (("HF_ENDPOINT", endpoint), ("HF_TOKEN", token)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    if home is not None:
        monkeypatch.setenv("HF_HOME", str(home))
        monkeypatch.delenv("HF_TOKEN_PATH", raising=False)


@contextlib.asynccontextmanager
async def serving_hub(srv: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *,
                      token: str | None = None) -> AsyncIterator[HubServer]:
    """`srv` started, the environment pointed at it (`use_hub`, HF_HOME under `tmp_path`); stopped after."""
    await srv.start()
    try:
        use_hub(monkeypatch, srv.hub, tmp_path / "hf-home", token=token)
        yield srv
    finally:
        await srv.stop()


class HubServer:
    def __init__(self, data: bytes, path: str = "/org/model/resolve/main/m.gguf"):
        self.data = data
        self.path = path
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.cdn_etag = '"cdn-v1"'
        self.body_override: bytes | None = None  # the CDN's bytes, when not the file's
        self.token: str | None = None  # a gated repo: this Bearer token is needed
        self.uses_per_signature = 1  # a signed URL answers this many requests, then 403 (expired)
        self.relative_location = False  # the 302 names a path on the Hub's own host
        # with a token set: a reader without it is sent (302) to a login page on another host (the
        # CDN's port: 200 text/html), as an SSO before a private mirror does, not answered 401
        self.login_redirect = False
        self.hub_fail_with: list[tuple[int, dict[str, str]]] = []  # (status, headers), one per request
        self.drop_after: int | None = None  # the CDN closes after this many body bytes (once)
        self.hub_requests: list[dict] = []
        self.cdn_requests: list[dict] = []
        self.sent = 0
        self._uses: dict[str, int] = {}
        self._sig = itertools.count()
        self.runners: list[web.AppRunner] = []
        self.hub = self.cdn = ""
        self.files: dict[str, bytes] = {path: data}  # more with add_file (before start)
        self.served: dict[str, int] = {}  # path → body bytes sent
        self.drop_path: str | None = None  # drop_after applies to this file only (None: any)
        self._sig_path: dict[str, str] = {}
        self.api_requests: list[dict] = []
        self.api_fail_with: list[tuple[int, dict[str, str]]] = []
        self.tree_page_size: int | None = None  # None: one page
        # the CDN (and a presigned URL) sends this many body bytes of `stall_path`'s file (None: any),
        # then holds the connection until `release` is set (a node stopped meanwhile)
        self.stall_after: int | None = None
        self.stall_path: str | None = None
        self.release = asyncio.Event()
        self.hold_head: asyncio.Event | None = None  # a HEAD without a token waits for it (a slow check)

    def add_file(self, path: str, data: bytes) -> None:
        self.files[path] = data

    @property
    def url(self) -> str:
        return self.hub + self.path

    async def _site(self, app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001

    async def start(self) -> None:
        hub, cdn = web.Application(), web.Application()
        for path in self.files:
            hub.router.add_route("*", path, self.resolve)
        hub.router.add_get("/cdn/{sig}", self.serve)  # a relative Location lands here
        hub.router.add_get("/api/models/{owner}/{repo}/tree/{revision}", self.tree)
        cdn.router.add_get("/cdn/{sig}", self.serve)
        cdn.router.add_get("/login", self.login)
        for path in self.files:
            cdn.router.add_get("/bucket" + path, self.serve_presigned)
        self.hub = await self._site(hub)
        self.cdn = await self._site(cdn)

    @staticmethod
    def _object_sig(path: str) -> str:
        return hashlib.sha256(f"key\0{path}".encode()).hexdigest()[:16]

    def presigned(self, path: str) -> str:
        """An S3 presigned URL of the file at `path` (after start): valid for that object only."""
        return f"{self.cdn}/bucket{path}?X-Amz-Expires=3600&X-Amz-Signature={self._object_sig(path)}"

    async def serve_presigned(self, request: web.Request) -> web.Response:
        path = request.path.removeprefix("/bucket")
        self.cdn_requests.append(dict(request.headers))
        if request.query.get("X-Amz-Signature") != self._object_sig(path):
            return web.Response(status=403, text="SignatureDoesNotMatch")
        if request.method != "GET":
            return web.Response(body=self.files[path], headers={"ETag": self.cdn_etag})
        return await self._send(request, path, self.files[path])

    async def tree(self, request: web.Request) -> web.Response:
        """The repo's files at a revision, as the Hub lists them (directories included, paged)."""
        self.api_requests.append(dict(request.headers))
        if self.api_fail_with:
            status, headers = self.api_fail_with.pop(0)
            return web.Response(status=status, headers=headers, text="busy")
        m = request.match_info
        repo = f"/{m['owner']}/{m['repo']}/resolve/"
        prefix = f"{repo}{m['revision']}/"
        auth = request.headers.get("Authorization")
        if not any(p.startswith(repo) for p in self.files):
            return web.json_response({"error": "Repository not found"}, status=404 if auth else 401,
                                     headers={"X-Error-Code": "RepoNotFound"})
        if self.token is not None and auth != f"Bearer {self.token}":
            return web.json_response({"error": "Access to this repo is restricted"}, status=403 if auth else 401,
                                     headers={"X-Error-Code": "GatedRepo"})
        if not any(p.startswith(prefix) for p in self.files):
            return web.json_response({"error": "Invalid rev id"}, status=404,
                                     headers={"X-Error-Code": "RevisionNotFound"})
        entries, dirs = [], set()
        for path, data in sorted(self.files.items()):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix):]
            for i in range(1, rel.count("/") + 1):
                d = "/".join(rel.split("/")[:i])
                if d not in dirs:
                    dirs.add(d)
                    entries.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(),
                                    "size": 0, "path": d})
            sha = hashlib.sha256(data).hexdigest()
            entries.append({"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data),
                            "path": rel, "lfs": {"oid": sha, "size": len(data), "pointerSize": 134}})
        start = int(request.query.get("cursor", "0"))
        stop = len(entries) if self.tree_page_size is None else start + self.tree_page_size
        headers = {}
        if stop < len(entries):
            headers["Link"] = f'<{self.hub}{request.path}?recursive=true&cursor={stop}>; rel="next"'
        return web.json_response(entries[start:stop], headers=headers)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    async def resolve(self, request: web.Request) -> web.Response:
        self.hub_requests.append(dict(request.headers))
        if request.method == "HEAD" and "Authorization" not in request.headers and self.hold_head is not None:
            await self.hold_head.wait()
        if self.hub_fail_with:
            status, headers = self.hub_fail_with.pop(0)
            return web.Response(status=status, headers=headers, text="busy")
        if self.token is not None and self.login_redirect and "Authorization" not in request.headers:
            return web.Response(status=302, headers={"Location": f"{self.cdn}/login?next={request.path}"})
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            status = 403 if "Authorization" in request.headers else 401
            return web.Response(status=status, text=f"Access to model org/model is restricted. {status}")
        sig = f"sig{next(self._sig)}"
        self._uses[sig] = 0
        self._sig_path[sig] = request.path
        data = self.files[request.path]
        where = f"/cdn/{sig}?X-Amz-Expires=3600&X-Amz-Signature=secret{sig}"
        return web.Response(status=302, headers={
            "Location": where if self.relative_location else self.cdn + where,
            "X-Linked-Size": str(len(data)), "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "x-repo-commit": "0123456789abcdef0123456789abcdef01234567"})

    async def login(self, request: web.Request) -> web.Response:
        """The SSO's login page (login_redirect): any reader gets it, 200."""
        self.cdn_requests.append(dict(request.headers))
        return web.Response(text="<html><body><form>Sign in</form></body></html>", content_type="text/html")

    async def serve(self, request: web.Request) -> web.StreamResponse:
        self.cdn_requests.append(dict(request.headers))
        sig = request.match_info["sig"]
        if sig not in self._uses or self._uses[sig] >= self.uses_per_signature:
            return web.Response(status=403, text="Request has expired")
        self._uses[sig] += 1
        path = self._sig_path[sig]
        data = self.body_override if self.body_override is not None and path == self.path else self.files[path]
        return await self._send(request, path, data)

    async def _send(self, request: web.Request, path: str, data: bytes) -> web.StreamResponse:
        """`data` from the Range asked (If-Range: the CDN's ETag), dropping or stalling on request."""
        start = 0
        rng = request.headers.get("Range")
        if rng and request.headers.get("If-Range") in (None, self.cdn_etag):
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):  # past the end, as S3 and CloudFront answer it
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}", "ETag": self.cdn_etag})
            end = rng.split("-")[1]
            stop = int(end) + 1 if end else len(data)
        else:
            stop = len(data)
        resp = web.StreamResponse(status=206 if rng and start or (rng and stop < len(data)) else 200)
        resp.headers["ETag"] = self.cdn_etag
        resp.headers["Accept-Ranges"] = "bytes"
        if resp.status == 206:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        resp.content_length = stop - start
        await resp.prepare(request)
        body = data[start:stop]
        if self.stall_after is not None and self.stall_path in (None, path):
            cut, self.stall_after = self.stall_after, None
            await resp.write(body[:cut])
            self.served[path] = self.served.get(path, 0) + cut
            await self.release.wait()
            if request.transport is not None:
                request.transport.close()
            return resp
        if self.drop_after is not None and self.drop_path in (None, path):
            cut, self.drop_after = self.drop_after, None
            await resp.write(body[:cut])
            self.sent += cut
            self.served[path] = self.served.get(path, 0) + cut
            await asyncio.sleep(0.5)  # the client reads what was sent before the close
            if request.transport is not None:
                request.transport.close()
            return resp
        await resp.write(body)
        self.sent += len(body)
        self.served[path] = self.served.get(path, 0) + len(body)
        await resp.write_eof()
        return resp
