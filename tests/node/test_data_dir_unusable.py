"""`swarmllm run --data-dir X` where X cannot be the data dir (a file; a path under a file; read-only
or not writable): one error line naming the dir and what to do, exit 2; not an OSError traceback
from opening node.log."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO, hermetic_env


def _run(data_dir):
    return subprocess.run([sys.executable, "-m", "node.cli", "run", "-p", "0", "--data-dir", str(data_dir),
                           "--no-mdns", "--no-default-model"], cwd=REPO, env=hermetic_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_data_dir_that_cannot_be_one(tmp_path, where):
    (tmp_path / "afile").write_text("not a directory\n")
    data_dir = tmp_path / "afile" if where == "file" else tmp_path / "afile" / "sub"
    out = _run(data_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert str(data_dir) in lines[0] and "--data-dir" in lines[0], lines
