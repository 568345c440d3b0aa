"""`swarmllm run --model URL --layers A-B` whose origin answered the header but went away while
the layers were fetched, longer than the fetch's retries (about 30 s): the slice stayed `failed`
until the node was restarted, though the origin came back a minute later (found by driving a
real node against an origin that went down mid-fetch, 2026-12-06). The load is tried again."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from node import const
from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128, name="later")


class Origin:
    """Ranges with an ETag; while `down_from` is set, a range starting at or past it is a 503."""

    def __init__(self, data: bytes):
        self.data, self.down_from = data, None
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def do_GET(self):  # noqa: N802
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                first = int(m.group(1)) if m else 0
                if origin.down_from is not None and first >= origin.down_from:
                    self.send_error(503)
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
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/later.gguf"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


async def test_layers_that_failed_to_arrive_at_start_load_once_the_origin_is_back(tmp_path, monkeypatch):
    for name, value in (("DOWNLOAD_RETRY_BASE_S", 0.01), ("DOWNLOAD_RETRIES", 2), ("PARTIAL_OPEN_RETRY_MIN_S", 0.2)):
        monkeypatch.setattr(const, name, value)
    data = write_gguf(tmp_path / "later.gguf", SPEC).read_bytes()
    origin = Origin(data)
    origin.down_from = 65536  # the header comes; the layers' ranges do not
    try:
        config = node_config(tmp_path / "data", models=[origin.url], layers="1-2", slice_dtype="f32",
                             slice_kv_dtype="f32")
        async with running_node(config) as node:
            [hosted] = node.slice_host.slices.values()
            assert hosted.state == "failed", hosted.state
            origin.down_from = None  # the origin is back
            await wait_until(lambda: any(s.state == "loaded" for s in node.slice_host.slices.values()), 30.0, 0.05,
                             "the layers, once the origin is back")
    finally:
        origin.close()
