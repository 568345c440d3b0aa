"""Entry point of both bundled programs: `swarmllm` (the CLI and headless node) and `swarmllm-tray`
(the desktop app). One script, two executables built from it (swarmllm.spec): which one runs is
decided by the executable's name."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def ensure_std_streams() -> None:
    """A windowed executable (the tray on Windows, the .app on macOS) starts without stdout and
    stderr; llama.cpp's quiet mode duplicates file descriptors 1 and 2, and logging writes to
    sys.stderr. Point whatever is missing at the null device."""
    if sys.stdout is not None and sys.stderr is not None:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.dup2(null, fd)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (lives as long as the process)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


def main() -> int:
    ensure_std_streams()
    if Path(sys.executable).stem.lower().startswith("swarmllm-tray"):
        from app.main import main as tray_main

        return tray_main()
    from node.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
