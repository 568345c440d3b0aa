"""Cohere Command R7B's and Cohere2 MoE's (North) tool-call format: its region readers and grammar.

  <|START_THINKING|>the plan<|END_THINKING|>
  <|START_ACTION|>[
      {"tool_call_id": "0", "tool_name": "NAME", "parameters": {...}},
      ...
  ]<|END_ACTION|>

or, for an answer, `<|START_RESPONSE|>text<|END_RESPONSE|>` (R7B) / `<|START_TEXT|>text<|END_TEXT|>`
(Cohere2 MoE). One action block holds all the turn's calls; their `tool_call_id`s are the template's
counters ("0", "1", ...), not the client's ids, which the template maps back to its counters for the
results (`<|START_TOOL_RESULT|>`). The answer's wrapper is markup: its text is the content, the tags
never are (in any chunking; the parser reads a reply that may call tools, and without tools the tags
are control tokens, which a reply's text does not show). The thoughts' tags are reasoning.COHERE_THINK; an action also ends them,
as llama.cpp's Cohere2 MoE parser reads them. Command R+ writes `Action: ```json [...]```` as
plain text instead: not this format (generic).
"""

from __future__ import annotations

from typing import Any

from node.inference import grammar
from node.inference.tools.jsonscan import JsonError, skip_ws
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.regions import call_list
from node.inference.tools.tagged import waits

ACTION_OPEN, ACTION_CLOSE = "<|START_ACTION|>", "<|END_ACTION|>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"  # R7B's answer
TEXT_OPEN, TEXT_CLOSE = "<|START_TEXT|>", "<|END_TEXT|>"  # Cohere2 MoE's answer
# may be control tokens in a Cohere vocabulary (the reply's text must show them to the parser)
MARKERS = (ACTION_OPEN, ACTION_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, TEXT_OPEN, TEXT_CLOSE)


def is_cohere(template: str) -> bool:
    """Command R7B's or Cohere2 MoE's template: an action block of `tool_name` calls and a wrapped answer."""
    return ACTION_OPEN in template and '"tool_name"' in template and (RESPONSE_OPEN in template or TEXT_OPEN in template)


def opened_answer(rendered: str) -> tuple[str, str] | None:
    """(opener, closer) of the answer's wrapper that the prompt opens (R7B's default template ends its
    generation prompt with `<|START_RESPONSE|>`), or None: the reply starts inside it, and ends at the
    closer, which no vocabulary makes an end-of-generation token (Ollama adds it as a stop string)."""
    end = rendered.rstrip()
    return next(((o, c) for o, c in ((RESPONSE_OPEN, RESPONSE_CLOSE), (TEXT_OPEN, TEXT_CLOSE)) if end.endswith(o)), None)


def cohere_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each earlier call turn's thoughts as its `tool_plan`, which R7B's published tool_use template
    writes in `<|START_THINKING|>…<|END_THINKING|>` before the action (Cohere2 MoE's reads it first,
    then `reasoning_content`; llama.cpp's copy of R7B's was edited to read `reasoning_content`)."""
    return [{**m, "tool_plan": m["reasoning_content"]}
            if m.get("role") == "assistant" and m.get("tool_calls") and m.get("reasoning_content") else m
            for m in messages]


def action(text: str, final: bool) -> Region:
    """The calls of one action block (the text after `<|START_ACTION|>`): a JSON list of
    `{"tool_call_id", "tool_name", "parameters"}` objects, then `<|END_ACTION|>`."""
    region = call_list(text, 0, final, Region(), name_key="tool_name")
    if region.end is None:
        return region
    if not region.calls:
        raise JsonError("an action without calls")
    i = skip_ws(text, region.end)
    rest = text[i:]
    if rest.startswith(ACTION_CLOSE):
        region.end = i + len(ACTION_CLOSE)
    elif waits(rest, ACTION_CLOSE) and not final:
        region.end = None  # the closing tag may be coming
    elif waits(rest, ACTION_CLOSE):  # the reply ended without it: the calls stand
        region.end = len(text)
    # (anything else after the list: the calls stand, what follows is content)
    return region


def wrapped(close: str):
    """A reader of an answer's wrapper that ends at `close`: its text is content, the tags are not."""
    def read(text: str, final: bool) -> Region:
        k = text.find(close)
        if k >= 0:
            return Region(content=text[:k], end=k + len(close))
        keep = 0 if final else next((n for n in range(min(len(close) - 1, len(text)), 0, -1)
                                     if close.startswith(text[-n:])), 0)
        return Region(content=text[:len(text) - keep], partial_ok=True)  # (a reply may end without the tag)
    return read


# --- the grammar (a tool_choice that forces calls) ---

def cohere_calls(tools: Any, args: list[dict[str, Any]], max_calls: int | None) -> grammar.Spec:
    """One action block of one or more calls (at most `max_calls`) of `tools`, laid out as the
    template writes it (`[`, each call on its own line, `]`), each call's `tool_call_id`,
    `tool_name` and `parameters` (`args`: each tool's arguments schema) in the template's order and
    in compact JSON, as every forced call; the block's tags alone in their literals (a vocabulary
    may hold them as single tokens)."""
    each = [grammar.json_value({
        "type": "object", "properties": {"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,4}$"},
                                         "tool_name": {"const": t.name}, "parameters": a},
        "required": ["tool_call_id", "tool_name", "parameters"], "additionalProperties": False,
        "x-guidance": {"lenient": True}})  # (as every format's call grammar: forced._lenient)
        for t, a in zip(tools, args, strict=True)]
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(ACTION_OPEN), grammar.literal("[\n    "),
                       grammar.repeat(one, 1, max_calls, sep=",\n    "), grammar.literal("\n]"),
                       grammar.literal(ACTION_CLOSE))


def cohere_answer(template: str, answer: grammar.Spec) -> grammar.Spec:
    """The answer of a reply that may call tools beside a response_format: the JSON in the answer's
    wrapper as the template writes it (R7B's `<|START_RESPONSE|>`, Cohere2 MoE's `<|START_TEXT|>`), both
    tags optional (the prompt may have opened it; the reply may end without the closer; llama.cpp's
    cohere2moe grammar), each alone in its literal (a control token); the parser keeps the JSON alone
    as content. Before 2026-12-06 the answer was bare JSON, which these models never write."""
    opener, closer = (TEXT_OPEN, TEXT_CLOSE) if TEXT_OPEN in template else (RESPONSE_OPEN, RESPONSE_CLOSE)
    return grammar.seq(grammar.repeat(grammar.literal(opener), 0, 1), answer,
                       grammar.repeat(grammar.literal(closer), 0, 1))


COHERE = Syntax("cohere", (ACTION_OPEN, RESPONSE_OPEN, TEXT_OPEN), False, action,
                ((RESPONSE_OPEN, wrapped(RESPONSE_CLOSE)), (TEXT_OPEN, wrapped(TEXT_CLOSE))))
