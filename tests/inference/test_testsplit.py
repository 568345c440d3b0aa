"""`swarmllm test-split`: output format and exit codes (marker: llama)."""

from __future__ import annotations

import pytest

from node.cli import main
from node.inference.synth import SynthSpec
from tests.inference.conftest import needs_llama

pytestmark = [pytest.mark.llama, needs_llama]
SPEC = SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=320, n_layers=3)


def test_passes_and_prints_one_line_per_position(synth_model, capsys):
    path = synth_model(SPEC)
    assert main(["test-split", str(path), "--slices", "3", "--tokens", "8", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(line.startswith("pos=") for line in lines) == 8
    assert lines[-2].startswith("PASS")
    assert lines[-1].startswith("max_abs_logit_diff=")
    assert lines[-1].endswith("greedy_match=8/8 slices=3")


def test_mismatch_beyond_tolerance_exits_non_zero(synth_model, capsys):
    path = synth_model(SPEC)
    argv = ["test-split", str(path), "--slices", "2", "--tokens", "4", "--threads", "1", "--dtype", "int8"]
    assert main([*argv, "--tolerance", "0"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-2].startswith("FAIL")


def test_unusable_requests_exit_2(synth_model, capsys):
    path = synth_model(SPEC)
    assert main(["test-split", str(path), "--slices", "9"]) == 2
    assert "cannot split 3 layers into 9 slices" in capsys.readouterr().err
