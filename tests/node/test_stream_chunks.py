"""The streamed text chunk's pre-rendered JSON is byte for byte what the general chunk path writes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.api.responses import StreamChunks
from node.inference.request import CompletionRequest, Delta
from node.inference.sampling import SamplingParams
from node.trace import RequestTrace

MODELS = ["tiny-1234abcd", "name with \x00 nul", "quote\"model"]
TEXTS = ["hello", "", " ", 'quote " and \\ backslash', "line\nbreak\ttab", "é ü 你好", "emoji 🚀",
         "\x00\x01\x1f control", "\u2028\u2029", "</script>", '{"json": [1, 2]}', "\ud7ff\ue000"]


def chunks(kind: str, include_usage: bool, model: str = "tiny-1234abcd") -> StreamChunks:
    completion = CompletionRequest(kind=kind, model=model, stream=True, include_usage=include_usage,
                                   params=SamplingParams())
    return StreamChunks(completion, RequestTrace(model=model, operation="chat.completions"))


@pytest.mark.parametrize("kind", ["chat", "text"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("model", MODELS)
def test_text_chunk_equals_the_general_chunk(kind, include_usage, text, model):
    events = chunks(kind, include_usage, model)
    fast = events._text_chunk(text)
    assert fast == events._chunk({"content": text}, None)
    body = json.loads(fast[len(b"data: "):])
    got = body["choices"][0]["delta"]["content"] if kind == "chat" else body["choices"][0]["text"]
    assert got == text and body["choices"][0]["finish_reason"] is None


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=1), model=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1))
def test_text_chunk_equals_the_general_chunk_for_any_text_and_model_name(text, model):
    for kind in ("chat", "text"):
        events = chunks(kind, False, model)
        assert events._text_chunk(text) == events._chunk({"content": text}, None)


def test_delta_uses_the_text_chunk_and_keeps_logprobs_and_empty_deltas():
    events = chunks("chat", False)
    assert events.opening() == []  # the role chunk goes with the first piece (content "" for text)
    assert events.delta(Delta(text="hi")) == [events._chunk({"role": "assistant", "content": ""}, None),
                                              events._chunk({"content": "hi"}, None)]
    assert events.delta(Delta(text="hi")) == [events._chunk({"content": "hi"}, None)]
    assert events.delta(Delta(text="")) == []


def test_hidden_reasoning_leaves_the_thoughts_out_and_keeps_the_text_beside_them():
    """OpenRouter's `reasoning.exclude`: a delta of thoughts only sends nothing; the delta that ends
    the thoughts and starts the answer sends the answer alone (review r37: the real-node test never
    met such a delta)."""
    completion = CompletionRequest(kind="chat", model="m", stream=True, include_usage=False, params=SamplingParams())
    events = StreamChunks(completion, RequestTrace(model="m", operation="chat.completions"), hide_reasoning=True)
    assert events.delta(Delta(reasoning="thinking")) == []
    sent = [json.loads(c[len(b"data: "):]) for c in events.delta(Delta(reasoning="end", text="Answer"))]
    assert [c["choices"][0]["delta"] for c in sent] == [{"role": "assistant", "content": ""}, {"content": "Answer"}]
    shown = chunks("chat", False)  # the same deltas with the thoughts shown
    sent = [json.loads(c[len(b"data: "):]) for c in shown.delta(Delta(reasoning="end", text="Answer"))]
    assert [c["choices"][0]["delta"] for c in sent] == [{"role": "assistant", "content": ""},
                                                        {"reasoning_content": "end"}, {"content": "Answer"}]
