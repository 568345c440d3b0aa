"""Render the model card (resources/models/README.md) from a run's figures."""

from __future__ import annotations

from pathlib import Path


def _fmt_int(n: float) -> str:
    return f"{int(n):,}"


def _quote(text: str) -> str:
    return "\n".join(f"> {line}".rstrip() for line in (text or "(empty)").splitlines())


def _minutes(s: float) -> str:
    return f"{s / 60:.1f} min"


def _before_after(st: dict) -> str:
    """The previous (256-token) model's card figures next to this run's."""
    b = st.get("baseline")
    if not b:
        return ""
    m, t, rl = st["config"]["model"], st["train"], st.get("recall_long")
    br, r = b["recall_train"], st["recall_train"]
    vs = st.get("val_loss_short")
    rows = [
        ("context length", f"{b['context_length']} tokens", f"{m['context_length']} tokens"),
        ("batch (tokens per step)", b["batch"], f"{st['config']['train']['batch_size']} × {m['context_length']}"),
        ("steps / tokens seen", f"{_fmt_int(b['steps'])} / {_fmt_int(b['tokens_seen'])}",
         f"{_fmt_int(t['steps'])} / {_fmt_int(t['tokens_seen'])}"),
        ("final train loss", f"{b['final_train_loss']:.3f}", f"{t['final_train_loss']:.3f}"),
        ("validation loss, rows of its own context", f"{b['final_val_loss']:.3f}", f"{t['final_val_loss']:.3f}"),
    ]
    if vs:
        rows.append((f"validation loss, the same {vs['rows']}-token rows", f"{b['final_val_loss']:.3f}",
                     f"{vs['loss']:.3f}"))
    rows += [
        ("exact recall (20 training items)", f"{br['exact']} (re-run: {b['rerun_recall_train']['exact']})", str(r["exact"])),
        ("first sentence right", f"{br['first_sentence']} (re-run: {b['rerun_recall_train']['first_sentence']})",
         str(r["first_sentence"])),
        ("turn ended", f"{br['ended_turn']} (re-run: {b['rerun_recall_train']['ended_turn']})", str(r["ended_turn"])),
    ]
    if rl:
        rows.append((f"the same 20 after ~{rl['system_tokens']} tokens of context: exact / first sentence / ended",
                     "does not fit (prompt > 256 tokens)",
                     f"{rl['exact']} / {rl['first_sentence']} / {rl['ended_turn']}"))
    rows.append(("file", f"{b['file_bytes'] / 1e6:.2f} MB", f"{st['file']['bytes'] / 1e6:.2f} MB"))
    table = "\n".join(f"| {a} | {x} | {y} |" for a, x, y in rows)
    new = {s["prompt"]: s for s in st["samples"]}
    samples = "\n\n".join(
        f"**User:** {s['prompt']}\n\nBefore ({s['completion_tokens']} tokens, `{s['finish_reason']}`):\n\n"
        + _quote(s["answer"])
        + (f"\n\nAfter ({new[s['prompt']]['completion_tokens']} tokens, `{new[s['prompt']]['finish_reason']}`):\n\n"
           + _quote(new[s["prompt"]]["answer"]) if s["prompt"] in new else "")
        for s in b["samples"])
    return f"""## Before / after: 256 → {m['context_length']} tokens of context

The previous file (sha256 `{b['sha256'][:16]}…`) was trained by this same code with a
{b['context_length']}-token context; its figures come from its card. Same corpus, tokenizer,
architecture, optimiser, steps and tokens per step; only the row length (and so the batch) changed.

| | before ({b['context_length']}) | after ({m['context_length']}) |
|---|---|---|
{table}

{samples}

"""


def _long_prompt(st: dict) -> str:
    rl = st.get("recall_long")
    if not rl:
        return ""
    s = rl["sample"]
    return f"""## A long prompt

A system message of {rl['system_tokens']} tokens ("Reference:" and then whole docstrings of other
training items, none of them the one asked about), then the question: prompts of
{rl['prompt_tokens'][0]}–{rl['prompt_tokens'][1]} tokens, the rest of the context for the answer.
Asked "What does X do?" this way for the same 20 training items, the model repeats the docstring
answer exactly for {rl['exact']}, gets its first sentence right for {rl['first_sentence']} and ends its turn
in {rl['ended_turn']} (asked alone, without it: {st['recall_train']['exact']}, {st['recall_train']['first_sentence']} and
{st['recall_train']['ended_turn']}). The system message begins:

{_quote(rl['system_head'] + '…')}

**User** (after it, {s['prompt_tokens']} prompt tokens in all): {s['prompt']}

**Assistant** ({s['completion_tokens']} tokens, finish_reason `{s['finish_reason']}`):

{_quote(s['answer'])}

"""


def render(st: dict) -> str:
    m, t, c, co = st["config"]["model"], st["train"], st["config"]["train"], st["corpus"]
    cc = st["config"]["corpus"]
    hist = "\n".join(
        f"| {h['step']} | {h['epoch']} | {h['lr']:.2e} | {h['train_loss']:.3f} | {h['val_loss']:.3f} |"
        for h in t["history"])
    logits = "\n".join(
        f"| {name} | {r['tokens']} | {r['max_abs_diff']:.2e} | {r['logit_scale']:.1f} | {r['argmax_agree']:.0%} |"
        for name in ("f32", "q8_0") for r in st[f"logits_{name}"])
    samples = "\n\n".join(
        f"**User:** {s['prompt']}\n\n**Assistant** ({s['completion_tokens']} tokens, "
        f"finish_reason `{s['finish_reason']}`):\n\n" + _quote(s["answer"]) for s in st["samples"])
    rp = st.get("repro")
    repro = ("not run (`--repro-steps 0`)." if not rp else
             f"the same configuration was trained twice for {rp['steps']} steps in one process; the "
             f"per-step losses were {'bit-for-bit identical' if rp['identical'] else 'not identical'} "
             f"(max difference {rp['max_abs_diff']:.3g}; first losses "
             f"{', '.join(f'{x:.4f}' for x in rp['losses'][:5])}).")
    ta = st["tokenizer_agreement"]
    rc = st.get("recall_train")
    recall = ("" if not rc else
              f"Asked \"What does X do?\" for {rc['items']} random training items (seed 7), the model "
              f"repeats the docstring answer exactly for {rc['exact']}, gets its first sentence right for "
              f"{rc['first_sentence']}, and ends its turn by itself in {rc['ended_turn']}. Items it has not "
              "seen (validation) get fluent but invented answers: it is a memoriser, not an oracle.\n")
    notes = "".join(f"{n}\n\n" for n in st.get("notes", []))
    provisional = ("\n> **Provisional**: a short run made to give the project a real file with the final "
                   "tokenizer, template and metadata; the full training run replaces it.\n"
                   if st.get("provisional") else "")
    return f"""# SwarmLLM default model: `{st['file']['name']}`
{provisional}
A tiny Llama-architecture chat model that ships inside SwarmLLM so that `swarmllm run` serves
something on a machine with no internet. It was trained from scratch, here, on the docstrings of
the Python {co['python']} standard library, shaped as ChatML chats ("What does `json.dumps` do?" →
the docstring's first paragraph) plus the docstrings as plain text. It answers questions about
Python standard-library modules, classes and functions in docstring English and ends its turn
(`<|im_end|>`). It knows nothing else; it is a smoke-test and first-run model, not an assistant.

- **Licence**: model weights MIT. Training text: Python standard-library docstrings, © Python
  Software Foundation, PSF License Agreement.
- **File**: `{st['file']['name']}`, {st['file']['bytes'] / 1e6:.2f} MB, GGUF, Q8_0 (1-D norm weights F32),
  sha256 `{st['file']['sha256']}`.
- **Made by**: `packaging/default_model/` in this repository.

## Reproduce

```
{st['command']}
```

One command, run from the repository root with the project's virtualenv (`pip install -e '.[train,test]'`).
It harvests the docstrings (each top-level module imported in a child process; GUI, test-suite and
side-effect modules skipped), trains the tokenizer and the model, writes the GGUF here, checks it
against llama.cpp and rewrites this card. Intermediate files go to `build/default_model/`.
All seeds (python, numpy, torch) come from `TrainConfig.seed = {c['seed']}`; the data order is a
seeded shuffle; `torch.use_deterministic_algorithms(True)`; torch threads pinned to {c['threads']}.
Reproducibility: {repro} The corpus depends on the exact Python build (docstrings differ between
versions), and floating-point sums can differ across CPUs and thread counts, so another machine
gives a model of the same quality, not necessarily the same bytes.

## Model

| | |
|---|---|
| architecture | llama (RMSNorm, RoPE on adjacent pairs, SwiGLU, GQA, tied embeddings: {m['tie_embeddings']}) |
| parameters | {_fmt_int(st['params'])} |
| embedding / layers / heads / KV heads | {m['dim']} / {m['n_layers']} / {m['n_heads']} / {m['n_kv_heads']} (head dim {m['dim'] // m['n_heads']}) |
| feed-forward | {m['ffn_dim']} |
| context length | {m['context_length']} tokens |
| RoPE base / RMSNorm eps | {m['rope_theta']:g} / {m['norm_eps']:g} |
| tokenizer | SentencePiece BPE, {m['vocab_size']} tokens, byte fallback (`<0x00>`…`<0xFF>`), no dummy prefix, identity normalisation |
| special tokens | `<unk>` 0, `<s>` 1 (BOS, not added), `</s>` 2, `<pad>` 3, `<\\|im_start\\|>` 4, `<\\|im_end\\|>` 5 (EOS/EOT) |
| chat template | standard ChatML (`tokenizer.chat_template`) |

No BOS token is used in training or inference (`tokenizer.ggml.add_bos_token = false`), so
llama-cpp-python's built-in ChatML formatter, a Jinja rendering of the template and a manual
rendering all give the model the same tokens.

## Corpus

| | train | validation |
|---|---|---|
| documented items (modules, classes, functions, methods, properties) | {_fmt_int(co['items_train'])} | {_fmt_int(co['items_val'])} |
| samples (chats + plain texts) | {_fmt_int(co['samples_train'])} | {_fmt_int(co['samples_val'])} |
| characters | {_fmt_int(co['chars_train'])} | {_fmt_int(co['chars_val'])} |
| tokens | {_fmt_int(co['tokens_train'])} | {_fmt_int(co['tokens_val'])} |

{_fmt_int(co['records'])} docstrings from {co['modules']} modules. Each item gives {cc['chats_per_item']} chats (varied
phrasings; 20 % with a system prompt; 10 % with a second question) with the cleaned first
paragraph(s) as the answer (cut at a sentence end before {cc['answer_chars']} characters), and one plain
text (the name and the cleaned docstring, up to {cc['text_chars']} characters). A few self-description
chats ("Who are you?") are added to train. Validation holds out {cc['val_fraction']:.0%} of the items
(all their samples) with a seeded shuffle; `os.path.join` is in the
{'validation' if co['val_contains_os_path_join'] else 'training'} split, so its sample answer is
{'not ' if co['val_contains_os_path_join'] else ''}a memorised docstring.

## Training

AdamW (β = {c['beta1']}, {c['beta2']}; weight decay {c['weight_decay']} on matrices), learning rate {c['lr']:g} with
{c['warmup_steps']} warm-up steps and cosine decay to {c['min_lr']:g}, batch {c['batch_size']} × {m['context_length']} tokens,
gradient clipping {c['grad_clip']}, no dropout, float32.

Packed sequences, plain causal: every epoch the samples are shuffled (seeded), concatenated, each
one starting with `<s>` (chats end with `<|im_end|>\\n`, plain texts with `</s>`), and cut into rows
of {m['context_length']} + 1 tokens; attention is causal over the whole row, across sample boundaries,
and the loss counts every next token, the boundary ones included. No document mask, on purpose: the
samples are short (mean {co['tokens_train'] / co['samples_train']:.0f} tokens, longest {co.get('tokens_max_train', '?')}),
so with a mask (and positions restarting per sample) no attention would ever span more than one
sample, most attention spans would stay under a hundred tokens and the positions past the longest
sample would never be trained; packed causally, every position
up to {m['context_length'] - 1} is trained, attending over up to {m['context_length'] - 1} earlier tokens of
other samples that it learns to look past from the `<s>` marker on. That is what a long prompt at
inference needs: the question comes after hundreds of tokens of other text. The boundary targets
(`<s>`, a sample's first token) are honest predictions, just hard ones; they were in the
256-token model's loss too.

| | |
|---|---|
| steps | {_fmt_int(t['steps'])} |
| tokens seen | {_fmt_int(t['tokens_seen'])} ({st['epochs']:.1f} epochs) |
| final train loss (mean of the last {c['eval_every']} steps) | {t['final_train_loss']:.3f} nats/token |
| final validation loss | **{t['final_val_loss']:.3f}** nats/token |
| unigram baseline validation loss | {st['unigram_val_loss']:.3f} nats/token |
| training wall time | {_minutes(t['wall_s'])} (whole command {_minutes(st['total_wall_s'])}) |
| machine | {st['machine']}, torch {st['torch']} (CPU), {c['threads']} threads, shared with other work |

{notes}The unigram baseline is the cross-entropy, on the validation tokens, of the token frequencies
counted on the training tokens (add-one smoothed).

Validation loss in this table: the first {c['eval_batches'] * c['batch_size']} validation rows of {m['context_length']} tokens
on the way, all {co['tokens_val'] // m['context_length']} rows at the last step.

| step | epoch | lr | train loss | val loss |
|---|---|---|---|---|
{hist}

## Checked against llama.cpp

The torch model and llama.cpp (llama-cpp-python, `logits_all=True`) on the exported files give
these logits for the prompts (two chats, one plain text with non-ASCII and, last, the long prompt
of the section below):

| file | tokens | max abs logit diff | max abs logit | same argmax |
|---|---|---|---|---|
{logits}

llama.cpp tokenizes {ta['identical']} of {ta['texts']} validation samples exactly like SentencePiece.

## Samples

Greedy decoding (temperature 0, max 200 tokens) through llama-cpp-python's
`create_chat_completion` on the shipped Q8_0 file:

{samples}

{recall}
{_long_prompt(st)}{_before_after(st)}"""


def write(path: Path, stats: dict) -> None:
    """Write the card for ``stats`` (the dict train.py saves as build/default_model/stats.json)."""
    path.write_text(render(stats))
