"""Commands that talk to a running node over its API: diagnostics, models, download, peers, chat."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

from node.config import load_config
from node.datadir import API_KEY_FILE, read_api_key
from node.logs import clean_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register diagnostics, models, download, peers and chat."""
    from node.cli import add_node_options

    p = sub.add_parser("diagnostics", help="print the diagnostics report (safe to paste in public)")
    add_node_options(p)
    p.add_argument("--full", action="store_true", help="keep network addresses (for your own machine)")
    p.set_defaults(func=diagnostics)

    p = sub.add_parser("models", help="list the node's models, where they run and why; `models add PATH` serves "
                       "a GGUF file from anywhere on disk (until the node stops)")
    add_node_options(p)
    p.add_argument("action", nargs="?", choices=["add"], help="add: serve the GGUF file at PATH")
    p.add_argument("path", nargs="?", help="the .gguf file to add")
    p.add_argument("--load", action="store_true", help="with add: load the model too")
    p.add_argument("--json", action="store_true", help="raw JSON")
    p.set_defaults(func=models)

    p = sub.add_parser("download", help="download a GGUF model into the node's models/ folder")
    add_node_options(p)
    p.add_argument("url", nargs="?", help="https://…/model.gguf, hf://owner/repo/model.gguf[@revision] or "
                   "hf://owner/repo[:QUANT] (default Q4_K_M, as llama.cpp's -hf)")
    p.add_argument("--list", action="store_true", help="list the node's downloads, those a stopped node left "
                   "unfinished too (paused: --resume ID goes on, --cancel ID deletes the partial file)")
    p.add_argument("--resume", metavar="ID", default=None, help="go on with a paused or failed download")
    p.add_argument("--cancel", metavar="ID", default=None, help="stop a download and delete its partial file")
    p.add_argument("--sha256", default=None, help="expected sha256 of the file (checked before it is kept)")
    p.add_argument("--filename", default=None, help="file name in models/ (default: the URL's)")
    p.add_argument("--load", action="store_true", help="load the model once it is downloaded")
    p.set_defaults(func=download)

    p = sub.add_parser("peers", help="list the node's peers")
    add_node_options(p)
    p.add_argument("--json", action="store_true", help="raw JSON")
    p.set_defaults(func=peers)

    p = sub.add_parser("chat", help="send one chat message and stream the reply")
    add_node_options(p)
    p.add_argument("message", help="the user message")
    p.add_argument("--model", default=None, help="model id or name (default: the first listed)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.set_defaults(func=chat)


class NoNode(SystemExit):
    """No node answers at the client's address (the message is the exit's)."""


class NodeClient:
    """Minimal blocking HTTP client for the node's API (CLI use only)."""

    def __init__(self, args: argparse.Namespace):
        cfg = load_config({"port": args.port, "data_dir": args.data_dir})
        self.base = f"http://127.0.0.1:{cfg.port}"
        self.data_dir = cfg.data_dir
        self.key_file = cfg.data_dir / API_KEY_FILE
        self.key = read_api_key(cfg.data_dir)

    def request(self, method: str, path: str, body: dict | None = None, stream: bool = False):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            resp = urllib.request.urlopen(req, timeout=600)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # the key of this command's data dir is not the node's: another data dir
                had = "refused the key in" if self.key else "wants a key; there is none in"
                raise SystemExit(f"error: the node at {self.base} {had} {self.key_file}: give this command the "
                                 "--data-dir the node runs with") from None
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise SystemExit(f"error: {exc.code} {detail}") from None
        except (urllib.error.URLError, ConnectionError) as exc:
            raise NoNode(f"error: no node answering at {self.base} ({getattr(exc, 'reason', exc)}); "
                         "is `swarmllm run` running?") from None
        return resp if stream else resp.read()


def diagnostics(args: argparse.Namespace) -> int:
    """Print the report."""
    body = NodeClient(args).request("GET", "/api/admin/diagnostics" + ("?full=1" if args.full else ""))
    sys.stdout.write(body.decode())
    return 0


def models(args: argparse.Namespace) -> int:
    """Print the model table, or add a model file (`models add PATH`)."""
    if getattr(args, "action", None) == "add":
        return models_add(args)
    if getattr(args, "path", None):
        raise SystemExit(f"error: unexpected argument {args.path!r} (to serve a file: swarmllm models add PATH)")
    data = json.loads(NodeClient(args).request("GET", "/api/admin/models"))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{'ID':44} {'ARCH':8} {'LAYERS':>6} {'QUANT':6} {'SIZE MB':>8} {'STATE':9} DEVICE (reason)")
    for m in data["models"]:
        reason = f" ({m['cpu_placement_reason']})" if m.get("cpu_placement_reason") else ""
        # a slice's row (engine torch-slice) has no file metadata: its layers and what is held
        held = m.get("layers_held")
        layers = f"{held[0]}-{held[1] - 1}/{m['n_layers']}" if held and m.get("engine") == "torch-slice" \
            else str(m["n_layers"])
        size = f"{m['size_bytes'] / 2**20:>8.1f}" if m.get("size_bytes") is not None else f"{'-':>8}"
        partial = f" [{m['partial']}]" if m.get("partial") else ""
        partial += " [file deleted: it cannot be reloaded]" if m.get("file_gone") else ""
        print(f"{m['id']:44} {m.get('architecture') or '-':8} {layers:>6} {m.get('quantization') or '-':6} "
              f"{size} {m['state']:9} {m.get('device') or '-'}{reason}{partial}")
    return 0


def models_add(args: argparse.Namespace) -> int:
    """Serve a GGUF file from anywhere on disk on the running node (`--model PATH` without a restart)."""
    if not args.path:
        raise SystemExit("error: models add needs the path of a .gguf file")
    path = os.path.abspath(os.path.expanduser(args.path))  # the node's working directory is not ours
    reply = json.loads(NodeClient(args).request("POST", "/api/admin/models/add", {"path": path, "load": args.load}))
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    m = reply["model"]
    how = "added" if reply["added"] else "already served"
    print(f"{how}: model {m['id']} ({m['state']}) from {path}")
    return 0


def _part_of(job: dict) -> str:
    """` (part 2/3)` while a split model's set is fetched, part after part; "" for one file."""
    return f" (part {job['part']}/{job['parts']})" if job.get("parts", 1) > 1 and job.get("part") else ""


# a downloaded model is registered, not loaded (memory is the user's call): peers fetch its layers
# from this node at once (while it contributes: its HELLO's `files`, which lists only files from a
# public origin, download/public.py; a private or signed download and a file the user added are
# handed out only while loaded), but run it here, and list it among the swarm's models, only once
# it is loaded (until 2026-12-06 its layers too)
NOT_SHARED_YET = ("not loaded yet: it loads on its first request here. Your swarm's other devices can take its "
                  "layers from this device now if anyone could download it where it came from (while it "
                  "contributes; a private repo's or signed link's download, or a file you add yourself, is "
                  "shared only while loaded), and use it here once it is loaded "
                  "(run the download with --load, or Load in the Models tab)")
# a model split in parts is served on this node only, loaded or not (node.inference.adverts)
SPLIT_NOT_SHARED = "a model split in parts is served on this device only: the swarm's other devices do not see it"


def sharing_text(file_name: str) -> str:
    """What a finished download means for the swarm (found in review: a split set was told Load shares it)."""
    from pathlib import Path

    from node.models.file_kinds import split_part

    return SPLIT_NOT_SHARED if split_part(Path(file_name)) else NOT_SHARED_YET


def _done_text(job: dict) -> str:
    """A finished download: its file and model, or (one part of a split set, fetched alone from a
    signed URL) the job's note naming the parts still missing."""
    parts = f", {job['parts']} parts" if job.get("parts", 1) > 1 else ""
    done = f"downloaded {job['file']} ({job['done_bytes'] / 1e6:.1f} MB{parts})"
    return f"{done}: model {job['model_id']}" if job.get("model_id") or not job.get("note") else \
        f"{done}; {job['note']}"


def _list_line(job: dict) -> str:
    """One download of `download --list`: id, state, file, bytes, and what can be done with it."""
    total = f" of {job['total_bytes'] / 1e6:.1f}" if job.get("total_bytes") else ""
    line = f"{job['id']}  {job['state']:<11} {job['file']}{_part_of(job) if job['state'] != 'paused' else ''}  " \
           f"{job['done_bytes'] / 1e6:.1f}{total} MB"
    if job.get("resumed_as"):
        return f"{line}  (resumed as {job['resumed_as']})"
    if job.get("restored") and job["state"] == "paused":
        line += "  (left by an earlier run)"
    if job.get("resumable"):
        line += f"  --resume {job['id']} goes on, --cancel {job['id']} deletes it"
    if job["state"] == "failed":
        line += f"\n    {job['error']}"
    return line


def _kept_on_disk(client: NodeClient, job: dict) -> tuple[int, str | None]:
    """(bytes of the download's `.part` files in the node's models/, the job id their sidecar names:
    the one a restarted node lists it under). The CLI runs beside its node (127.0.0.1), so the files
    are there to read once it stopped; a split set's parts all count."""
    from pathlib import Path

    from node.models.file_kinds import llama_split_name, split_part

    split = split_part(Path(job["file"])) if job.get("parts", 1) > 1 else None
    names = [llama_split_name(split[0], n, split[2]).lower() for n in range(1, split[2] + 1)] if split else \
        [job["file"].lower()]
    try:
        found = {p.name[:-len(".part")].lower(): p for p in (client.data_dir / "models").iterdir()
                 if p.name.endswith(".part")}
    except OSError:
        return 0, None
    size, job_id = 0, None
    for name in names:
        if (part := found.get(name)) is None:
            continue
        try:
            size += part.stat().st_size
            meta = json.loads(part.with_name(part.name + ".json").read_text(encoding="utf-8"))
            job_id = meta.get("job") if isinstance(meta, dict) and isinstance(meta.get("job"), str) else job_id
        except (OSError, ValueError):
            pass
    return size, job_id


def _stopped_text(client: NodeClient, job: dict) -> str:
    """What is kept of a download whose node stopped answering, and how to go on, from the files
    on disk (2026-12-07: from the last progress seen, up to half a second old, so a download that had
    just begun, or not yet, said "its partial file (0.0 MB) is kept")."""
    size, job_id = _kept_on_disk(client, job)
    if not size and (client.data_dir / "models" / job["file"]).is_file():
        # landed (the .part renamed into models/, part 1 of a set last) before the next poll saw it done
        # (2026-12-07: "nothing of it had been downloaded yet … run the same download again", which the
        # node then refused: "models/X already exists")
        return (f"it had completed: models/{job['file']} is there, served once the node starts again "
                "(no need to download it again)")
    if not size:
        return "nothing of it had been downloaded yet: start the node again and run the same download again"
    amount = f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"
    return (f"its partial file ({amount}) is kept: start the node again and "
            f"`swarmllm download --resume {job_id or job['id']}` (see `swarmllm download --list`), or run the "
            "same download again, to resume it")


def _download_list(client: NodeClient) -> int:
    jobs = json.loads(client.request("GET", "/api/admin/downloads"))["downloads"]
    print("\n".join(_list_line(job) for job in jobs) if jobs else "no downloads")
    return 0


def download(args: argparse.Namespace) -> int:
    """Start a download on the node and show its progress until it ends (Ctrl-C cancels it, or pauses
    a --resume); --list,
    --resume ID and --cancel ID act on the node's downloads (an earlier run's unfinished ones too)."""
    client = NodeClient(args)
    if args.list:
        return _download_list(client)
    if args.cancel:
        job = json.loads(client.request("POST", f"/api/admin/downloads/{args.cancel}/cancel"))["download"]
        print(f"download {job['id']} {job['state']}: {job['file']}")
        return 0
    if args.resume:
        job = json.loads(client.request("POST", f"/api/admin/downloads/{args.resume}/resume"))["download"]
    elif args.url:
        body = {"url": args.url, "sha256": args.sha256, "filename": args.filename}
        job = json.loads(client.request("POST", "/api/admin/models/download",
                                        {k: v for k, v in body.items() if v is not None}))["download"]
    else:
        sys.stderr.write("error: download needs a URL (or --list, --resume ID, --cancel ID)\n")
        return 2
    try:
        while job["state"] in ("starting", "downloading", "verifying"):
            total = job["total_bytes"]
            done = f"{job['done_bytes'] / 1e6:.1f}" + (f" / {total / 1e6:.1f} MB ({job['progress'] * 100:.0f}%)"
                                                       if total else " MB")
            rate = f", {job['mb_per_s']:.1f} MB/s" if job.get("mb_per_s") else ""
            sys.stderr.write(f"\r{job['file']}{_part_of(job)}: {job['state']} {done}{rate}   ")
            sys.stderr.flush()
            time.sleep(0.5)
            job = json.loads(client.request("GET", f"/api/admin/downloads/{job['id']}"))["download"]
    except NoNode:  # the node stopped mid-download: say what is kept and how to go on
        sys.stderr.write(f"\nerror: the node at {client.base} stopped answering during the download; "
                         f"{_stopped_text(client, job)}\n")
        return 1
    except KeyboardInterrupt:
        try:  # (the latest state: whether this run went on from kept bytes)
            job = json.loads(client.request("GET", f"/api/admin/downloads/{job['id']}"))["download"]
        except (NoNode, KeyError, ValueError):
            pass
        # the user went on with kept bytes (--resume, or the same download again, as the messages say to):
        # Ctrl-C keeps them (2026-12-06: it deleted them; the plain-URL way found in review)
        if args.resume or job.get("resumed_from"):
            client.request("POST", f"/api/admin/downloads/{job['id']}/pause")
            sys.stderr.write(f"\npaused: its partial file is kept; `swarmllm download --resume {job['id']}` goes on, "
                             f"`swarmllm download --cancel {job['id']}` deletes it\n")
            return 130
        client.request("POST", f"/api/admin/downloads/{job['id']}/cancel")
        sys.stderr.write("\ncancelled\n")
        return 130
    sys.stderr.write("\n")
    if job["state"] != "done":
        print(f"download {job['state']}: {job['error']}")
        return 1
    print(_done_text(job))
    if args.load and job.get("model_id"):
        client.request("POST", f"/api/admin/models/{job['model_id']}/load")
        print(f"loaded {job['model_id']}")
        if sharing_text(job["file"]) == SPLIT_NOT_SHARED:
            print(SPLIT_NOT_SHARED)
    elif job.get("model_id"):
        print(sharing_text(job["file"]))
    return 0


def _advert_text(m: object) -> str:
    """A peer's advertised model as "name[a-b]" (layers, inclusive) or "name[whole]". Its name is the
    peer's word: one line, control characters escaped (a terminal's escapes or a forged row, 2026-12-07)."""
    if not isinstance(m, dict):
        return clean_text(str(m), 200)
    name = clean_text(str(m.get("name") or m.get("id") or "?"), 200)
    if isinstance(m.get("start"), int) and isinstance(m.get("end"), int):
        return f"{name}[{m['start']}-{m['end'] - 1}{' loading' if m.get('loading') is True else ''}]"
    return f"{name}[whole]" if m.get("whole") else name


def peers(args: argparse.Namespace) -> int:
    """Print the peer table."""
    data = json.loads(NodeClient(args).request("GET", "/api/admin/peers"))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows, refused = data.get("peers", []), data.get("refused", [])
    if not rows and not refused:
        print("no peers")
        return 0
    print(f"{'PEER':9} {'STATE':10} {'TRANSPORT':9} {'RTT MS':>7} {'ADDRESS':28} MODELS")
    for p in rows:
        rtt = f"{p['rtt_ms']:.1f}" if p.get("rtt_ms") is not None else "-"
        models_text = ", ".join(_advert_text(m) for m in p.get("models", [])) or "-"
        print(f"{p['short_id']:9} {p['state']:10} {p.get('transport') or '-':9} {rtt:>7} "
              f"{p.get('address') or '-':28} {models_text}")
        if p.get("last_error") and p["state"] != "connected":
            print(f"{'':9} last error: {clean_text(str(p['last_error']), 500)}")  # (a peer's words in it)
    shown = {p["short_id"] for p in rows}
    for r in (r for r in refused if r["peer"] not in shown):  # never linked (a --bootstrap address)
        print(f"{r['peer']:9} {'refused':10} not in this swarm (swarm {r['swarm'] or '-'}) x{r['count']}: "
              f"{r['reason']}" + (f"\n{'':9} {r['hint']}" if r.get("hint") else ""))
    return 0


def chat(args: argparse.Namespace) -> int:
    """Stream one reply to stdout."""
    client = NodeClient(args)
    model = args.model
    if model is None:
        listed = json.loads(client.request("GET", "/v1/models"))["data"]
        if not listed:
            raise SystemExit("error: the node serves no model")
        model = listed[0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": args.message}], "stream": True,
            "max_tokens": args.max_tokens, "temperature": args.temperature}
    resp = client.request("POST", "/v1/chat/completions", body, stream=True)
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise SystemExit(f"\nerror: {event['error']['message']}")
        for choice in event.get("choices", []):
            sys.stdout.write(choice.get("delta", {}).get("content") or "")
            sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
