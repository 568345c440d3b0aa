"""A request's prompt as the model reads it: a chat rendered with the model's template and the tools
(prompt_inputs, the reasoning history, a prefilled reply), a fill-in-the-middle prompt, or the text;
tokenized off the loop. CompletionRun.prepare (generate.py) and count_tokens use it. A chat asking
for it (Ollama's /api/chat) that is past the context is fitted by dropping its oldest messages."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from node import const
from node.inference import reasoning
from node.inference.prefill import prefill_of
from node.inference.request import CompletionRequest
from node.inference.tokenizer import ModelTokenizer
from node.inference.tools import ToolFormat, chat_template, prompt_inputs, thought_ends
from node.inference.tools.cohere import opened_answer
from node.inference.tools.harmony import continued


@dataclass
class Prompt:
    tokens: list[int]
    fmt: ToolFormat | None = None  # a chat's: the model's tool-call format
    thoughts: reasoning.ReasoningSplitter | None = None  # a reasoning model's thoughts, kept apart
    counter: reasoning.ThoughtCounter | None = None  # usage's reasoning_tokens
    answer: tuple[str, str] | None = None  # (opener, closer) of an answer's wrapper the prompt opened (Cohere)


async def async_prompt(request: CompletionRequest, tok: ModelTokenizer, n_ctx: int) -> Prompt:
    """The prompt's tokens and, for a chat, what reads the reply (off the loop: the generic format
    tries a template once, ~50 ms for the largest; rendering and tokenizing)."""
    loop = asyncio.get_running_loop()
    if request.kind == "chat":
        # the tool_use template when the reply may call tools and it shows them (a probe render, once a template)
        template, fmt = await loop.run_in_executor(None, chat_template, request, tok.chat_template,
                                                   tok.named_templates.get("tool_use"))
        prefill = prefill_of(request)  # (its message is left out before the history is built)
        messages, tools = await loop.run_in_executor(None, prompt_inputs, fmt, request, template,
                                                     reasoning.with_history, prefill is not None)
        if prefill is not None:
            prefill = continued(template, prefill)  # gpt-oss: in its final channel
        rendered, tokens = await loop.run_in_executor(None, tok.chat_prompt, messages, tools, prefill or "",
                                                      request.template_kwargs, template)
        ends = thought_ends(fmt, request)  # a call's opener ends the thoughts too
        thoughts = reasoning.splitter_for(request, template, rendered, prefill, ends)
        counting = reasoning.splitter_for(request, template, rendered, prefill, ends)
        return Prompt(tokens, fmt, thoughts, None if counting is None else reasoning.ThoughtCounter(counting),
                      opened_answer(rendered))
    if request.suffix is not None:
        # other files' context fills what the code and the reply leave of the context (llama-server's rule)
        room = n_ctx - 2 * (request.params.max_tokens or const.DEFAULT_MAX_TOKENS)
        return Prompt(await loop.run_in_executor(None, tok.infill_tokens, request.prompt, request.suffix,
                                                 request.infill_extra, request.infill_middle, room))
    return Prompt(await loop.run_in_executor(None, tok.tokenize, request.prompt))


async def async_fitted_prompt(request: CompletionRequest, tok: ModelTokenizer,
                              n_ctx: int) -> tuple[Prompt, CompletionRequest, int]:
    """The prompt, and for a request with `drop_old_messages` without room for its reply, the prompt
    of the fewest oldest messages dropped that leaves it that room: system messages and the last
    message are kept (an assistant prefill as the last message with the user message before it:
    review r48), and the kept history starts at a user message (a template may refuse a history that
    opens with a reply or a tool's result). An agent loop (a user message, then calls and their
    results) is cut before an assistant message that makes calls, its results kept with it, the task
    (the latest user message before it) kept before it (review r46: the cut fell on the last tool
    result alone; r47: the oldest task was kept; r49: a prefill continuing a loop, the loop after its
    question). When no cut leaves the room, half of it (or what the last unit alone leaves) is the
    floor: a chat that leaves that much is served whole (review r48: it lost its whole history),
    else cut to leave it (review r49: the cut leaving one token was taken); a history ending in a tool
    result that cannot keep a user turn is not cut (the context's 400; review r47). Returns (prompt,
    the request it renders, the messages dropped). Each try is one render: a binary search over each
    kind of cut."""
    prompt = await async_prompt(request, tok, n_ctx)
    if not request.drop_old_messages:
        return prompt, request, 0
    # room for the reply: what it asks (up to a quarter of the context), else a quarter (review r46:
    # fitted to leave one token, the reply was cut at whatever room the cut happened to leave)
    asked = request.params.max_tokens
    wanted = max(1, min(asked if asked is not None and asked > 0 else n_ctx, n_ctx // 4))
    if len(prompt.tokens) + wanted <= n_ctx:
        return prompt, request, 0
    messages = request.messages
    rest = [i for i, m in enumerate(messages) if m.get("role") != "system"]
    if len(rest) < 2:
        return prompt, request, 0
    last = rest[-1]
    users = [i for i in rest if messages[i].get("role") == "user"]
    unit = last  # the last message and what must stay with it
    if messages[last].get("role") == "assistant" and not messages[last].get("tool_calls"):
        unit = max((i for i in users if i < last), default=last)  # a prefill: its question with it
    # the calls a loop's cut may fall before: between the task and the last unit, or, for a prefill
    # that continues a loop (calls between its question and it), after that question, the task
    # then (review r49: such a chat could not be cut at all)
    span = (unit, last) if unit != last and any(
        messages[i].get("role") == "assistant" and messages[i].get("tool_calls") for i in rest if unit < i < last) \
        else (max((i for i in users if i < unit), default=None), unit)
    task = span[0]

    def cut_at(start: int, keep: int | None = None) -> CompletionRequest:
        kept = tuple(m for i, m in enumerate(messages) if m.get("role") == "system" or i >= start or i == keep)
        return dataclasses.replace(request, messages=kept)

    async def earliest(cuts: list[int], keep: int | None, room: int) -> tuple[Prompt, CompletionRequest, int] | None:
        best = None
        lo, hi = 0, len(cuts) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            trimmed = cut_at(cuts[mid], keep)
            tried = await async_prompt(trimmed, tok, n_ctx)
            if len(tried.tokens) + room <= n_ctx:
                dropped = sum(1 for i in rest if i < cuts[mid] and i != keep)
                best, hi = (tried, trimmed, dropped), mid - 1
            else:
                lo = mid + 1
        return best

    user_cuts = [i for i in users if rest[0] < i < unit]
    call_cuts = [i for i in rest if task is not None and task + 1 < i < span[1]
                 and messages[i].get("role") == "assistant" and messages[i].get("tool_calls")]
    # the last unit alone: a user turn, or (no user message at all) the last message
    unit_cut = [unit] if messages[unit].get("role") == "user" or not users else []

    async def search(room: int) -> tuple[Prompt, CompletionRequest, int] | None:
        return (await earliest(user_cuts, None, room) or await earliest(call_cuts, task, room)
                or await earliest(unit_cut, None, room))

    found = await search(wanted)
    if found is None:
        # no cut leaves the reply all its room: half of it, or what the last unit alone leaves (review
        # r49: the earliest cut leaving one token cut replies to a few tokens, as before r46); a chat
        # within the context that leaves that much is served whole (review r48: history kept)
        # (the last unit alone, or a loop's last call with its results and task: review r50, a loop
        # ending in a tool result got the one-token floor)
        smallest = cut_at(unit) if unit_cut else cut_at(call_cuts[-1], task) if call_cuts else None
        alone = len((await async_prompt(smallest, tok, n_ctx)).tokens) if smallest is not None else n_ctx
        floor = max(1, min(wanted // 2, n_ctx - alone))
        if len(prompt.tokens) + floor <= n_ctx:
            return prompt, request, 0
        found = await search(floor)
    return found or (prompt, request, 0)
