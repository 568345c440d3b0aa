"""A validated completion request: what generation needs to know, whichever API dialect parsed it.

The HTTP layer (node.api.schemas for OpenAI chat/completions; the Anthropic Messages and OpenAI
Responses handlers translate into the same thing) builds it; the engine side
(node.inference.generate) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from node.inference.sampling import SamplingParams


@dataclass(frozen=True)
class ResponseFormat:
    """OpenAI `response_format` (or Responses `text.format`): text, any JSON object, or a JSON schema;
    or what llama-server's `grammar` and vLLM's guided_* / structured_outputs ask for (node.api
    .constraints): a Lark grammar (GBNF converted), a regex, or one of a list of strings (`choices`)."""

    type: Literal["text", "json_object", "json_schema", "grammar", "regex", "choice"]
    schema: dict[str, Any] | None = field(default=None, hash=False)
    name: str = ""
    strict: bool = False
    text: str = ""  # "grammar": its Lark text; "regex": the pattern
    choices: tuple[str, ...] = ()
    param: str = "response_format"  # the request field it came from (its 400s name it)


@dataclass(frozen=True)
class ToolSpec:
    """One function tool the model may call."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}}, hash=False)
    strict: bool = False


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call in a reply (arguments: a JSON text, as OpenAI sends it)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call, OpenAI's delta shape: the first piece of call `index` carries
    its id and name, later pieces append to its arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability, and the most likely alternatives at that step."""

    token: str  # the token's text (may be part of a UTF-8 character: see `bytes`)
    bytes: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()
    text_offset: int = 0  # where the token's text starts in the reply, in characters


@dataclass(frozen=True)
class Delta:
    """What a run yields as the reply grows: text, tool-call pieces, and the logprobs of its tokens."""

    text: str = ""  # the answer (chat: the text outside the thoughts and the tool calls)
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    reasoning: str = ""  # a reasoning model's thoughts (node.inference.reasoning)
    choice: int = 0  # which of the request's `n` choices it belongs to (node.inference.choices)
    ended: bool = False  # choices only: choice `choice` is complete (its finish reason is known)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated chat or text completion request."""

    kind: Literal["chat", "text"]
    model: str  # as the client named it: an id, a readable name or a sha256 prefix
    stream: bool
    include_usage: bool  # stream_options.include_usage: a final usage chunk
    params: SamplingParams
    # chat messages, whichever API parsed them (the one internal shape):
    #   {"role": "system" | "user" | "assistant" | "tool", "content": str}  ("" when null)
    #   assistant messages that called tools add "tool_calls": a tuple of ToolCall (id, name,
    #     arguments as a JSON text encoding an object); their "content" may be ""
    #   assistant messages may add "reasoning_content": the thoughts a reasoning model wrote then
    #   tool messages add "tool_call_id" (the id of a call made by an earlier assistant message)
    #     and "name" (that call's function name); "content" is the result as text
    # node.inference.tools.prompt_inputs turns these into what the model's template expects.
    messages: tuple[dict, ...] = ()
    prompt: str = ""  # text completions
    suffix: str | None = None  # text completions: fill in the middle between `prompt` and this
    # llama-server's t_max_predict_ms (code completion keeps replies short): the reply ends once this
    # long has passed since its first token and it holds a newline (finish_reason "length")
    predict_time_limit_ms: int | None = None
    # llama-server's /infill: other files' (filename, text) put before the code, and the middle's start
    infill_extra: tuple[tuple[str, str], ...] = ()
    infill_middle: str = ""
    response_format: ResponseFormat | None = None
    tools: tuple[ToolSpec, ...] = ()
    # "none" | "auto" | "required" | "function" (then tool_choice_name names it)
    tool_choice: Literal["none", "auto", "required", "function"] = "auto"
    tool_choice_name: str | None = None
    parallel_tool_calls: bool = True
    # a reasoning model's thoughts apart ("deepseek": reasoning_content, llama-server's default) or
    # left in the text ("none"); chat only
    reasoning_format: Literal["none", "deepseek"] = "deepseek"
    # a reasoning model's thinking budget in tokens (Anthropic's thinking.budget_tokens, llama-server's
    # reasoning_budget_tokens): the closing tag is forced after it (node.inference.think_budget)
    reasoning_budget: int | None = None
    # the request's chat_template_kwargs (enable_thinking, ...), given to the chat template
    template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    operation: str = ""  # the API operation for the trace ("chat.completions", "messages", "responses", ...)
    # Ollama's /api/chat: a history past the context loses its oldest messages (system ones and the
    # last kept) until it fits, as Ollama's chatPrompt does; every other route answers a 400
    drop_old_messages: bool = False
    # OpenAI's `n`: this many choices for the one prompt (node.inference.choices); 1 on every other API
    n: int = 1

    @property
    def prompt_param(self) -> str:
        """The request field a prompt problem is reported against, in its API's own words."""
        if self.operation == "responses":
            return "input"
        return "messages" if self.kind == "chat" else "prompt"

