"""Checks on an exported GGUF: llama.cpp logits vs torch, tokenizer agreement, greedy samples."""

from __future__ import annotations

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
def compare_logits(model: Llama, tok: Tokenizer, gguf_path, n_ctx: int) -> list[dict]:
    """Per prompt: token count, max |torch - llama.cpp| over all positions, and the logit scale."""
    llm = load_llama(gguf_path, n_ctx, logits_all=True)
    model.eval()
    out = []
    for prompt in LOGIT_PROMPTS:
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


def greedy_samples(gguf_path, n_ctx: int, prompts=SAMPLE_PROMPTS) -> list[dict]:
    """Greedy chat completions through llama-cpp-python's own chat handling."""
    llm = load_llama(gguf_path, n_ctx)
    out = []
    for prompt in prompts:
        res = llm.create_chat_completion(
            messages=[{"role": "user", "content": prompt}], temperature=0.0, max_tokens=MAX_ANSWER_TOKENS)
        choice = res["choices"][0]
        out.append({"prompt": prompt, "answer": choice["message"]["content"],
                    "finish_reason": choice["finish_reason"],
                    "completion_tokens": res["usage"]["completion_tokens"]})
    llm.close()
    return out


def recall(gguf_path, n_ctx: int, items, n: int, seed: int) -> dict:
    """Greedy answers to "What does X do?" for ``n`` seeded random items vs their docstring answer."""
    import random

    picks = random.Random(seed).sample(list(items), n)
    res = greedy_samples(gguf_path, n_ctx, [f"What does {it.qualname} do?" for it in picks])
    first = [r["answer"].strip().split(". ")[0] == it.answer.split(". ")[0] for it, r in zip(picks, res, strict=True)]
    return {
        "items": n,
        "exact": sum(r["answer"].strip() == it.answer for it, r in zip(picks, res, strict=True)),
        "first_sentence": sum(first),
        "ended_turn": sum(r["finish_reason"] == "stop" for r in res),
    }
