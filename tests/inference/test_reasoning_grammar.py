"""Forced tool calls (tool_choice "required", a named function, response_format beside tools) from
reasoning models whose calls may end their thoughts (Kimi K2 Thinking, DeepSeek V3.1/V3.2/V4, GLM /
Ling 3, Qwen3.5: `ToolFormat.thought_ends`). The grammar leaves room to think first; until
2026-12-06 it was "free thoughts up to `</think>`, then the call", so a model trained to go straight
from its thoughts to the call's opener was made to write `</think>` first. Now either shape is
allowed, and nothing but the call after the thoughts. The grammar runs in llguidance on a real
(synthetic) vocabulary; its outputs go through the driver's splitter and tool parser."""

from __future__ import annotations

import re

import pytest

from node.inference import constrain, reasoning
from node.inference import grammar as g
from node.inference.request import CompletionRequest, ResponseFormat
from node.inference.sampling import SamplingParams
from node.inference.synth import SynthSpec
from node.inference.tokenizer import ModelTokenizer
from node.inference.tools import detect_format, thought_ends, tool_grammar
from tests.inference.test_reasoning_calls import HI, REPLIES, THOUGHT, drive
from tests.inference.test_tools import WEATHER, render, request, template
from tests.support.nodes import tiny_model


@pytest.fixture(scope="module")
def think_tok(tmp_path_factory):
    t = ModelTokenizer(tiny_model(tmp_path_factory.mktemp("thinkgrammar"), SynthSpec(think=True), "think.gguf"))
    yield t
    t.close()


def accepts(tok: ModelTokenizer, spec: g.Spec, text: str) -> bool:
    """Whether the grammar lets the model write `text` and then end the reply."""
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec))
    vocab = constrain.vocabulary(tok).tokenizer
    tokens = []  # the thought tags as their tokens, the rest as the vocabulary spells it (`▁` as its
    for part in re.split("(</?think>|▁)", text):  # bytes: the synthetic vocabulary reads it as a space)
        if part in ("<think>", "</think>"):
            tokens += tok.tokenize(part, add_bos=False)
        elif part:
            tokens += (vocab.greedy_tokenize if part == "▁" else vocab.tokenize_str)(part)
    for token in tokens:
        if not c.allowed()[token]:
            return False
        c.accept(token)
    return bool(c.allowed()[c.eog_ids].any())


def forced(name: str, req: CompletionRequest, tok: ModelTokenizer) -> g.Spec:
    """The grammar generate.py hands the sampler: the format's call grammar with room to think."""
    tmpl = template(name)
    fmt = detect_format(tmpl)
    splitter = reasoning.splitter_for(req, tmpl, render(tmpl, req), None, thought_ends(fmt, req))
    return reasoning.grammar_with_room(splitter, tool_grammar(fmt, req), tok)


def closed(name: str, reply: str) -> str:
    """The same reply with `</think>` between the thoughts and the call."""
    at = reply.index(THOUGHT) + len(THOUGHT)
    return reply[:at] + "</think>" + reply[at:]


CHOICES = [{"choice": "required"}, {"choice": "function", "name": "get_weather", "parallel": False}]
# (Kimi's second reply calls without the section: its forced grammar writes the section, as its template
# does; DeepSeek V3.1's markers hold `▁`, which llguidance cannot spell in a literal of the synthetic
# SentencePiece vocabulary, closing tag or not: its grammar's shape is checked below)
FORCEABLE = [(name, reply) for name, reply in REPLIES
             if not reply.startswith("<think>" + THOUGHT + "\n<|tool_call_") and name != "deepseek-ai-DeepSeek-V3.1"]


@pytest.mark.llama
@pytest.mark.parametrize("choice", CHOICES, ids=["required", "named"])
@pytest.mark.parametrize(("name", "reply"), FORCEABLE, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FORCEABLE)])
def test_a_forced_call_may_end_the_thoughts_or_follow_their_closing_tag(think_tok, name, reply, choice):
    req = request(HI, tools=(WEATHER,), **choice)
    spec = forced(name, req, think_tok)
    for text in (reply, closed(name, reply)):
        assert accepts(think_tok, spec, text), text
        reasoning_text, content, calls = drive(name, req, [text])
        assert reasoning_text == THOUGHT and content == "", text
        assert calls == [("get_weather", {"city": "Paris"})], text
    # free text after the thoughts is no call: refused, whichever way the thoughts end
    assert not accepts(think_tok, spec, closed(name, reply).replace("</think>", "</think>Sure."))
    assert not accepts(think_tok, spec, reply.replace(THOUGHT, THOUGHT + "</think>Sure.", 1))
    assert not accepts(think_tok, spec, reply.split(THOUGHT)[0] + THOUGHT + "</think>")


@pytest.mark.llama
def test_only_formats_whose_calls_end_the_thoughts_may_skip_the_closing_tag(think_tok):
    """Hermes (Qwen3): a call's opener inside the thoughts is still thoughts; the closing tag must come."""
    name = "Qwen-Qwen3-0.6B"
    req = request(HI, tools=(WEATHER,), choice="required")
    spec = forced(name, req, think_tok)
    call = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    assert accepts(think_tok, spec, f"<think>{THOUGHT}</think>\n\n{call}")
    assert not accepts(think_tok, spec, f"<think>{THOUGHT}{call}")


@pytest.mark.llama
def test_an_answer_schema_beside_the_tools_follows_the_closing_tag_only(think_tok):
    """tool_choice "auto" with a response_format: after `</think>` the JSON answer or a call; straight
    from the thoughts only a call (the opener ended them)."""
    name = "Qwen3.5-4B"
    req = request(HI, tools=(WEATHER,))
    req = CompletionRequest(**{**req.__dict__, "response_format": ResponseFormat("json_schema", {"enum": ["yes"]})})
    spec = forced(name, req, think_tok)
    reply = dict(REPLIES)[name]
    assert accepts(think_tok, spec, reply) and accepts(think_tok, spec, closed(name, reply))
    assert accepts(think_tok, spec, f'{THOUGHT}</think>\n\n"yes"')
    assert not accepts(think_tok, spec, f'{THOUGHT}</think>\n\nSure.')


def test_what_follows_a_calls_opener_in_its_grammar():
    calls = g.seq(g.literal("<a>"), g.repeat(g.alt(g.literal("x"), g.literal("y")), 1, 3, sep=","), g.literal("</a>"))
    assert g.after(calls, "<a>") == [calls["items"][1], calls["items"][2]]
    assert g.after(g.literal("<a>\n"), "<a>") == [g.literal("\n")]
    assert g.after(g.json_value(None), "<a>") is None
    one = g.seq(g.literal("<a>"), g.literal("x"))
    assert g.after(g.repeat(one, 1, 2, sep="\n"), "<a>") == [g.literal("x"), g.repeat(g.seq(g.literal("\n"), one), 0, 1)]
    assert g.after(g.repeat(one, 1, 1), "<a>") == [g.literal("x")]
    assert g.after(g.repeat(one, 0, 1), "<a>") is None  # (it may be empty: what then follows is not known here)
    assert g.after(g.alt(g.json_value(None), one), "<a>") == [g.literal("x")]
    both = g.alt(g.literal("<a>"), one)
    assert g.after(both, "<a>") == [g.repeat(g.literal("x"), 0, 1)]
    for spec in (calls, one, both):
        for rest in [g.after(spec, "<a>")]:
            g.validate(g.seq(g.literal("<a>"), *rest) if rest else g.literal("<a>"))


@pytest.mark.llama
def test_deepseek_v31s_thoughts_may_end_at_its_calls_section(think_tok):
    name = "deepseek-ai-DeepSeek-V3.1"
    req = request(HI, tools=(WEATHER,), choice="required")
    calls = tool_grammar(detect_format(template(name)), req)
    spec = forced(name, req, think_tok)
    assert spec["type"] == "alt" and len(spec["items"]) == 2
    opener = "<｜tool▁calls▁begin｜>"
    upto, *rest = spec["items"][1]["items"]
    assert upto == g.free_text(opener) and g.seq(*calls["items"][1:]) == g.seq(*rest)


@pytest.mark.llama
def test_a_spent_thinking_budget_still_closes_the_thoughts_into_the_call(think_tok):
    """The budget forces `</think>` (node.inference.think_budget): the grammar still takes it, and the
    forced call follows; a call's opener written in time ends the count instead."""
    import numpy as np

    from node.inference.think_budget import spec as budget_spec

    name = "Qwen3.5-4B"
    req = request(HI, tools=(WEATHER,), choice="required")
    spec = forced(name, req, think_tok)
    vocab = constrain.vocabulary(think_tok).tokenizer
    thought = vocab.tokenize_str("I need it")
    budget = budget_spec(len(thought), "<think>", "</think>", True, ends=("<tool_call>",))
    c = constrain.constraint_for(think_tok, SamplingParams(grammar=spec, reasoning_budget=budget))
    for token in thought:
        c.accept(token)
    assert c.budget.state == "forcing", c.budget.state
    logits = c.apply(np.zeros(think_tok.n_vocab, dtype=np.float32))
    close = think_tok.tokenize("</think>", add_bos=False)[0]
    assert int(np.argmax(logits)) == close and np.isfinite(logits[close])
    c.accept(close)
    call = dict(REPLIES)[name].removeprefix(THOUGHT)
    for token in vocab.tokenize_str(call):
        assert c.allowed()[token]
        c.accept(token)
    assert c.allowed()[c.eog_ids].any()


def test_an_opener_that_is_a_token_is_a_literal_every_peer_resolves():
    """As the closing tag (test_reasoning.py): free text, then the opener's literal, never a text
    node's `stop` spelt as a token, which an older sampling peer would wait for as text."""
    calls = g.seq(g.literal("<tool_call>"), g.literal("x"), g.literal("</tool_call>"))
    s = reasoning.ReasoningSplitter(reasoning.THINK, True, ends=("<tool_call>",))
    spec = s.grammar(calls, close_is_token=True, token_ends=("<tool_call>",))
    assert spec["items"][1] == g.seq(g.seq(g.free_text(), g.literal("<tool_call>")), g.literal("x"),
                                     g.literal("</tool_call>"))
    assert s.grammar(calls)["items"][1] == g.seq(g.free_text("<tool_call>"), g.literal("x"), g.literal("</tool_call>"))
    # no call opener among the grammar's starts (a JSON answer alone): the closing tag only, as before
    assert s.grammar(g.json_value(None)) == reasoning.ReasoningSplitter(reasoning.THINK, True).grammar(g.json_value(None))


@pytest.mark.llama
def test_many_tools_keep_within_the_grammar_bound_and_a_grammar_past_it_is_a_400(think_tok):
    """Each opener branch copies the call grammar: 40 tools of 8 parameters on Qwen3.5 passed
    g.MAX_NODES and every such request was a 500 (found in review). The branches are then left out
    (the closing tag alone, as before); a tool grammar past the bound by itself is a 400 naming `tools`."""
    from node.errors import InvalidRequest
    from node.inference.request import ToolSpec

    params = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(8)},
              "required": [f"p{i}" for i in range(8)]}
    tools = tuple(ToolSpec(f"tool_{n}", "a tool", params) for n in range(40))
    spec = forced("Qwen3.5-4B", request(HI, tools=tools, choice="required"), think_tok)
    g.validate(spec)  # within the bound
    constrain.check(think_tok, SamplingParams(grammar=spec), "tools")  # compiles: no 500
    too_many = tuple(ToolSpec(f"tool_{n}", "a tool", params) for n in range(128))
    big = tool_grammar(detect_format(template("Qwen3.5-4B")), request(HI, tools=too_many, choice="required"))
    with pytest.raises(InvalidRequest, match="too large"):
        constrain.check(think_tok, SamplingParams(grammar=big), "tools")
