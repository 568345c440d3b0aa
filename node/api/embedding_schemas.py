"""An OpenAI /v1/embeddings body parsed into an `EmbeddingRequest`; every problem is a clear 400."""

from __future__ import annotations

from typing import Any

from node.api.schemas import _check_keys
from node.errors import InvalidRequest
from node.inference.embeddings import MAX_INPUTS, EmbeddingRequest

# NVIDIA NIM's (langchain-nvidia-ai-endpoints' NVIDIAEmbeddings sends both): `truncate` NONE (a 400
# past the limit, as without it), END or START (the input's first or last tokens); `input_type`
# query | passage, a no-op here as on llama-server: a GGUF declares no per-type prefix, so the text
# is embedded as sent
_EMBEDDING_KEYS = {"model", "input", "encoding_format", "dimensions", "user", "truncate", "input_type"}
EMBED_TRUNCATE = ("NONE", "START", "END")
EMBED_INPUT_TYPES = ("query", "passage")


def _token_list(value: list, param: str) -> list[int]:
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidRequest(f"`{param}` must be a string or a list of token ids (integers); it holds a "
                                 f"{type(token).__name__}", param="input")
    return list(value)


def parse_embeddings(body: Any) -> EmbeddingRequest:
    """A /v1/embeddings body: `input` a string, a list of strings, a list of token ids, or a list of lists."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    _check_keys(body, _EMBEDDING_KEYS)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` is required and must be a string", param="model")
    if "input" not in body:
        raise InvalidRequest("`input` is required", param="input")
    raw = body["input"]
    inputs: list[str | list[int]]
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        inputs = [list(raw)]  # one input as token ids
    elif isinstance(raw, list):
        if not raw:
            raise InvalidRequest("`input` is empty: give a string or a non-empty list", param="input")
        inputs = []
        for i, item in enumerate(raw):
            if isinstance(item, str):
                inputs.append(item)
            elif isinstance(item, list):
                if not item:
                    raise InvalidRequest(f"`input[{i}]` is an empty list of token ids", param="input")
                inputs.append(_token_list(item, f"input[{i}]"))
            else:
                raise InvalidRequest(f"`input[{i}]` must be a string or a list of token ids, got "
                                     f"{type(item).__name__}", param="input")
    else:
        raise InvalidRequest(f"`input` must be a string, a list of strings, a list of token ids or a list of "
                             f"lists of token ids, got {type(raw).__name__}", param="input")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"`input` has {len(inputs)} items; at most {MAX_INPUTS} are allowed", param="input")
    for i, item in enumerate(inputs):
        if item == "":
            raise InvalidRequest(f"`{'input' if len(inputs) == 1 else f'input[{i}]'}` is an empty string",
                                 param="input")
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"`encoding_format` must be \"float\" or \"base64\", got {encoding!r}",
                             param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidRequest(f"`dimensions` must be a positive integer, got {dimensions!r}", param="dimensions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("`user` must be a string", param="user")
    truncate = body.get("truncate")
    truncate = "NONE" if truncate is None else truncate
    if not isinstance(truncate, str) or truncate.upper() not in EMBED_TRUNCATE:
        raise InvalidRequest(f"`truncate` must be one of {', '.join(EMBED_TRUNCATE)}, got {truncate!r}",
                             param="truncate")
    input_type = body.get("input_type")
    if input_type is not None and input_type not in EMBED_INPUT_TYPES:
        raise InvalidRequest(f"`input_type` must be \"query\" or \"passage\", got {input_type!r}",
                             param="input_type")
    return EmbeddingRequest(model, inputs, encoding, dimensions, truncate.upper())
