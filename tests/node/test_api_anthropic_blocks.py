"""Anthropic content blocks that reach the model as text (the official `anthropic` client, a real
node with the default model): plain-text `document` blocks (a text source or a content list, with
their title and context) and `search_result` blocks, in a user turn and inside a tool_result. Each
is the same prompt, token for token, as the tagged text it stands for (node.api.anthropic_blocks),
so the model reads the document; PDFs and URLs stay a 400 naming them."""

from __future__ import annotations

import anthropic
import pytest

from tests.support.nodes import anthropic_client, default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

GREEDY = {"temperature": 0}
TOOL = {"name": "search", "description": "Search the docs",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}
CACHE = {"type": "ephemeral"}

node = default_model_node("anthropic-blocks")


@pytest.fixture
def client(node):
    return anthropic_client(node)


def whole_prompt(usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


async def same_prompt_and_reply(client, model_id, turns, expected_turns, **kw):
    """`turns` (with the blocks) count, prompt and greedily answer as `expected_turns` (plain text)."""
    counted = await client.messages.count_tokens(model=model_id, messages=turns, **kw)
    expected = await client.messages.count_tokens(model=model_id, messages=expected_turns, **kw)
    assert counted.input_tokens == expected.input_tokens
    msg = await client.messages.create(model=model_id, max_tokens=12, messages=turns, extra_body=GREEDY, **kw)
    plain = await client.messages.create(model=model_id, max_tokens=12, messages=expected_turns, extra_body=GREEDY,
                                         **kw)
    assert whole_prompt(msg.usage) == counted.input_tokens
    assert msg.content == plain.content and msg.stop_reason == plain.stop_reason
    return msg


async def test_a_plain_text_document_is_read_as_text(node, client, model_id):
    """Claude Code and RAG agents send documents; each was a 400 'document content blocks are not
    supported' (a compatibility run, 2026-12-06)."""
    question = {"type": "text", "text": "What color is the sky?"}
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The sky is green."},
           "title": "Facts", "context": "From the handbook", "citations": {"enabled": True}, "cache_control": CACHE}
    text = ("<document>\n<title>Facts</title>\n<context>From the handbook</context>\n"
            "The sky is green.\n</document>\nWhat color is the sky?")
    await same_prompt_and_reply(client, model_id, [{"role": "user", "content": [doc, question]}],
                                [{"role": "user", "content": text}])
    tok = node.models.all()[0].tokenizer
    msg = await client.messages.create(model=model_id, max_tokens=2, messages=[{"role": "user", "content": [doc, question]}])
    assert whole_prompt(msg.usage) == len(tok.chat_tokens([{"role": "user", "content": text}]))
    # a content source: its text blocks joined; no title, no tags for it
    blocks = {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "The sky "}, {"type": "text", "text": "is green.", "cache_control": CACHE}]}}
    await same_prompt_and_reply(client, model_id, [{"role": "user", "content": [blocks, question]}],
                                [{"role": "user", "content": "<document>\nThe sky is green.\n</document>\n"
                                                             "What color is the sky?"}])


async def test_search_results_in_a_turn_and_in_a_tool_result(client, model_id):
    result = {"type": "search_result", "source": "https://docs.python.org/3/library/functions.html#open",
              "title": "open()", "content": [{"type": "text", "text": "open(file) opens a file."}],
              "citations": {"enabled": True}}
    rendered = ("<search_result>\n<source>https://docs.python.org/3/library/functions.html#open</source>\n"
                "<title>open()</title>\nopen(file) opens a file.\n</search_result>\n")
    await same_prompt_and_reply(client, model_id,
                                [{"role": "user", "content": [result, {"type": "text", "text": "How to open a file?"}]}],
                                [{"role": "user", "content": rendered + "How to open a file?"}])
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "open"}},
        {"type": "tool_use", "id": "toolu_2", "name": "search", "input": {"q": "read"}}]}
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "read() reads."}}
    turns = [{"role": "user", "content": "How to open a file?"}, call, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [result, {"type": "text", "text": "(1 hit)"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [doc], "is_error": False}]}]
    expected = [*turns[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": rendered + "(1 hit)"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "<document>\nread() reads.\n</document>\n"}]}]
    await same_prompt_and_reply(client, model_id, turns, expected, tools=[TOOL])


@pytest.mark.parametrize(("source", "needle"), [
    ({"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}, "PDF documents are not supported"),
    ({"type": "url", "url": "https://example.com/a.pdf"}, "documents by URL are not supported"),
    ({"type": "text", "media_type": "text/html", "data": "<p>x</p>"}, "source.media_type"),
])
async def test_documents_this_node_cannot_read_are_400s_naming_them(client, model_id, source, needle):
    with pytest.raises(anthropic.BadRequestError) as err:
        await client.messages.create(model=model_id, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "document", "source": source}, {"type": "text", "text": "Summarize."}]}])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0.source" in err.value.body["error"]["message"]
    assert needle in err.value.body["error"]["message"]


async def test_an_image_a_tool_returned_is_left_out_and_said_an_image_a_user_sends_is_a_400(client, model_id):
    """Claude Code reads a screenshot with a tool: a 400 for the image failed that request and every
    later one (it stays in the history). The model is told it was left out instead; an image the
    user sends is still a 400, as they expect it seen."""
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "screen"}}]}
    turns = [{"role": "user", "content": "What is on the screen?"}, call, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "shot:"}, png]}]}]
    expected = [*turns[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": "shot:[an image was left out: this model reads text only]"}]}]
    await same_prompt_and_reply(client, model_id, turns, expected, tools=[TOOL])
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.create(model=model_id, max_tokens=4, messages=[
            {"role": "user", "content": [png, {"type": "text", "text": "What is this?"}]}])
