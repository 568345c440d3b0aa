"""A request's prompt as the model reads it: a chat rendered with the model's template and the tools
(prompt_inputs, the reasoning history, a prefilled reply), a fill-in-the-middle prompt, or the text;
tokenized off the loop. CompletionRun.prepare (generate.py) and count_tokens use it."""

from __future__ import annotations

import asyncio
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
