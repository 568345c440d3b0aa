"""A reasoning model's thinking budget, prefills that end mid-tag and usage's reasoning_tokens, through
the official `anthropic` and `openai` clients against a real node: a tiny random model whose
vocabulary has `<think>`/`</think>` tokens, under DeepSeek-R1's template (the reply starts inside
the thoughts) and Qwen3's (the model opens them). A random model never closes its thoughts by
itself; a logit_bias makes one token come every time."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio

from node.inference.synth import SynthSpec
from tests.support.nodes import anthropic_client, node_config, openai_client, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"
R1 = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
SPEC = SynthSpec(n_ctx=2048, think=True, chat_template=R1, name="thinker")
ASK = [{"role": "user", "content": "Is the sky blue?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("think_budget")
    models = (tiny_model(base, SPEC, "thinker.gguf"),
              tiny_model(base, SPEC.replace(chat_template=QWEN3, name="qwen3ish"), "qwen3ish.gguf"))
    async with running_node(node_config(base / "data", *models)) as n:
        yield n


@pytest.fixture
def client(node):
    return openai_client(node)


@pytest.fixture
def claude(node):
    return anthropic_client(node)  # (its SDK models built here, off the loop)


def model_id(node, name: str) -> str:
    return next(s.id for s in node.models.all() if s.entry.name == name)


def token_of(node, text: str) -> int:
    """The one token that writes `text` (after the tokenizer's leading space, if it adds one)."""
    return node.models.all()[0].tokenizer.tokenize(text, add_bos=False)[-1]


async def chat(node, client, model: str, stream: bool = False, **kw) -> tuple[str, str, str, object]:
    """(reasoning_content, content, finish_reason, usage) of one greedy reply, a stream's put back together."""
    kw = dict(model=model_id(node, model), messages=kw.pop("messages", ASK), temperature=0, **kw)
    if not stream:
        r = await client.chat.completions.create(**kw)
        msg = r.choices[0].message
        return getattr(msg, "reasoning_content", None) or "", msg.content or "", r.choices[0].finish_reason, r.usage
    reasoning = content = finish = ""
    usage = None
    async with await client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                    **kw) as events:
        async for chunk in events:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                reasoning += getattr(choice.delta, "reasoning_content", None) or ""
                content += choice.delta.content or ""
                finish = choice.finish_reason or finish
    return reasoning, content, finish, usage


# --- prefills and stop sequences -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prefill_that_ends_mid_tag(node, client, stream):
    """The client's own start of the reply ends inside a tag; the model's first token finishes it
    (found 2026-12-06: the held "<think" was dropped, so Qwen3's thoughts came back as content, and
    R1's answer after "</think" as thoughts, with reasoning_tokens counting the other side)."""
    gt = {str(token_of(node, ">")): 100}
    opened = [*ASK, {"role": "assistant", "content": "<think"}]
    reasoning, content, _, usage = await chat(node, client, "qwen3ish", stream, messages=opened, max_tokens=5, logit_bias=gt)
    assert (reasoning, content) == (">>>>", "")
    assert usage.completion_tokens_details.reasoning_tokens == 5  # the tag's ">" and four thoughts
    raw = await chat(node, client, "qwen3ish", stream, messages=opened, max_tokens=5, logit_bias=gt,
                     extra_body={"reasoning_format": "none"})
    assert raw[:2] == ("", ">>>>>")  # as written after the client's own "<think"
    closing = [*ASK, {"role": "assistant", "content": "Blue, surely.</think"}]
    reasoning, content, _, usage = await chat(node, client, "thinker", stream, messages=closing, max_tokens=5, logit_bias=gt)
    assert (reasoning, content) == ("", ">>>>")
    assert usage.completion_tokens_details.reasoning_tokens == 1  # the tag's ">"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_sequence_right_after_the_thoughts(node, client, stream):
    """A stop sequence holds back the text that may start it: the token after the closing tag is the
    answer's, not a thought, when the stop sequence ends the reply there (found 2026-12-06:
    reasoning_tokens counted it, one too many)."""
    gt = {str(token_of(node, ">")): 100}
    closing = [*ASK, {"role": "assistant", "content": "Blue, surely.</think"}]
    reasoning, content, finish, usage = await chat(node, client, "thinker", stream, messages=closing, max_tokens=8,
                                                   logit_bias=gt, stop=[">>"])
    assert (reasoning, content, finish) == ("", "", "stop")
    assert usage.completion_tokens == 2 and usage.completion_tokens_details.reasoning_tokens == 1
