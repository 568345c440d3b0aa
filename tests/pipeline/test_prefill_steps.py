"""How a chain's prefill is cut into WORK steps (`run.prefill_steps`)."""

from __future__ import annotations

import pytest

from node import const
from node.inference.pipeline.run import prefill_steps

CHUNK, MIN = const.PREFILL_CHUNK_TOKENS, const.PIPELINE_MIN_CHUNK_TOKENS


@pytest.mark.parametrize("segments", [1, 2, 3, 5])
@pytest.mark.parametrize("start", [0, 17])
@pytest.mark.parametrize("n", [1, MIN - 1, MIN, 2 * MIN - 1, 2 * MIN, 3 * MIN + 5, CHUNK, CHUNK + 1, 747, 2000])
def test_steps_cover_the_prefill_in_order_within_the_chunk(segments, start, n):
    steps = prefill_steps(start, start + n, segments)
    assert steps[0][0] == start and steps[-1][1] == start + n
    assert all(a < b for a, b in steps)
    assert all(b == a2 for (_, b), (a2, _) in zip(steps[:-1], steps[1:], strict=True))  # contiguous
    sizes = [b - a for a, b in steps]
    assert max(sizes) <= CHUNK and max(sizes) - min(sizes) <= 1  # equal steps, no runt
    k = len(steps)
    assert k == max(-(-n // CHUNK), min(segments, n // MIN), 1)
    if k > -(-n // CHUNK):  # cut for the segments' overlap: every step keeps MIN rows
        assert k <= segments and min(sizes) >= MIN


def test_a_short_turn_is_one_step_and_a_long_one_one_per_segment():
    assert prefill_steps(1009, 1071, 3) == [(1009, 1071)]  # 62 rows: cut, they would fall to 16-bit products
    assert prefill_steps(0, 244, 3) == [(0, 82), (82, 163), (163, 244)]
    assert prefill_steps(0, 244, 1) == [(0, 244)]  # one segment: nothing to overlap
    assert prefill_steps(0, 747, 3) == [(0, 249), (249, 498), (498, 747)]
    assert prefill_steps(5, 5, 3) == []
