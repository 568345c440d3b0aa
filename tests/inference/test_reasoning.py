"""Reasoning models' thoughts apart from their answer (node.inference.reasoning): the templates of
real reasoning models (tests/fixtures/templates), the reply shapes they lead to, in any chunking,
and the grammar that leaves room to think, walked on a real vocabulary."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from node.inference import constrain, reasoning
from node.inference import grammar as g
from node.inference.chat import render_chat
from node.inference.reasoning import (
    MISTRAL_THINK,
    THINK,
    ReasoningSplitter,
    opens_inside,
    think_tags,
    with_history,
)
from node.inference.sampling import SamplingParams
from node.inference.synth import SynthSpec
from node.inference.tokenizer import ModelTokenizer
from tests.support.nodes import tiny_model

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"
HI = [{"role": "user", "content": "hi"}]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def prompt(name: str, **extra) -> str:
    return render_chat(template(name), HI, bos_token="<s>", eos_token="</s>", extra=extra or None)


# (template, where its generation prompt leaves the reply: inside the thoughts or not, and whether
# the template reads enable_thinking)
OPENS = [("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True, True), ("llama-cpp-deepseek-r1", True, False),
         ("Qwen-QwQ-32B", True, True), ("Qwen3.5-4B", True, True), ("Qwen-Qwen3-0.6B", False, True),
         ("GLM-4.6", False, True), ("GLM-4.7-Flash", True, True), ("deepseek-ai-DeepSeek-V3.1", True, True),
         ("Kimi-K2-Thinking", False, False)]


@pytest.mark.parametrize(("name", "inside", "switch"), OPENS)
def test_reasoning_templates_are_found_and_where_the_reply_starts(name, inside, switch):
    assert think_tags(template(name)) == THINK
    assert opens_inside(prompt(name), THINK) is inside
    # enable_thinking false (chat_template_kwargs) closes the thoughts in the prompt: the reply is the answer
    assert opens_inside(prompt(name, enable_thinking=False), THINK) is (inside and not switch)


def test_other_templates_are_not_reasoning_templates():
    assert think_tags(template("mistralai-Ministral-3-14B-Reasoning-2512")) == MISTRAL_THINK
    for name in ("Qwen-Qwen2.5-7B-Instruct", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
                 "meta-llama-Llama-3.2-3B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407"):
        assert think_tags(template(name)) is None, name
    assert think_tags(None) is None


# (tags, reply starts inside, the model's text, reasoning, content)
SHAPES = [
    (THINK, True, "Okay, the user says hi.\nI should greet.\n</think>\n\nHello! How can I help?",
     "Okay, the user says hi.\nI should greet.", "Hello! How can I help?"),
    (THINK, False, "<think>\nHmm, a greeting.\n</think>\n\nHi there", "Hmm, a greeting.", "Hi there"),
    (THINK, False, "\n<think>\n\n</think>\n\nHi", "", "Hi"),
    (THINK, False, "Hi there, no thoughts <think> here", "", "Hi there, no thoughts <think> here"),
    (THINK, True, "Okay, so the user", "Okay, so the user", ""),  # max_tokens cut the thoughts
    (THINK, True, "a < b and c </thin k> </think>ok </think> x", "a < b and c </thin k>", "ok </think> x"),
    (THINK, True, "  trailing   \n\n", "trailing", ""),
    (THINK, False, "<thi", "", "<thi"),  # the reply ended on a tag's start: it was text
    (THINK, True, "x </thi", "x </thi", ""),
    (MISTRAL_THINK, False, "[THINK]plan it[/THINK]The answer.", "plan it", "The answer."),
]


def run(splitter: ReasoningSplitter, pieces: list[str]) -> tuple[str, str]:
    reasoning = content = ""
    for piece in pieces:
        r, c = splitter.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    return reasoning + r, content + c


def chunkings(text: str):
    yield [text]
    yield list(text)
    for i, j in itertools.combinations(range(1, len(text)), 2):
        yield [text[:i], text[i:j], text[j:]]


@pytest.mark.parametrize(("tags", "inside", "text", "reasoning", "content"), SHAPES)
def test_the_reply_splits_the_same_in_any_chunking(tags, inside, text, reasoning, content):
    for pieces in chunkings(text):
        assert run(ReasoningSplitter(tags, inside), pieces) == (reasoning, content), pieces


def test_nothing_is_held_longer_than_a_tag_could_need():
    s = ReasoningSplitter(THINK, True)
    assert s.feed("I think ") == ("I think", "")  # the space waits: it may end the thoughts
    assert s.feed("so</") == (" so", "")  # "</" may start the closing tag
    assert s.feed("b>") == ("</b>", "")
    assert s.feed("</think>\n\nYes") == ("", "Yes")
    assert s.phase == "answer"


def test_history_thoughts_reach_the_template_as_qwen3_reads_them():
    original = ({"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello", "reasoning_content": "They greet me."},
                {"role": "user", "content": "and?"})
    messages = with_history(original, [dict(m) for m in original if True])
    text = render_chat(template("Qwen-Qwen3-0.6B"), messages[:2])  # its turn is the last: thoughts shown
    assert "<think>\nThey greet me.\n</think>\n\nHello" in text
    text = render_chat(template("Qwen-Qwen3-0.6B"), messages)  # an earlier turn's thoughts are dropped
    assert "They greet me." not in text and "Hello<|im_end|>" in text
    # thoughts left in an earlier turn's content are the template's to strip
    inline = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nSecret.\n</think>\n\nHello"},
              {"role": "user", "content": "and?"}]
    assert "Secret." not in render_chat(template("Qwen-Qwen3-0.6B"), inline)


@pytest.fixture(scope="module")
def think_tok(tmp_path_factory):
    t = ModelTokenizer(tiny_model(tmp_path_factory.mktemp("think"), SynthSpec(think=True), "think.gguf"))
    yield t
    t.close()


def walk(tok, spec, bias, seed=0, steps=120):
    """Random logits with a bias, masked by the grammar: the text until end of generation."""
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec))
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        logits = rng.normal(size=tok.n_vocab).astype(np.float32) * 3
        for token, b in bias.items():
            logits[token] += b
        c.apply(logits)
        token = int(np.argmax(logits))
        if tok.is_eog(token):
            return b"".join(tok.piece(i) for i in out).decode()
        out.append(token)
        c.accept(token)
    return None


@pytest.mark.llama
def test_a_grammar_leaves_room_to_think_first(think_tok):
    """A JSON answer's grammar, from a prompt that opened the thoughts: free text up to `</think>`,
    then the JSON (a bias makes the model close its thoughts soon)."""
    answer = g.json_value({"enum": ["yes"]})
    close = think_tok.tokenize("</think>", add_bos=False)
    assert len(close) == 1  # a single token, as in Qwen3's vocabulary
    inside = ReasoningSplitter(THINK, True)
    for seed in range(3):
        text = walk(think_tok, inside.grammar(answer), {close[0]: 4.0}, seed)
        assert text is not None and "</think>" in text
        assert run(ReasoningSplitter(THINK, True), [text])[1] == '"yes"'
    # a reply that may open thoughts: with them, or the answer at once
    start = ReasoningSplitter(THINK, False).grammar(answer)
    assert start["type"] == "alt"
    answered = ReasoningSplitter(THINK, False)
    answered.feed("x")
    assert answered.grammar(answer) == answer  # already answering: the grammar as it was


@pytest.mark.parametrize("inside", [True, False])
def test_raw_thoughts_and_the_answer_rebuild_the_reply_in_any_chunking(inside):
    """reasoning_format "none": feed_raw's first part is the thoughts as written (tags, whitespace),
    the second the answer the tool parser reads; together they are the reply."""
    reply = ("  <think>\n" if not inside else "") + "let me see </thi nk> no\n</think>\n\n{\"a\": 1}"
    for cut in range(len(reply) + 1):
        for cut2 in range(cut, len(reply) + 1, 5):
            s = reasoning.ReasoningSplitter(reasoning.ThinkTags("<think>", "</think>"), inside)
            raw = answer = ""
            for piece in (reply[:cut], reply[cut:cut2], reply[cut2:]):
                r, a = s.feed_raw(piece)
                raw, answer = raw + r, answer + a
            r, a = s.feed_raw("", final=True)
            raw, answer = raw + r, answer + a
            assert raw + answer == reply and answer == '{"a": 1}', (cut, cut2, raw, answer)


def test_a_closing_tag_that_is_a_token_is_a_literal_every_peer_resolves():
    """An older sampling peer compiles a text node's `stop` as text; `</think>` as a special token
    cannot be spelt so, and the model thought until max_tokens (found in review)."""
    s = reasoning.ReasoningSplitter(reasoning.ThinkTags("<think>", "</think>"), True)
    spec = s.grammar(g.json_value({"enum": ["yes"]}), close_is_token=True)
    assert spec["items"][0] == g.seq(g.free_text(), g.literal("</think>"))
    assert s.grammar(g.json_value(None))["items"][0] == g.free_text("</think>")
