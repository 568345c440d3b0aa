"""The soak with faults, short (bench/soak.py runs it long): a split model with a standby per
segment plus a model served whole, clients sending mixed requests while nodes are SIGKILLed and
restarted. Nothing is lost, every reply is llama.cpp's text, every failure is a clean OpenAI error,
and the swarm is idle afterwards."""

from __future__ import annotations

import asyncio

import pytest

from bench.soak import soak

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_short_soak_with_node_kills(tmp_path):
    lines: list[str] = []
    result = asyncio.run(soak(requests=150, clients=4, max_s=240, seed=3, chaos_every_s=(1.5, 2.5),
                              down_s=(0.5, 1.5), deadline_s=60, workdir=tmp_path, kill_at=(0.1, 0.4, 0.7),
                              targeted=1.0, out=lines.append))
    report = "\n".join(lines)
    t = result.tally
    assert t.total == 150, report
    assert t.lost == 0 and t.wrong == 0, report
    assert t.ok + t.failed == 150 and t.ok >= 100, report  # failures are clean errors (counted apart)
    assert result.kills == 3, report
    assert result.failovers >= 1, report  # a kill landed mid-request and the stream carried on
    for name, stats in result.end_stats.items():
        assert stats["kv_sessions"] == 0, (name, report)
        assert stats["in_flight"] == {"traces": 0, "pipelines": 0}, (name, report)
    assert len(result.end_stats) == 6, report  # every node answered at the end, the restarted ones too
