"""gpt-oss's "harmony" format: a reply is a run of messages in channels, not text with tags.

After the generation prompt `<|start|>assistant` the model writes messages such as

  <|channel|>analysis<|message|>THOUGHTS<|end|>
  <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
  <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>

(the recipient ` to=functions.NAME` may also stand before `<|channel|>`, the constraint may be
` json` or absent; `<|return|>` and `<|call|>` end the generation). As llama-server with
`--reasoning-format auto` reads them: the analysis channel is the thoughts (`reasoning_content`),
the final channel and a commentary message without a recipient (a preamble) are the answer, a
message to `functions.NAME` is a tool call, and one to any other recipient (the built-in browser
or python tools, which the node does not offer) is dropped and logged.

`HarmonySplitter` does this in any chunking, with ReasoningSplitter's interface: its answer holds
the content, and each call written as `<|start|>functions.NAME<|message|>ARGS<|call|>`, which the
tool-call parser reads with `HARMONY` (a body never holds `<|start|>`: it ends a message). A reply
that does not open with a harmony header is all content, as written.

History goes back through the template as it expects (`harmony_history`): an assistant turn's
`reasoning_content` as `thinking`, one call an assistant message (the template renders only a
message's first), each result right after its call (it names a result after the call before it).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from node.inference import grammar as g
from node.inference.tools.jsonscan import JsonError, PartialCall, scan_value, skip_ws
from node.inference.tools.parser import Region, Syntax

log = logging.getLogger(__name__)

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
CALL, RETURN, CONSTRAIN = "<|call|>", "<|return|>", "<|constrain|>"
TOKENS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)
_ENDS = (END, CALL, RETURN, START)  # what ends a message's body (`<|start|>` when `<|end|>` was not shown)
CALL_OPEN = START + "functions."  # how the answer carries a call to the tool parser
_HEADER_MAX = 256  # a header longer than any real one: not harmony
_RECIPIENT = re.compile(r"to=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"(\w+)")


@dataclass(frozen=True)
class _Tags:
    open: str
    close: str


TAGS = _Tags(CHANNEL + "analysis" + MESSAGE, END)  # llama.cpp's thinking start and end tags


def is_harmony(template: str | None) -> bool:
    """Whether a chat template speaks harmony (llama.cpp's test: it writes `<|channel|>`)."""
    return bool(template) and CHANNEL in template and START in template


def continued(template: str | None, prefill: str) -> str:
    """A prefill (a final assistant message to continue) as the reply's text: in the final channel
    for harmony (llama.cpp's continuation), where plain text after `<|start|>assistant` is no message."""
    if not prefill or not is_harmony(template) or prefill.lstrip().startswith((CHANNEL, " to=", "to=")):
        return prefill
    return CHANNEL + "final" + MESSAGE + prefill


def _held(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that may begin one of `tags`."""
    for n in range(min(len(text), max(len(t) for t in tags) - 1), 0, -1):
        if any(t.startswith(text[-n:]) for t in tags):
            return n
    return 0


class HarmonySplitter:
    """A harmony reply in pieces in, (reasoning, answer) pieces out (see the module's text)."""

    tags = TAGS
    rearms = True  # every analysis message is thoughts: a thinking budget starts again on each
    markers = TOKENS  # control tokens the text must show (`<|end|>` renders as nothing otherwise)

    def __init__(self, tools: bool, request_id: str = ""):
        self._tools = tools  # calls go to the tool parser; without tools they are dropped
        self._rid = request_id
        self._state = "start"  # start | header | body | raw
        self._kind = ""  # the body's: reasoning | content | call | drop
        self._buf = ""
        self._thought = False  # some thoughts were sent (a later analysis message starts a new line)
        self._raw = False  # feed_raw: the analysis messages as written go to `inline`

    @property
    def _held(self) -> str:  # (reasoning.splitter_for forgets what a prefill left held)
        return self._buf

    @property
    def held(self) -> str:
        """The text held back (a header or a tag's possible start); a thinking budget reads it."""
        return self._buf

    @_held.setter
    def _held(self, value: str) -> None:
        self._buf = value

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content, _ = self._run(text, final=False)
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        reasoning, content, _ = self._run("", final=True)
        return reasoning, content

    def feed_raw(self, text: str, final: bool = False) -> tuple[str, str]:
        """reasoning_format "none": the analysis messages as written (they stay content), and the answer."""
        self._raw = True
        _, content, inline = self._run(text, final)
        return inline, content

    @property
    def phase(self) -> str:
        if self._state in ("start", "raw"):
            return "start" if self._state == "start" else "answer"
        return "thinking" if self._state == "body" and self._kind == "reasoning" else "answer"

    def _run(self, text: str, final: bool) -> tuple[str, str, str]:
        out = {"reasoning": "", "content": "", "inline": ""}
        buf = self._buf + text
        self._buf = ""
        while buf or final:
            if self._state == "raw":
                out["content"] += buf
                break
            if self._state in ("start", "header"):
                buf = self._header(buf, final, out)
                if buf is None:
                    break
                continue
            buf = self._body(buf, final, out)
            if buf is None:
                break
        return out["reasoning"], out["content"], out["inline"]

    def _header(self, buf: str, final: bool, out: dict[str, str]) -> str | None:
        at = buf.find(MESSAGE)
        head = buf if at < 0 else buf[:at]
        body = head.lstrip()
        plausible = any(body.startswith(t) or t.startswith(body) for t in (START, CHANNEL, " to=", "to="))
        if not plausible or len(head) > _HEADER_MAX:
            if self._state == "start":
                log.debug("a reply without a harmony header: all content request_id=%s", self._rid)
                self._state = "raw"
                return buf
            log.warning("harmony text that is no message header was dropped request_id=%s chars=%d", self._rid,
                        len(head))  # (the text itself, the model's reply, at -v only)
            log.debug("the harmony text dropped request_id=%s text=%r", self._rid, head[:200])
            self._state, self._kind = "body", "drop"
            return buf[len(head):] if at < 0 else buf[at + len(MESSAGE):]
        if at < 0:
            if final:
                if head.strip():
                    log.debug("the reply ended inside a harmony header request_id=%s text=%r", self._rid, head)
                return None
            self._buf = buf
            return None
        recipient = _RECIPIENT.search(head)
        channels = _CHANNEL.findall(head)  # the last: a stray `<|channel|>commentary to=assistant` may come first
        to = recipient.group(1) if recipient else ""
        if to.startswith("functions."):
            self._kind = "call" if self._tools else "drop"
            if self._tools:
                out["content"] += CALL_OPEN + to[len("functions."):] + MESSAGE
            else:
                log.warning("the model called %s with no tools offered: dropped request_id=%s", to, self._rid)
        elif to and to != "assistant":
            self._kind = "drop"  # a built-in tool (browser, python) the node does not run
            log.warning("the model called the built-in tool %s: dropped request_id=%s", to, self._rid)
        elif channels and channels[-1] == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"  # final, or a commentary preamble
        if self._kind == "reasoning" and self._raw:
            out["inline"] += buf[:at + len(MESSAGE)]
        elif self._kind == "reasoning" and self._thought:
            out["reasoning"] += "\n"
        self._state = "body"
        return buf[at + len(MESSAGE):]

    def _body(self, buf: str, final: bool, out: dict[str, str]) -> str | None:
        hits = [(k, t) for t in _ENDS if (k := buf.find(t)) >= 0]
        if hits:
            k, tag = min(hits)
            self._emit(buf[:k], out)
            rest = buf[k:] if tag == START else buf[k + len(tag):]
            if self._kind == "reasoning" and self._raw and tag != START:
                out["inline"] += tag
            if self._kind == "call":
                out["content"] += CALL
            self._state, self._kind = "header", ""
            return rest
        keep = 0 if final else _held(buf, _ENDS)
        self._emit(buf[:len(buf) - keep], out)
        self._buf = buf[len(buf) - keep:]
        return None

    def _emit(self, text: str, out: dict[str, str]) -> None:
        if not text or self._kind == "drop":
            return
        if self._kind == "reasoning":
            if self._raw:
                out["inline"] += text
            else:
                out["reasoning"] += text
                self._thought = True
        else:
            out["content"] += text

    def grammar(self, spec: g.Spec, close_is_token: bool = False) -> g.Spec:
        """The reply's grammar: room for one analysis message, then `spec` — a tool call's own
        messages (`call_grammar`), or an answer (response_format) in the final channel."""
        end = g.seq(g.free_text(), g.literal(END)) if close_is_token else g.free_text(END)
        analysis = g.seq(g.literal(CHANNEL), g.literal("analysis"), g.literal(MESSAGE), end,
                         g.literal(START), g.literal("assistant"))
        body = spec if _headed(spec) else g.seq(g.literal(CHANNEL), g.literal("final"), g.literal(MESSAGE), spec)
        if self.phase != "start":
            return body
        return g.seq(g.repeat(analysis, 0, 1), body)


def _headed(spec: g.Spec) -> bool:
    """Whether a spec writes its own harmony headers (call_grammar's do)."""
    if spec.get("type") == "alt":
        return all(_headed(item) for item in spec["items"])
    return spec.get("type") == "seq" and spec["items"][0] == g.literal(CHANNEL)


def call_grammar(names_and_args: list[tuple[str, dict[str, Any]]], answer: dict[str, Any] | None) -> g.Spec:
    """One call of any of the tools (`(name, its arguments' schema)`), as gpt-oss writes it
    (`<|call|>` ends the generation: one call a reply); with `answer`, or that JSON in the final channel."""
    options = [g.seq(g.literal(CHANNEL), g.literal(f"commentary to=functions.{name} "), g.literal(CONSTRAIN),
                     g.literal("json"), g.literal(MESSAGE), g.json_value(args)) for name, args in names_and_args]
    if answer is not None:
        options.append(g.seq(g.literal(CHANNEL), g.literal("final"), g.literal(MESSAGE), g.json_value(answer)))
    return options[0] if len(options) == 1 else g.alt(*options)


def harmony_region(text: str, final: bool) -> Region:
    """One call as the splitter writes it: `NAME<|message|>ARGS` then `<|call|>` (or the reply's end)."""
    region = Region()
    k = text.find(MESSAGE)
    if k < 0:
        if len(text) > _HEADER_MAX:
            raise JsonError("not a function name")
        return region
    call = PartialCall(name=text[:k])
    region.calls.append(call)
    i = skip_ws(text, k + len(MESSAGE))
    if i >= len(text):
        return region
    end = scan_value(text, i, final=final)
    call.args = text[i: len(text) if end is None else end]
    if end is None:
        return region
    call.done = call.args_done = True
    call.end = end
    j = skip_ws(text, end)
    rest = text[j:]
    if rest.startswith(CALL):
        region.end = j + len(CALL)
    elif CALL.startswith(rest):
        if final:
            region.end = len(text)
    else:
        region.end = end
    return region


HARMONY = Syntax("harmony", (CALL_OPEN,), False, harmony_region)


def harmony_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools with a description each: the template writes `"// " + description`, and a tool
    without one (optional at OpenAI; most MCP tools' parameters have none) failed to render."""
    if tools is None:
        return None
    return [{**t, "function": {"description": "", **t["function"]}} for t in tools]


def harmony_history(original: list[dict[str, Any]], rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template's messages (`rendered`: the native ones, one for each of `original`)."""
    out: list[dict[str, Any]] = []
    results: dict[str, dict[str, Any]] = {}  # a call's result, by the call's id
    for src, msg in zip(original, rendered, strict=True):
        if msg["role"] == "tool" and msg.get("tool_call_id") in results:
            results[msg["tool_call_id"]].update(msg)  # its place was kept after its call
            continue
        if msg["role"] != "assistant":
            out.append(msg)
            continue
        thinking = src.get("reasoning_content")
        calls = msg.get("tool_calls") or []
        if thinking:
            msg = {**msg, "thinking": thinking}
            if calls:  # the template refuses both (llama.cpp keeps the thoughts)
                msg = {k: v for k, v in msg.items() if k != "content"}
        if len(calls) <= 1:
            out.append(msg)
            continue
        for n, call in enumerate(calls):
            part = {**msg, "tool_calls": [call]} if n == 0 else {"role": "assistant", "content": "",
                                                                   "tool_calls": [call]}
            out.append(part)
            if n < len(calls) - 1 and call.get("id"):
                slot: dict[str, Any] = {}
                results[call["id"]] = slot
                out.append(slot)
    return [m for m in out if m]  # (a result that never came leaves no empty message)
