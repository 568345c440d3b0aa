"""json_body's pieces join to json.dumps's text, byte for byte (the bytes clients got before)."""

from __future__ import annotations

import json

import pytest

from node import const
from node.api import json_body


@pytest.mark.parametrize("obj", [
    {}, [], {"a": []}, {"a": [1, 2.5, None, True, "é\u2028\"x"]},
    {"choices": [{"logprobs": {"content": [{"token": f"t{i}\n", "logprob": -i / 3, "bytes": [116, i % 256],
                                            "top_logprobs": [{"token": "ü", "logprob": -1e-7, "bytes": []}] * 3}
                                           for i in range(300)]}}], "usage": {"n": 1}},
    {"tokens": list(range(1000)), "nested": [[list(range(300))], (1, 2)], "s": "x" * 10},
])
def test_pieces_join_to_json_dumps(obj, monkeypatch):
    monkeypatch.setattr(const, "JSON_SLICE_ITEMS", 7, raising=False)
    assert json_body.encode(obj) == json.dumps(obj).encode()


def test_no_piece_is_a_slice_of_wide_embeddings():
    """An embeddings reply (2048 inputs of 4096 floats, 80 MB of text): every piece the C encoder
    writes at once stays small, so the GIL passes to the loop between them. Sliced 128 items at a
    time, one piece was 128 vectors (~10 MB, 0.3-0.6 s with the GIL held: found in review)."""
    body = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [0.123456789] * 4096}
                                       for i in range(256)], "usage": {"prompt_tokens": 1}}
    pieces = list(json_body.dumps_in_pieces(body))
    assert "".join(pieces) == json.dumps(body)
    assert max(map(len, pieces)) < 64 * 1024  # one slice of 128 floats, not of 128 vectors
