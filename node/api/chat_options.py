"""Chat request fields for reasoning models, as llama-server (and vLLM) take them.

`reasoning_format`: "deepseek" (the default; "auto" is the same) puts a reasoning model's thoughts
in `reasoning_content`, "none" leaves them in `content` as the model wrote them. `"deepseek-legacy"`
(thoughts in both) is refused naming the two that work.
`chat_template_kwargs`: an object given to the chat template beside its messages (Qwen3's
`enable_thinking: false`); names the template does not read change nothing; `enable_thinking` must
be a boolean; the template's own variables (messages, tools, ...) cannot be replaced.
`reasoning_effort: "none"` turns thinking off, as on llama-server (enable_thinking false); another
effort reaches the template as `reasoning_effort` (gpt-oss's reads it).
`reasoning_budget_tokens` (or `thinking_budget_tokens`), llama-server's: the thoughts' budget in
tokens, after which the closing tag is forced (node.inference.think_budget); -1 (the default) is
none, 0 closes the thoughts at once.
An assistant message's `reasoning_content` (a string) is kept for the template (node.inference.reasoning).
"""

from __future__ import annotations

from typing import Any

from node.errors import InvalidRequest, Unsupported

REASONING_FORMATS = ("none", "auto", "deepseek")
RESERVED_TEMPLATE_NAMES = ("messages", "tools", "bos_token", "eos_token", "add_generation_prompt",
                           "raise_exception", "strftime_now")
KEYS = {"reasoning_format", "chat_template_kwargs", "reasoning_budget_tokens", "thinking_budget_tokens"}
MAX_BUDGET_TOKENS = (1 << 31) - 1


def reasoning_format(body: dict) -> str:
    """The request's reasoning_format: "deepseek" or "none"."""
    value = body.get("reasoning_format")
    if value is None:
        return "deepseek"
    if value == "deepseek-legacy":
        raise Unsupported("`reasoning_format` \"deepseek-legacy\" is not supported: use \"deepseek\" "
                          "(thoughts in reasoning_content) or \"none\" (thoughts in content)",
                          param="reasoning_format")
    if value not in REASONING_FORMATS:
        raise InvalidRequest(f"`reasoning_format` must be one of {', '.join(REASONING_FORMATS)}, got {value!r}",
                             param="reasoning_format")
    return "none" if value == "none" else "deepseek"


def template_kwargs(body: dict) -> dict[str, Any]:
    """The request's chat_template_kwargs, with reasoning_effort folded in as llama-server does."""
    value = body.get("chat_template_kwargs")
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"`chat_template_kwargs` must be an object, got {type(value).__name__}",
                             param="chat_template_kwargs")
    for name in value:
        if name in RESERVED_TEMPLATE_NAMES:
            raise InvalidRequest(f"`chat_template_kwargs.{name}` cannot be set: the node gives the template "
                                 f"its {name}", param=f"chat_template_kwargs.{name}")
    thinking = value.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise InvalidRequest(f"`chat_template_kwargs.enable_thinking` must be a boolean, got "
                             f"{type(thinking).__name__}", param="chat_template_kwargs.enable_thinking")
    out = {k: v for k, v in value.items() if v is not None or k != "enable_thinking"}
    return {**out, **effort_kwargs(body.get("reasoning_effort"))}  # its value is checked with the other hints


def reasoning_budget(body: dict) -> int | None:
    """llama-server's `reasoning_budget_tokens` (`thinking_budget_tokens`): None for none (-1)."""
    key = "reasoning_budget_tokens" if body.get("reasoning_budget_tokens") is not None else "thinking_budget_tokens"
    value = body.get(key)
    if value is None or value == -1:
        return None
    if type(value) is not int or not 0 <= value <= MAX_BUDGET_TOKENS:
        raise InvalidRequest(f"`{key}` must be -1 (no budget) or a number of tokens, got {value!r}", param=key)
    return value


def effort_kwargs(effort: object) -> dict[str, Any]:
    """A reasoning effort as the template's kwargs, as llama-server folds it in: "none" turns
    thinking off (enable_thinking false); another effort reaches the template as `reasoning_effort`
    (gpt-oss's reads it). The chat route's `reasoning_effort`, Responses' `reasoning.effort`."""
    if effort == "none":
        return {"enable_thinking": False}
    return {"reasoning_effort": effort} if isinstance(effort, str) and effort else {}


def history_reasoning(msg: dict, index: int) -> str | None:
    """An assistant message's reasoning_content (None when it has none)."""
    value = msg.get("reasoning_content")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"messages[{index}].reasoning_content must be a string",
                             param=f"messages[{index}].reasoning_content")
    return value
