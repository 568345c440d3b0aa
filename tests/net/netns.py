"""Network namespaces for LAN tests (root only): created with `ip`, always deleted."""

from __future__ import annotations

import os
import shutil
import subprocess


def netns_unavailable() -> str | None:
    """Why namespace tests cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    probe = f"swprobe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Namespaces:
    """Named namespaces with a per-test prefix; `close()` deletes them all (and their links)."""

    def __init__(self, tag: str):
        self.prefix = f"sw{os.getpid() % 100000}{tag}"
        self.names: list[str] = []

    def add(self, short: str) -> str:
        """Create namespace <prefix><short> with loopback up."""
        name = self.prefix + short
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # leftovers of a crash
        self.run_host("ip", "netns", "add", name)
        self.names.append(name)
        self.run(name, "ip", "link", "set", "lo", "up")
        return name

    @staticmethod
    def run_host(*cmd: str) -> None:
        """Run a command in the root namespace; raise with its stderr on failure."""
        result = subprocess.run(list(cmd), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip()}")

    def run(self, ns: str, *cmd: str) -> None:
        """Run a command inside a namespace."""
        self.run_host("ip", "netns", "exec", ns, *cmd)

    def veth(self, ns_a: str, if_a: str, ns_b: str, if_b: str) -> None:
        """A veth pair with one end in each namespace (created in the first, one end moved)."""
        self.run(ns_a, "ip", "link", "add", if_a, "type", "veth", "peer", "name", if_b)
        self.run(ns_a, "ip", "link", "set", if_b, "netns", ns_b)
        self.run(ns_a, "ip", "link", "set", if_a, "up")
        self.run(ns_b, "ip", "link", "set", if_b, "up")

    def address(self, ns: str, ifname: str, cidr: str) -> None:
        """Assign an address."""
        self.run(ns, "ip", "addr", "add", cidr, "dev", ifname)

    def close(self) -> None:
        """Delete every namespace created (veths and bridges inside go with them)."""
        for name in reversed(self.names):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.names.clear()
