#!/usr/bin/env sh
# Install the SwarmLLM bundle this script sits in for the current user (no root): the folder goes
# to ~/.local/opt/swarmllm, `swarmllm` and `swarmllm-tray` to ~/.local/bin, a menu entry and its
# icon to ~/.local/share, and (unless --no-autostart) an autostart entry so the tray comes back at
# login. `install.sh --uninstall` removes all of it (your data dir and API key stay).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix="${XDG_DATA_HOME:-$HOME/.local/share}"
opt="$HOME/.local/opt/swarmllm"
bin="$HOME/.local/bin"
autostart="${XDG_CONFIG_HOME:-$HOME/.config}/autostart"
if [ "${1:-}" = "--uninstall" ]; then
  rm -rf "$opt" "$bin/swarmllm" "$bin/swarmllm-tray" "$prefix/applications/swarmllm.desktop" \
    "$prefix/icons/hicolor/256x256/apps/swarmllm.png" "$autostart/swarmllm.desktop"
  echo "SwarmLLM removed."
  exit 0
fi
[ -x "$here/swarmllm-tray" ] || { echo "run this script from the unpacked SwarmLLM folder" >&2; exit 2; }
mkdir -p "$opt" "$bin" "$prefix/applications" "$prefix/icons/hicolor/256x256/apps"
if [ "$here" != "$opt" ]; then
  rm -rf "$opt"
  cp -a "$here" "$opt"
fi
ln -sf "$opt/swarmllm" "$bin/swarmllm"
ln -sf "$opt/swarmllm-tray" "$bin/swarmllm-tray"
cp "$opt/_internal/resources/icons/swarmllm.png" "$prefix/icons/hicolor/256x256/apps/swarmllm.png"
sed "s|^Exec=.*|Exec=$opt/swarmllm-tray|" "$opt/swarmllm.desktop" > "$prefix/applications/swarmllm.desktop"
if [ "${1:-}" != "--no-autostart" ]; then
  mkdir -p "$autostart"
  cp "$prefix/applications/swarmllm.desktop" "$autostart/swarmllm.desktop"
fi
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$prefix/applications" || true
echo "SwarmLLM installed: start it from the applications menu, or run swarmllm-tray."
echo "Local apps use http://localhost:8800/v1 (API key: swarmllm-tray's menu, Copy API key)."
