"""Conversation history shared by the dialects that translate tool turns (Anthropic, Responses)."""

from __future__ import annotations

from node.errors import InvalidRequest


def link_tool_results(messages: list[dict], param: str) -> list[dict]:
    """Give each tool message the name of the call it answers (the templates render it), as
    schemas does for OpenAI chat; a result for a call no earlier assistant turn made is a 400."""
    names: dict[str, str] = {}
    out = []
    for msg in messages:
        for call in msg.get("tool_calls") or ():
            names[call.id] = call.name
        if msg["role"] == "tool":
            call_id = msg["tool_call_id"]
            if call_id not in names:
                raise InvalidRequest(f"a tool result answers tool call {call_id!r}, which no earlier assistant "
                                     "turn made", param=param)
            msg = {**msg, "name": names[call_id]}
        out.append(msg)
    return out
