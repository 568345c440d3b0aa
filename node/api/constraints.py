"""Output constraints and end-of-generation options other servers take beyond OpenAI's fields.

- llama-server's `grammar` (a GBNF grammar: SillyTavern, llama.cpp's web UI, Home Assistant's
  llama.cpp integrations send it) is converted to llguidance's Lark dialect by llguidance's own
  converter (`llguidance.gbnf_to_lark`, in node.inference.constrain where it is compiled; a grammar
  already in Lark passes as it is); one it cannot read is a 400 naming `grammar` with its reason.
- vLLM's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (removed in vLLM 0.12) and
  their successor `structured_outputs` {json, regex, choice, grammar, json_object} are the same
  engine: a JSON schema, a regex, one of a list of strings, a grammar.
  Each becomes the request's `ResponseFormat`; two at once (or one beside `response_format`) is a
  400 naming both.
- `ignore_eos` (llama-server, vLLM: benchmark tools send it for fixed-length replies) and vLLM's
  `min_tokens` ban the end-of-generation tokens (for the first min_tokens tokens), as llama-server's
  logit_bias_eog does; SamplingParams carries them to wherever sampling happens.
"""

from __future__ import annotations

from typing import Any

from node.api.errors import parse_json_text
from node.errors import InvalidRequest, Unsupported
from node.inference.grammar import MAX_GRAMMAR_CHARS
from node.inference.request import ResponseFormat

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
STRUCTURED = ("json", "regex", "choice", "grammar", "json_object")
# vLLM's knobs for its own backends: our JSON is already compact and its objects closed
_STRUCTURED_HINTS = {"disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                     "whitespace_pattern"}
_GUIDED_HINTS = ("guided_decoding_backend", "guided_whitespace_pattern")
MAX_CHOICES = 1024
# the fields that ask for a JSON reply the usual way (api/extras.py maps the last two onto the first)
RESPONSE_FIELDS = ("response_format", "json_schema", "format")  # the fields a client names a schema in


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"`{param}` must be a non-empty string", param=param)
    if len(value) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"`{param}` is longer than {MAX_GRAMMAR_CHARS} characters", param=param)
    return value


def _grammar(value: Any, param: str) -> ResponseFormat:
    """A GBNF (or llguidance Lark) grammar: converted where it is compiled (constrain, in an
    executor: the converter can take seconds), its 400 naming `param` before any reply byte."""
    return ResponseFormat("grammar", text=_text(value, param), param=param)


def _choice(value: Any, param: str) -> ResponseFormat:
    if not isinstance(value, list) or not value or len(value) > MAX_CHOICES \
            or not all(isinstance(c, str) and c for c in value):
        raise InvalidRequest(f"`{param}` must be a list of 1 to {MAX_CHOICES} non-empty strings", param=param)
    if sum(map(len, value)) > MAX_GRAMMAR_CHARS:  # (1,000 choices of 2 KB compiled, then failed mid-reply
        # with the grammar's lexer out of room: a 400 naming no field, after the stream's 200: review r53)
        raise InvalidRequest(f"`{param}` holds more than {MAX_GRAMMAR_CHARS} characters in all", param=param)
    return ResponseFormat("choice", choices=tuple(value), param=param)


def _json(value: Any, param: str) -> ResponseFormat:
    schema, why = value, ""
    if isinstance(value, str):  # vLLM takes the schema's text too
        try:
            schema = parse_json_text(value, "its text")
        except InvalidRequest as exc:
            schema, why = None, f" ({exc.message})"
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"`{param}` must be a JSON Schema object{why}", param=param)
    return ResponseFormat("json_schema", schema=schema, name=param.replace(".", "_"), param=param)


def _one(kind: str, value: Any, param: str) -> ResponseFormat:
    if kind == "grammar":
        return _grammar(value, param)
    if kind == "regex":
        return ResponseFormat("regex", text=_text(value, param), param=param)
    if kind == "choice":
        return _choice(value, param)
    if kind == "json_object":
        if value is not True:
            raise InvalidRequest(f"`{param}` must be true", param=param)
        return ResponseFormat("json_object", param=param)
    return _json(value, param)


def _structured(value: Any) -> list[ResponseFormat]:
    if not isinstance(value, dict):
        raise InvalidRequest("`structured_outputs` must be an object of one of " + ", ".join(STRUCTURED),
                             param="structured_outputs")
    if value.get("structural_tag") is not None:
        raise Unsupported("`structured_outputs.structural_tag` is not supported: use json, regex, choice or grammar",
                          param="structured_outputs.structural_tag")
    unknown = value.keys() - set(STRUCTURED) - _STRUCTURED_HINTS - {"structural_tag"}
    if unknown:
        key = sorted(unknown)[0]
        raise InvalidRequest(f"unrecognized `structured_outputs` field: {key}", param=f"structured_outputs.{key}")
    return [_one(k, value[k], f"structured_outputs.{k}") for k in STRUCTURED
            if value.get(k) is not None and not (k == "json_object" and value[k] is False)]


def pop_output_constraint(out: dict, sent: dict) -> ResponseFormat | None:
    """The constraint llama-server's `grammar` or vLLM's fields ask for, taken out of `out` (the
    normalized body); `sent`: the client's body, to name the field of a conflicting response_format."""
    found: list[ResponseFormat] = []
    if "grammar" in out:
        value = out.pop("grammar")
        if value not in (None, ""):  # "" is SillyTavern's "no grammar"
            found.append(_grammar(value, "grammar"))
    for key in GUIDED:
        if key in out:
            value = out.pop(key)
            if value is not None:
                found.append(_one(key.removeprefix("guided_"), value, key))
    for key in _GUIDED_HINTS:
        out.pop(key, None)
    if "structured_outputs" in out:
        value = out.pop("structured_outputs")
        if value is not None:
            found.extend(_structured(value))
    if len(found) > 1:
        raise InvalidRequest(f"give one output constraint: `{found[0].param}` and `{found[1].param}` both ask "
                             "for one", param=found[1].param)
    if not found:
        return None
    fmt = out.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        other = next((k for k in RESPONSE_FIELDS if sent.get(k) not in (None, "")), "response_format")
        raise InvalidRequest(f"give either `{other}` or `{found[0].param}`, not both: each constrains the output",
                             param=found[0].param)
    return found[0]


def pop_eos_options(out: dict) -> tuple[bool, int]:
    """(ignore_eos, min_tokens), taken out of `out`."""
    ignore = out.pop("ignore_eos", None)
    if ignore is None:
        ignore = False
    if not isinstance(ignore, bool):
        raise InvalidRequest("`ignore_eos` must be a boolean", param="ignore_eos")
    least = out.pop("min_tokens", None)
    if least is None:
        least = 0
    if type(least) is not int or not 0 <= least <= 1 << 24:
        raise InvalidRequest(f"`min_tokens` must be an integer between 0 and {1 << 24}", param="min_tokens")
    return ignore, least
