"""The incremental tool-call parser: a reply's text in, content text and OpenAI tool-call deltas out.

One parser per reply. `feed(text)` takes each new piece of the reply and returns what can be sent
now: content text, and `ToolCallDelta`s (a call's first piece carries its id and name, later ones
append to its arguments). `finish()` at the end returns the rest; then `calls` holds the complete
calls and `content` the reply's text outside them.

Formats differ only in how a call region opens and what it holds (`Syntax`): the region's text is
re-read after each piece (a region is one call or a few, so this stays cheap), and what it holds so
far is compared with what was already sent. Text that turns out not to be a valid call — a region
that does not parse, or one the reply left unfinished — is returned as content and logged: nothing
the model wrote is lost. (A call already streamed in part stays streamed: deltas cannot be taken
back; the final `calls` and `content` are exact.) A reply cut by its token budget, or by a stop
sequence the call's text holds (`finish(cut=True)`), is not a malformed one: its unfinished call is
`cut_call` (name and the arguments written so far, as OpenAI and llama-server return a budget's
cut) and the markup never becomes content.
"""

from __future__ import annotations

import json
import logging
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from node.inference.request import ToolCall, ToolCallDelta
from node.inference.tools.jsonscan import JsonError, PartialCall, scan_string, skip_ws

log = logging.getLogger(__name__)

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """`call_` and 24 random letters and digits, as OpenAI's ids look."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass
class Region:
    """What a call region holds so far."""

    calls: list[PartialCall] = field(default_factory=list)
    content: str = ""  # text the region carries as content (the generic format's "response")
    end: int | None = None  # index after the region, once it is closed
    partial_ok: bool = False  # unfinished at the end of the reply, and still fine (a cut "response")


RegionParser = Callable[[str, bool], Region]  # (region text, final) -> Region; raises JsonError


@dataclass(frozen=True)
class Syntax:
    """How one format writes calls: the texts that open a region, whether a reply beginning with
    `{` is one (Llama 3.x, generic), and the region's reader (`readers`: openers with a reader of
    their own, as Cohere's answer wrappers, whose text is content)."""

    name: str
    markers: tuple[str, ...]
    at_start: bool
    region: RegionParser
    readers: tuple[tuple[str, RegionParser], ...] = ()


@dataclass
class _Slot:
    call: PartialCall
    id: str
    header_sent: bool = False
    args_sent: str = ""
    dead: bool = False
    cut: bool = False  # the call the token budget cut short (its arguments are unfinished)


def final_arguments(call: PartialCall) -> str:
    """The arguments JSON text of a finished call (raises JsonError unless it is a JSON object)."""
    raw = "{}" if call.args is None else call.args.strip()
    try:
        value = json.loads(raw)
        if isinstance(value, str):  # some models write the arguments as a JSON string
            raw, value = value.strip(), json.loads(value)
    except ValueError as exc:
        raise JsonError(f"arguments are not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise JsonError("arguments must be a JSON object")
    return raw


class ToolCallParser:
    """Splits one reply into content and tool calls, as it streams."""

    def __init__(self, syntax: Syntax, *, request_id: str = "", known: tuple[str, ...] = (),
                 new_id: Callable[[], str] = new_call_id, answers: bool = False, opened: str = ""):
        self.syntax = syntax
        # a reply that starts with `{` may be a response_format's answer, not a call (Llama 3's bare
        # JSON calls under tool_choice "auto"): such a region is a call only when it opens as one,
        # `{"name": "<an offered tool>"`, else it is content (`_call_head`)
        self._answers = answers
        self._rid = request_id
        self._known = known
        self._new_id = new_id
        self._mode = "content"
        self._buf = ""  # content mode: text held back (a marker may be starting); region: its text
        self._opener = ""  # the marker that opened the region ("" when the reply's `{` did)
        self._started = False  # the reply has had non-whitespace content
        self._content = ""  # content so far (committed)
        self._sent = 0  # how much of the content has been returned
        self._slots: list[_Slot] = []
        self._region_base = 0  # first slot of the current region
        self._region = Region()
        self.calls: list[ToolCall] = []
        self.cut_call: ToolCall | None = None  # finish(cut=True): the call the budget cut short, if named
        self.cut_short = False  # finish(cut=True) cut a call short or dropped one (named or not)
        self.content = ""
        self.failed = False  # some call text was not valid and went back into the content
        if opened:  # the prompt opened this region (one of syntax.readers'): the reply starts inside it
            self._enter(opened, "")

    # --- input ---

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        self._advance(final=False)
        return self._emit(final=False)

    @property
    def in_call(self) -> bool:
        """The reply so far ends inside a tool call, or what may still be one: a call marker's region
        (not an answer's wrapper, Cohere's `readers`), or a reply's bare `{` unless it reads as an
        answer (Llama 3's: not `{"name": "<an offered tool>"`; the generic format's `{"response"`),
        and always once a call of it was named (the stream sent it). Review r76: any region, so a JSON
        answer a stop sequence matched inside was cut as a call and lost; r78: a call not named yet."""
        if self._mode != "region" or self._opener in dict(self.syntax.readers):
            return False
        if self._opener or any(s.call.name for s in self._slots[self._region_base:]):
            return True
        if self.syntax.name == "generic":
            return not self._buf.lstrip().lstrip("{").lstrip().startswith('"r')
        return self._call_head() is not False

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """The end of the reply; `cut`: the token budget (max_tokens, the context) ended it, so the
        text may stop anywhere, inside a call or a marker."""
        if cut:
            self._finish_cut()
        else:
            self._finish_whole()
        out = self._emit(final=True)
        live = [s for s in self._slots if not s.dead]
        self.calls = [ToolCall(s.id, s.call.name or "", final_arguments(s.call)) for s in live if not s.cut]
        self.cut_call = next((ToolCall(s.id, s.call.name or "", s.args_sent) for s in live if s.cut), None)
        self.content = self._content.strip() if self.calls or self.cut_call else self._content
        return out

    def _finish_cut(self) -> None:
        self._advance(final=False)  # the text is a prefix of what the model meant to write
        if self._mode == "region" and self._answers and self._opener == "" and not self._call_head():
            self._content += self._buf  # cut before it could tell: the answer as far as it was written
            self._mode, self._buf, self._region = "content", "", Region()
            return
        if self._mode == "content":
            if self._buf.strip():  # the first characters of a marker (held back): markup, not content
                log.debug("the reply was cut inside a tool-call marker request_id=%s format=%s text=%r", self._rid,
                          self.syntax.name, self._buf)
            else:
                self._content += self._buf
            self._buf = ""
            return
        region = self._read(final=False)
        if region is None:  # not a call however it went on: returned as content (logged)
            return
        slots, complete = self._complete_calls(region)
        for k, slot in enumerate(slots[complete:]):
            if k == 0 and slot.call.name is not None:
                slot.cut = True  # streamed as far as it was written; returned so, with finish_reason length
            else:
                slot.dead = True
        # a call left unfinished or dropped, or a marker's region opened with no call read yet (r80:
        # `<tool_call>\n` after a whole call): a stop sequence then ended the reply inside a call (r79)
        self.cut_short = bool(slots[complete:]) or (self._opener != "" and not slots)
        if slots[complete:]:  # (a plain answer in the generic format's `{"response": ...}` is no call)
            log.info("the reply was cut inside a tool call (token budget): %d complete call(s), the unfinished "
                     "one %s request_id=%s format=%s", complete,
                     "returned with its partial arguments" if any(s.cut for s in slots) else "dropped (no name yet)",
                     self._rid, self.syntax.name)
        self._content += region.content
        self._mode, self._buf, self._region = "content", "", Region()

    def _finish_whole(self) -> None:
        self._advance(final=True)
        if self._mode == "region":
            region = self._read(final=True)
            if region is not None and (region.end is not None or region.partial_ok):
                self._close_region(region)
            elif region is not None and not self._keep_complete_calls(region):
                self._fail("the reply ended inside a tool call")
        else:
            self._content += self._buf
            self._buf = ""

    # --- the state machine ---

    def _advance(self, final: bool) -> None:
        while True:
            if self._mode == "content":
                if not self._find_region(final):
                    return
            region = self._read(final)
            if region is None:  # failed: back to content
                continue
            self._region = region
            self._update_slots(region.calls)
            if region.end is None:
                return
            self._close_region(region)

    def _find_region(self, final: bool) -> bool:
        """Content mode: commit the content before the next region and enter it (True), or hold
        back what may start one and return False."""
        buf = self._buf
        if self.syntax.at_start and not self._started:
            i = skip_ws(buf, 0)
            if i == len(buf) and not final:
                return False  # only whitespace yet: a call may still start
            if i < len(buf) and buf[i] == "{":
                self._content += buf[:i]
                self._enter("", buf[i:])
                return True
        best = None
        for marker in self.syntax.markers:
            k = buf.find(marker)
            if k >= 0 and (best is None or k < best[0]):
                best = (k, marker)
        if best is not None:
            k, marker = best
            self._commit_content(buf[:k])
            self._enter(marker, buf[k + len(marker):])
            return True
        hold = 0 if final else _held_back(buf, self.syntax.markers)
        self._commit_content(buf[: len(buf) - hold])
        self._buf = buf[len(buf) - hold:]
        return False

    def _commit_content(self, text: str) -> None:
        if text:
            self._content += text
            if text.strip():
                self._started = True

    def _enter(self, opener: str, text: str) -> None:
        self._mode, self._opener, self._buf = "region", opener, text
        self._region_base, self._region = len(self._slots), Region()

    def _read(self, final: bool) -> Region | None:
        if self._answers and self._opener == "":
            head = self._call_head()
            if head is None and not final:
                return Region()  # undecided yet
            if not head:  # the answer: content, as it goes on (no call, nothing to warn about)
                log.debug("a reply object is the answer, not a call request_id=%s format=%s", self._rid,
                          self.syntax.name)
                self._content += self._buf
                self._started = True
                self._mode, self._buf, self._region = "content", "", Region()
                return None
        reader = next((r for opener, r in self.syntax.readers if opener == self._opener), self.syntax.region)
        try:
            return reader(self._buf, final)
        except JsonError as exc:
            self._fail(str(exc))
            return None

    def _call_head(self) -> bool | None:
        """Does the bare object being read open as a call of an offered tool, `{"name": "<tool>"`?
        None while the text written so far cannot tell."""
        buf, i = self._buf, 0
        for part in ("{", '"name"', ":"):
            i = skip_ws(buf, i)
            got = buf[i:i + len(part)]
            if got != part:
                return None if len(got) < len(part) and part.startswith(got) else False
            i += len(part)
        i = skip_ws(buf, i)
        if i >= len(buf):
            return None
        if buf[i] != '"':
            return False
        end = scan_string(buf, i)
        if end is None:  # the name so far: still a call only while it can become an offered tool's
            return None if any(name.startswith(buf[i + 1:]) for name in self._known) else False
        return json.loads(buf[i:end]) in self._known

    def _update_slots(self, calls: list[PartialCall]) -> None:
        for j, call in enumerate(calls):
            k = self._region_base + j
            if k < len(self._slots):
                self._slots[k].call = call
            else:
                self._slots.append(_Slot(call, self._new_id()))

    def _close_region(self, region: Region) -> None:
        self._update_slots(region.calls)
        for call in region.calls:
            try:
                if call.name is None:
                    raise JsonError("a call without a name")
                final_arguments(call)
            except JsonError as exc:
                self._fail(str(exc))
                return
            if self._known and call.name not in self._known:
                log.warning("model called a tool the request does not offer request_id=%s tool=%r", self._rid,
                            call.name)
        self._content += region.content
        if region.content.strip():
            self._started = True
        rest = self._buf[region.end:] if region.end is not None else ""
        self._mode, self._buf, self._region = "content", rest, Region()
        if region.calls:
            self._started = True  # a `{` after a call is content, not another at-start region

    def _complete_calls(self, region: Region) -> tuple[list[_Slot], int]:
        """The region's slots (updated from its calls) and how many at its start are complete calls."""
        self._update_slots(region.calls)
        slots = self._slots[self._region_base:]
        complete = 0
        for slot in slots:
            if not slot.call.done or slot.call.name is None:
                break
            try:
                final_arguments(slot.call)
            except JsonError:
                break
            complete += 1
        return slots, complete

    def _keep_complete_calls(self, region: Region) -> bool:
        """The reply ended by itself (its end token) inside a region after one or
        more complete calls: keep those — a stream has already sent them — and drop the unfinished
        one (logged). False when no call in the region is complete. (A reply the token budget or a
        stop sequence cut is `_finish_cut`'s.)"""
        slots, complete = self._complete_calls(region)
        if not complete:
            return False
        for slot in slots[complete:]:
            slot.dead = True
        log.warning("the reply ended inside a tool call: kept the %d complete call(s) before it, dropped the "
                    "unfinished one request_id=%s format=%s", complete, self._rid, self.syntax.name)
        self._content += region.content
        self._mode, self._buf, self._region = "content", "", Region()
        return True

    def _fail(self, why: str) -> None:
        """The region is not a valid call: its text (marker included) becomes content."""
        self.failed = True
        # the text is the model's reply (it can hold what the user wrote): at -v only, not in every node.log
        log.warning("tool call text was not valid; returned as content request_id=%s format=%s reason=%s chars=%d",
                    self._rid, self.syntax.name, why, len(self._opener + self._buf))
        log.debug("the tool call text that was not valid request_id=%s text=%r", self._rid,
                  (self._opener + self._buf)[:200])
        for slot in self._slots[self._region_base:]:
            slot.dead = True
        self._content += self._opener + self._buf
        self._started = True
        self._mode, self._buf, self._region = "content", "", Region()

    # --- output ---

    def _emit(self, final: bool) -> tuple[str, list[ToolCallDelta]]:
        deltas: list[ToolCallDelta] = []
        for index, slot in enumerate(self._slots):
            if slot.dead or slot.call.name is None:
                continue
            args = self._args_now(slot.call)
            if not args.startswith(slot.args_sent):
                continue  # cannot happen for well-formed text; never send a contradiction
            more = args[len(slot.args_sent):]
            if not slot.header_sent:
                deltas.append(ToolCallDelta(index, slot.id, slot.call.name, more))
                slot.header_sent = True
            elif more:
                deltas.append(ToolCallDelta(index, arguments=more))
            slot.args_sent = args
        content = self._content + (self._region.content if self._mode == "region" else "")
        pending = content[self._sent:]
        text = ""
        if pending.strip() or (final and not self._slots and pending):
            text, self._sent = pending, len(content)
        return text, deltas

    @staticmethod
    def _args_now(call: PartialCall) -> str:
        if call.done or call.args_done:
            try:
                return final_arguments(call)
            except JsonError:
                return call.args or ""
        raw = call.args or ""
        return "" if raw.startswith('"') else raw  # a string-encoded value is sent once decoded


def _held_back(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of buf that could be the start of a marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buf)), best, -1):
            if marker.startswith(buf[-n:]):
                best = n
                break
    return best
