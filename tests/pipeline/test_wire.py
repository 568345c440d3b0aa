"""Pipeline messages and the activation codec."""

import json

import pytest
import torch

from node.errors import ProtocolError
from node.inference.pipeline.wire import (
    Ack,
    Hop,
    Result,
    SessionControl,
    Work,
    decode_activations,
    decode_tokens,
    encode_activations,
    encode_tokens,
)
from node.inference.sampling import SamplingParams


def test_activation_roundtrip_f32_exact_f16_close_int8_per_row():
    torch.manual_seed(0)
    x = torch.randn(5, 64) * torch.tensor([1.0, 10.0, 0.1, 100.0, 3.0])[:, None]  # rows of very different scale
    meta, data = encode_activations(x, 32)
    assert torch.equal(decode_activations(meta, data), x)
    assert len(data) == 5 * 64 * 4
    meta, data = encode_activations(x, 16)
    assert len(data) == 5 * 64 * 2
    assert torch.allclose(decode_activations(meta, data), x, rtol=1e-3, atol=1e-3)
    meta, data = encode_activations(x, 8)
    assert len(data) == 5 * 4 + 5 * 64
    y = decode_activations(meta, data)
    # per-row scales: each row's error is bounded by its own scale, not the largest row's
    row_err = (y - x).abs().max(dim=1).values
    row_scale = x.abs().max(dim=1).values / 127
    assert torch.all(row_err <= row_scale * 0.51)


def test_large_payload_is_zstd_compressed_and_restored():
    x = torch.zeros(512, 1024)
    x[:, :8] = torch.randn(512, 8)
    meta, data = encode_activations(x, 16)
    assert meta.get("zstd") == 512 * 1024 * 2 and len(data) < 512 * 1024 * 2
    assert torch.allclose(decode_activations(meta, data), x, atol=1e-3)


@pytest.mark.parametrize(("meta", "payload"), [
    ({"dtype": "f16", "shape": [2, 4]}, b"\x00" * 3),
    ({"dtype": "f64", "shape": [1, 1]}, b"\x00" * 8),
    ({"dtype": "f32"}, b""),
    ({"dtype": "f32", "shape": [1, 2], "zstd": 8}, b"not zstd"),
    ({"dtype": "i8", "shape": [1, 4]}, b"\x00" * 4),
    ({"dtype": "f32", "shape": [json.loads("Infinity"), 4]}, b""),  # was an OverflowError
    ({"dtype": "f32", "shape": [1.0, 4]}, b"\x00" * 16),
    ({"dtype": "f32", "shape": [2**40, 2**20]}, b""),  # more than any frame carries
])
def test_bad_activation_payloads_are_protocol_errors(meta, payload):
    with pytest.raises(ProtocolError):
        decode_activations(meta, payload)


@pytest.mark.parametrize("content_size", [True, False])
def test_a_zstd_bomb_is_refused_without_expanding_it(content_size):
    """A 16 KiB payload of 512 MiB of zeros, for 256 bytes of activations: refused from the frame's
    stated size, or after reading one byte past 256 when it states none (it once expanded whole)."""
    import resource

    import zstandard

    size, chunk = 512 * 2**20, b"\0" * 2**20  # written a MiB at a time: this process never holds it
    cobj = zstandard.ZstdCompressor(level=3, write_content_size=content_size).compressobj(size=size if content_size else -1)
    bomb = b"".join(cobj.compress(chunk) for _ in range(size // len(chunk))) + cobj.flush()
    assert len(bomb) < 64 * 2**10 and (zstandard.frame_content_size(bomb) == size) == content_size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ProtocolError, match="expected 256"):
        decode_activations({"dtype": "f32", "shape": [1, 64], "zstd": 256}, bomb)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 64 * 2**20


def test_tokens_roundtrip():
    assert decode_tokens(encode_tokens([0, 1, 127999, 5])) == [0, 1, 127999, 5]
    with pytest.raises(ProtocolError):
        decode_tokens(b"abc")


def test_work_header_roundtrip():
    route = (Hop("a" * 64, 0, 4), Hop("b" * 64, 4, 8))
    w = Work(sid="s1", model="f" * 64, seq=3, index_pos=10, n_tokens=1, route=route, hop=1, coordinator="a" * 64,
             sample=True, activation_bits=8, sampling=SamplingParams(temperature=0.5, seed=7, stop=("x",)),
             history=(5, 6), telemetry=({"node": "a", "eval_us": 12},), act={"dtype": "i8", "shape": [1, 8]})
    back = Work.from_header(w.to_header())
    assert back == w
    assert back.target == route[1]
    spec = Work(sid="s1", model="f" * 64, seq=4, index_pos=11, n_tokens=4, route=route, hop=0, coordinator="a" * 64,
                sample=True, draft=(7, 8, 9), rewind=True)
    assert Work.from_header(spec.to_header()) == spec
    assert "draft" not in w.to_header() and "rewind" not in w.to_header()  # absent unless speculating
    kinds = Work(sid="s1", model="f" * 64, seq=0, index_pos=0, n_tokens=5, route=route, hop=0, coordinator="a" * 64,
                 sample=False, prompt_rows=3)
    assert Work.from_header(kinds.to_header()) == kinds
    assert Work.from_header({k: v for k, v in kinds.to_header().items() if k != "prompt_rows"}).prompt_rows is None


@pytest.mark.parametrize("patch", [
    {"hop": 5}, {"index_pos": -1}, {"n": 0}, {"route": []}, {"route": [{"node": "x", "start": 3, "end": 1}]},
    {"bits": 12}, {"sampling": {"temperature": "hot"}}, {"seq": "x"},
    {"draft": [1, 2]}, {"draft": [1], "sample": False}, {"draft": ["x"]},  # a draft needs a row after it
    {"prompt_rows": 3}, {"prompt_rows": -1}, {"prompt_rows": "x"}, {"prompt_rows": 2, "draft": [1]},
    # JSON's other numbers are not integers (Python's json reads Infinity and NaN too)
    {"prompt_rows": True}, {"prompt_rows": 1.5}, {"prompt_rows": "1"}, {"prompt_rows": json.loads("Infinity")},
    {"index_pos": json.loads("Infinity")}, {"n": 2.0}, {"seq": json.loads("NaN")}, {"hop": False},
    {"history": [1.5]}, {"route": [{"node": "n", "start": 0.0, "end": 2}]},
])
def test_malformed_work_is_protocol_error(patch):
    good = Work(sid="s", model="m", seq=0, index_pos=0, n_tokens=2, route=(Hop("n", 0, 2),), hop=0,
                coordinator="n", sample=True).to_header()
    with pytest.raises(ProtocolError):
        Work.from_header({**good, **patch})


def test_result_ack_control_roundtrip():
    r = Result("s", 4, token=9, telemetry=({"node": "x"},))
    assert Result.from_header(r.to_header()) == r
    verified = Result("s", 5, token=9, tokens=(9, 3, 4))
    assert Result.from_header(verified.to_header()) == verified
    e = Result("s", 4, error="KV position mismatch: index_pos=7 but kv_len=5", error_code="kv_position_mismatch",
               failed_node="b" * 64)
    assert Result.from_header(e.to_header()) == e
    a = Ack("s", 4, 1, "b" * 64)
    assert Ack.from_header(a.to_header()) == a
    done = Ack("s", 4, 1, "b" * 64, held_us=1234, done=True)
    assert Ack.from_header(done.to_header()) == done
    assert Ack.from_header({**done.to_header(), "done": "yes"}).done is False  # only a JSON true counts
    c = SessionControl("s", "m", "cancel")
    assert SessionControl.from_header(c.to_header()) == c
    with pytest.raises(ProtocolError):
        Ack.from_header({"sid": "s"})
    for bad in ({"seq": json.loads("Infinity")}, {"token": 9.5}, {"tokens": [9, True]},
                {"error": {"message": "x", "code": ["x"]}}, {"error": "x"}, {"error": {"message": 5}}):
        with pytest.raises(ProtocolError):
            Result.from_header({**r.to_header(), **bad})
    with pytest.raises(ProtocolError):
        Ack.from_header({**a.to_header(), "held_us": json.loads("Infinity")})


def test_prompt_rows_of_each_kind_of_step():
    """The coordinator's count of a step's prompt rows (a 10-token prompt)."""
    from node.inference.pipeline.coordinator import prompt_rows_of

    assert [prompt_rows_of(10, a, n) for a, n in ((0, 4), (4, 4), (8, 2))] == [4, 4, 2]  # chunked prefill
    assert prompt_rows_of(10, 9, 1) == 1  # a resumed prompt's last token
    assert prompt_rows_of(10, 6, 7) == 4  # a re-prefill after a failover: 4 prompt + 3 generated
    assert prompt_rows_of(10, 12, 1) == 0 and prompt_rows_of(10, 10, 1) == 0  # decode / verify steps
