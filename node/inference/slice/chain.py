"""N slices of one model chained in-process: `test-split`, the reference tests and the bench.

Hidden states cross each boundary as float32 [T, H], exactly what a peer would receive (before
wire compression), so a chain of N slices exercises the same code as a distributed pipeline
minus the network.
"""

from __future__ import annotations

from pathlib import Path

import torch

from node.errors import ModelLoadError
from node.inference.slice.model import SliceModel


def split_ranges(n_layers: int, n_slices: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges covering n_layers, as even as possible."""
    if not 1 <= n_slices <= n_layers:
        raise ModelLoadError(f"cannot split {n_layers} layers into {n_slices} slices")
    base, extra = divmod(n_layers, n_slices)
    ranges, start = [], 0
    for i in range(n_slices):
        end = start + base + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


class SliceChain:
    """Slices [0, a), [a, b), ... [z, L) of one model, run one after another."""

    def __init__(self, slices: list[SliceModel]):
        self.slices = slices

    @classmethod
    def load(cls, path: str | Path, n_slices: int, **load_kwargs) -> SliceChain:
        """Load the model at `path` as `n_slices` slices (keyword args go to SliceModel.load)."""
        from node.inference.weights.gguf_file import GgufFile

        f = GgufFile(path)
        n_layers = int(f.arch_field("block_count", 0))
        del f
        return cls([SliceModel.load(path, a, b, **load_kwargs) for a, b in split_ranges(n_layers, n_slices)])

    @property
    def first(self) -> SliceModel:
        return self.slices[0]

    @property
    def last(self) -> SliceModel:
        return self.slices[-1]

    def new_session(self, session_id: str) -> None:
        """A KV session with this id on every slice."""
        for s in self.slices:
            s.new_session(session_id)

    def free_session(self, session_id: str) -> None:
        """Drop the session everywhere."""
        for s in self.slices:
            s.free_session(session_id)

    def forward(self, session_id: str, ids, index_pos: int, *, last_only: bool = False,
                prompt_rows: int | None = None) -> torch.Tensor:
        """Token ids [T] in, logits [T, V] (or [1, V]) out, through every slice in order
        (`prompt_rows`: see SliceModel.forward)."""
        x = torch.as_tensor(ids, dtype=torch.long)
        for s in self.slices:
            x = s.forward(session_id, x, index_pos, last_only=last_only, prompt_rows=prompt_rows)
        return x
