"""The Anthropic SDK's model listing pages by `limit`, `after_id` and `before_id` (Anthropic's GET
/v1/models): the official client against a real node serving three tiny models."""

from __future__ import annotations

import anthropic
import openai
import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import anthropic_client, tiny_models_node

pytestmark = pytest.mark.asyncio(loop_scope="module")

SPECS = [SynthSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, ffn=64, vocab=320, n_ctx=128, name=name)
         for name in ("pages-a", "pages-b", "pages-c")]

node = tiny_models_node(*SPECS)


async def test_the_model_list_pages_as_anthropic_s_does(node, client):
    """An app that asks for the page after the last model gets none (until 2026-12-07 the node
    ignored `after_id` and answered every page with the whole list again: an app paging until an
    empty page never stopped, and one paging by `limit` got each model once per page)."""
    claude = anthropic_client(node)
    every = [m.id for m in (await client.models.list()).data]  # the OpenAI listing: all, no pages
    assert len(every) == 3
    whole = await claude.models.list()
    assert [m.id for m in whole.data] == every and whole.has_more is False
    first = await claude.models.list(limit=1)
    assert [m.id for m in first.data] == every[:1] and first.has_more is True
    assert (first.first_id, first.last_id) == (every[0], every[0])
    assert [m.id async for m in first] == every  # the SDK's auto-paging follows last_id with after_id
    last = await claude.models.list(after_id=every[-1])
    assert last.data == [] and last.has_more is False
    after = await claude.models.list(after_id=every[0], limit=1)
    assert [m.id for m in after.data] == every[1:2] and after.has_more is True
    before = await claude.models.list(before_id=every[2])
    assert [m.id for m in before.data] == every[:2] and before.has_more is False
    before = await claude.models.list(before_id=every[2], limit=1)
    assert [m.id for m in before.data] == every[1:2] and before.has_more is True
    for bad in (0, 1001):
        with pytest.raises(anthropic.BadRequestError, match="limit"):
            await claude.models.list(limit=bad)


async def test_model_errors_take_anthropic_s_shape_for_its_sdk(node, client):
    """GET /v1/models/{id} of an unknown model and a wrong key, asked by the anthropic client: its
    error body (`{"type": "error", "error": {"type": "not_found_error", ...}}`), as on /v1/messages;
    the OpenAI client still gets OpenAI's. Until 2026-12-07 both clients got OpenAI's body, whose
    type (`invalid_request_error`) an app reading `error.body["error"]["type"]` took for a bad request."""
    claude = anthropic_client(node)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.models.retrieve("no-such-model")
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in missing.value.body["error"]["message"]
    wrong = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{node.api.port}", api_key="wrong", max_retries=0)
    async with wrong:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await wrong.models.list()
    assert refused.value.body["error"]["type"] == "authentication_error" and refused.value.body["type"] == "error"
    with pytest.raises(openai.NotFoundError) as plain:
        await client.models.retrieve("no-such-model")
    assert plain.value.code == "model_not_found"
