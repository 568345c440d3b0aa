"""The swarm every test node belongs to (one per test session), unless a test makes its own.

Nodes refuse peers outside their swarm; a test that starts several nodes puts them all in this
one, as a user would with invites (tests/net/test_membership.py covers invites themselves)."""

from __future__ import annotations

from pathlib import Path

from node.net import Swarm, write_swarm_file
from node.net._membership import SWARM_FILE

TEST_SWARM = Swarm.create()


def join_test_swarm(data_dir: Path, swarm: Swarm = TEST_SWARM) -> Path:
    """Make the node of data_dir a member of `swarm` (unless it already has a swarm file)."""
    data_dir = Path(data_dir)
    if not (data_dir / SWARM_FILE).exists():
        write_swarm_file(data_dir, swarm)
    return data_dir
