"""What a user sees of requests that are not chats, and of a model that is not a chat model.

Seen in the app (2026-12-06): the Requests table had no word for what a request was: a /v1/rerank
and a /v1/embeddings row read like a chat that generated nothing ("8 → 0", "ok"); a chat that ended
in tool calls or at max_tokens read "ok" like any other; cached and reasoning tokens were not shown.
A reranker (rank pooling) was listed in the Models tab as a plain "qwen3 · F32" model and offered
in the Chat tab's picker, where it answers noise.
"""

from __future__ import annotations

import time

import aiohttp
import openai
import pytest

from app.ui.requests_model import RequestsModel
from node.inference.synth import SynthSpec, write_gguf
from node.trace import RequestTrace
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui

RERANKER = SynthSpec(arch="qwen3", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512,
                     n_ctx=256, rerank=True, name="tiny-reranker")


@pytest.fixture
def reranker(tmp_path):
    path = tmp_path / "tiny-reranker.gguf"
    write_gguf(path, RERANKER)
    return path


@pytest.mark.llama
def test_a_reranker_is_called_one_and_is_kept_out_of_the_chat(qtbot, run, data_dir, tiny_model, reranker):
    async def body():
        async with running_app(node_config(data_dir, tiny_model, reranker)) as app:
            node, models, chat = app.node, app.feeds.models, app.window.chat_tab
            ids = {s.entry.name: s.id for s in node.models.all()}
            await wait_until(lambda: chat.picker.count() >= 1 and models.rowCount() == 2, DEADLINE_S,
                             what="the models in the picker and the table")
            assert [chat.picker.itemText(i) for i in range(chat.picker.count())] == [ids["tiny"]]
            assert models.cell_text(ids["tiny-reranker"], "Architecture").endswith("· reranker")
            assert "reranker" not in models.cell_text(ids["tiny"], "Architecture")

    run(body())


@pytest.mark.llama
def test_rerank_and_embeddings_rows_say_what_they_were(qtbot, run, data_dir, tiny_model, reranker):
    async def body():
        async with running_app(node_config(data_dir, tiny_model, reranker)) as app:
            node, rows = app.node, app.feeds.requests
            ids = {s.entry.name: s.id for s in node.models.all()}
            client = openai.AsyncOpenAI(base_url=node.api_url, api_key=node.api_key, max_retries=0)
            try:
                await client.embeddings.create(model=ids["tiny"], input=["hello", "world"])
                await client.chat.completions.create(model=ids["tiny"], max_tokens=4,
                                                     messages=[{"role": "user", "content": "hi"}])
            finally:
                await client.close()
            async with aiohttp.ClientSession() as session, session.post(
                    f"{node.api_url}/rerank", headers={"Authorization": f"Bearer {node.api_key}"},
                    json={"model": ids["tiny-reranker"], "query": "a", "documents": ["x", "y"]}) as reply:
                assert reply.status == 200, await reply.text()
            await wait_until(lambda: node.traces.in_flight == 0 and rows.rowCount() == 3, DEADLINE_S,
                             what="three finished rows")
            by_op = {t.operation: t.request_id for t in rows.values()}
            assert rows.cell_text(by_op["rerank"], "Operation") == "rerank"
            assert rows.cell_text(by_op["embeddings"], "Operation") == "embeddings"
            assert rows.cell_text(by_op["chat.completions"], "Operation") == "chat"
            for op in ("rerank", "embeddings"):  # tokens read, none generated: no "→ 0"
                assert rows.cell_text(by_op[op], "Tokens").endswith(" in"), rows.cell_text(by_op[op], "Tokens")
            assert "→" in rows.cell_text(by_op["chat.completions"], "Tokens")

    run(body())


def _finished(**fields) -> RequestTrace:
    trace = RequestTrace(model="tiny-1234abcd", operation="chat.completions", route="local", prompt_tokens=120,
                         completion_tokens=30, outcome="ok", **fields)
    trace.finished = time.monotonic()
    return trace


def test_tool_calls_max_tokens_cached_and_thinking_tokens_are_said(qapp):
    model = RequestsModel()
    tools = _finished(finish_reason="tool_calls", cached_tokens=100, reasoning_tokens=12)
    cut = _finished(finish_reason="length", finish_detail="max_tokens")
    full = _finished(finish_reason="length", finish_detail="context")  # (found in review: "max tokens" too)
    late = _finished(finish_reason="length", finish_detail="time_limit")
    plain = _finished(finish_reason="stop")
    for trace in (tools, cut, full, late, plain):
        model.on_trace_event("started", trace)
        model.on_trace_event("finished", trace)
    assert model.cell_text(tools.request_id, "Outcome") == "ok · tool calls"
    assert model.cell_text(tools.request_id, "Tokens") == "120 (100 cached) → 30 (12 thinking)"
    assert model.cell_text(cut.request_id, "Outcome") == "ok · cut at max tokens"
    assert model.cell_text(full.request_id, "Outcome") == "ok · cut: context full"
    assert model.cell_text(late.request_id, "Outcome") == "ok · cut: time limit"
    assert model.cell_text(plain.request_id, "Outcome") == "ok"
    assert model.cell_text(plain.request_id, "Tokens") == "120 → 30"


def test_ollama_requests_say_which_api(qapp):
    """/api/chat and /api/generate (2026-12-07) read as chats of Ollama's API, not "ollama.chat"."""
    model = RequestsModel()
    chat, generate = _finished(), _finished()
    chat.operation, generate.operation = "ollama.chat", "ollama.generate"
    for trace in (chat, generate):
        model.on_trace_event("started", trace)
        model.on_trace_event("finished", trace)
    assert model.cell_text(chat.request_id, "Operation") == "chat (Ollama)"
    assert model.cell_text(generate.request_id, "Operation") == "generate (Ollama)"
    assert model.cell_text(chat.request_id, "Tokens") == "120 → 30"
