"""An origin that answers a range with something other than the file — a 200 error page, a
proxy's or a captive portal's reply — while the file itself is unchanged: it was taken for a new
version, every part held was deleted (layers in use included), and the fetch failed with "keeps
changing" (found by driving a real `--layers` node, 2026-12-06: 13 MB of layers gone after one
bad answer; gigabytes on a real model). The origin is asked first; the parts stay."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from node import const
from node.errors import DownloadFailed
from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)


class Origin:
    """The file with ranges and an ETag; with `error_page_from` set, a range starting at or past
    that byte is answered 200 with a small HTML page (no ETag), as a proxy's error would be."""

    def __init__(self, data: bytes):
        self.data, self.error_page_from = data, None
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def do_GET(self):  # noqa: N802
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                first = int(m.group(1)) if m else 0
                if origin.error_page_from is not None and first >= origin.error_page_from:
                    body = b"<html>upstream error</html>"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                last = min(int(m.group(2)), len(origin.data) - 1) if m and m.group(2) else len(origin.data) - 1
                self.send_response(206 if m else 200)
                self.send_header("ETag", '"v1"')
                self.send_header("Content-Length", str(last - first + 1))
                if m:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{len(origin.data)}")
                self.end_headers()
                self.wfile.write(origin.data[first:last + 1])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/m.gguf"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


async def test_an_answer_that_is_not_the_file_costs_no_part_held(tmp_path, model):  # noqa: F811
    origin = Origin(model.read_bytes())
    try:
        store, manifest = await async_open_partial(origin.url, tmp_path / "m.partial")
        header = read_header(store.header_path)
        held = parts_for(header, 2, 4)
        await async_fetch_parts(store, manifest, held)
        assert manifest.covers(held)
        origin.error_page_from = 4096  # the probe's first bytes come through; every layer range is a page
        with pytest.raises(DownloadFailed, match="something other than the file"):
            await async_fetch_parts(store, manifest, parts_for(header, 2, 6))
        assert manifest.covers(held) and all(store.part_path(p).exists() for p in held)
        assert store.load().covers(held)
        origin.error_page_from = None
        await async_fetch_parts(store, manifest, parts_for(header, 2, 6))  # the origin is well again
        assert manifest.covers(parts_for(header, 2, 6))
    finally:
        origin.close()
