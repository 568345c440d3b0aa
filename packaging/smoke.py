"""Smoke-test a built bundle (DESIGN.md §11): both programs start from the bundle alone, serve the
embedded default model on a free port, answer a chat completion, and stop cleanly on SIGTERM.
`swarmllm` also answers what users rely on beyond a chat: a forced tool call and a json_schema
reply (llguidance, the Jinja chat template), embeddings, Anthropic's /v1/messages, `diagnostics`,
`invite` and `download --list`; it serves the default model as a slice of all its layers on the
compiled int8 kernel (diagnostics must name qgemm, not a fallback); and every subcommand the
checkout's CLI has answers --help from the bundle (a module the spec missed is skipped silently
by node/cli.build_parser, so the bundle's list is compared with the checkout's).

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


def request(base: str, key: str, path: str, body: dict | None = None, headers: dict[str, str] | None = None,
            timeout: float = 120) -> tuple[dict, dict]:
    """(JSON reply, headers) of a GET (no body) or a JSON POST; an HTTP error ends in its body."""
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r), dict(r.headers)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{path}: HTTP {exc.code} {exc.read()[:500]!r}") from None


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


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
                                                  "sure": {"type": "boolean"}},
                 "required": ["answer", "sure"], "additionalProperties": False}


def run_cli(program: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The bundled `swarmllm` with a clean environment, cwd elsewhere."""
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=timeout,
                          env=clean_env({}), cwd=tempfile.gettempdir())


def passed(what: str, ok: bool, detail: str = "") -> bool:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""))
    return ok


def _attempt(what: str, fn) -> bool:
    """fn() -> (ok, detail); an exception is a failure with its message."""
    try:
        ok, detail = fn()
    except Exception as exc:  # noqa: BLE001 (every failure is reported, the next check still runs)
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return passed(what, ok, detail)


def api_features(program: Path):
    """The node's API beyond a plain chat, and the client subcommands, against the bundled node."""
    def run(base: str, key: str, port: int, data: Path) -> bool:
        model = request(base, key, "/v1/models")[0]["data"][0]["id"]
        chat_body = {"model": model, "max_tokens": 64, "temperature": 0}

        def tool_call():
            body = {**chat_body, "messages": [{"role": "user", "content": "Weather in Paris?"}],
                    "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
            msg = request(base, key, "/v1/chat/completions", body)[0]["choices"][0]["message"]
            call = (msg.get("tool_calls") or [{}])[0].get("function", {})
            args = json.loads(call.get("arguments", "null"))
            return call.get("name") == "get_weather" and isinstance(args, dict) and "city" in args, json.dumps(call)

        def json_schema():
            body = {**chat_body, "max_tokens": 96, "messages": [{"role": "user", "content": "Is Python typed? JSON."}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER_SCHEMA,
                                                                                "strict": True}}}
            text = request(base, key, "/v1/chat/completions", body)[0]["choices"][0]["message"]["content"]
            reply = json.loads(text)
            return set(reply) == {"answer", "sure"} and isinstance(reply["sure"], bool), text

        def embeddings():
            reply = request(base, key, "/v1/embeddings", {"model": model, "input": ["os.path.join", "a list"]})[0]
            vecs = [d["embedding"] for d in reply["data"]]
            return len(vecs) == 2 and len(vecs[0]) > 0 and len(vecs[0]) == len(vecs[1]), f"2 x {len(vecs[0])} floats"

        def messages():
            body = {"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": QUESTION}]}
            reply = request(base, key, "/v1/messages", body, {"x-api-key": key, "anthropic-version": "2023-06-01"})[0]
            text = "".join(b.get("text", "") for b in reply["content"] if b["type"] == "text")
            return reply["type"] == "message" and bool(text.strip()), repr(text[:60])

        node = ("-p", str(port), "--data-dir", str(data))

        def cli(*args: str, expect: str):
            done = run_cli(program, *args, *node)
            out = (done.stdout + done.stderr).strip()
            if done.returncode != 0:
                return False, f"exit {done.returncode}: {out[-300:]}"
            return expect in out, (out.splitlines() or [""])[0][:100]

        return all([
            _attempt("forced tool call (llguidance, Jinja template)", tool_call),
            _attempt("json_schema response_format", json_schema),
            _attempt("/v1/embeddings", embeddings),
            _attempt("Anthropic /v1/messages", messages),
            _attempt("swarmllm diagnostics", lambda: cli("diagnostics", expect="SwarmLLM diagnostics")),
            _attempt("swarmllm invite", lambda: cli("invite", expect="swarmllm1-")),
            _attempt("swarmllm download --list", lambda: cli("download", "--list", expect="")),
            _attempt("swarmllm models", lambda: cli("models", expect=model)),
        ])
    return run


def slice_kernel(program: Path):
    """The default model served as a slice of every layer: the compiled int8 kernel (qgemm) is loaded."""
    def run(base: str, key: str, port: int, data: Path) -> bool:
        def kernels():
            done = run_cli(program, "diagnostics", "-p", str(port), "--data-dir", str(data))
            lines = [ln for ln in done.stdout.splitlines() if "kernels:" in ln]
            ok = done.returncode == 0 and any(ln.startswith("int8 kernels: qgemm (") for ln in lines) \
                and any(ln.startswith("slice kernels: int8 qgemm") for ln in lines)
            return ok, " | ".join(lines) or done.stdout[-300:] + done.stderr[-300:]
        return _attempt("slice on the compiled qgemm kernel (diagnostics)", kernels)
    return run


def subcommand_helps(program: Path) -> bool:
    """Every subcommand of the checkout's CLI is in the bundle and answers --help."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from node.cli import build_parser

    expected = sorted(next(a for a in build_parser()._actions if a.dest == "command").choices)
    print(f"== swarmllm --help, and --help of {len(expected)} subcommands")

    def listed():
        out = run_cli(program, "--help").stdout
        absent = [c for c in expected if f"    {c}" not in out]
        return not absent, f"missing {absent}" if absent else f"{len(expected)} listed"

    def helps(command: str):
        done = run_cli(program, command, "--help")
        return done.returncode == 0 and f"usage: swarmllm {command}" in done.stdout, \
            f"exit {done.returncode}" + (f": {done.stderr.strip()[-300:]}" if done.returncode else "")

    results = [_attempt("swarmllm --help lists them all", listed)]
    results += [_attempt(f"swarmllm {c} --help", lambda c=c: helps(c)) for c in expected]
    return all(results)


def default_model_layers(bundle: Path) -> tuple[Path, int]:
    """The bundled default model and its layer count."""
    import gguf

    path = next((bundle / "_internal" / "resources" / "models").glob("*.gguf"))
    fields = gguf.GGUFReader(path).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    return path, int(fields[f"{arch}.block_count"].parts[-1][0])


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


def check(program: Path, name: str, env_extra: dict[str, str], extra_args: tuple[str, ...] = (),
          more=None, route: str = "local") -> bool:
    """Start `program`, wait for ready, chat (the reply's route must be `route`), run `more(base, key,
    port, data)` (returns whether its checks passed) and stop it with SIGTERM."""
    port, peer_port = free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix=f"smoke-{name}-"))
    log_path = data / "stdout.log"
    args = [str(program), *([] if name.startswith("swarmllm-tray") else ["run"]), "-p", str(port), "--peer-port", str(peer_port),
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
            ok = bool(text.strip()) and headers.get("x-swarm-route") == route
            if more is not None:
                ok = more(base, key, port, data) and ok
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
    ok = ok and code == 0 and stopped and not qt_trouble
    if ok:
        shutil.rmtree(data, ignore_errors=True)
    else:
        print(f"(its data dir and logs are kept: {data})")
    return ok


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
    model, n_layers = default_model_layers(bundle)
    results = {
        "subcommands --help": subcommand_helps(cli),
        "swarmllm": check(cli, "swarmllm", {}, more=api_features(cli)),
        # the slice engine in the bundle: one node serving every layer, the distributed route
        "swarmllm (slice of every layer)": check(
            cli, "swarmllm-slice", {}, ("--model", str(model), "--no-default-model", "--layers", f"0-{n_layers - 1}"),
            more=slice_kernel(cli), route="distributed"),
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
