"""Chat templates: render OpenAI messages with the model's own Jinja template (sandboxed).

The template sees what Hugging Face's `apply_chat_template` gives it: `messages`, `tools` (None
when no tool may be called; node.inference.tools shapes both), `bos_token`, `eos_token`,
`add_generation_prompt`, `raise_exception`, `strftime_now`, and a `tojson` that keeps the key
order and non-ASCII text as written (Jinja's own sorts keys and escapes `<`, `>`, `&`, `'`, which
would change the tool-call text the model was trained on). As llama-server, it also sees
`enable_thinking` (true unless the request's `chat_template_kwargs` say otherwise: llama.cpp's
copies of the R1-distill and QwQ templates close the thoughts at once when it is not set) and the
request's other `chat_template_kwargs` (which cannot replace the variables above).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
from typing import Any

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from node.errors import InvalidRequest

log = logging.getLogger(__name__)

# Used only when a GGUF has no template: ChatML, the most common convention.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    # a template that checks the effort it is given (Tencent Hy3: no_think/low/high) refuses the
    # request's reasoning_effort (Ollama's `think: "medium"`), not its messages (review r56)
    if "reasoning_effort" in str(message):
        raise InvalidRequest(f"the chat template refused the reasoning effort: {message}", param="reasoning_effort")
    raise InvalidRequest(f"chat template rejected the messages: {message}", param="messages")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_listed)


def _listed(value: Any) -> Any:
    """A sequence Jinja leaves lazy (`tools | map(attribute='function')`, as llama.cpp's R1 template
    writes the tools) as a list; anything else is not JSON."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return list(value)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face marks the assistant's tokens with it for
    training masks): renders its body as it is. LFM 2.5 and Poolside Laguna templates use it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class _ChatEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, except that a template may `append` to and `pop` from a list (Kimi K2
    Instruct / Thinking queue their call ids so; llama.cpp's Jinja engine allows it): without it those
    templates were a 400 on every chat whose history held a tool call. The lists a template reaches
    are this request's own (node.inference.tools gives it fresh messages and tools); dicts, strings
    and the rest stay immutable."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if type(obj) is list and attr in ("append", "pop"):
            return True
        return super().is_safe_attribute(obj, attr, value)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    # the extensions Hugging Face's apply_chat_template enables: `{% break %}`/`{% continue %}` (Command R7B,
    # Kimi K3, Reka) and `{% generation %}`; without them those templates were a 400 on every request
    env = _ChatEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader(),
                          extensions=["jinja2.ext.loopcontrols", _Generation])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True,
                tools: list[dict] | None = None, extra: dict[str, Any] | None = None) -> str:
    """The prompt text for `messages` under `template` (ChatML when the model has none); `extra`:
    the request's chat_template_kwargs."""
    if not template:
        log.debug("DIAG: build_prompt template_matched=false fallback=chatml")
    try:
        compiled = _compile(template or CHATML_TEMPLATE)
        context: dict[str, Any] = {"enable_thinking": True, **(extra or {}), "messages": messages, "bos_token": bos_token, "eos_token": eos_token,
                                   "add_generation_prompt": add_generation_prompt}
        if tools is not None:  # templates test `tools is defined` / `tools is not none`
            context["tools"] = tools
        return compiled.render(**context)
    except InvalidRequest:
        raise
    except jinja2.TemplateError as exc:
        raise InvalidRequest(f"the model's chat template failed to render: {exc}", param="messages") from exc


# --- Gemma 4 (tools/gemma4.py): its template leaves a model turn closed that llama.cpp opens ---

GEMMA4_TURN_END, GEMMA4_MODEL_TURN = "<turn|>\n", "<|turn>model\n"


def is_gemma4(template: str) -> bool:
    return "'<|tool_call>call:'" in template  # (llama.cpp's test)


def model_turn(template: str | None, rendered: str) -> str:
    """The prompt with the model's turn opened where the template leaves it closed: after a turn
    with text beside its calls and their results the template writes `<turn|>` and no generation
    prompt (it opens none after a tool response), so the model was asked to go on after its own
    turn's end. llama.cpp opens `<|turn>model` there."""
    if template and rendered.endswith(GEMMA4_TURN_END) and is_gemma4(template):
        return rendered + GEMMA4_MODEL_TURN
    return rendered
