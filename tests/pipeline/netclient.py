"""A tiny API client run inside a network namespace (`ip netns exec NS python -m tests.pipeline.netclient`).

    wait  PORT DATA_DIR MODEL_NAME TIMEOUT_S      → prints the model id once the swarm serves it
    chat  PORT DATA_DIR MODEL CONTENT MAX_TOKENS  → prints JSON {status, headers, text, usage} (greedy)
    peers PORT DATA_DIR                           → prints /api/admin/peers
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _get(port: int, key: str, path: str):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def main() -> None:
    cmd, port, data_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    key_file = data_dir / "api_key"
    if cmd == "wait":
        name, deadline = sys.argv[4], time.monotonic() + float(sys.argv[5])
        while time.monotonic() < deadline:
            try:
                key = key_file.read_text().strip()
                ids = [m["id"] for m in _get(port, key, "/v1/models")["data"] if m["name"] == name]
                if ids:
                    print(ids[0])
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.3)
        sys.exit(f"{name} not servable within the deadline")
    if cmd == "peers":
        print(json.dumps(_get(port, key_file.read_text().strip(), "/api/admin/peers")))
        return
    if cmd == "chat":
        model, content, max_tokens = sys.argv[4], sys.argv[5], int(sys.argv[6])
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}],
                           "max_tokens": max_tokens, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={
            "Authorization": f"Bearer {key_file.read_text().strip()}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                data = json.loads(r.read())
                print(json.dumps({"status": r.status, "headers": dict(r.headers),
                                  "text": data["choices"][0]["message"]["content"], "usage": data.get("usage")}))
        except urllib.error.HTTPError as exc:
            print(json.dumps({"status": exc.code, "headers": dict(exc.headers), "text": exc.read().decode()}))
        return
    sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
