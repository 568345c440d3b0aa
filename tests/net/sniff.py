"""Capture every frame on every interface of the current network namespace into a file.

    python -m tests.net.sniff OUT     (root; stops on SIGTERM)

Used inside the relay's namespace to show that what crosses the relay's wires is ciphertext.
"""

from __future__ import annotations

import signal
import socket
import sys

ETH_P_ALL = 0x0003


def main() -> None:
    """Capture until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    with open(sys.argv[1], "wb") as out:
        print("sniffing", flush=True)
        while True:
            out.write(sock.recv(65536))
            out.flush()


if __name__ == "__main__":
    main()
