"""Token pieces → client text: UTF-8-safe incremental decoding and stop-sequence matching.

Engines produce token byte pieces; this turns them into text deltas that never split a
multi-byte character, and holds back text that could be the start of a stop sequence so that a
matched stop sequence never reaches the client. Shared by the local and distributed paths.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass
class StopMatch:
    """Where a stop sequence matched."""

    sequence: str
    emitted_chars: int  # characters of text sent to the client before the match


class TextAssembler:
    """Feed byte pieces, get text deltas; reports a stop-sequence match."""

    def __init__(self, stop: tuple[str, ...] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._hold_max = max((len(s) for s in self._stop), default=0)
        self._pending = ""  # decoded text not yet emitted (possible stop-sequence prefix)
        self.emitted = ""  # everything sent to the client
        self.stop_match: StopMatch | None = None

    def arm(self, stop: tuple[str, ...]) -> None:
        """Watch for `stop` too from here on (vLLM's `min_tokens`: stop strings count once that many
        tokens are out; text emitted before is not searched again)."""
        self._stop = (*self._stop, *(s for s in stop if s))
        self._hold_max = max((len(s) for s in self._stop), default=0)

    @property
    def decoded_chars(self) -> int:
        """Characters decoded so far, emitted or held back (where the next token's text starts)."""
        return len(self.emitted) + len(self._pending)

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; returns text safe to emit now ('' if held back)."""
        if self.stop_match is not None:
            return ""
        self._pending += self._decoder.decode(piece)
        return self._drain(final=False)

    def finish(self) -> str:
        """End of generation: flush held text (incomplete UTF-8 becomes U+FFFD)."""
        if self.stop_match is not None:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._drain(final=True)

    def _drain(self, final: bool) -> str:
        if self._stop:
            hit = None
            for seq in self._stop:
                idx = self._pending.find(seq)
                if idx >= 0 and (hit is None or idx < hit[0]):
                    hit = (idx, seq)
            if hit is not None:
                out = self._pending[: hit[0]]
                self.emitted += out
                self.stop_match = StopMatch(hit[1], len(self.emitted))
                self._pending = ""
                return out
            if not final:
                keep = self._longest_stop_prefix_suffix()
                out = self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep:]
                self.emitted += out
                return out
        out = self._pending
        self._pending = ""
        self.emitted += out
        return out

    def _longest_stop_prefix_suffix(self) -> int:
        """Length of the longest tail of pending text that is a prefix of some stop sequence."""
        text = self._pending
        for n in range(min(len(text), self._hold_max - 1), 0, -1):
            tail = text[-n:]
            if any(seq.startswith(tail) for seq in self._stop):
                return n
        return 0
