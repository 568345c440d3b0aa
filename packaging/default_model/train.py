"""Build SwarmLLM's default model end to end: corpus, tokenizer, training, GGUF, checks, model card.

    python packaging/default_model/train.py --out resources/models

Intermediate files (raw docstrings, tokenizer, checkpoint, F32 GGUF, logs, stats) go to ``--work``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

# Run as a script: import this folder as the package `default_model` (see __init__.py for why).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# OpenMP threads that spin at barriers lose most of their time when other processes share the
# cores (measured here: 19 s vs 3.4 s per step); sleeping waits change nothing numerically.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from default_model import card, corpus, export, tokenizer, trainer, verify  # noqa: E402
from default_model.config import GGUF_NAME, Config  # noqa: E402

log = logging.getLogger("default_model")
COMMAND = "python packaging/default_model/train.py --out resources/models"
RECALL_ITEMS = 20  # training items asked "What does X do?" for the card's memorisation figure
SHORT_ROWS = 256  # the previous model's context: validation is also scored on rows this long
BASELINE = Path(__file__).with_name("baseline_ctx256.json")  # that model's figures, for the card


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("resources/models"), help="where the GGUF and card go")
    ap.add_argument("--work", type=Path, default=Path("build/default_model"), help="intermediate files")
    ap.add_argument("--steps", type=int, help="override TrainConfig.steps (a shorter, provisional run)")
    ap.add_argument("--eval-every", type=int, help="override TrainConfig.eval_every")
    ap.add_argument("--repro-steps", type=int, default=30,
                    help="first train twice for this many steps and compare losses (0: skip)")
    ap.add_argument("--resume", action="store_true",
                    help="continue an interrupted run from WORK/checkpoint.pt (same data order)")
    return ap.parse_args(argv)


def _machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.machine()}"


def build_corpus(cfg: Config, work: Path):
    """Harvest, clean, split, tokenize; return tokenizer, train/val docs, val texts, stats, train items."""
    records = corpus.harvest()
    (work / "raw_docstrings.json").write_text(json.dumps(records))
    c = cfg.corpus
    items = corpus.build_items(records, c.answer_chars, c.text_chars)
    train_items, val_items = corpus.split(items, c.val_fraction, cfg.train.seed)
    train_samples = corpus.samples(train_items, cfg.train.seed, c.chats_per_item, identity=True)
    val_samples = corpus.samples(val_items, cfg.train.seed + 1, c.chats_per_item, identity=False)

    def text(s):
        return s if isinstance(s, str) else tokenizer.render_chat(s)

    train_texts = [text(s) for s in train_samples]
    val_texts = [text(s) for s in val_samples]
    sp_path = tokenizer.train(train_texts, cfg.model.vocab_size, work / "tokenizer")
    tok = tokenizer.Tokenizer(sp_path)
    train_docs = [tok.encode_sample(s) for s in train_samples]
    val_docs = [tok.encode_sample(s) for s in val_samples]
    stats = {
        "python": platform.python_version(),
        "records": len(records),
        "modules": len({r["module"] for r in records}),
        "items_train": len(train_items), "items_val": len(val_items),
        "samples_train": len(train_samples), "samples_val": len(val_samples),
        "chats_train": sum(not isinstance(s, str) for s in train_samples),
        "chars_train": sum(map(len, train_texts)), "chars_val": sum(map(len, val_texts)),
        "tokens_train": sum(map(len, train_docs)), "tokens_val": sum(map(len, val_docs)),
        "tokens_max_train": max(map(len, train_docs)),
        "val_contains_os_path_join": any(it.qualname == "os.path.join" for it in val_items),
    }
    log.info("corpus %s", stats)
    return tok, train_docs, val_docs, val_texts, stats, train_items


def repro_check(cfg: Config, train_docs, val_docs, work: Path, steps: int) -> dict:
    """Train the real configuration twice for ``steps`` steps; compare every step's loss."""
    short = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps, eval_every=steps))
    runs = [trainer.train(short, train_docs, val_docs, work / f"repro_{i}.jsonl")[1].step_losses for i in range(2)]
    diff = max(abs(a - b) for a, b in zip(*runs, strict=True))
    log.info("reproducibility: %d steps, max loss difference %.3g", steps, diff)
    return {"steps": steps, "max_abs_diff": diff, "identical": runs[0] == runs[1], "losses": runs[0]}


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    t_start = time.perf_counter()
    cfg = Config()
    overrides = {k: v for k, v in {"steps": args.steps, "eval_every": args.eval_every}.items() if v}
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **overrides))
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    trainer.seed_everything(cfg.train.seed, cfg.train.threads)

    tok, train_docs, val_docs, val_texts, corpus_stats, train_items = build_corpus(cfg, args.work)
    assert tok.vocab_size == cfg.model.vocab_size
    repro = None
    if args.repro_steps and not args.resume:
        repro = repro_check(cfg, train_docs, val_docs, args.work, args.repro_steps)
        (args.work / "repro.json").write_text(json.dumps(repro))
    elif (args.work / "repro.json").exists():
        repro = json.loads((args.work / "repro.json").read_text())

    model, result = trainer.train(cfg, train_docs, val_docs, args.work / "train_log.jsonl",
                                  checkpoint=args.work / "checkpoint.pt", resume=args.resume)
    torch.save(model.state_dict(), args.work / "model.pt")
    val_rows = trainer.eval_rows(val_docs, cfg.model.context_length)
    unigram = trainer.unigram_baseline(train_docs, val_rows, cfg.model.vocab_size)
    # the same 256-token windows the previous model was scored on: a like-for-like validation loss
    val_short = trainer.evaluate(model, trainer.eval_rows(val_docs, SHORT_ROWS), cfg.train.batch_size)
    log.info("validation loss on %d-token rows: %.4f", SHORT_ROWS, val_short)

    description = (f"Tiny Llama trained on Python {platform.python_version()} standard-library docstrings "
                   "as ChatML chats; answers 'What does X do?' questions. Built by SwarmLLM's "
                   "packaging/default_model/train.py.")
    f32 = export.write_gguf(model, tok, cfg, args.work / "model-f32.gguf", "F32", description)
    q8 = export.write_gguf(model, tok, cfg, args.out / GGUF_NAME, "Q8_0", description)
    n_ctx = cfg.model.context_length
    picks = verify.pick_items(train_items, RECALL_ITEMS, seed=7)
    long_chat = verify.long_chat(tok, train_items, seed=7, exclude=[it.qualname for it in picks])
    stats = {
        "command": COMMAND + (f" --steps {args.steps}" if args.steps else ""),
        "config": cfg.to_dict(),
        "provisional": cfg.train.steps < Config().train.steps,
        "machine": _machine(),
        "torch": torch.__version__,
        "params": model.n_params(),
        "corpus": corpus_stats,
        "train": {k: v for k, v in dataclasses.asdict(result).items() if k != "step_losses"},
        "epochs": result.tokens_seen / corpus_stats["tokens_train"],
        "unigram_val_loss": unigram,
        "logits_f32": verify.compare_logits(model, tok, f32, n_ctx, [long_chat]),
        "logits_q8_0": verify.compare_logits(model, tok, q8, n_ctx, [long_chat]),
        "tokenizer_agreement": verify.tokenizer_agreement(tok, q8, val_texts),
        "samples": verify.greedy_samples(q8, n_ctx),
        "recall_train": verify.recall(q8, n_ctx, train_items, RECALL_ITEMS, seed=7),
        "recall_long": verify.long_context_recall(q8, n_ctx, tok, train_items, RECALL_ITEMS, seed=7),
        "val_loss_short": {"rows": SHORT_ROWS, "loss": val_short},
        "baseline": json.loads(BASELINE.read_text()),
        "resumed": args.resume,
        "repro": repro,
        "file": {"name": GGUF_NAME, "bytes": q8.stat().st_size,
                 "sha256": hashlib.sha256(q8.read_bytes()).hexdigest()},
    }
    stats["total_wall_s"] = time.perf_counter() - t_start
    (args.work / "stats.json").write_text(json.dumps(stats, indent=2))
    card.write(args.out / "README.md", stats)
    log.info("wrote %s (%d bytes) and the model card; total %.0fs", q8, stats["file"]["bytes"],
             stats["total_wall_s"])


if __name__ == "__main__":
    main()
