"""A validated completion request: what generation needs to know, whichever API dialect parsed it.

The HTTP layer (node.api.schemas) builds it; the engine side (node.inference.generate) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from node.inference.sampling import SamplingParams


@dataclass(frozen=True)
class CompletionRequest:
    """A validated chat or text completion request."""

    kind: Literal["chat", "text"]
    model: str  # as the client named it: an id, a readable name or a sha256 prefix
    stream: bool
    include_usage: bool  # stream_options.include_usage: a final usage chunk
    params: SamplingParams
    messages: tuple[dict, ...] = ()  # chat: {"role", "content"} with text content only
    prompt: str = ""  # text completions

    @property
    def prompt_param(self) -> str:
        """The request field a prompt problem is reported against."""
        return "messages" if self.kind == "chat" else "prompt"
