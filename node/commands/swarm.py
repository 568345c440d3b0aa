"""Swarm membership from the command line: invite, join, swarm (status | leave | remove NODE_ID).

All of them talk to the running node over its admin API (the node holds the swarm). An invite code
is printed once, to stdout only: it admits one device, so treat it like a password until it is used
or expires.
"""

from __future__ import annotations

import argparse
import json
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register invite, join and swarm."""
    from node.cli import add_node_options

    p = sub.add_parser("invite", help="print a one-time code that lets another device join this swarm")
    add_node_options(p)
    p.add_argument("--hours", type=float, default=24.0, help="how long the code stays valid (default 24)")
    p.set_defaults(func=invite)

    p = sub.add_parser("join", help="join the swarm of the device that made CODE (leaves the current one)")
    add_node_options(p)
    p.add_argument("code", help="the invite code (swarmllm1-…)")
    p.set_defaults(func=join)

    p = sub.add_parser("swarm", help="this node's swarm: status, leave, remove a member")
    add_node_options(p)
    p.add_argument("action", nargs="?", choices=("status", "leave", "remove"), default="status")
    p.add_argument("node_id", nargs="?", help="remove: the member's node id (or an unambiguous prefix)")
    p.add_argument("--json", action="store_true", help="status as raw JSON")
    p.set_defaults(func=swarm)


def _client(args):
    from node.commands.client import NodeClient

    return NodeClient(args)


def invite(args: argparse.Namespace) -> int:
    if not 1 / 60 <= args.hours <= 30 * 24:  # what the node accepts (ttl_s 60 s .. 30 days), in hours
        raise SystemExit("error: --hours must be from 0.017 (one minute) to 720 (30 days)")
    out = json.loads(_client(args).request("POST", "/api/admin/swarm/invite", {"ttl_s": args.hours * 3600}))
    left_min = max(0, round((out["expires_at"] - time.time()) / 60))
    valid = f"{left_min} min" if left_min < 90 else f"{left_min / 60:.3g} h"
    print(out["code"])
    print(f"(valid for {valid}, for one device: on it, run swarmllm join <code>)")
    return 0


def join(args: argparse.Namespace) -> int:
    out = json.loads(_client(args).request("POST", "/api/admin/swarm/join", {"code": args.code}))
    print(f"joined swarm {out['swarm']}")
    return 0


def swarm(args: argparse.Namespace) -> int:
    if args.node_id and args.action != "remove":
        # 2026-12-07: `swarmllm swarm leave NODE_ID` (meant: make that node leave) ignored the id and took
        # this node out of its swarm, which only a new invite undoes
        hint = f" (to take a member out of the swarm: swarmllm swarm remove {args.node_id})" \
            if args.action == "leave" else " (`swarmllm peers` lists each peer's state)"  # (r77: not for status)
        raise SystemExit(f"error: swarm {args.action} takes no node id{hint}")
    client = _client(args)
    if args.action == "leave":
        out = json.loads(client.request("POST", "/api/admin/swarm/leave", {}))
        print(f"left; this node is now alone in a new private swarm {out['swarm']}")
        return 0
    if args.action == "remove":
        if not args.node_id:
            raise SystemExit("error: swarm remove needs the member's node id")
        out = json.loads(client.request("POST", "/api/admin/swarm/remove", {"node_id": args.node_id}))
        print(f"removed {args.node_id[:8]}; the new swarm secret went to {out['members_told']} linked member(s)")
        return 0
    status = json.loads(client.request("GET", "/api/admin/swarm"))
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"swarm: {status['swarm']}" + (" (open: any node that opted in may link)" if status["open"] else
                                         f" (private, epoch {status['epoch']})"))
    print(f"members connected: {status['members_connected']}  open invites: {status['invites_open']}  "
          f"removed: {status['removed']}")
    for m in status.get("members", []):
        when = "connected" if m["connected"] else f"last linked {_ago(m['last_linked_s_ago'])} ago"
        print(f"  member {m['peer']} ({when})")
    for r in status["refused"]:
        who = "refused by us" if r["by_us"] else "refused us"
        print(f"  {r['peer']} {who} (swarm {r['swarm'] or '-'}) x{r['count']}, last {r['last_s_ago']:.0f} s ago"
              + (f": {r['reason'].removeprefix('refused us: ')}" if r.get("reason") else ""))
        if r.get("hint"):
            print(f"    {r['hint']}")
    return 0


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
