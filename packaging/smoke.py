"""Smoke-test a built bundle (DESIGN.md §11): both programs start from the bundle alone, serve the
embedded default model on a free port, answer a chat completion, and stop cleanly on SIGTERM.

    python packaging/smoke.py dist/swarmllm

Runs each program with its own data dir and ports, with a clean environment (no PYTHONPATH, no
virtualenv on PATH), so nothing from the source checkout can stand in for the bundle. Prints what
it measured (bundle size, seconds to ready, the reply and its headers) and exits 0 only if every
check passed. POSIX only as it stands: it stops the programs with SIGTERM and expects the node's
clean-shutdown line (on Windows that signal is TerminateProcess; a Windows port would ask the
node to stop another way).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_DEADLINE_S = 180.0
STOP_DEADLINE_S = 30.0
QUESTION = "What does os.path.join do?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dir_size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if "venv" not in p and ".venv" not in p)
    env.update(extra)
    return env


def wait_ready(proc: subprocess.Popen, base: str, deadline_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if proc.poll() is not None:
            raise SystemExit(f"FAIL: exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base + "/health/ready", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise SystemExit(f"FAIL: not ready within {deadline_s:.0f} s")


def chat(base: str, key: str) -> tuple[dict, dict]:
    req = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 48,
            "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r), dict(r.headers)


def start_xvfb() -> tuple[subprocess.Popen, str] | None:
    """A virtual X server for the tray app's real (xcb) window, if Xvfb is installed."""
    xvfb = shutil.which("Xvfb")
    if xvfb is None or sys.platform != "linux":
        return None
    n = next(i for i in range(90, 200) if not Path(f"/tmp/.X11-unix/X{i}").exists())
    proc = subprocess.Popen([xvfb, f":{n}", "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not Path(f"/tmp/.X11-unix/X{n}").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            return None
        time.sleep(0.05)
    return proc, f":{n}"


def check(program: Path, name: str, env_extra: dict[str, str], extra_args: tuple[str, ...] = ()) -> bool:
    port, peer_port = free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix=f"smoke-{name}-"))
    log_path = data / "stdout.log"
    args = [str(program), *(["run"] if name == "swarmllm" else []), "-p", str(port), "--peer-port", str(peer_port),
            "--data-dir", str(data), "--no-mdns", *extra_args]
    print(f"== {name}: {' '.join(args)}")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=clean_env(env_extra),
                                cwd=tempfile.gettempdir())
        try:
            base = f"http://127.0.0.1:{port}"
            ready_s = wait_ready(proc, base, READY_DEADLINE_S)
            key = (data / "api_key").read_text().strip()
            reply, headers = chat(base, key)
            text = reply["choices"][0]["message"]["content"]
            print(f"ready in {ready_s:.1f} s; reply ({reply['usage']['completion_tokens']} tokens): {text!r}")
            print(f"x-swarm-route: {headers.get('x-swarm-route')}; server-timing: {headers.get('server-timing')}")
            ok = bool(text.strip()) and headers.get("x-swarm-route") == "local"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                print(f"FAIL: {name} did not stop within {STOP_DEADLINE_S:.0f} s of SIGTERM")
                ok = False
    logged = log_path.read_text(errors="replace") + "".join(
        p.read_text(errors="replace") for p in data.glob("*.log"))
    stopped = "node stopped" in logged
    qt_trouble = [ln for ln in logged.splitlines() if "qt.qpa" in ln or "Could not load the Qt platform plugin" in ln]
    print(f"exit code {code}; 'node stopped' logged: {stopped}; Qt platform warnings: {len(qt_trouble)}")
    for line in qt_trouble[:5]:
        print("   ", line)
    return ok and code == 0 and stopped and not qt_trouble


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle", nargs="?", default="dist/swarmllm", help="the folder PyInstaller made")
    args = ap.parse_args()
    bundle = Path(args.bundle).resolve()
    exe = ".exe" if sys.platform == "win32" else ""
    cli, tray = bundle / f"swarmllm{exe}", bundle / f"swarmllm-tray{exe}"
    for program in (cli, tray):
        if not program.exists():
            print(f"FAIL: {program} is missing")
            return 1
    print(f"bundle {bundle}: {dir_size_mb(bundle):.0f} MB")
    results = {
        "swarmllm": check(cli, "swarmllm", {}),
        # the tray app with Qt's offscreen platform: no display needed, same node inside
        "swarmllm-tray (offscreen)": check(tray, "swarmllm-tray", {"QT_QPA_PLATFORM": "offscreen"}),
    }
    xvfb = start_xvfb()
    if xvfb is not None:  # a real X display: the bundled xcb plugin and its libraries, window open
        try:
            results["swarmllm-tray (X11 window)"] = check(tray, "swarmllm-tray", {"DISPLAY": xvfb[1]}, ("--show",))
        finally:
            xvfb[0].terminate()
            xvfb[0].wait(10)
    else:
        print("(no Xvfb: the X11 window check is skipped)")
    for name, ok in results.items():
        print(f"{name}: {'PASS' if ok else 'FAIL'}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
