"""Checks on an exported GGUF: llama.cpp logits vs torch, tokenizer agreement, greedy samples."""

from __future__ import annotations

import random

import numpy as np
import torch

from .model import Llama
from .tokenizer import Tokenizer, render_chat

LOGIT_PROMPTS = (
    [{"role": "user", "content": "What does os.path.join do?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "How do I use `json.dumps`?"}],
    "Return the square root of x. naïve café — 東京 🚀",
)
SAMPLE_PROMPTS = (
    "What does os.path.join do?",
    "How do I use `json.dumps`?",
    "What is `collections.Counter`?",
)
MAX_ANSWER_TOKENS = 200
LONG_CONTEXT_TOKENS = 850  # reference text before the question in the long-prompt check


def load_llama(path, n_ctx: int, logits_all: bool = False):
    """A llama-cpp-python model on the CPU, quiet, seeded."""
    from node.inference.llamacpp import load

    LlamaCpp = load().Llama

    return LlamaCpp(model_path=str(path), n_ctx=n_ctx, logits_all=logits_all, n_threads=2,
                    n_batch=n_ctx, seed=0, verbose=False)


def _prompt_ids(tok: Tokenizer, prompt) -> list[int]:
    if isinstance(prompt, str):
        return tok.encode(prompt)
    return tok.encode(render_chat(prompt, add_generation_prompt=True))


@torch.no_grad()
def compare_logits(model: Llama, tok: Tokenizer, gguf_path, n_ctx: int, extra=()) -> list[dict]:
    """Per prompt (``LOGIT_PROMPTS``, then ``extra``): token count, max |torch - llama.cpp| over all
    positions, and the logit scale."""
    llm = load_llama(gguf_path, n_ctx, logits_all=True)
    model.eval()
    out = []
    for prompt in (*LOGIT_PROMPTS, *extra):
        ids = _prompt_ids(tok, prompt)
        llm.reset()
        llm.eval(ids)
        ref = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        ours = model(torch.tensor([ids]))[0].numpy()
        out.append({
            "tokens": len(ids),
            "max_abs_diff": float(np.abs(ours - ref).max()),
            "logit_scale": float(np.abs(ours).max()),
            "argmax_agree": float((ours.argmax(-1) == ref.argmax(-1)).mean()),
        })
    llm.close()
    return out


def tokenizer_agreement(tok: Tokenizer, gguf_path, texts: list[str]) -> dict:
    """How many texts llama.cpp tokenizes exactly like SentencePiece (special tokens parsed)."""
    llm = load_llama(gguf_path, 64)
    same = sum(llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) == tok.encode(t) for t in texts)
    llm.close()
    return {"texts": len(texts), "identical": same}


def greedy_samples(gguf_path, n_ctx: int, prompts=SAMPLE_PROMPTS, system: str | None = None,
                   tok: Tokenizer | None = None) -> list[dict]:
    """Greedy chat completions through llama-cpp-python's own chat handling.

    With ``system``, each question follows that system message; the answer gets what is left of the
    context, at most ``MAX_ANSWER_TOKENS`` (``tok`` counts the prompt's tokens).
    """
    llm = load_llama(gguf_path, n_ctx)
    out = []
    for prompt in prompts:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        prompt_tokens = len(_prompt_ids(tok, messages)) if tok is not None else 0
        res = llm.create_chat_completion(messages=messages, temperature=0.0,
                                         max_tokens=min(MAX_ANSWER_TOKENS, n_ctx - prompt_tokens))
        choice = res["choices"][0]
        out.append({"prompt": prompt, "answer": choice["message"]["content"],
                    "finish_reason": choice["finish_reason"],
                    "prompt_tokens": res["usage"]["prompt_tokens"],
                    "completion_tokens": res["usage"]["completion_tokens"]})
    llm.close()
    return out


def reference_text(tok: Tokenizer, items, n_tokens: int, seed: int, exclude=()) -> str:
    """A long system message: "Reference:" then whole docstrings (name, blank line, text) of seeded
    random items, as many as fit in ``n_tokens``; ``exclude`` names items to leave out."""
    skip = set(exclude)
    pool = [it for it in items if it.qualname not in skip]
    text = "Reference:"
    for it in random.Random(seed).sample(pool, len(pool)):
        candidate = f"{text}\n\n{it.qualname}\n\n{it.text}"
        if len(tok.encode(candidate)) <= n_tokens:
            text = candidate
        elif len(tok.encode(text)) > n_tokens - 40:
            break
    return text


def pick_items(items, n: int, seed: int) -> list:
    return random.Random(seed).sample(list(items), n)


def _score(picks, res) -> dict:
    pairs = list(zip(picks, res, strict=True))
    return {
        "items": len(picks),
        "exact": sum(r["answer"].strip() == it.answer for it, r in pairs),
        "first_sentence": sum(r["answer"].strip().split(". ")[0] == it.answer.split(". ")[0] for it, r in pairs),
        "ended_turn": sum(r["finish_reason"] == "stop" for r in res),
    }


def recall(gguf_path, n_ctx: int, items, n: int, seed: int) -> dict:
    """Greedy answers to "What does X do?" for ``n`` seeded random items vs their docstring answer."""
    picks = pick_items(items, n, seed)
    return _score(picks, greedy_samples(gguf_path, n_ctx, [f"What does {it.qualname} do?" for it in picks]))


def long_chat(tok: Tokenizer, items, seed: int, exclude=(), context_tokens: int = LONG_CONTEXT_TOKENS) -> list[dict]:
    """SAMPLE_PROMPTS[0] (os.path.join) after a ~``context_tokens`` reference system message."""
    system = reference_text(tok, items, context_tokens, seed, exclude=[*exclude, "os.path.join"])
    return [{"role": "system", "content": system}, {"role": "user", "content": SAMPLE_PROMPTS[0]}]


def long_context_recall(gguf_path, n_ctx: int, tok: Tokenizer, items, n: int, seed: int,
                        context_tokens: int = LONG_CONTEXT_TOKENS) -> dict:
    """``recall``'s questions (same items) after a system message of ~``context_tokens`` tokens of
    other items' docstrings: does a long prompt still get the memorised answer?"""
    picks = pick_items(items, n, seed)
    system = long_chat(tok, items, seed, [it.qualname for it in picks], context_tokens)[0]["content"]
    res = greedy_samples(gguf_path, n_ctx, [f"What does {it.qualname} do?" for it in picks], system, tok)
    sample = greedy_samples(gguf_path, n_ctx, SAMPLE_PROMPTS[:1], system, tok)[0]
    return {**_score(picks, res), "system_tokens": len(tok.encode(system)),
            "prompt_tokens": [min(r["prompt_tokens"] for r in res), max(r["prompt_tokens"] for r in res)],
            "system_head": system[:300], "sample": sample}
