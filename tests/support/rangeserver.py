"""A file origin in a thread: `bytes=a-b` / `bytes=a-` ranges, a strong ETag honoured by If-Range, a
count of the body bytes it sent, and misbehaviour on request. In a thread, not on the test's event
loop: a server writing megabytes on the loop it is tested from is the test blocking that loop."""

from __future__ import annotations

import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_FLIP = bytes(i ^ 0x5A for i in range(256))


def other_bytes(data: bytes, offset: int) -> bytes:
    """`data` with every byte from `offset` on changed (the same size; a file replaced in place with the
    same header). By table, not a generator over the bytes: that took 0.26 s of the test's event loop
    for 5 MB (CI, 2026-12-07)."""
    return data[:offset] + data[offset:].translate(_FLIP)


class ThreadedOrigin:
    """Serves `data` at /<name> on 127.0.0.1 until closed (a context manager)."""

    def __init__(self, data: bytes, name: str = "m.gguf"):
        self.data, self.name, self.etag = data, name, '"v1"'
        self.sent = 0
        self.requests = 0  # every request received (answered or not)
        self.linked_etag: str | None = None  # sent as X-Linked-Etag (the whole file's sha256, as the Hub states it)
        self.ignore_range = False
        self.drop_after: int | None = None  # close the connection after this many body bytes (once)
        self.drop_cut: int | None = None  # the drop_after last used
        self.short_by: int | None = None  # answer the next range this many bytes short (once)
        self.change_after: tuple[int, bytes] | None = None  # after N body bytes, serve other bytes as "v2"
        self.ranges: list[str | None] = []
        self.stall_after: int | None = None  # once this many body bytes went out, wait for `release`
        self.unavailable = False  # answer every request 503 (the origin is down)
        self.hold_answers = False  # accept requests and answer nothing (no status line) until `release`
        # ranges starting at or past this byte fail (the header's first bytes still come through):
        # with a 503 (the origin went away mid-fetch), or, with `fail_page`, a 200 with a small HTML
        # page and no ETag (a proxy's or a captive portal's answer that is not the file)
        self.fail_from: int | None = None
        self.fail_page = False
        self.release = threading.Event()
        self._lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                with origin._lock:
                    origin.requests += 1
                if origin.hold_answers:
                    origin.release.wait(120)  # a hung origin (a proxy holding the request) until let go
                if origin.unavailable:
                    self.send_error(503)
                    return
                if self.path.split("?")[0] != f"/{origin.name}":
                    self.send_error(404)
                    return
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if origin.fail_from is not None and m and int(m.group(1)) >= origin.fail_from:
                    if not origin.fail_page:
                        self.send_error(503)
                        return
                    page = b"<html>upstream error</html>"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                with origin._lock:
                    if origin.change_after is not None and origin.sent >= origin.change_after[0]:
                        origin.data, origin.etag, origin.change_after = origin.change_after[1], '"v2"', None
                    data, etag, rng = origin.data, origin.etag, self.headers.get("Range")
                    origin.ranges.append(rng)
                    first, last, status = 0, len(data) - 1, 200
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
                    if m and not origin.ignore_range and self.headers.get("If-Range") in (None, etag):
                        first = int(m.group(1))
                        last = min(int(m.group(2)), len(data) - 1) if m.group(2) else len(data) - 1
                        if origin.short_by:
                            last, origin.short_by = last - origin.short_by, None
                        status = 206
                    cut, origin.drop_after = origin.drop_after, None
                    if cut is not None:
                        origin.drop_cut = cut
                self.send_response(status)
                if etag is not None:  # None: an origin that names no version
                    self.send_header("ETag", etag)
                if origin.linked_etag is not None:
                    self.send_header("X-Linked-Etag", f'"{origin.linked_etag}"')
                self.send_header("Content-Length", str(last - first + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
                self.end_headers()
                view = memoryview(data)[first:last + 1]
                if cut is not None:
                    view = view[:cut]
                try:
                    for i in range(0, len(view), 64 * 1024):
                        piece = view[i:i + 64 * 1024]
                        if origin.stall_after is not None and origin.sent >= origin.stall_after:
                            self.wfile.flush()
                            origin.release.wait(60)  # a slow origin, until the test lets it go on
                        self.wfile.write(piece)
                        with origin._lock:
                            origin.sent += len(piece)
                    if cut is not None:  # what was sent arrives, then the connection ends mid-body
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_WR)
                        self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{name}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="test-origin", daemon=True)

    def __enter__(self) -> ThreadedOrigin:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving (idempotent): the origin is gone."""
        self.release.set()
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()
