#!/usr/bin/env bash
# Build the Linux bundle and smoke-test it (DESIGN.md §11). Run from a checkout with the project
# installed in the active environment: pip install torch==2.13.0 && pip install -e '.[gui,package]'
#
#   packaging/build_linux.sh            -> dist/swarmllm/ and dist/swarmllm-linux-<arch>.tar.gz
#
# The tarball unpacks to a `swarmllm/` folder: double-click `swarmllm-tray` to run it in place, or
# `install.sh` to install it for the user (menu entry, autostart, ~/.local/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/swarmllm.spec
cp packaging/linux/install.sh packaging/linux/swarmllm.desktop dist/swarmllm/
tarball="dist/swarmllm-linux-$(uname -m).tar.gz"
tar -C dist -czf "$tarball" swarmllm
echo "built $tarball ($(du -h "$tarball" | cut -f1))"
python packaging/smoke.py dist/swarmllm
