"""The models table: one row per served model, fed by ModelManager observer events.

Rows are `ServedModel.summary()` dicts taken at event time, so the table shows exactly what the
admin API reports: state, device and the reason a model runs on the CPU. Layer slices this node
serves to the swarm (`--layers`) get one row each, from the slice host's own summary.
"""

from __future__ import annotations

from typing import Any

from app.ui import fmt
from app.ui.table_model import Column, KeyedTableModel


def _layers(m: dict[str, Any]) -> str:
    if m.get("partial"):  # a slice of a partial model: the layers and bytes on disk, of the file's
        held = m.get("held_layers")
        if not isinstance(held, list) or m.get("held_bytes") is None:
            return str(m["partial"])
        # in the Size column's units (MiB): the node's line said "25 MB of 49 MB" beside "47.1 MiB"
        runs: list[list[int]] = []
        for i in held:
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        layers = ", ".join(f"{a}–{b}" if a != b else f"{a}" for a, b in runs) or "none"
        unchecked = m.get("unchecked_parts") or 0
        return (f"layers {layers} of {m.get('n_layers')}, {fmt.size(m['held_bytes'])} of "
                f"{fmt.size(m.get('size_bytes'))}" + (f", {unchecked} parts not yet checked against the origin"
                                                       if unchecked else ""))
    return fmt.layers(m.get("layers_held"), m.get("n_layers"))


def _memory(m: dict[str, Any]) -> str:
    # A whole model held by llama.cpp takes about its file (weights are mmapped) and its KV cache at
    # the served context; told before a load too, to decide whether to press Load. A slice's
    # footprint depends on its layers and dtype, which its summary does not say.
    estimate = m.get("memory_estimate")
    if is_slice(m) or not estimate:
        return fmt.DASH
    text = "≈ " + fmt.size(estimate["total_bytes"])
    return text if m.get("state") in ("loaded", "loading", "unloading") else text + " to load"


def memory_tip(m: dict[str, Any]) -> str | None:
    """What the Memory figure is made of."""
    estimate = m.get("memory_estimate")
    if is_slice(m) or not estimate:
        return None
    tip = (f"≈ {fmt.size(estimate['total_bytes'])}: the weights (the file, {fmt.size(estimate['weights_bytes'])}) "
           f"and the KV cache ({fmt.size(estimate['kv_bytes'])}: {estimate['kv_tokens']:,} tokens of context)")
    if estimate.get("head_copy_bytes"):  # a tied head: llama.cpp copies the embeddings to its GPU
        tip += f", and a GPU copy of the token embeddings for the head ({fmt.size(estimate['head_copy_bytes'])})"
    if estimate.get("gpu_bytes"):  # offloaded layers and their cache take VRAM, not RAM
        tip += f"; ≈ {fmt.size(estimate['gpu_bytes'])} of it on the GPU, ≈ {fmt.size(_ram(estimate))} in RAM"
    return tip


def _ram(estimate: dict[str, Any]) -> int:
    """The part of an estimate that takes RAM (all of it when nothing is on a GPU)."""
    return estimate.get("ram_bytes", estimate["total_bytes"])


def fit(m: dict[str, Any], ram_free_bytes: int) -> tuple[bool | None, str]:
    """Whether a load of this model fits in the RAM free now, and that in words (None, '' when
    nothing is known)."""
    estimate = m.get("memory_estimate")
    if not estimate:
        return None, ""
    need, free = _ram(estimate), ram_free_bytes
    takes = f"Loading {m['id']} takes ≈ {fmt.size(need)}"
    if estimate.get("gpu_bytes"):  # placed on a GPU as the load would place it now
        takes += f" of RAM (≈ {fmt.size(estimate['gpu_bytes'])} more on the GPU)"
    if need <= free:
        return True, f"{takes}; {fmt.size(free)} of RAM is free."
    return False, (f"{takes}, more than the {fmt.size(free)} of RAM free now: "
            "it may not fit (the machine slows down swapping, or the load fails). Unload another model first, "
            "or start with a smaller --ctx.")


def _state(m: dict[str, Any]) -> str:
    state = m.get("state", fmt.DASH)
    fetch = m.get("fetch")
    if state == "loading" and fetch and fetch.get("total_bytes"):  # a partial model's layers arriving
        done, total = fetch["done_bytes"], fetch["total_bytes"]
        return f"fetching layers {100 * done / total:.0f}% ({fmt.size(done)} of {fmt.size(total)})"
    if m.get("file_gone") and state in ("loaded", "loading", "unloading"):  # held from a file deleted since
        return f"{state} — file deleted: it cannot be reloaded"
    if state == "loaded" and m.get("checking"):  # its file touched: hashed again, then serves on
        return "loaded, checking its file"
    if state == "loaded" and m.get("busy"):
        waiting = m.get("waiting") or 0
        return "loaded, busy" + (f" (+{waiting} waiting)" if waiting else "")
    return state


def _state_tip(m: dict[str, Any]) -> str | None:
    if m.get("file_gone"):
        return ("Its file was deleted or moved since it was loaded: it serves on from memory until it is "
                "unloaded, and then leaves this list (put the file back in place to keep it).")
    if m.get("state") == "loaded" and m.get("checking"):
        return ("Its file changed on disk (its size or time) and is being hashed again: the same bytes, it "
                "serves on; other bytes, it stops. Peers are not sent work for it meanwhile.")
    if m.get("state") == "failed" and m.get("no_vocabulary") and m.get("error"):  # refused for good: no Load
        return (f"{m['error']}\n\nWithout its vocabulary no load can succeed: replace the file with a whole, "
                "supported copy.")
    if m.get("state") == "failed" and m.get("failed_at") and m.get("error"):  # a failed load, remembered
        return (f"{m['error']}\n\nRequests do not load it again until its file changes, another "
                "model is unloaded or a few minutes pass: select it and press Load to try again.")
    return m.get("error") or None


def _architecture(m: dict[str, Any]) -> str:
    text = f"{m.get('architecture', '?')} · {m.get('quantization', '?')}"
    if is_slice(m):
        text += f" · torch slice {m.get('dtype') or ''}".rstrip()
    if m.get("reranker"):  # not a chat model: /v1/rerank only (the Chat tab does not offer it)
        text += " · reranker"
    return text


def is_slice(m: dict[str, Any]) -> bool:
    """A row for layers this node serves to the swarm (torch slice engine), not a whole model."""
    return m.get("engine") == "torch-slice"


MODEL_COLUMNS = [
    Column("Model", lambda m: m["id"], tooltip=lambda m: f"{m['id']}\nsha256 {m.get('sha256', '')}\nsource: {m.get('source')}",
           header_tip="the model's id: its name and the first 8 digits of its file's sha256 (the same on every node)"),
    Column("Architecture", _architecture, header_tip="the model family and the weights' storage type; “torch slice” for layers served with the slice engine; “reranker” for a model that scores documents (/v1/rerank), not a chat model"),
    Column("Size", lambda m: fmt.size(m.get("size_bytes")), numeric=True, header_tip="the GGUF file's size"),
    Column("Layers held", _layers, header_tip="the layers this node holds (inclusive), of the model's total"),
    Column("Device", lambda m: fmt.placement(m.get("device"), m.get("cpu_placement_reason"))[0], header_tip="where it runs: CPU or GPU"),
    Column("Placement reason", lambda m: fmt.placement(m.get("device"), m.get("cpu_placement_reason"))[1],
           tooltip=lambda m: m.get("cpu_placement_reason"),
           header_tip="why the model runs where it runs (GPU admission or the CPU reason)"),
    Column("Memory", _memory, numeric=True, tooltip=memory_tip,
           header_tip="memory its weights and KV cache take (≈: estimated); “to load”: what a load would take"),
    Column("State", _state, tooltip=_state_tip, color=lambda m: fmt.STATE_COLORS.get(m.get("state", "")), header_tip="loaded, loading (with the layers' fetch progress), unloading, unloaded or failed (hover for why)"),
]


class ModelsModel(KeyedTableModel):
    """One row per ServedModel, keyed by model id."""

    def __init__(self, parent=None):
        super().__init__(MODEL_COLUMNS, parent=parent)

    def on_model_event(self, event: str, served) -> None:
        """ModelManager observer: "added" or "changed" with the ServedModel.

        A model held here only as slices (whole=False) is shown by its slice rows instead.
        """
        if event == "removed" or not served.whole:
            self.remove(served.id)
        else:
            self.upsert(served.id, served.summary())

    def set_slices(self, rows: dict[str, dict[str, Any]]) -> None:
        """The slice rows (key → row); slice rows not in `rows` are dropped."""
        for key in [k for k in self.keys() if is_slice(self.value(k)) and k not in rows]:
            self.remove(key)
        for key, row in rows.items():
            if self.value(key) != row:
                self.upsert(key, row)

    def summary(self, model_id: str) -> dict[str, Any] | None:
        return self.value(model_id)
