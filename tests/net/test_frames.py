"""Frames and the network's own messages: round trips, limits, validation on decode."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import const
from node.errors import ProtocolError
from node.net import Frame, FrameType
from node.net._frames import PREFIX, PREFIX_LEN, decode_frame, decode_prefix, encode_frame, frame_bytes
from node.net._messages import Hello, NotSwarmPeer, PexEntry, parse_pex, pex_frame
from node.net._preamble import MAGIC as PREAMBLE_MAGIC
from node.net._preamble import read_preamble

NODE_A = "a" * 64
NODE_B = "b" * 64

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(
    ftype=st.integers(0, 255),
    header=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    payload=st.binary(max_size=2048),
    request_id=st.integers(0, 2**64 - 1),
    flags=st.integers(0, 0xFFFF),
)
@settings(max_examples=150, deadline=None)
def test_frame_round_trip(ftype, header, payload, request_id, flags):
    frame = Frame(ftype, header, payload, request_id, flags)
    assert decode_frame(frame_bytes(frame)) == frame


def test_large_payload_is_not_copied_small_frames_are_one_buffer():
    payload = b"x" * 100_000
    parts = encode_frame(Frame(FrameType.WORK, {"a": 1}, payload))
    assert parts[1] is payload
    assert len(parts[0]) == PREFIX_LEN + len(b'{"a":1}')
    assert len(encode_frame(Frame(FrameType.WORK, {"a": 1}, b"y" * 8192))) == 1


def test_reply_carries_request_id_and_response_flag():
    request = Frame(FrameType.WORK, {}, b"", request_id=42)
    reply = request.reply(FrameType.RESULT, {"ok": True})
    assert reply.request_id == 42 and reply.is_response and not request.is_response


@pytest.mark.parametrize(
    ("prefix", "match"),
    [
        (PREFIX.pack(b"HTTP", 1, 1, 0, 0, 0, 0), "magic"),
        (PREFIX.pack(b"SWRM", 9, 1, 0, 0, 0, 0), "version"),
        (PREFIX.pack(b"SWRM", 1, 1, 0, 0, const.MAX_HEADER_BYTES + 1, 0), "header too large"),
        (PREFIX.pack(b"SWRM", 1, 1, 0, 0, 0, const.MAX_FRAME_BYTES + 1), "payload too large"),
        (b"SWRM\x01", "truncated"),
    ],
)
def test_bad_prefixes_are_refused_before_reading_the_body(prefix, match):
    with pytest.raises(ProtocolError, match=match):
        decode_prefix(prefix)


def test_size_limits_follow_const(monkeypatch):
    monkeypatch.setattr(const, "MAX_FRAME_BYTES", 10)
    with pytest.raises(ProtocolError):
        encode_frame(Frame(FrameType.WORK, {}, b"x" * 11))
    with pytest.raises(ProtocolError):
        decode_prefix(PREFIX.pack(b"SWRM", 1, 16, 0, 0, 0, 11))


@pytest.mark.parametrize("header", [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe",
                                    b'{"a":' * 50000 + b"1" + b"}" * 50000, b'{"a":' + b"9" * 5000 + b"}"])
def test_header_must_be_a_json_object(header):
    """(A header nested past the recursion limit, and an integer past 4300 digits, raised a
    RecursionError / bare ValueError the frame reader did not catch: 2026-12-07.)"""
    data = PREFIX.pack(b"SWRM", 1, 16, 0, 0, len(header), 0) + header
    with pytest.raises(ProtocolError):
        decode_frame(data)


def test_truncated_body_is_refused():
    data = frame_bytes(Frame(FrameType.WORK, {"k": "v"}, b"payload"))
    with pytest.raises(ProtocolError, match="truncated"):
        decode_frame(data[:-1])


def test_unknown_types_decode_so_they_can_be_answered():
    frame = decode_frame(frame_bytes(Frame(200, {"x": 1})))
    assert frame.type == 200


def test_frame_fields_are_validated():
    with pytest.raises(ValueError):
        Frame(256)
    with pytest.raises(ValueError):
        Frame(1, request_id=-1)
    with pytest.raises(ValueError):
        Frame(1, header=[1])  # type: ignore[arg-type]


def _hello(**overrides) -> Hello:
    fields = {"node_id": NODE_A, "boot_id": "b00t", "agent": "swarmllm-py/test", "listen_port": 8810,
              "listen": ("10.0.0.1:8810",), "features": 3,
              "models": ({"model_id": "m", "layers": [0, 12], "hash": "abc"},),
              "hardware": {"device": "cpu", "free_mb": 1000}, "region": "TH", "link_nonce": "n1",
              "swarm": "1a2b3c4d", "epoch": 3, "member_nonce": "ab" * 16, "time": 1796570000.25}
    fields.update(overrides)
    return Hello(**fields)


def test_hello_round_trip():
    hello = _hello()
    assert Hello.from_frame(decode_frame(frame_bytes(hello.to_frame()))) == hello


def test_hello_sampling_features_round_trip_and_an_older_hello_lists_none():
    """2026-12-07: a HELLO lists the sampling features its node decodes; one of a version before
    (5607039 and older: no `sampling` key, which they ignore when they read ours) says nothing: None,
    read by the coordinator as the old set (sampling.OLD_FEATURES)."""
    hello = _hello(sampling=frozenset({"sampling:min_tokens", "grammar:gbnf"}))
    frame = hello.to_frame()
    assert frame.header["sampling"] == ["grammar:gbnf", "sampling:min_tokens"]
    assert Hello.from_frame(decode_frame(frame_bytes(frame))) == hello
    older = _hello().to_frame()
    assert "sampling" not in older.header
    assert Hello.from_frame(older).sampling is None
    assert Hello.from_frame(Frame(FrameType.HELLO, dict(older.header, sampling=[]))).sampling == frozenset()


@pytest.mark.parametrize(
    ("protocol", "version"), [("libp2p", 1), ("swarmllm", 1), ("swarmllm", 3), (None, None)]
)
def test_hello_from_another_protocol_is_not_a_swarm_peer(protocol, version):
    header = dict(_hello().to_frame().header, protocol=protocol, version=version, agent="other/1.0")
    with pytest.raises(NotSwarmPeer) as info:
        Hello.from_frame(Frame(FrameType.HELLO, header))
    assert info.value.agent == "other/1.0"


@pytest.mark.parametrize(
    "change",
    [
        {"node_id": "not-an-id"},
        {"listen_port": 70000},
        {"listen_port": True},
        {"listen": "10.0.0.1:1"},
        {"listen": ["no-port"]},
        {"models": {"a": 1}},
        {"models": [1, 2]},
        {"hardware": []},
        {"agent": "x" * 1000},
        {"features": -1},
        {"member_nonce": "\ud800" * 32},  # a lone surrogate: once a crash in the proof's encode
        {"member_nonce": "ab"},
        {"member_nonce": None},
        {"swarm": "not-hex!"},
        {"swarm": None},
        {"epoch": 2**31},
        {"epoch": -1},
        {"time": "yesterday"},
        {"time": True},
        {"time": -1},
        {"time": 1e300},
        {"time": float("nan")},
        {"sampling": "sampling:min_tokens"},
        {"sampling": [1]},
        {"sampling": ["x" * 65]},
        {"sampling": ["x"] * 513},
    ],
)
def test_malformed_hello_fields_are_protocol_errors(change):
    header = dict(_hello().to_frame().header, **change)
    with pytest.raises(ProtocolError):
        Hello.from_frame(Frame(FrameType.HELLO, header))


def test_pex_round_trip_and_validation():
    entries = [PexEntry(NODE_A, ("10.0.0.1:8810",), ()), PexEntry(NODE_B, (), ("10.0.0.9:8810",))]
    assert parse_pex(decode_frame(frame_bytes(pex_frame(entries)))) == entries
    for bad in ({"peers": "x"}, {"peers": [{"node_id": "zz"}]}, {"peers": [1]}, {}):
        with pytest.raises(ProtocolError):
            parse_pex(Frame(FrameType.PEX, bad))


def test_prefix_layout_is_stable():
    """The wire layout is a contract with other versions: pin it."""
    data = frame_bytes(Frame(FrameType.PING, {}, b"", 7, 1))
    assert data == struct.pack("!4sBBHQII", b"SWRM", 1, 3, 1, 7, 0, 0)
    assert json.loads(frame_bytes(Frame(2, {"code": "x"}))[PREFIX_LEN:]) == {"code": "x"}


@pytest.mark.asyncio
@pytest.mark.parametrize("body", [b"[" * 8000 + b"]" * 8000, b'{"v":' + b"7" * 5000 + b"}"])
async def test_a_preamble_json_cannot_read_is_a_protocol_error(body):
    """A preamble body nested 8,000 deep (it fits PREAMBLE_MAX_BYTES) was a RecursionError, logged with a
    traceback as "failed unexpectedly" by the inbound handshake (2026-12-07); a protocol error now."""

    class Bytes:
        def __init__(self, data: bytes) -> None:
            self.data = data

        async def read_exactly(self, n: int) -> bytes:
            out, self.data = self.data[:n], self.data[n:]
            return out

        read_some = read_exactly

    assert len(body) <= const.PREAMBLE_MAX_BYTES
    with pytest.raises(ProtocolError, match="not JSON"):
        await read_preamble(Bytes(PREAMBLE_MAGIC + b"T" + struct.pack("!I", len(body)) + body))
