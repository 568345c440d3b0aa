"""What a person can do about a refused peer, in the words of the CLI (`swarmllm invite`, `join`).

Two nodes of different swarms refuse each other on every link; the node that dialled (someone gave
it the other's address: --bootstrap, a LAN find) most likely meant to join the other's swarm, and
the node that was dialled most likely meant to let it in. Shown once per refused peer: in the log
line of its first refusal, in `swarmllm swarm status`, and in the peer's last_error (`swarmllm
peers`, the GUI's peer row and report).
"""

from __future__ import annotations

from node.logs import utc_clock

from ._membership import OPEN

JOIN_THERE = "to join that device's swarm: run `swarmllm invite` on it, then `swarmllm join CODE` here"
LET_IN = "to let that device in: run `swarmllm invite` here, then `swarmllm join CODE` on it"
PEER_OPEN = "that device is in the open swarm: start this node with --open-swarm to link with it"
WE_OPEN = ("this node is in the open swarm: to join that device's swarm, start this node without "
           "--open-swarm, run `swarmllm invite` on that device, then `swarmllm join CODE` here")


def refusal_hint(*, peer_swarm: str | None, ours: str, removed: bool, dialled: bool) -> str:
    """What to do about a peer refused for being in another swarm ('' when that is not the case:
    a removed member, a stale secret or a bad proof say what they are by their reason)."""
    if removed or not peer_swarm or peer_swarm == ours:
        return ""
    if peer_swarm == OPEN:
        return PEER_OPEN
    if ours == OPEN:
        return WE_OPEN if dialled else ""
    return JOIN_THERE if dialled else LET_IN


def no_answer_since(last_seen: float, error: str) -> str:
    """A linked peer's redials time out: when it was last heard, and the likely why (before
    2026-12-06 only "ADDR: timed out"). `last_seen`: unix time of its last frame."""
    return f"no answer since {utc_clock(last_seen)} (asleep or off the network?): {error}"  # (maybe days ago)
