"""Screenshots of the real window, one per tab, taken on an X server (Xvfb when there is no display).

    python -m app.screenshots [--out docs/screenshots] [--model PATH]

Starts Xvfb if $DISPLAY is unset (Debian: `apt-get install xvfb libxcb-cursor0`), runs the app on
the xcb platform with a throwaway data dir and a free port, in a 3-node swarm on loopback: nodes B
and C serve layers 0-3 and 2-4 of an 8-layer model fetched from a local origin (partial model
files), leaving layers 5-7 a gap (the first Swarm shot); the app's node then helps serve that
model through the Swarm tab's controls, takes the gap, and a request runs on the chain B → C or
B → this node, drawn over the map (the second Swarm shot). A chat in the Chat tab and a few API
requests fill the other tabs; then the first-run state (no model) and the tray icon looks. The
models are small random-weight GGUFs (their replies are gibberish; their traces are real).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCREEN = "1280x800x24"


def _free_display() -> int:
    for n in range(90, 200):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            return n
    raise RuntimeError("no free X display number")


@contextlib.contextmanager
def x_display():
    """Use $DISPLAY, or start a private Xvfb for the duration."""
    if os.environ.get("DISPLAY"):
        yield os.environ["DISPLAY"]
        return
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        raise SystemExit("no $DISPLAY and no Xvfb: apt-get install xvfb (or run under a desktop)")
    n = _free_display()
    proc = subprocess.Popen([xvfb, f":{n}", "-screen", "0", SCREEN, "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"Xvfb :{n} did not start")
            time.sleep(0.05)
        yield f":{n}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _async_until(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not reach the expected state")
        await asyncio.sleep(0.05)


async def _settle() -> None:
    """Let Qt lay out and paint while the loop idles (a picture, not a test: the pause is the point).

    Never QApplication.processEvents() inside a coroutine: under qasync it would run other tasks
    re-entrantly ("Cannot enter into task ... while another task is being executed").
    """
    await asyncio.sleep(0.5)


def _grab(window, path: Path) -> None:
    from PySide6.QtGui import QGuiApplication

    screen = QGuiApplication.primaryScreen()
    pixmap = screen.grabWindow(window.winId())  # pixels from the X server: the real window
    if pixmap.isNull() or pixmap.width() < 50:
        pixmap = window.grab()
    if not pixmap.save(str(path)):
        raise OSError(f"could not save {path}")
    print(path)


class _Origin:
    """A local HTTP origin with Range and an ETag: where the swarm's nodes fetch the split model's
    layers (as a real model host would serve them)."""

    def __init__(self, path: Path, bytes_per_s: int | None = None):
        import http.server
        import threading

        data, name = path.read_bytes(), path.name

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != f"/{name}":
                    self.send_error(404)
                    return
                first, last, status = 0, len(data) - 1, 200
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes=") and self.headers.get("If-Range") in (None, '"v1"'):
                    a, _, b = rng[6:].partition("-")
                    first, last, status = int(a), min(int(b) if b else len(data) - 1, len(data) - 1), 206
                self.send_response(status)
                self.send_header("ETag", '"v1"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(last - first + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
                self.end_headers()
                step = bytes_per_s // 10 if bytes_per_s else last + 1 - first
                for at in range(first, last + 1, step):  # at bytes_per_s when given: a download in progress
                    try:
                        self.wfile.write(data[at:min(at + step, last + 1)])
                    except OSError:  # the client went (a cancelled download)
                        return
                    if bytes_per_s:
                        time.sleep(0.1)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{name}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _demo_models(work: Path) -> dict[str, Path]:
    """Small random-weight GGUFs: one split across the swarm (~5 MB a layer as int8 slices: a
    budget of a few tens of MB takes a few layers), two served whole."""
    from node.inference.synth import SynthSpec, write_gguf

    specs = {
        "split": ("qwen2-demo-f16.gguf", SynthSpec(arch="qwen2", n_layers=8, hidden=512, n_heads=8, n_kv_heads=2,
                                                   ffn=1536, n_ctx=2048, qtype="F16", name="qwen2-demo")),
        "whole": ("tinyllama-demo-q8_0.gguf", SynthSpec(n_layers=4, hidden=128, n_heads=4, n_kv_heads=2, ffn=256,
                                                        n_ctx=2048, qtype="Q8_0", name="tinyllama-demo")),
        "spare": ("phi3-demo-q4_0.gguf", SynthSpec(arch="phi3", n_layers=4, hidden=128, n_heads=4, n_kv_heads=4,
                                                   ffn=256, n_ctx=2048, qtype="Q4_0", name="phi3-demo")),
    }
    (work / "a" / "models").mkdir(parents=True)
    out = {}
    for role, (name, spec) in specs.items():
        # whole models live in the app node's models dir; the split one is the origin's
        path = (work / "a" / "models" / name) if role != "split" else (work / name)
        write_gguf(path, spec)
        out[role] = path
    return out


async def _async_requests(app, split_name: str | None) -> None:
    """A few requests through the API: to the whole models, and to the split model when it is served
    (its chain is drawn on the Swarm tab's map); one too long, so a failure shows."""
    import openai

    node = app.node
    client = openai.AsyncOpenAI(base_url=node.api_url, api_key=node.api_key, max_retries=0)
    whole = [m.id for m in node.models.whole_models() if m.state == "loaded"]
    try:
        asks = [(whole[0], "Write a haiku about peers."), (whole[-1], "def fibonacci(n):")]
        if split_name:
            asks = [(split_name, "What is a GGUF file?"), (split_name, "Name three prime numbers.")]
        for i, (model, prompt) in enumerate(asks):
            messages = [{"role": "user", "content": prompt}]
            if i == 1:
                stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=32,
                                                              stream=True)
                async for _chunk in stream:
                    pass
            else:
                await client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                                     temperature=0.7, seed=i)
        if not split_name:
            with contextlib.suppress(openai.APIError):  # shows a failed request in the table
                await client.chat.completions.create(model=whole[0], max_tokens=100_000,
                                                     messages=[{"role": "user", "content": "too long"}])
    finally:
        await client.close()


async def _async_chat(window, model_id: str) -> None:
    """One turn in the Chat tab with the split model (its route badge says distributed)."""
    chat = window.chat_tab
    chat.refresh_models()
    chat.picker.setCurrentText(model_id)
    task = chat.send("Which layers does each node hold?")
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 120)


async def _async_shoot(out: Path, model_arg: Path | None) -> None:
    from app.host import AppState
    from app.tray_app import TrayApp
    from node.config import NodeConfig
    from node.net import Swarm, write_swarm_file
    from node.node import Node
    from node.resources import default_model_path

    members = Swarm.create()  # the screenshot swarm: three nodes as if invited

    def config(data_dir: Path, models: list[Path], **extra) -> NodeConfig:
        write_swarm_file(data_dir, members)
        return NodeConfig(data_dir=data_dir, port=_free_port(), models=[str(m) for m in models],
                          log_to_file=False, n_threads=1, mdns=False, peer_host="127.0.0.1", **extra)

    with tempfile.TemporaryDirectory(prefix="swarmllm-shots-") as tmp:
        work = Path(tmp)
        demo = _demo_models(work)
        if model_arg is not None:
            (work / "a" / "models" / model_arg.name).symlink_to(model_arg)  # resolved in main()
        origin, slow = _Origin(demo["split"]), None
        peers: list[Node] = []
        # The app's node: whole models from its models dir (+ the default model when present) and
        # nothing of the split model; B and C serve layers 0-3 and 2-4 of it from the origin.
        app = TrayApp(config(work / "a", [], include_default_model=default_model_path().is_file()),
                      show_window=True)
        task = asyncio.ensure_future(app.async_run())
        try:
            await _async_until(lambda: app.host.state == AppState.SERVING)
            for name, layers in (("b", "0-3"), ("c", "2-4")):
                peer = Node(config(work / name, [origin.url], layers=layers, include_default_model=False,
                                   bootstrap=[f"127.0.0.1:{app.node.peers.listen_port}"]))
                await peer.start()
                peers.append(peer)
            window = app.window
            window.resize(1180, 720)
            await app.host.async_unload(next(m.id for m in app.node.models.all()
                                             if m.entry.path.name == demo["spare"].name))
            layer_map, panel = app.feeds.layer_map, window.swarm_tab.contribute
            def split_map():
                return next((m for m in layer_map.maps if m.name.startswith("qwen2-demo") and len(m.holders) == 2), None)
            await _async_until(lambda: split_map() is not None)
            picker = window.swarm_tab.picker
            picker.setCurrentIndex(picker.findData(split_map().sha256))
            split_id = layer_map.current().model_id
            window.show_tab("Swarm")  # (the panel sizes the model once it is seen)
            await _async_until(lambda: split_id in app.node.catalog.entries and bool(panel.cost.get(split_id)))
            await _async_requests(app, None)
            await _async_until(lambda: app.node.traces.in_flight == 0)
            window.show_tab("Swarm")
            await _settle()
            _grab(window, out / "2-swarm-gap.png")  # layers 5-7: nobody serves them
            # "Help serve this model" with a budget of three layers and the head: the gap is taken
            cost = panel.cost[split_id]
            panel.slider.setValue(int(cost["head_mb"] + 3.5 * cost["per_layer_mb"]))
            panel.help_box.click()
            await _async_until(lambda: layer_map.current() is not None and not layer_map.current().gaps
                               and any(h.this_node and not h.loading for h in layer_map.current().holders))
            await _async_until(lambda: split_id in [m["id"] for m in app.node.list_openai_models()])
            await _async_requests(app, split_id)
            await _async_until(lambda: app.node.traces.in_flight == 0 and any(
                h.hop is not None for h in layer_map.current().holders))
            await _async_chat(window, split_id)
            # a download in progress for the Models tab's progress bar (a slow local origin)
            big = work / "demo-download.gguf"
            await asyncio.get_running_loop().run_in_executor(None, big.write_bytes, b"GGUF" + bytes(96 * 2**20))
            slow = _Origin(big, bytes_per_s=8 * 2**20)
            job = app.node.downloads.start(slow.url)
            await _async_until(lambda: job.done_bytes > 24 * 2**20)
            rows = app.feeds.requests
            window.requests_tab.select(next(k for k in rows.keys() if rows.cell_text(k, "Route") == "distributed"))
            window.models_tab.select(next(iter(app.feeds.models.keys())))
            for i, name in ((1, "Overview"), (3, "Swarm"), (4, "Chat"), (5, "Peers"), (6, "Models"),
                            (7, "Requests"), (8, "Diagnostics")):
                window.show_tab(name)
                if name == "Diagnostics":
                    await window.diagnostics_tab.async_refresh()
                await _settle()
                _grab(window, out / f"{i}-{'swarm-chain' if name == 'Swarm' else name.lower()}.png")
            window.set_appearance("dark")  # the dark palette, on the busiest tab
            window.show_tab("Swarm")
            await _settle()
            _grab(window, out / "9-swarm-dark.png")
            window.set_appearance("system")
        finally:
            for peer in peers:
                await peer.stop()
            app.request_quit()
            await task
            for server in (origin, slow) if slow is not None else (origin,):
                server.close()

    with tempfile.TemporaryDirectory(prefix="swarmllm-shots-") as tmp:
        app = TrayApp(config(Path(tmp) / "data", [], include_default_model=False), show_window=True)
        task = asyncio.ensure_future(app.async_run())
        try:
            await _async_until(lambda: app.host.state == AppState.NO_MODEL)
            app.window.resize(1180, 520)
            await _settle()
            _grab(app.window, out / "0-first-run.png")
        finally:
            app.request_quit()
            await task


def _tray_looks(out: Path) -> None:
    """The five tray icon looks side by side, with their names."""
    from PySide6.QtCore import QRect, Qt
    from PySide6.QtGui import QColor, QImage, QPainter

    from app.icon_art import LOOKS, draw_icon

    cell = 150
    image = QImage(cell * len(LOOKS), 170, QImage.Format.Format_ARGB32)
    image.fill(QColor("#f4f4f4"))
    p = QPainter(image)
    for i, look in enumerate(LOOKS):
        p.drawImage(i * cell + 27, 10, draw_icon(look, 96))
        p.drawImage(i * cell + 59, 112, draw_icon(look, 32))
        p.drawText(QRect(i * cell, 146, cell, 20), Qt.AlignmentFlag.AlignCenter, look.replace("_", " "))
    p.end()
    path = out / "tray-icons.png"
    image.save(str(path))
    print(path)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m app.screenshots", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--model", type=Path, default=None, help="also serve this GGUF whole")
    args = parser.parse_args(argv)
    if args.model is not None:
        args.model = args.model.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    with x_display() as display:
        os.environ["DISPLAY"] = display
        os.environ["QT_QPA_PLATFORM"] = "xcb"
        import qasync
        from PySide6.QtWidgets import QApplication

        from node.logs import setup_logging

        setup_logging(0)
        app = QApplication(sys.argv[:1])
        app.setQuitOnLastWindowClosed(False)
        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_async_shoot(args.out, args.model))
            _tray_looks(args.out)
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
