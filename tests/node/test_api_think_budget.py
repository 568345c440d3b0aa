"""A reasoning model's thinking budget, prefills that end mid-tag and usage's reasoning_tokens, through
the official `anthropic` and `openai` clients against a real node: a tiny random model whose
vocabulary has `<think>`/`</think>` tokens, under DeepSeek-R1's template (the reply starts inside
the thoughts) and Qwen3's (the model opens them). A random model never closes its thoughts by
itself; a logit_bias makes one token come every time."""

from __future__ import annotations

import openai
import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import anthropic_client, template, tiny_models_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

R1 = template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
QWEN3 = template("Qwen-Qwen3-0.6B")
SPEC = SynthSpec(n_ctx=2048, think=True, chat_template=R1, name="thinker")
ASK = [{"role": "user", "content": "Is the sky blue?"}]


node = tiny_models_node(SPEC, SPEC.replace(chat_template=QWEN3, name="qwen3ish"))


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


# --- the budget -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_budget_tokens_close_the_thoughts(node, claude, stream):
    """`thinking: {type: enabled, budget_tokens: 4}`: after 4 tokens of thoughts `</think>` is forced
    and the answer follows (until 2026-12-06 the budget was accepted and ignored: this model thinks
    until max_tokens and never answers)."""
    kw = dict(model=model_id(node, "thinker"), max_tokens=30, messages=ASK, extra_body={"temperature": 0})
    free = await claude.messages.create(**kw)
    assert [b.type for b in free.content] == ["thinking"] and free.stop_reason == "max_tokens"
    budget = {"type": "enabled", "budget_tokens": 4}
    if stream:
        async with claude.messages.stream(**kw, thinking=budget) as events:
            async for _ in events:
                pass
            capped = await events.get_final_message()
    else:
        capped = await claude.messages.create(**kw, thinking=budget)
    assert [b.type for b in capped.content] == ["thinking", "text"], capped.content
    thoughts = capped.content[0].thinking
    assert thoughts and free.content[0].thinking.startswith(thoughts) and len(thoughts) < len(free.content[0].thinking)
    assert capped.content[1].text.strip()


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_budget_tokens_on_chat_completions(node, client, stream):
    """llama-server's `reasoning_budget_tokens`: the closing tag after 3 tokens of thoughts, even where
    a logit_bias bans it; reasoning_tokens counts them and the tag; 0 closes the thoughts at once,
    -1 is no budget, another value a 400 naming it."""
    ban = {str(token_of(node, "</think>")): -100}
    _, raw, _, _ = await chat(node, client, "thinker", stream, max_tokens=20, logit_bias=ban,
                         extra_body={"reasoning_format": "none"})
    _, raw_capped, _, _ = await chat(node, client, "thinker", stream, max_tokens=20, logit_bias=ban,
                                     extra_body={"reasoning_format": "none", "reasoning_budget_tokens": 3})
    thoughts, answer = raw_capped.split("</think>", 1)
    assert raw.startswith(thoughts) and answer
    reasoning, content, finish, usage = await chat(node, client, "thinker", stream, max_tokens=20, logit_bias=ban,
                                                   extra_body={"reasoning_budget_tokens": 3})
    assert reasoning == thoughts.strip() and content == answer.strip() and finish == "length"
    assert usage.completion_tokens_details.reasoning_tokens == 4
    _, content, _, usage = await chat(node, client, "thinker", stream, max_tokens=6,
                                      extra_body={"thinking_budget_tokens": 0})
    assert content and usage.completion_tokens_details.reasoning_tokens == 1
    none = await chat(node, client, "thinker", stream, max_tokens=6, logit_bias=ban, extra_body={"reasoning_budget_tokens": -1})
    assert none[1] == "" and none[3].completion_tokens_details.reasoning_tokens == 6
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(node, client, "thinker", stream, max_tokens=6, extra_body={"reasoning_budget_tokens": "10"})
    assert caught.value.body["param"] == "reasoning_budget_tokens"


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
