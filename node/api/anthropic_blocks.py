"""Anthropic content blocks that reach the model as text: text blocks, tool results, plain-text
documents and search results.

A `document` whose source is text (`{"type": "text", "media_type": "text/plain", "data"}`) or a
list of text blocks (`{"type": "content", "content": [...]}`), and a `search_result` (`source`,
`title`, text `content`), are given to the model as tagged text with their title, context and
source, in the turn where they stand or inside a tool_result, as Anthropic's API puts them into
its prompt; agents (Claude Code's WebFetch and RAG tools) send them. PDFs, URLs, file ids and
images stay a 400 naming them: this node reads no files and sees no pictures.
"""

from __future__ import annotations

from typing import Any

from node.api.message_schemas import IMAGE_LEFT_OUT
from node.errors import InvalidRequest, Unsupported

_DOCUMENT_KEYS = {"type", "source", "title", "context", "citations", "cache_control"}
_SEARCH_RESULT_KEYS = {"type", "source", "title", "content", "citations", "cache_control"}


def text_blocks(value: Any, where: str) -> str:
    """A string, or a list of text blocks joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}: must be a string or a list of text blocks", param=where)
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidRequest(f"{where}.{i}: expected a text block, got {kind}", param=where)
        texts.append(block["text"])
    return "".join(texts)


def _optional_str(block: dict, key: str, where: str) -> str | None:
    value = block.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{where}.{key}: must be a string", param="messages")
    return value or None


def _extra_keys(block: dict, allowed: set[str], where: str) -> None:
    unknown = set(block) - allowed
    if unknown:
        raise InvalidRequest(f"{where}.{sorted(unknown)[0]}: Extra inputs are not permitted", param="messages")


def _tagged(tag: str, fields: list[tuple[str, str | None]], text: str) -> str:
    head = "".join(f"<{name}>{value}</{name}>\n" for name, value in fields if value)
    return f"<{tag}>\n{head}{text}\n</{tag}>\n"


def document_text(block: dict, where: str) -> str:
    """A plain-text document block as the model reads it."""
    _extra_keys(block, _DOCUMENT_KEYS, where)
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text":
        data = source.get("data")
        media = source.get("media_type", "text/plain")
        if not isinstance(data, str):
            raise InvalidRequest(f"{where}.source.data: Field required (a string)", param="messages")
        if media != "text/plain":
            raise InvalidRequest(f"{where}.source.media_type: Input should be 'text/plain'", param="messages")
        text = data
    elif kind == "content":
        content = source.get("content")
        if isinstance(content, list):
            for i, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image":
                    raise Unsupported(f"{where}.source.content.{i}: image content blocks are not supported by this "
                                      "node", param="messages")
        text = text_blocks(content, f"{where}.source.content")
    elif kind in ("base64", "url", "file"):
        what = {"base64": "PDF documents", "url": "documents by URL", "file": "documents by file id"}[kind]
        raise Unsupported(f"{where}.source: {what} are not supported by this node; send the text "
                          "(source type text or content)", param="messages")
    else:
        raise InvalidRequest(f"{where}.source: expected a text, content, base64, url or file source", param="messages")
    fields = [("title", _optional_str(block, "title", where)), ("context", _optional_str(block, "context", where))]
    return _tagged("document", fields, text)


def search_result_text(block: dict, where: str) -> str:
    """A search_result block as the model reads it."""
    _extra_keys(block, _SEARCH_RESULT_KEYS, where)
    source, title = block.get("source"), block.get("title")
    if not isinstance(source, str):
        raise InvalidRequest(f"{where}.source: Field required (a string)", param="messages")
    if not isinstance(title, str):
        raise InvalidRequest(f"{where}.title: Field required (a string)", param="messages")
    if not isinstance(block.get("content"), list):
        raise InvalidRequest(f"{where}.content: Field required (a list of text blocks)", param="messages")
    text = text_blocks(block["content"], f"{where}.content")
    return _tagged("search_result", [("source", source), ("title", title)], text)




def tool_result(block: dict, where: str) -> dict:
    """A tool_result block as a tool message: its text, documents and search results; an image in
    it becomes IMAGE_LEFT_OUT (an image a user sends is still a 400: they expect it seen)."""
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise InvalidRequest(f"{where}.tool_use_id: Field required", param=where)
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            pwhere = f"{where}.content.{i}"
            if kind == "document":
                parts.append(document_text(part, pwhere))
            elif kind == "search_result":
                parts.append(search_result_text(part, pwhere))
            elif kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind in ("text", None):
                raise InvalidRequest(f"{pwhere}: expected a text block, got {kind}", param=where)
            elif kind == "image" and isinstance(part.get("source"), dict):
                # a tool's picture (Claude Code reads a screenshot): the model is told it was left out.
                # A 400 here failed that request and every later one, the image staying in the history.
                parts.append(IMAGE_LEFT_OUT)
            else:
                raise Unsupported(f"{pwhere}: {kind} tool results are not supported by this node "
                                  "(text, documents and search results are)", param=where)
        text = "".join(parts)
    else:
        text = text_blocks(content, f"{where}.content")
    if block.get("is_error"):
        text = f"Error: {text}"  # the template has no is_error field; the model reads it in the text
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}
