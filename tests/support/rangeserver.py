"""A file origin in a thread (for node subprocesses): `bytes=a-b` / `bytes=a-` ranges, a strong
ETag honoured by If-Range, and a count of the body bytes it sent."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ThreadedOrigin:
    """Serves `data` at /<name> on 127.0.0.1 until closed (a context manager)."""

    def __init__(self, data: bytes, name: str = "m.gguf"):
        self.data, self.name, self.etag = data, name, '"v1"'
        self.sent = 0
        self._lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != f"/{origin.name}":
                    self.send_error(404)
                    return
                data, first, last, status = origin.data, 0, len(origin.data) - 1, 200
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if m and self.headers.get("If-Range") in (None, origin.etag):
                    first = int(m.group(1))
                    last = min(int(m.group(2)), len(data) - 1) if m.group(2) else len(data) - 1
                    status = 206
                self.send_response(status)
                self.send_header("ETag", origin.etag)
                self.send_header("Content-Length", str(last - first + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
                self.end_headers()
                view = memoryview(data)[first:last + 1]
                try:
                    for i in range(0, len(view), 256 * 1024):
                        piece = view[i:i + 256 * 1024]
                        self.wfile.write(piece)
                        with origin._lock:
                            origin.sent += len(piece)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{name}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="test-origin", daemon=True)

    def __enter__(self) -> ThreadedOrigin:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving (idempotent): the origin is gone."""
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()
