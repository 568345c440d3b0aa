"""A reasoning model's thoughts on the Anthropic Messages route, as llama-server writes them.

The thoughts (node.inference.reasoning) come first, as a `thinking` block (stream: its
content_block_start, `thinking_delta` deltas, and a `signature_delta` before its content_block_stop,
as Anthropic's API sends and the SDK's stream accumulator expects). The `signature` is always the
empty string: nothing here can sign thoughts (llama-server sends the same); a client that sends the
block back gets it read, not checked. They come whether or not the request had `thinking`, as on
llama-server; `thinking: {"type": "disabled"}` asks the template not to think (enable_thinking
false), which the templates that read it (Qwen3, QwQ, R1 distills as llama.cpp ships them) honour;
`{"type": "enabled", "budget_tokens": N}` caps the thoughts at N tokens (the closing tag is then
forced, as llama-server does: node.inference.think_budget).
An earlier assistant turn's thinking blocks become its `reasoning_content` (the template shows or
drops it: Qwen3's keeps those of the turns after the last user message, as Anthropic's API keeps
them within a tool-use loop); redacted_thinking blocks are left out.
"""

from __future__ import annotations

from typing import Any

from node.errors import InvalidRequest

SIGNATURE = ""  # no signature can be made for a local model's thoughts (llama-server: "" too)


def template_kwargs(body: dict) -> dict[str, Any]:
    """The template's kwargs the request's `thinking` asks for (its shape is checked elsewhere)."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        return {"enable_thinking": False}
    return {}


def budget(body: dict) -> int | None:
    """The thinking budget in tokens `{"type": "enabled", "budget_tokens": N}` asks for (its shape is
    checked elsewhere): after N tokens of thoughts the closing tag is forced, as llama-server does
    (node.inference.think_budget); None: no budget."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        return thinking.get("budget_tokens")
    return None


def history_thinking(block: dict, where: str) -> str:
    """The text of an earlier turn's thinking block ("" for redacted_thinking)."""
    if block.get("type") == "redacted_thinking":
        return ""
    text = block.get("thinking")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.thinking: Field required (a string)", param="messages")
    return text


def thinking_block(text: str) -> dict[str, Any]:
    """The non-streaming block."""
    return {"type": "thinking", "thinking": text, "signature": SIGNATURE}


def opening_block() -> dict[str, Any]:
    """The streamed block's content_block_start."""
    return {"type": "thinking", "thinking": "", "signature": ""}


def thinking_delta(text: str) -> dict[str, Any]:
    return {"type": "thinking_delta", "thinking": text}


def signature_delta() -> dict[str, Any]:
    """The last delta of a streamed thinking block."""
    return {"type": "signature_delta", "signature": SIGNATURE}
