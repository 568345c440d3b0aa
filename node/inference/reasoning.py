"""Reasoning models: their thoughts apart from their answer.

Models that think before they answer (Qwen3, QwQ, DeepSeek-R1 distills, Qwen3.5, Ministral
Reasoning, ...) write `<think> ... </think>` (Ministral: `[THINK] ... [/THINK]`, Gemma 4:
`<|channel>thought ... <channel|>`) and then the
answer. Their chat templates say so: they write the tags (to show or strip earlier thoughts, or to
open the thoughts in the generation prompt). `think_tags(template)` finds them; `ReasoningSplitter`
cuts the reply's text, in any chunking, into thoughts (`reasoning_content`) and answer (`content`),
as llama-server's `--reasoning-format deepseek` does:

- a generation prompt that ends with the opening tag (R1 distills, QwQ, Qwen3.5: `<think>\\n`)
  starts the reply inside the thoughts, with no opening tag of its own;
- otherwise an opening tag at the very start of the reply (after whitespace) opens them (Qwen3);
  a reply that starts with anything else is all answer;
- the thoughts end at the closing tag; a reply that never writes it (max_tokens cut it) is all
  thoughts, its answer empty;
- when the request offers tools, they also end where the tool format's call opener begins
  (`ToolFormat.thought_ends`: Kimi K2 Thinking, DeepSeek V3.1/V3.2, GLM, Qwen3.5 call tools at the
  end of their thoughts without closing them, as llama.cpp's parsers allow); the opener is the
  answer's first text, for the tool parser;
- whitespace around the thoughts and at the start of the answer is dropped (the templates write
  `<think>\\n` ... `\\n</think>\\n\\n`).

The tool-call parser then sees only the answer.
"""

from __future__ import annotations

import codecs
import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node.inference import grammar as g
from node.inference import think_budget

if TYPE_CHECKING:
    from node.inference.request import CompletionRequest
    from node.inference.sampling import SamplingParams


@dataclass(frozen=True)
class ThinkTags:
    """The tags a model writes around its thoughts."""

    open: str
    close: str
    # the model may open its thoughts again after its answer (Gemma 4 ends an answer with an empty
    # `<|channel>thought<channel|>`, and may write a lone `<channel|>`): such blocks are thoughts
    # and a stray closing tag is dropped, as llama.cpp's Gemma 4 parser reads them
    reopens: bool = False
    # control tokens a tag is written with besides a whole tag's own (Gemma 4 writes `<|channel>` as
    # one and `thought` as text): the reply's text must show them, and a grammar spells them as tokens
    tokens: tuple[str, ...] = ()

    def parts(self, tag: str) -> tuple[str, ...]:
        """`tag` cut into its control tokens (`tokens`) and the text between, in order."""
        if not self.tokens:
            return (tag,)
        pattern = "(" + "|".join(re.escape(t) for t in sorted(self.tokens, key=len, reverse=True)) + ")"
        return tuple(part for part in re.split(pattern, tag) if part)


THINK = ThinkTags("<think>", "</think>")
MISTRAL_THINK = ThinkTags("[THINK]", "[/THINK]")
# Gemma 4's thinking channel (its generation prompt closes an empty one unless enable_thinking; the
# template strips earlier ones): `<|channel>` is a control token, `thought` text
GEMMA4_THINK = ThinkTags("<|channel>thought", "<channel|>", reopens=True, tokens=("<|channel>",))


COHERE_THINK = ThinkTags("<|START_THINKING|>", "<|END_THINKING|>")  # Command R7B, Cohere2 MoE


def think_tags(template: str | None) -> ThinkTags | None:
    """The thought tags a chat template writes, or None: not a reasoning template."""
    if not template:
        return None
    for tags in (THINK, MISTRAL_THINK, GEMMA4_THINK, COHERE_THINK):
        if tags.open in template and tags.close in template:
            return tags
    return None


def opens_inside(prompt: str, tags: ThinkTags) -> bool:
    """Whether the rendered prompt ends inside the thoughts (its generation prompt opened them)."""
    return prompt.rstrip().endswith(tags.open)


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """Where the first of `tags` begins in `text` (-1 when none does) and which."""
    found = [(at, tag) for tag in tags if (at := text.find(tag)) >= 0]
    return min(found) if found else (-1, "")


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Feed the reply's text in pieces, get (reasoning, content) pieces; text that may be part of a
    tag, or whitespace that may end the thoughts, is held back until the next piece tells."""

    def __init__(self, tags: ThinkTags, inside: bool, ends: tuple[str, ...] = ()):
        self.tags = tags
        self.ends = tuple(ends)  # tool-call openers that also end the thoughts (kept as the answer's start)
        self.by_call = False  # the thoughts ended at one of `ends`, not at the closing tag
        self._state = "thinking" if inside else "start"
        self._began = False  # thoughts have had their first non-space character
        self._held = ""
        self._echo = 0  # characters at the front of `_held` that the client wrote itself (its prefill)

    @property
    def held(self) -> str:
        """The text held back: whitespace, or a tag's possible start."""
        return self._held

    @property
    def markers(self) -> tuple[str, ...]:
        """Tags that may be control tokens, and the control tokens a tag is written with (Gemma 4's
        `<|channel>`: until 2026-12-06 it rendered "" without tools, and its thoughts were content),
        which the reply's text must show."""
        return (self.tags.open, self.tags.close, *self.tags.tokens, *self.ends)

    def feed(self, text: str) -> tuple[str, str]:
        """One piece of the reply: its (reasoning, content) parts ready to send."""
        return self._run(self._held + text, final=False)

    def finish(self) -> tuple[str, str]:
        """The end of the reply: whatever was held back."""
        return self._run(self._held, final=True)

    def feed_raw(self, text: str, final: bool = False) -> tuple[str, str]:
        """As feed (finish with `final`), but the first part is the thoughts' text as written, tags
        and whitespace included (reasoning_format "none": it stays content, and only the rest goes to
        the tool parser). Content is always the tail of what came in, held text the tail otherwise."""
        came, echo = self._held + text, self._echo
        _, content = self._run(came, final=final, raw=True)
        first = came[:len(came) - len(self._held) - len(content)]
        return first[min(echo, len(first)):], content

    def _run(self, text: str, final: bool, raw: bool = False) -> tuple[str, str]:
        self._held = ""
        echo, self._echo = self._echo, 0  # the client's own text at the front of `text`: not sent back
        reasoning = content = ""
        while text:
            if self._state == "start":
                body = text.lstrip()
                if body.startswith(self.tags.open):
                    self._state, text, echo = "thinking", body[len(self.tags.open):], 0
                    continue
                if not final and self.tags.open.startswith(body):  # "" or a tag's beginning
                    self._held, self._echo = text, echo
                    return reasoning, content
                self._state = "content"
                continue
            if self._state == "thinking":
                if not self._began:
                    text = text.lstrip()
                    if not text:
                        break
                    self._began = True
                at, tag = _first(text, (self.tags.close, *self.ends))
                if at >= 0:
                    reasoning += text[:at].rstrip()[echo:]
                    if tag == self.tags.close:
                        self._state, text, echo = "answer", text[at + len(tag):], 0
                    else:  # a tool call's opener: the tool parser reads it, as answer text
                        self._state, text, echo, self.by_call = "content", text[at:], 0, True
                    continue
                if final:
                    reasoning += text.rstrip()[echo:]
                    break
                keep = max(_partial_suffix(text, t) for t in (self.tags.close, *self.ends))
                body = text[:len(text) - keep]
                ready = body.rstrip()
                reasoning += ready[echo:]
                self._held = text[len(ready):]  # trailing whitespace and a possible closing tag's start
                self._echo = max(0, echo - len(ready))
                break
            if self._state == "answer":  # the answer's leading whitespace is dropped
                text = text.lstrip()
                if text:
                    self._state = "content"
                continue
            if self.tags.reopens and not raw:
                text, more = self._reopen(text, final)
                content += text[echo:]
                if more is None:
                    self._echo = max(0, echo - len(text)) if self._held else 0
                    break
                text, echo = more, 0
                continue
            content += text[echo:]
            break
        return reasoning, content

    def _reopen(self, text: str, final: bool) -> tuple[str, str | None]:
        """The answer's text up to thoughts opened again (what follows their opening tag, None when
        none opens); a stray closing tag is dropped, a possible tag's start held back."""
        tags = self.tags
        while True:
            at, tag = _first(text, (tags.open, tags.close))
            if at < 0:
                break
            if tag == tags.close:
                text = text[:at] + text[at + len(tag):]
                continue
            self._state, self._began = "thinking", False
            return text[:at].rstrip(), text[at + len(tag):]
        keep = 0 if final else max(_partial_suffix(text, t) for t in (tags.open, tags.close))
        if keep:
            self._held = text[len(text) - keep:]
        return text[:len(text) - keep], None

    @property
    def phase(self) -> str:
        """start (the reply may open thoughts), thinking, or answer."""
        return "answer" if self._state in ("answer", "content") else self._state

    def grammar(self, spec: g.Spec, close_is_token: bool = False, token_ends: tuple[str, ...] = (),
                open_parts: tuple[str, ...] | None = None) -> g.Spec:
        """A grammar the reply must follow, with room to think first (as llama-server's grammars
        for reasoning models): thoughts are free text up to the closing tag, then the answer keeps
        to `spec`. Without it a JSON or tool-call grammar forced its text from the first token.
        `close_is_token`: the closing tag is one special token of the vocabulary; it is then written
        as free text and a literal, which every peer's grammar compiler resolves to that token (a
        text node's `stop` as a token is new: an older sampling peer would wait for it spelt as
        text, which a model never writes, and think until max_tokens; found in review).
        Where a call's opener also ends the thoughts (`ends`) and `spec` may begin with it (a forced
        call), the thoughts may also end directly at the opener, the call's grammar going on from
        there, as llama.cpp's grammars for these models allow (until 2026-12-06 the model was made
        to write the closing tag first); `token_ends`: the openers that are one special token.
        `open_parts`: the opening tag cut into its control tokens and text (`ThinkTags.parts`), one
        literal each: Gemma 4's `<|channel>thought` as one literal was plain text, which cannot spell
        the token `<|channel>`, so no grammar let it think (until 2026-12-06)."""
        gap = g.repeat(g.literal("\n"), 0, 2)
        ends = [g.seq(_upto(self.tags.close, close_is_token), gap, spec)]
        for opener in self.ends:
            rest = g.after(spec, opener)
            if rest is not None:
                ends.append(g.seq(_upto(opener, opener in token_ends), *rest))
        opening = [g.literal(part) for part in (open_parts or self.tags.parts(self.tags.open))]
        whole = self._with_room(spec, ends, opening)
        if len(ends) > 1 and not _fits(whole):  # each opener branch copies the call grammar: with many
            whole = self._with_room(spec, ends[:1], opening)  # tools that passed g.MAX_NODES (a 500 for
        return whole  # 40 tools, found in review): the closing tag alone then, as before

    def _with_room(self, spec: g.Spec, ends: list[g.Spec], opening: list[g.Spec]) -> g.Spec:
        thoughts = ends[0] if len(ends) == 1 else g.alt(*ends)
        if self.phase == "thinking":
            return thoughts
        if self.phase == "start":
            return g.alt(g.seq(*opening, thoughts), spec)
        return spec


def _fits(spec: g.Spec) -> bool:
    """Whether a spec keeps within the grammar's node bound (g.MAX_NODES)."""
    try:
        g.validate(spec)
    except ValueError:
        return False
    return True


def _upto(tag: str, is_token: bool) -> g.Spec:
    """Free text up to and with `tag` (a special token: free text, then the token's literal)."""
    return g.seq(g.free_text(), g.literal(tag)) if is_token else g.free_text(tag)


def splitter_for(request: CompletionRequest, template: str | None, rendered: str,
                 prefill: str | None, ends: tuple[str, ...] = ()) -> Any:
    """Where a chat's reply stands with its thoughts, or None (not a reasoning template). With
    reasoning_format "none" the thoughts stay content (`feed_raw`). `rendered`: the
    prompt as the template wrote it; `prefill`: the start of the reply the request wrote itself (it
    may open or close the thoughts); `ends`: tool-call openers that also end the thoughts (the
    format's `thought_ends` when the request offers tools)."""
    from node.inference.tools.harmony import HarmonySplitter, is_harmony

    if request.kind == "chat" and is_harmony(template):  # gpt-oss: channels, not tags
        harmony = HarmonySplitter(bool(request.tools) and request.tool_choice != "none")
        if prefill:
            harmony.feed(prefill)  # the client's own text is not sent back
            harmony._held = ""
        return harmony
    tags = think_tags(template)
    if tags is None or request.kind != "chat":
        return None
    splitter = ReasoningSplitter(tags, opens_inside(rendered, tags), ends)
    if prefill:  # the client's own text is not sent back; what the splitter holds of it (a tag's
        splitter.feed(prefill)  # start: "<thi") is read with the reply's first text, not dropped
        splitter._echo = len(splitter.held)
    return splitter


class ThoughtCounter:
    """Counts the reply's tokens written in the thoughts, tags included (usage's reasoning_tokens),
    from each token's own text: a splitter of its own, fed as the tokens come, not the text a stop
    sequence's possible start holds back (found 2026-12-06: the token after the closing tag was
    counted as a thought when the stop sequence began there). Tokens that may begin the opening
    tag ("<", "thi") count once it is complete. The token that completes a tool call's opener ending
    the thoughts (`ReasoningSplitter.ends`) is the call's, not a thought."""

    def __init__(self, splitter: ReasoningSplitter):
        self._splitter = splitter
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = 0  # tokens read at the reply's start that may be the opening tag's

    def add(self, piece: bytes) -> int:
        """One token's text; how many tokens it adds to the thoughts' count."""
        before = self._splitter.phase
        self._splitter.feed(self._decoder.decode(piece))
        after = self._splitter.phase
        if before == "thinking" and after == "answer" and getattr(self._splitter, "by_call", False):
            return 0
        if "thinking" in (before, after):
            counted, self._pending = 1 + self._pending, 0
            return counted
        self._pending = self._pending + 1 if after == "start" else 0
        return 0


def with_history(original: tuple[dict, ...], rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier assistant turns' `reasoning_content` handed to the template, as Hugging Face's
    templates read it (Qwen3's, Qwen3.5's: they show the thoughts of the turns after the last user
    message and drop the others); `rendered`: the messages as node.inference.tools.prompt_inputs
    maps them, one for each of `original`, before a format's history merges or splits turns
    (prompt_inputs applies it there)."""
    thoughts = [m.get("reasoning_content") for m in original if m.get("role") == "assistant"]
    if not any(thoughts):
        return rendered
    out, turn = [], 0
    for msg in rendered:
        if msg.get("role") == "assistant":
            if turn < len(thoughts) and thoughts[turn]:
                msg = {**msg, "reasoning_content": thoughts[turn]}
            turn += 1
        out.append(msg)
    return out


def grammar_with_room(splitter: ReasoningSplitter, spec: g.Spec, tok: Any) -> g.Spec:
    """`splitter.grammar(spec)`, knowing whether the closing tag is one special token of `tok`'s
    vocabulary (blocking: the grammar vocabulary may be built here)."""
    from node.inference import constrain

    vocab = constrain.vocabulary(tok)
    close_is_token = vocab.special_token(splitter.tags.close) is not None
    ends = getattr(splitter, "ends", ())
    if not ends:
        return splitter.grammar(spec, close_is_token)
    return splitter.grammar(spec, close_is_token, tuple(e for e in ends if vocab.special_token(e) is not None))


def with_budget(params: SamplingParams, thoughts: ReasoningSplitter | None, tokens: int | None) -> SamplingParams:
    """`params` with the request's thinking budget of `tokens` (node.inference.think_budget), where the
    reply (split by `thoughts`) may still think."""
    if thoughts is None or tokens is None or thoughts.phase == "answer":
        return params
    budget = think_budget.spec(tokens, thoughts.tags.open, thoughts.tags.close, thoughts.phase == "thinking",
                               thoughts.held, rearm=getattr(thoughts, "rearms", False),
                               ends=getattr(thoughts, "ends", ()))
    return dataclasses.replace(params, reasoning_budget=budget)
