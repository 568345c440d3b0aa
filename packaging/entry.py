"""Entry point of both bundled programs: `swarmllm` (the CLI and headless node) and `swarmllm-tray`
(the desktop app). One script, two executables built from it (swarmllm.spec): which one runs is
decided by the executable's name."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    if Path(sys.executable).stem.lower().startswith("swarmllm-tray"):
        from app.main import main as tray_main

        return tray_main()
    from node.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
