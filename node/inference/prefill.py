"""A chat that ends with an assistant message: the start of the reply, written by the client."""

from __future__ import annotations

from node.errors import Unsupported
from node.inference.request import CompletionRequest
from node.inference.tools import tools_active


def prefill_of(request: CompletionRequest) -> str | None:
    """A chat that ends with an assistant message asks for that message to be continued (a
    prefill, as Anthropic's API and llama-server take it): its text follows the generation
    prompt and the reply is what comes after it. Until 2026-12-06 the chat route rendered it as
    a finished turn and answered a new one. None when the chat ends otherwise."""
    last = request.messages[-1] if request.messages else None
    if last is None or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content")
    if not isinstance(content, str) or not content:
        return ""  # an empty placeholder some apps append: the reply starts as usual
    if request.response_format is not None or tools_active(request):
        raise Unsupported("a final assistant message (prefill) cannot be combined with tools or "
                          "response_format; end with a user turn", param=request.prompt_param)
    return content
