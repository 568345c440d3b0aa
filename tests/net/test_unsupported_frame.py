"""A frame type a node does not serve is answered with ERROR `unsupported_frame_type` that names
the type and echoes the frame's sid (a pipeline frame's request id) and its request id, so an asker
of a newer version fails the request waiting on it at once (until 2026-12-07 the ERROR carried
only a code and a message: a pipeline frame's asker could not tell which request it refused)."""

from __future__ import annotations

import pytest

from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from tests.support.processes import NodeProcess

from .rawclient import RawPeer, read_frame

pytestmark = pytest.mark.slow


def _error(sock) -> Frame:
    while True:
        frame = read_frame(sock)
        if frame.type == FrameType.PING:
            sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
        elif frame.type == FrameType.ERROR:
            return frame


def test_an_unknown_frame_is_refused_naming_its_type_sid_and_request_id(tmp_path):
    node = NodeProcess(tmp_path / "n", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        sock, _ = RawPeer(tmp_path, "127.0.0.1", node.peer_port).linked()
        sock.sendall(frame_bytes(Frame(99, {"sid": "req-1/p0/1"})))  # a future pipeline frame, no request id
        err = _error(sock)
        assert err.header["code"] == "unsupported_frame_type"
        assert err.header["frame_type"] == 99 and err.header["sid"] == "req-1/p0/1", err.header
        assert err.request_id == 0 and not err.is_response
        sock.sendall(frame_bytes(Frame(98, {"sid": 7}, b"", 42)))  # a request: the reply carries its id
        err = _error(sock)
        assert err.header["frame_type"] == 98 and "sid" not in err.header, err.header
        assert err.request_id == 42 and err.is_response
        sock.close()
    finally:
        node.terminate()
