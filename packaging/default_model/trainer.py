"""Training loop: seeded, deterministic data order, AdamW, warmup + cosine schedule, periodic eval."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .config import Config
from .model import Llama

log = logging.getLogger(__name__)


def seed_everything(seed: int, threads: int) -> None:
    """Seed python/numpy/torch and pin the thread count so runs repeat bit for bit on one machine."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def epoch_rows(docs: list[list[int]], length: int, seed: int, epoch: int) -> torch.Tensor:
    """Shuffle documents with (seed, epoch), concatenate, cut into rows of ``length + 1`` ids."""
    order = list(range(len(docs)))
    random.Random(seed * 1000 + epoch).shuffle(order)
    stream = np.fromiter((t for i in order for t in docs[i]), dtype=np.int64)
    n = (len(stream) - 1) // length
    idx = np.arange(n)[:, None] * length + np.arange(length + 1)[None, :]
    return torch.from_numpy(stream[idx])


def eval_rows(docs: list[list[int]], length: int) -> torch.Tensor:
    """Validation rows in the corpus's own order (no shuffle) so every run scores the same tokens."""
    stream = np.fromiter((t for d in docs for t in d), dtype=np.int64)
    n = (len(stream) - 1) // length
    idx = np.arange(n)[:, None] * length + np.arange(length + 1)[None, :]
    return torch.from_numpy(stream[idx])


def lr_at(step: int, cfg) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` at the last step."""
    warmup = min(cfg.warmup_steps, cfg.steps // 5)  # short (provisional) runs warm up for 20 %
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(model: Llama, rows: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over all rows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        logits = model(batch[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
        count += batch[:, 1:].numel()
    model.train()
    return total / count


def unigram_baseline(train_docs: list[list[int]], val_rows: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy on the validation targets of a unigram distribution fitted on train (add-one)."""
    counts = np.ones(vocab_size, dtype=np.float64)
    for d in train_docs:
        np.add.at(counts, np.asarray(d), 1)
    logp = np.log(counts / counts.sum())
    targets = val_rows[:, 1:].numpy().ravel()
    return float(-logp[targets].mean())


@dataclass
class TrainResult:
    """What the model card reports about a run."""

    steps: int = 0
    tokens_seen: int = 0
    wall_s: float = 0.0
    final_train_loss: float = float("nan")  # mean of the last ``eval_every`` steps
    final_val_loss: float = float("nan")
    history: list[dict] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)


def _batches(train_docs: list[list[int]], cfg: Config, start_step: int):
    """Yield (epoch, batch) for steps ``start_step`` onwards; the order depends only on the seed."""
    t_cfg, ctx = cfg.train, cfg.model.context_length
    epoch, rows = 0, epoch_rows(train_docs, ctx, t_cfg.seed, 0)
    per_epoch = len(rows) // t_cfg.batch_size
    epoch, cursor = divmod(start_step, per_epoch)
    if epoch:
        rows = epoch_rows(train_docs, ctx, t_cfg.seed, epoch)
    while True:
        if cursor == per_epoch:
            epoch, cursor = epoch + 1, 0
            rows = epoch_rows(train_docs, ctx, t_cfg.seed, epoch)
        yield epoch, rows[cursor * t_cfg.batch_size : (cursor + 1) * t_cfg.batch_size]
        cursor += 1


def _optimizer(model: Llama, t_cfg) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": t_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t_cfg.lr, betas=(t_cfg.beta1, t_cfg.beta2), foreach=False,
    )


def train(cfg: Config, train_docs: list[list[int]], val_docs: list[list[int]], log_path: Path,
          checkpoint: Path | None = None, resume: bool = False) -> tuple[Llama, TrainResult]:
    """Train a fresh model (or resume ``checkpoint``); log JSON lines to ``log_path``.

    With ``checkpoint`` set, model + optimizer + progress are saved at every evaluation; resuming
    replays the same data order, so a resumed run ends where an uninterrupted one would.
    """
    t_cfg, ctx = cfg.train, cfg.model.context_length
    seed_everything(t_cfg.seed, t_cfg.threads)
    model = Llama(cfg.model)
    opt = _optimizer(model, t_cfg)
    val = eval_rows(val_docs, ctx)
    result, start, prior_s = TrainResult(), 0, 0.0
    if resume and checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, prior_s = state["step"], state["elapsed_s"]
        result.history, result.step_losses = state["history"], state["step_losses"]
        log.info("resumed from %s at step %d", checkpoint, start)
    else:
        log_path.write_text("")
    t0, window = time.perf_counter(), []
    batches = _batches(train_docs, cfg, start)
    for step in range(start, t_cfg.steps):
        epoch, batch = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t_cfg)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t_cfg.grad_clip)
        opt.step()
        result.step_losses.append(loss.item())
        window.append(loss.item())
        last = step + 1 == t_cfg.steps
        if (step + 1) % t_cfg.eval_every == 0 or last:
            elapsed = prior_s + time.perf_counter() - t0
            entry = {
                "step": step + 1, "epoch": epoch, "lr": lr_at(step, t_cfg),
                "train_loss": sum(window) / len(window),
                # a fixed slice of validation on the way, all of it at the end
                "val_loss": evaluate(model, val if last else val[: t_cfg.eval_batches * t_cfg.batch_size],
                                     t_cfg.batch_size),
                "elapsed_s": round(elapsed, 1),
                "tok_per_s": round((step + 1 - start) * t_cfg.batch_size * ctx / (elapsed - prior_s)),
            }
            window = []
            result.history.append(entry)
            with log_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            log.info("step %(step)d epoch %(epoch)d lr %(lr).2e train %(train_loss).4f val %(val_loss).4f "
                     "%(elapsed_s).0fs %(tok_per_s)d tok/s", entry)
            if checkpoint is not None:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                            "elapsed_s": elapsed, "history": result.history,
                            "step_losses": result.step_losses}, checkpoint)
    result.steps = t_cfg.steps
    result.tokens_seen = t_cfg.steps * t_cfg.batch_size * ctx
    result.wall_s = prior_s + time.perf_counter() - t0
    result.final_train_loss = result.history[-1]["train_loss"]
    result.final_val_loss = result.history[-1]["val_loss"]
    return model, result
