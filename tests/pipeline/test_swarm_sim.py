"""bench/swarm_sim.py runs the node's own layer choice and planner over a simulated swarm: a short
run prints its figures, every layer stays held, and the planner's chain is never worse than the
best chain over the same placement (a lower bound the sim computes independently)."""

from __future__ import annotations

import re
import sys

from tests.support.processes import REPO


def test_a_short_simulation_prints_its_figures(capsys):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import swarm_sim
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert swarm_sim.main(["--nodes", "30", "--layers", "24", "--minutes", "12", "--warmup", "2",
                           "--plan-every", "30"]) == 0
    out = capsys.readouterr().out
    assert "cpu: " in out
    cover1 = float(re.search(r"every layer >=1 holder: ([\d.]+)%", out).group(1))
    assert cover1 >= 99.0, out
    found, samples = (int(x) for x in re.search(r"found in (\d+)/(\d+) samples", out).groups())
    assert samples > 0 and found == samples, out
    ratio_max = float(re.search(r"planned / best\(placed\): median [\d.]+ p95 [\d.]+ max ([\d.]+)", out).group(1))
    assert ratio_max >= 0.999, out  # the planner can never beat the lower bound
    assert ratio_max <= 1.10, out
