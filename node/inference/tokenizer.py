"""Tokenizer and chat template of a GGUF model, from a llama.cpp vocab-only load.

Every node tokenizes a model identically because llama.cpp itself does it, whether or not the
model's weights are loaded here (a coordinator that holds only a slice still tokenizes). Reading
the vocabulary is safe from any thread once loaded; loading is blocking (run in an executor).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from pathlib import Path
from typing import Any

from node.errors import ModelLoadError, ProtocolError, Unsupported
from node.inference.chat import model_turn, render_chat

log = logging.getLogger(__name__)

_NAMED = "tokenizer.chat_template."  # a named template's key: tool_use, rag, rerank, ...
_SNIPPET = "\n\n--- snippet ---\n\n"  # before each extra chunk when the model has no FIM_SEP (as llama-server)


class ModelTokenizer:
    """llama.cpp's tokenizer for one GGUF file."""

    def __init__(self, path: Path | str):
        path = Path(path)
        from node.inference.llamacpp import capture_errors, load, with_cause

        llama_cpp = load()
        self._llama_cpp = llama_cpp
        started = time.monotonic()
        try:
            with capture_errors() as said:
                self._llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        except Exception as exc:  # llama.cpp gives ValueError with little detail: its log says why
            raise ModelLoadError(with_cause(f"llama.cpp could not read the vocabulary of {path.name}: {exc}",
                                            said)) from exc
        model = self._llm._model
        self._vocab = model.vocab
        self.n_vocab = self._llm.n_vocab()
        self.n_ctx_train = model.n_ctx_train()
        meta = self._llm.metadata
        # the default template and the named ones (`tokenizer.chat_template.<name>`: Command R7B, R+ and
        # Hermes 2 Pro ship a `tool_use` one, which alone renders the tools); a GGUF with only a
        # tool_use template uses it for every chat, as llama.cpp does (common_chat_templates_init)
        self.named_templates: dict[str, str] = {
            k.removeprefix(_NAMED): v for k, v in meta.items() if k.startswith(_NAMED) and isinstance(v, str)}
        self.chat_template: str | None = meta.get("tokenizer.chat_template") or self.named_templates.get("tool_use")
        self.add_bos = bool(model.add_bos_token())
        self.bos_id = self._llm.token_bos()
        self.eos_id = self._llm.token_eos()
        self.bos_text = model.token_get_text(self.bos_id) if self.bos_id >= 0 else ""
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        self.unk_id = int(unk) if unk is not None and str(unk).isdigit() else -1  # <unk>: no text of its own
        self.eos_text = model.token_get_text(self.eos_id) if self.eos_id >= 0 else ""
        # a reranker (rank pooling) and how llama-server builds its query/document pair
        # (node.inference.rerank): the GGUF's rerank template, else the specials the vocabulary adds
        low = llama_cpp.llama_cpp
        self.reranker = meta.get(f"{meta.get('general.architecture', '')}.pooling_type") == str(
            llama_cpp.LLAMA_POOLING_TYPE_RANK)
        self.rerank_template: str | None = meta.get("tokenizer.chat_template.rerank")
        self.add_eos = bool(low.llama_vocab_get_add_eos(self._vocab))
        self.add_sep = bool(low.llama_vocab_get_add_sep(self._vocab))
        self.sep_id = int(low.llama_vocab_sep(self._vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}
        self._eog_ids: tuple[int, ...] | None = None
        self._lock = threading.Lock()
        self.constraint_vocab = None  # node.inference.constrain's grammar vocabulary, built on first use
        log.debug("DIAG: tokenizer loaded file=%s n_vocab=%d add_bos=%s elapsed_ms=%d", path.name,
                  self.n_vocab, self.add_bos, (time.monotonic() - started) * 1000)

    def tokenize(self, text: str, *, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of text; special tokens written in the text (e.g. `<|im_start|>`) are parsed
        (`special=False`: taken as text)."""
        bos = self.add_bos if add_bos is None else add_bos
        return self._llm.tokenize(text.encode("utf-8"), add_bos=bos, special=special)

    def _fim_ids(self) -> list[int]:
        return [f(self._vocab) for f in (self._llama_cpp.llama_vocab_fim_pre, self._llama_cpp.llama_vocab_fim_suf,
                                         self._llama_cpp.llama_vocab_fim_mid)]

    @property
    def can_infill(self) -> bool:
        """The model has the three fill-in-the-middle tokens (a code model trained for infilling)."""
        return min(self._fim_ids()) >= 0

    def infill_tokens(self, prefix: str, suffix: str, extra: tuple[tuple[str, str], ...] = (), middle: str = "",
                      max_prompt_tokens: int | None = None) -> list[int]:
        """A fill-in-the-middle prompt, as llama-server's /infill writes it (prefix-suffix-middle):
        [extra] [BOS] FIM_PRE prefix middle FIM_SUF suffix FIM_MID (llama-server puts the other files
        before BOS, format_prompt_infill); the reply is the middle. The code
        is taken as text (special-token names in it are not parsed). `extra`: (filename, text) chunks
        of other files (llama-server's `input_extra`), in the repo-level pattern when the model has
        FIM_REP / FIM_SEP (FIM_REP "myproject\\n", FIM_SEP filename "\\n" text ..., FIM_SEP
        "filename\\n"), else each text after a "--- snippet ---" line; only its end is kept where the
        whole would pass `max_prompt_tokens` (the code around the cursor is never cut). `middle`:
        the start of the middle, already written (its `prompt`). Unsupported (400) for a model without
        the three FIM tokens: only code models trained for infilling have them."""
        ids = self._fim_ids()
        if min(ids) < 0:
            raise Unsupported("`suffix` (fill-in-the-middle) needs a model trained for infilling; this model has no "
                              "FIM tokens (code models such as Qwen2.5-Coder, CodeLlama or StarCoder have them)",
                              param="suffix")
        pre, suf, mid = ids

        def text(t: str) -> list[int]:
            return self._llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) if t else []

        context: list[int] = []
        rep, sep = self._llama_cpp.llama_vocab_fim_rep(self._vocab), self._llama_cpp.llama_vocab_fim_sep(self._vocab)
        if extra and rep >= 0:
            context += [rep, *text("myproject\n")]
        for filename, chunk in extra:
            context += [sep, *text(filename + "\n")] if sep >= 0 else text(_SNIPPET)
            context += text(chunk)
        if extra and sep >= 0:
            context += [sep, *text("filename\n")]
        bos = [self.bos_id] * (self.add_bos and self.bos_id >= 0)
        code = [pre, *text(prefix), *text(middle), suf, *text(suffix), mid]
        if max_prompt_tokens is not None:
            keep = max(0, max_prompt_tokens - len(bos) - len(code))
            context = context[len(context) - min(len(context), keep):]
        return [*context, *bos, *code]

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    extra: dict[str, Any] | None = None, template: str | None = None) -> str:
        """The prompt text for chat messages (and the tools, OpenAI's shape) under the model's own
        template (`template`: one of its templates, tools.chat_template's; the default when None);
        node.inference.tools.prompt_inputs prepares both. `extra`: chat_template_kwargs."""
        template = template or self.chat_template
        rendered = render_chat(template, messages, bos_token=self.bos_text, eos_token=self.eos_text,
                               tools=tools, extra=extra)
        return model_turn(template, rendered)  # (Gemma 4: a model turn its template left closed)

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None, prefill: str = "") -> list[int]:
        """Render and tokenize; BOS is added only if the template did not already write it.
        `prefill`: the start of the assistant's reply, written after the generation prompt."""
        return self.chat_prompt(messages, tools, prefill)[1]

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None, prefill: str = "",
                    extra: dict[str, Any] | None = None, template: str | None = None) -> tuple[str, list[int]]:
        """chat_tokens, with the rendered text before the prefill (where the generation prompt
        leaves the reply: node.inference.reasoning reads it)."""
        rendered = self.render_chat(messages, tools, extra, template)
        text = rendered + prefill
        add_bos = self.add_bos and not (self.bos_text and text.startswith(self.bos_text))
        return rendered, self.tokenize(text, add_bos=add_bos)

    def _check(self, token_id: int) -> None:
        """llama.cpp aborts the process (a C++ out_of_range) on an id outside the vocabulary: ids
        that came from a peer are checked here, raised as the protocol error they are."""
        if not 0 <= token_id < self.n_vocab:
            raise ProtocolError(f"token id {token_id} is outside the model's vocabulary of {self.n_vocab}")

    def piece(self, token_id: int) -> bytes:
        """Bytes a token adds to the output text (control tokens add nothing)."""
        cached = self._pieces.get(token_id)
        if cached is not None:
            return cached
        self._check(token_id)
        size = 64
        buf = ctypes.create_string_buffer(size)
        n = self._llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, size, 0, False)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = self._llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, size, 0, False)
        piece = buf.raw[: max(n, 0)]
        with self._lock:
            self._pieces[token_id] = piece
        return piece

    def special_piece(self, token_id: int) -> str:
        """The text of a token with control tokens written out (`<|python_tag|>`, `[TOOL_CALLS]`):
        `piece` renders those as nothing; tool-call markers must be seen."""
        self._check(token_id)
        return self._llm._model.token_get_text(token_id)

    def is_eog(self, token_id: int) -> bool:
        """End-of-generation token (EOS, EOT, <|im_end|>...)."""
        hit = self._eog_cache.get(token_id)
        if hit is None:
            self._check(token_id)
            hit = bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token_id))
            self._eog_cache[token_id] = hit
        return hit

    def eog_ids(self) -> tuple[int, ...]:
        """Every end-of-generation token id (blocking: one look at each id, once per tokenizer)."""
        ids = self._eog_ids
        if ids is None:
            is_eog = self._llama_cpp.llama_vocab_is_eog
            ids = self._eog_ids = tuple(i for i in range(self.n_vocab) if is_eog(self._vocab, i))
        return ids

    def close(self) -> None:
        """Free the vocabulary (and the grammar engine's view of it)."""
        self.constraint_vocab = None
        self._llm.close()
