"""Garbage, truncated and oversized input at a node's peer port (hypothesis).

The node under test is a separate process with a second peer ("keeper") linked to it. After every
example the node must have closed the offending connection, still complete a fresh handshake and
answer PING, and the keeper's link must be the very same connection it was at the start.
"""

from __future__ import annotations

import contextlib
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.net import Frame, FrameType
from node.net._frames import MAGIC, PREFIX, frame_bytes
from node.net._preamble import MAGIC as PREAMBLE_MAGIC
from node.net._preamble import encode_preamble
from tests.support.waiting import wait_until_sync

from .rawclient import RawPeer, closed_by_peer, read_frame
from .util import PeerProc

pytestmark = pytest.mark.slow
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    node = PeerProc(work, "node", ["--echo", "--const", "PING_INTERVAL_S=0.5"])
    status = node.ready()
    keeper = PeerProc(work, "keeper", ["--bootstrap", f"127.0.0.1:{status['peer_port']}"])
    keeper_status = keeper.ready()
    wait_until_sync(lambda: (keeper.peer(status["node_id"]) or {}).get("state") == "connected",
                    60, 0.1, "keeper linked")
    conn_id = keeper.peer(status["node_id"])["connection_id"]
    raw = RawPeer(work, "127.0.0.1", status["peer_port"])
    yield {"node": node, "status": status, "keeper": keeper, "keeper_id": keeper_status["node_id"],
           "conn_id": conn_id, "raw": raw}
    node.stop()
    keeper.stop()


def still_serving(t) -> None:
    assert t["node"].alive(), t["node"].output()[-3000:]
    assert t["raw"].ping_ok()
    peer = t["keeper"].peer(t["status"]["node_id"])
    assert peer["state"] == "connected" and peer["connection_id"] == t["conn_id"]


def _not_our_magic(data: bytes) -> bool:
    return not PREAMBLE_MAGIC.startswith(data[: len(PREAMBLE_MAGIC)])


@given(data=st.binary(min_size=1, max_size=600).filter(_not_our_magic)
       | st.sampled_from([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                          b"SSH-2.0-OpenSSH_9.6\r\n", b"\x00" * 64]))
@FUZZ
def test_garbage_before_the_preamble(target, data):
    sock = target["raw"].raw()
    try:
        sock.sendall(data)
        assert closed_by_peer(sock)
    finally:
        sock.close()
    still_serving(target)


@given(kind=st.binary(min_size=1, max_size=1), body=st.binary(max_size=300),
       length=st.integers(0, 2**32 - 1))
@FUZZ
def test_malformed_preambles(target, kind, body, length):
    sock = target["raw"].raw()
    try:
        sock.sendall(PREAMBLE_MAGIC + kind + struct.pack("!I", length) + body)
        sock.shutdown(socket.SHUT_WR)  # truncated or not, nothing more comes
        assert closed_by_peer(sock)
    finally:
        sock.close()
    still_serving(target)


def test_tls_preamble_with_a_bad_certificate(target):
    for cert in ("bm90IGEgY2VydA==", "%%%", ""):
        sock = target["raw"].raw()
        try:
            sock.sendall(encode_preamble(b"T", {"v": 1, "cert": cert}))
            assert closed_by_peer(sock)
        finally:
            sock.close()
    still_serving(target)


frame_garbage = st.one_of(
    # random bytes, at least a prefix long (shorter ones are a slow sender until the liveness
    # deadline: test_truncated_frame_then_close covers them)
    st.binary(min_size=24, max_size=2000),
    st.builds(lambda m, v, t, h, p: PREFIX.pack(m, v, t, 0, 1, h, p),  # bad magic / version / sizes
              st.binary(min_size=4, max_size=4).filter(lambda m: m != MAGIC), st.integers(0, 255),
              st.integers(0, 255), st.integers(0, 64), st.integers(0, 64)),
    st.builds(lambda v, t: PREFIX.pack(MAGIC, v, t, 0, 1, 0, 0), st.integers(2, 255), st.integers(0, 255)),
    st.builds(lambda h, p: PREFIX.pack(MAGIC, 1, 16, 0, 1, h, p),  # oversized lengths
              st.integers(1024 * 1024 + 1, 2**32 - 1), st.integers(0, 2**32 - 1)),
    st.builds(lambda h: PREFIX.pack(MAGIC, 1, 16, 0, 1, len(h), 0) + h,  # header not a JSON object
              st.sampled_from([b"{", b"[]", b"null", b"\xff\xfe\xfd", b'"s"', b"1e999999"])),
)


@given(garbage=frame_garbage)
@FUZZ
def test_garbage_frames_on_an_authenticated_link(target, garbage):
    sock, _ = target["raw"].linked()
    try:
        sock.sendall(garbage)
        assert closed_by_peer(sock), "the node must close a link that sent a malformed frame"
    finally:
        sock.close()
    still_serving(target)


@given(cut=st.integers(1, 200))
@settings(max_examples=10, deadline=None)
def test_truncated_frame_then_close(target, cut):
    sock, _ = target["raw"].linked()
    data = frame_bytes(Frame(FrameType.WORK, {"k": "v" * 50}, b"p" * 150))
    try:
        sock.sendall(data[: min(cut, len(data) - 1)])
        sock.shutdown(socket.SHUT_WR)
        assert closed_by_peer(sock)
    finally:
        sock.close()
    still_serving(target)


def reply_to(sock, rid: int) -> Frame:
    """The node's response to our request rid (skipping its own PINGs and PEX)."""
    while True:
        frame = read_frame(sock)
        if frame.is_response and frame.request_id == rid:
            return frame


@given(ftype=st.integers(0, 255).filter(lambda t: t not in (1, 2, 3, 4, 5, 6, 16)),
       rid=st.integers(1, 2**64 - 1))
@settings(max_examples=15, deadline=None)
def test_unknown_or_unserved_types_get_error_and_the_link_stays(target, ftype, rid):
    sock, _ = target["raw"].linked()
    try:
        sock.sendall(frame_bytes(Frame(ftype, {"x": 1}, b"", rid)))
        reply = reply_to(sock, rid)
        assert reply.type == FrameType.ERROR
        sock.sendall(frame_bytes(Frame(FrameType.WORK, {}, b"still here", rid)))
        assert reply_to(sock, rid).payload == b"still here"
    finally:
        sock.close()


@pytest.mark.parametrize("payload", [2 * 2**20, 200 * 2**20])
def test_an_oversized_frame_before_admission_is_refused_unread(target, payload):
    """A HELLO declaring megabytes, from a peer that has proved nothing yet: the node closes at
    once (within a deadline well under the 10 s handshake timeout) instead of buffering the body
    (it once read up to 256 MiB per connection, 64 connections at a time, before refusing)."""
    sock, _ = target["raw"].tls_socket()
    try:
        sock.sendall(PREFIX.pack(MAGIC, 1, int(FrameType.HELLO), 0, 0, 100, payload))
        assert closed_by_peer(sock, timeout_s=3.0)
    finally:
        sock.close()
    still_serving(target)


@pytest.mark.parametrize("flood", [Frame(FrameType.PING, {}, b"", 7), Frame(200, {}, b"", 0),
                                   Frame(FrameType.PONG, {}, b"", 12345, 1)], ids=["ping", "unknown", "stray_reply"])
def test_a_member_flooding_small_frames_loses_its_link_and_no_one_else_does(target, flood):
    """100,000 frames back to back, nothing read: before, the node answered each (a probe link's
    PING waited up to 1 s behind them); now the link closes past its control-frame budget."""
    sock, _ = target["raw"].linked()
    try:
        blob = frame_bytes(flood) * 1000
        with contextlib.suppress(OSError):  # the node may close while we still write
            for _ in range(100):
                sock.sendall(blob)
        assert closed_by_peer(sock, timeout_s=10.0)
    finally:
        sock.close()
    wait_until_sync(lambda: "DIAG: peer flooding, closing link" in target["node"].output(), 20, 0.1, "the WARNING")
    still_serving(target)


def test_the_node_logs_what_it_refused(target):
    sock = target["raw"].raw()
    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert closed_by_peer(sock)
    sock.close()
    sock, _ = target["raw"].linked()
    sock.sendall(b"\x00" * 24)
    assert closed_by_peer(sock)
    sock.close()
    node = target["node"]
    wait_until_sync(lambda: "Ignoring a peer that does not speak SwarmLLM" in node.output()
                    and "DIAG: malformed frame, closing link" in node.output(), 20, 0.1, "the log lines")
    still_serving(target)


@pytest.mark.parametrize("header", [b'{"a":' * 50000 + b"1" + b"}" * 50000, b'{"a":' + b"9" * 5000 + b"}"],
                         ids=["nested_50000_deep", "integer_of_5000_digits"])
def test_a_frame_header_json_cannot_read_is_a_malformed_frame_not_a_crash(target, header):
    """A header nested 50,000 levels deep hit Python's recursion limit inside json.loads, and one
    holding an integer past 4300 digits raised a ValueError json.loads does not wrap: neither was
    caught, so the link died of a traceback (asyncio's "data_received() call failed") instead of
    the "malformed frame" line (2026-12-07). Both are the malformed frame now."""
    before = target["node"].output().count("DIAG: malformed frame, closing link")
    sock, _ = target["raw"].linked()
    try:
        sock.sendall(PREFIX.pack(MAGIC, 1, int(FrameType.PING), 0, 1, len(header), 0) + header)
        assert closed_by_peer(sock)
    finally:
        sock.close()
    wait_until_sync(lambda: target["node"].output().count("DIAG: malformed frame, closing link") > before,
                    20, 0.1, "the malformed-frame line")
    out = target["node"].output()
    assert "data_received() call failed" not in out and "RecursionError" not in out, out[-3000:]
    still_serving(target)

