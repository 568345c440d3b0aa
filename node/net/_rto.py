"""Per-peer retransmission-timeout estimator (RFC 6298), fed by PING/PONG and pipeline ACKs.

The pipeline uses `rto_s` as its ACK deadline and calls `backoff()` on a miss (seed 000: a busy
peer's ACKs arrive late, not never; a per-peer estimator that backs off self-corrects).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node import const

_ALPHA = 1 / 8  # RFC 6298 §2.3
_BETA = 1 / 4
_K = 4
_GRANULARITY_S = 0.001  # G: clock granularity of time.monotonic on the platforms we run on


@dataclass
class RtoEstimator:
    """SRTT/RTTVAR/RTO per RFC 6298, bounded by const.RTO_MIN_S..RTO_MAX_S."""

    srtt_s: float | None = None
    rttvar_s: float | None = None
    rto_s: float = field(default_factory=lambda: const.RTO_INITIAL_S)
    samples: int = 0
    backoffs: int = 0
    last_rtt_s: float | None = None

    def observe(self, rtt_s: float) -> None:
        """Feed one RTT measurement (never from a retransmitted probe: Karn's rule, §3)."""
        rtt_s = max(0.0, float(rtt_s))
        if self.srtt_s is None or self.rttvar_s is None:
            self.srtt_s = rtt_s  # §2.2
            self.rttvar_s = rtt_s / 2
        else:
            self.rttvar_s = (1 - _BETA) * self.rttvar_s + _BETA * abs(self.srtt_s - rtt_s)  # §2.3
            self.srtt_s = (1 - _ALPHA) * self.srtt_s + _ALPHA * rtt_s
        self.rto_s = self._bounded(self.srtt_s + max(_GRANULARITY_S, _K * self.rttvar_s))
        self.samples += 1
        self.backoffs = 0
        self.last_rtt_s = rtt_s

    def backoff(self) -> float:
        """Double the RTO after a timeout (§5.5), bounded by RTO_MAX_S. Returns the new RTO."""
        self.rto_s = self._bounded(self.rto_s * 2)
        self.backoffs += 1
        return self.rto_s

    def restart(self) -> None:
        """A new link to the same peer: keep SRTT/RTTVAR but drop the backoff of the old one."""
        if self.srtt_s is not None and self.rttvar_s is not None:
            self.rto_s = self._bounded(self.srtt_s + max(_GRANULARITY_S, _K * self.rttvar_s))
        else:
            self.rto_s = const.RTO_INITIAL_S
        self.backoffs = 0

    def deadline_s(self, attempts: int, *, floor_s: float = 0.0) -> float:
        """Total wait of `attempts` consecutive timeouts from now, each backing off: RTO·(2^n − 1)."""
        total, rto = 0.0, max(self.rto_s, floor_s)
        for _ in range(attempts):
            total += rto
            rto = min(rto * 2, max(const.RTO_MAX_S, floor_s))
        return total

    @staticmethod
    def _bounded(value: float) -> float:
        return min(max(value, const.RTO_MIN_S), const.RTO_MAX_S)
