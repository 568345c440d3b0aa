"""Chat templates: render OpenAI messages with the model's own Jinja template (sandboxed)."""

from __future__ import annotations

import functools
import logging

import jinja2
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
    raise InvalidRequest(f"chat template rejected the messages: {message}", param="messages")


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` under `template` (ChatML when the model has none)."""
    if not template:
        log.debug("DIAG: build_prompt template_matched=false fallback=chatml")
    try:
        compiled = _compile(template or CHATML_TEMPLATE)
        return compiled.render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt)
    except InvalidRequest:
        raise
    except jinja2.TemplateError as exc:
        raise InvalidRequest(f"the model's chat template failed to render: {exc}", param="messages") from exc
