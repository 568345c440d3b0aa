#!/usr/bin/env sh
# Install the SwarmLLM bundle this script sits in for the current user (no root): the folder goes
# to ~/.local/opt/swarmllm, `swarmllm` and `swarmllm-tray` to ~/.local/bin, a menu entry and its
# icon to ~/.local/share, and (unless --no-autostart) an autostart entry so the tray comes back at
# login. `install.sh --uninstall` removes all of it (your data dir and API key stay).
set -eu
here=$(cd "$(dirname "$0")" && pwd -P)
prefix="${XDG_DATA_HOME:-$HOME/.local/share}"
opt="$HOME/.local/opt/swarmllm"
bin="$HOME/.local/bin"
autostart="${XDG_CONFIG_HOME:-$HOME/.config}/autostart"

# remove a command link only if it is ours (a pip --user `swarmllm` stays)
unlink_ours() {
  if [ -L "$1" ]; then
    case "$(readlink "$1")" in "$opt"/*) rm -f "$1" ;; esac
  fi
}

if [ "${1:-}" = "--uninstall" ]; then
  unlink_ours "$bin/swarmllm"
  unlink_ours "$bin/swarmllm-tray"
  rm -f "$prefix/applications/swarmllm.desktop" "$prefix/icons/hicolor/256x256/apps/swarmllm.png" \
    "$autostart/swarmllm.desktop"
  rm -rf "$opt"
  echo "SwarmLLM removed."
  exit 0
fi
[ -x "$here/swarmllm-tray" ] || { echo "run this script from the unpacked SwarmLLM folder" >&2; exit 2; }
mkdir -p "$(dirname "$opt")" "$bin" "$prefix/applications" "$prefix/icons/hicolor/256x256/apps"
if [ ! "$here" -ef "$opt" ]; then  # (re)installing from an unpacked copy: replace in one step
  rm -rf "$opt.new"
  cp -a "$here" "$opt.new"
  rm -rf "$opt.old"
  if [ -e "$opt" ]; then mv "$opt" "$opt.old"; fi
  mv "$opt.new" "$opt"
  rm -rf "$opt.old"
fi
for name in swarmllm swarmllm-tray; do
  if [ -e "$bin/$name" ] && [ ! -L "$bin/$name" ]; then
    echo "note: $bin/$name exists and is not ours; left as it is (run $opt/$name)" >&2
  else
    ln -sf "$opt/$name" "$bin/$name"
  fi
done
cp "$opt/_internal/resources/icons/swarmllm.png" "$prefix/icons/hicolor/256x256/apps/swarmllm.png"
# Exec: the path quoted (the desktop entry spec), so a home folder with spaces works
sed "s|^Exec=.*|Exec=\"$opt/swarmllm-tray\"|" "$opt/swarmllm.desktop" > "$prefix/applications/swarmllm.desktop"
if [ "${1:-}" != "--no-autostart" ]; then
  mkdir -p "$autostart"
  cp "$prefix/applications/swarmllm.desktop" "$autostart/swarmllm.desktop"
fi
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$prefix/applications" || true
echo "SwarmLLM installed: start it from the applications menu, or run swarmllm-tray."
echo "Local apps use http://localhost:8800/v1 (API key: swarmllm-tray's menu, Copy API key)."
