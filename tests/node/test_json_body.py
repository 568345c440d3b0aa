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
