"""The diagnostics report: sections in order, redacted by default, never the key or a path."""

from __future__ import annotations

import asyncio
import functools
import re
import selectors
import socket
import threading
import time

import aiohttp
import openai
import pytest

from node.node import Node
from node.watchdog import LoopWatchdog, _sample
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.waiting import wait_until, wait_until_sync

pytestmark = pytest.mark.llama

SECTIONS = ["-- this machine --", "-- reachable at --", "-- peers --", "-- recent inference failures --",
            "-- recent requests --", "-- served for others --", "-- peer serving performance --", "-- models --",
            "-- downloads --", "-- recent activity --"]
ADDRESSES = ["93.184.216.34", "8.8.4.4", "192.168.77.12", "10.1.2.3", "2001:db8:85a3::8a2e:370:7334",
             "2606:4700:4700::1111", "fe80::a00:27ff:fe4e:66a1", "gpu-box.example.org", "nas.local"]


async def _report(node, full=False):
    url = f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics" + ("?full=1" if full else "")
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


async def test_report_sections_and_redaction(tmp_path):
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model)) as node:
        # Addresses reach the report the way real events put them there: activity lines and failures.
        node.note_activity("bootstrap dial failed addr=93.184.216.34:8810 error=refused")
        node.note_activity("mdns found peer at 192.168.77.12:8810 and [2001:db8:85a3::8a2e:370:7334]:8810 "
                           "and fe80::a00:27ff:fe4e:66a1%eth0")
        node.note_activity("relay gpu-box.example.org:8810 via 8.8.4.4 then nas.local:8810 and 10.1.2.3")
        from node.models.download import DownloadJob  # a download's source is a host name too

        job = DownloadJob("j1", "https://nas.local/models/m.gguf?token=s3cret", "m.gguf", state="failed",
                          total_bytes=2 << 20, done_bytes=1 << 20, attempts=3, error="HTTP 403 Forbidden")
        node.downloads.jobs[job.id] = job
        node.note_activity("dns 2606:4700:4700::1111 again 93.184.216.34:9000")
        node.note_activity(f"this machine is {socket.gethostname()}; key file {tmp_path}/data/api_key")
        text = await _report(node)
        positions = [text.index(s) for s in SECTIONS]
        assert positions == sorted(positions)
        for addr in ADDRESSES:
            assert addr not in text, addr
        assert socket.gethostname() not in text
        assert node.api_key not in text and str(tmp_path) not in text
        # same host, same tag (twice 93.184.216.34, ports kept)
        tags = re.findall(r"<public-ip-([0-9a-f]{4})>:(8810|9000)", text)
        by_port = dict((port, tag) for tag, port in tags)
        assert by_port["8810"] == by_port["9000"]
        assert re.search(r"<private-ip-[0-9a-f]{4}>:8810", text)
        assert re.search(r"<host-[0-9a-f]{4}>:8810", text)
        assert "127.0.0.1:" in text  # loopback is exempt
        downloads = text.split("-- downloads --")[1].split("-- recent activity --")[0]
        assert re.search(r"m\.gguf  state=failed mb=1\.0/2\.0 attempts=3 from=<host-[0-9a-f]{4}> "
                         r"error=HTTP 403 Forbidden", downloads), downloads
        assert "s3cret" not in text
        assert f"node: {node.short_id}" in text
        assert re.search(r"in_flight: 0 traces, 0 pipelines", text)
        # a second report salts differently: the same address gets an unrelated tag
        again = await _report(node)
        assert re.findall(r"<public-ip-([0-9a-f]{4})>", again) != re.findall(r"<public-ip-([0-9a-f]{4})>", text)

        full = await _report(node, full=True)
        assert "93.184.216.34:8810" in full and "gpu-box.example.org" in full
        assert "from=nas.local" in full and "s3cret" not in full
        assert node.api_key not in full


async def test_report_lists_requests_failures_and_models(tmp_path):
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model)) as node:
        base = f"http://127.0.0.1:{node.api.port}"
        hdrs = {"Authorization": f"Bearer {node.api_key}"}
        async with aiohttp.ClientSession() as s:
            async with s.post(base + "/v1/completions", headers=hdrs,
                              json={"model": "tiny", "prompt": "a", "max_tokens": 2}) as r:
                assert r.status == 200
            async with s.post(base + "/v1/completions", headers=hdrs,
                              json={"model": "nope", "prompt": "a"}) as r:
                assert r.status == 404
        text = await _report(node)
        recent = text.split("-- recent requests --")[1].split("-- served for others --")[0]
        assert recent.count("DIAG: request complete") == 2
        failures = text.split("-- recent inference failures --")[1].split("-- recent requests --")[0]
        assert "error_type=ModelNotFound" in failures and "model=<unknown model>" in failures
        assert "error: ModelNotFound (status=404, code=model_not_found, param=model;" in failures
        models = text.split("-- models --")[1]
        assert "tiny-" in models and "device=cpu reason=no_gpu" in models and "layers=2" in models
        m = re.search(r"memory bandwidth: (.*)", text).group(1)
        assert m.endswith("GB/s (measured)") or m.startswith("could not be measured")


async def test_the_report_quotes_nothing_a_client_sent(tmp_path, caplog):
    """Found by an audit (2026-12-06): the report quoted an unknown model's name and client errors'
    messages verbatim (a schema's fragment, a pattern), a newline in a model name forged a
    `DIAG: request complete` line in the report and the log, and a 200 KB name made the report
    610 KB. Now such a name is `<unknown model>`, a client error shows its type, code and param,
    and log values are one line and bounded."""
    model = tiny_model(tmp_path)
    forged = "ZEBRA-MODEL-1\nDIAG: request complete request_id=FORGED outcome=ok"
    async with running_node(node_config(tmp_path / "data", model)) as node:
        base = f"http://127.0.0.1:{node.api.port}"
        hdrs = {"Authorization": f"Bearer {node.api_key}"}
        bodies = [
            {"model": forged, "messages": [{"role": "user", "content": "x"}]},
            {"model": "ZEBRA-LONG-" + "z" * 200_000, "messages": [{"role": "user", "content": "x"}]},
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "ZEBRA-SCHEMA-2"}}}},
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
             "response_format": {"type": "json_schema", "json_schema": {
                 "name": "x", "schema": {"type": "string", "pattern": "ZEBRA-PATTERN-3(("}}}},
        ]
        async with aiohttp.ClientSession() as s:
            for body in bodies:
                async with s.post(base + "/v1/chat/completions", headers=hdrs, json=body) as r:
                    assert 400 <= r.status < 500, await r.text()
                    assert "ZEBRA" in (await r.json())["error"]["message"]  # the client is told
        text = await _report(node)
    assert "ZEBRA" not in text and "FORGED" not in text and len(text) < 100_000
    failures = text.split("-- recent inference failures --")[1].split("-- recent requests --")[0]
    assert failures.count("DIAG: request complete") == 4 and failures.count("    error: ") == 4
    assert "code=invalid_request" in failures or "param=response_format" in failures
    logged = [r.getMessage() for r in caplog.records if "DIAG: request complete" in r.getMessage()]
    assert len(logged) == 4 and not any("\n" in m for m in logged)
    assert "model=ZEBRA-MODEL-1\\nDIAG: request complete request_id=FORGED" in logged[0]  # escaped, one line
    assert max(len(m) for m in logged) < 6000


@pytest.mark.blocks_loop("the stall the watchdog must name")
async def test_watchdog_names_the_blocking_function(caplog):
    dog = LoopWatchdog(threshold_ms=100, interval_s=0.02)
    dog.start()

    def hog_the_loop():
        time.sleep(0.4)  # deliberately blocking: the thing the watchdog exists to catch

    try:
        await asyncio.sleep(0.05)
        hog_the_loop()
        await wait_until(lambda: dog.stalls >= 1, 5, what="stall to be noticed")
    finally:
        dog.stop()
    assert "DIAG: network event loop stalled took_ms=" in caplog.text
    assert "arm=tests.node.test_diagnostics:hog_the_loop" in caplog.text
    assert dog.max_stall_ms >= 300


def test_watchdog_names_an_idle_loop_as_idle_not_its_caller():
    """A loop waiting in select while its beat is late was not busy: the process did not run
    (SIGSTOP, a paused VM). The line named the frame above the idle loop (`node.commands.run:run`)."""
    sel, (r, w) = selectors.DefaultSelector(), socket.socketpair()
    sel.register(r, selectors.EVENT_READ)
    waiting = threading.Thread(target=sel.select, args=(30,), daemon=True)
    waiting.start()
    try:
        wait_until_sync(lambda: (_sample(waiting.ident) or "").startswith("idle_in_select("), 5,
                        what="the thread sampled in select, named idle")
    finally:
        w.send(b"x")
        waiting.join(5)
        sel.close()
        r.close()
        w.close()


@pytest.mark.parametrize(("module", "function", "arm"), [
    ("asyncio.windows_events", "_poll", "idle_in_select("),  # Windows' ProactorEventLoop, idle
    ("qasync", "run_forever", "in_qt_event_loop("),  # the desktop app's loop, in Qt's exec()
])
def test_watchdog_names_other_idle_loops(module, function, arm):
    """Idle in another loop's wait: its innermost frame is machinery the sampler skipped, so the line
    named the frame above the loop as the culprit (found in review, 2026-12-06)."""
    release = threading.Lock()
    release.acquire()
    code = compile(f"def {function}(wait):\n    wait(30)\n", f"<{module}>", "exec")
    space = {"__name__": module}
    exec(code, space)  # a real frame of that module and function, blocked as the loop's wait is
    # (a C call, as GetQueuedCompletionStatus and QApplication.exec are: no Python frame above the module's)
    waiting = threading.Thread(target=space[function], args=(functools.partial(release.acquire, True),), daemon=True)
    waiting.start()
    try:
        wait_until_sync(lambda: (_sample(waiting.ident) or "").startswith(arm), 5, what=f"the thread named {arm}")
    finally:
        release.release()
        waiting.join(5)


async def test_the_report_of_a_node_that_failed_to_start_is_built(tmp_path):
    """A start that failed after the machine's measurement had begun (the API's address cannot be
    bound) cancelled the measurement, and the report then raised CancelledError: the desktop
    app's "Copy diagnostics" copied nothing (found by a bug hunt, 2026-12-06)."""
    from node.api.server import ApiPortUnavailable

    node = Node(node_config(tmp_path / "data", host="198.51.100.7"))  # TEST-NET-2: on no machine
    with pytest.raises(ApiPortUnavailable):  # (the bind's OSError, said as the address this machine lacks)
        await node.start()
    await node.stop()
    text = await node.async_report()
    assert "-- this machine --" in text and "cpu: " in text and "198.51.100.7" not in text


async def test_a_peers_e_mail_is_not_in_the_report(tmp_path):
    """A peer's region is its own text, and a user who put an e-mail there (or in any text the
    report quotes) had its local part pasted in public: `region=ana.garcia@<host-…>` (found by a
    bug hunt, 2026-12-06). An e-mail was then `<email>`, whole; a region that is no code is none
    since 2026-12-07 (review r64)."""
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "a", model)) as a:
        b_config = node_config(tmp_path / "b", region="ana.garcia@example.com",
                               bootstrap=[f"127.0.0.1:{a.peers.listen_port}"])
        async with running_node(b_config):
            await wait_until(lambda: any(p.state == "connected" for p in a.peers.peers()), 30,
                             what="the peer's HELLO")
            text = await _report(a)
    peers = text.split("-- peers --")[1].split("-- recent inference failures --")[0]
    assert "region=" not in peers, peers  # no region code: none (review r64), not `ana-garcia-example-com`
    assert "ana.garcia" not in text and "example.com" not in text and "garcia" not in text


async def test_a_peer_whose_clock_is_off_shows_its_skew(tmp_path):
    """A peer's clock hours off (its HELLO `time`) is shown on its row; one that agrees shows nothing."""
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "a", model)) as a, \
            running_node(node_config(tmp_path / "b")) as b, \
            running_node(node_config(tmp_path / "c", bootstrap=[f"127.0.0.1:{a.peers.listen_port}"])) as c:
        b.peers.clock.offset_s = -3 * 3600.0  # b's clock is three hours behind
        await a.peers.async_connect(f"127.0.0.1:{b.peers.listen_port}")
        await wait_until(lambda: all(a.peers.link(n.peers.node_id) for n in (b, c)), 30, what="a linked to b and c")
        text = await _report(a)
    peers = text.split("-- peers --")[1].split("-- recent inference failures --")[0]
    row_b = next(ln for ln in peers.splitlines() if ln.startswith(b.peers.node_id[:8]))
    row_c = next(ln for ln in peers.splitlines() if ln.startswith(c.peers.node_id[:8]))
    assert re.search(r" clock_skew_s=-10[78]\d\d\b", row_b), row_b
    assert "clock_skew_s" not in row_c, row_c


async def test_the_users_name_in_a_model_file_name_is_not_in_the_report(tmp_path, monkeypatch):
    """A model id is its file's name: a file its owner named after themself put their login in
    every line that names the model (found by a bug hunt, 2026-12-06). The login, the home folder's
    name and the full name are `<user>` in the redacted report, and kept in the full one."""
    monkeypatch.setenv("LOGNAME", "ana.garcia")  # what getpass.getuser() reads first
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "ana.garcia"))
    model = tiny_model(tmp_path, name="Ana.Garcia-llama.gguf")
    async with running_node(node_config(tmp_path / "data", model)) as node:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{node.api.port}/v1/completions",
                              headers={"Authorization": f"Bearer {node.api_key}"},
                              json={"model": "ana.garcia-llama", "prompt": "a", "max_tokens": 2}) as r:
                assert r.status == 200, await r.text()
        text = await _report(node)
        full = await _report(node, full=True)
    assert "garcia" not in text.lower(), text
    models = text.split("-- models --")[1]
    assert re.search(r"^<user>-llama-[0-9a-f]{8} ", models, re.MULTILINE), models
    assert "model=<user>-llama-" in text.split("-- recent requests --")[1]
    assert "ana.garcia-llama-" in full


async def test_a_peers_region_cannot_forge_report_lines(tmp_path):
    """A peer's region is its HELLO's text: a newline in it wrote lines of its own into the
    `-- peer serving performance --` section (the peers section escaped it; found by a bug hunt,
    2026-12-06). It is one line there too."""
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "a", model, layers="0-0")) as a:
        b_config = node_config(tmp_path / "b", model, layers="1-1", region="TH\nFORGED line",
                               bootstrap=[f"127.0.0.1:{a.peers.listen_port}"])
        async with running_node(b_config):
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{a.api.port}/v1", api_key=a.api_key,
                                        max_retries=0)

            async def served() -> bool:
                try:
                    await client.completions.create(model="tiny", prompt="a", max_tokens=2)
                except openai.APIStatusError:
                    return False  # the peer's layers not known yet
                return True
            await wait_until(served, 30, what="a request through both nodes")
            await client.close()
            text = await _report(a)
    performance = text.split("-- peer serving performance --")[1].split("-- swarm coverage --")[0]
    assert "FORGED" not in text, performance  # (escaped until 2026-12-07; no region code: none, review r64)
    assert not [line for line in text.splitlines() if line.startswith("FORGED")], performance


async def test_a_partial_model_with_no_origin_says_its_layers_come_from_peers(tmp_path):
    """A partial model made from a holder's header with no origin named (its layers come from peers
    only) showed `from=<host-…>`: a tag made of "?", a host that does not exist (found hunting the
    report, 2026-12-06). It says so; one with an origin still names the origin's host, redacted."""
    import hashlib

    from node.inference.synth import write_gguf
    from node.models.catalog import HashCache, scan_entry
    from node.models.partial.fromheader import create_from_header
    from node.models.partial.layout import dir_name
    from tests.support.nodes import TINY

    path = write_gguf(tmp_path / "whole.gguf", TINY)
    entry = scan_entry(path, "cli", HashCache(None))
    header = path.read_bytes()[:entry.header.data_offset]
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    for origin, name in ((None, "swarm"), ("https://gpu-box.example.org/o/r/resolve/main/x.gguf", "origin")):
        create_from_header(models / dir_name(f"swarm:{name}", f"{name}.gguf"), header, entry.header,
                           sha256=hashlib.sha256(name.encode()).hexdigest(),
                           header_sha256=hashlib.sha256(header).hexdigest(), size_bytes=entry.size_bytes,
                           origin_url=origin)
    async with running_node(node_config(tmp_path / "data")) as node:
        text = await _report(node)
        full = await _report(node, full=True)
    rows = [ln for ln in text.split("-- models --")[1].splitlines() if " partial=" in ln]
    assert len(rows) == 2, text
    assert sum(ln.endswith("from=peers (no origin named)") for ln in rows) == 1, rows
    assert sum(bool(re.search(r"from=<host-[0-9a-f]{4}>$", ln)) for ln in rows) == 1, rows
    assert "from=gpu-box.example.org" in full and "from=peers (no origin named)" in full


async def test_a_models_load_error_cannot_forge_report_lines(tmp_path, monkeypatch):
    """llama.cpp's error quotes the GGUF's own strings (its tokenizer's name: a header a peer sent
    goes through the same load), and the models section printed it as it was: a newline in the name
    wrote a `DIAG: request complete` line of its own into the report (a bug hunt, 2026-12-07). Every
    row of the report is one line."""
    import gguf

    from node.inference.synth import write_gguf
    from tests.support.nodes import TINY

    forged = "DIAG: request complete request_id=forged route=local outcome=ok"
    add = gguf.GGUFWriter.add_tokenizer_model
    monkeypatch.setattr(gguf.GGUFWriter, "add_tokenizer_model", lambda w, _m: add(w, f"evil\n{forged}\n"))
    model = write_gguf(tmp_path / "evil.gguf", TINY)
    monkeypatch.undo()
    async with running_node(node_config(tmp_path / "data", model)) as node:
        for full in (False, True):
            text = await _report(node, full=full)
            models = text.split("-- models --")[1].split("-- downloads --")[0]
            assert "state=failed" in models and "unknown tokenizer" in models, models
            assert "evil\\nDIAG: request complete" in models, models  # the newline shown as `\n`
            assert not [line for line in text.splitlines() if line.startswith("DIAG: request complete request_id=forged")], models


@pytest.mark.parametrize(("ours", "theirs", "regions"), [(None, "TH", "-,TH"), ("US", "TH", "US,TH"),
                                                        ("US", "US,EU,TH outcome=ok", "US,-")])
async def test_a_requests_regions_name_each_of_its_nodes(tmp_path, ours, theirs, regions):
    """`regions=` is one per node of `nodes=`, in order: it listed the regions named only, and never
    this node's own, so a chain of this node (US) and a peer (TH) read `nodes=<us>,<peer> regions=TH`,
    this node in TH (a bug hunt, 2026-12-07). A peer's HELLO region is any text: one that is not a
    code (`US,EU,TH outcome=ok`: three regions and a forged field) is none (review r64)."""
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "a", model, layers="0-0", region=ours)) as a:
        b_config = node_config(tmp_path / "b", model, layers="1-1", region=theirs,
                               bootstrap=[f"127.0.0.1:{a.peers.listen_port}"])
        async with running_node(b_config) as b:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{a.api.port}/v1", api_key=a.api_key,
                                        max_retries=0)
            nodes = []

            async def served() -> bool:
                try:
                    raw = await client.completions.with_raw_response.create(model="tiny", prompt="a", max_tokens=2)
                except openai.APIStatusError:
                    return False  # the peer's layers not known yet
                nodes.append(raw.headers["x-swarm-nodes"])
                return True
            await wait_until(served, 30, what="a request through both nodes")
            await client.close()
            text = await _report(a)
    assert nodes == [f"{a.short_id},{b.short_id}"]
    recent = text.split("-- recent requests --")[1].split("-- served for others --")[0]
    assert f"nodes={nodes[0]} regions={regions} " in recent, recent
    assert "outcome=ok outcome=ok" not in recent and " EU," not in text, recent


async def test_an_errors_server_timing_is_its_summary_lines(tmp_path):
    """An error reply's headers were made before its trace was closed: `server-timing` had no total
    (a request refused at once had no header at all) while the summary line, the report and the
    admin trace said total_ms= (a bug hunt, 2026-12-07). Both now read the one trace."""
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model)) as node:
        base = f"http://127.0.0.1:{node.api.port}"
        hdrs = {"Authorization": f"Bearer {node.api_key}"}
        async with aiohttp.ClientSession() as s:
            for path, body in (("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "a"}]}),
                               ("/v1/embeddings", {"model": "nope", "input": "a"})):
                async with s.post(base + path, headers=hdrs, json=body) as r:
                    assert r.status == 404
                    rid, timing = r.headers["x-request-id"], r.headers.get("server-timing", "")
                async with s.get(base + "/api/admin/requests", headers=hdrs) as r:
                    trace = next(t for t in (await r.json())["recent"] if t["request_id"] == rid)
                total = re.search(r"total;dur=([0-9.]+)", timing)
                assert total is not None, (path, timing)
                assert float(total.group(1)) == pytest.approx(trace["total_ms"], abs=0.06), (path, timing, trace)


async def test_a_multi_line_error_keeps_no_path_address_or_user_name(tmp_path, monkeypatch):
    """The report made a field one line (a newline written `\\n`) before it redacted it, and the
    redactor matches no path, address or user name right after a letter: `\\n/home/ana/...`,
    `\\n10.1.2.3` and `\\tana` went out in the public report (review r64). Each is redacted first."""
    import gguf

    from node.inference.synth import write_gguf
    from node.models.download import DownloadJob
    from node.trace import RequestTrace
    from tests.support.nodes import TINY

    private = "\n/home/anabel/models/m.gguf\n10.1.2.3:8810\tanabel"
    add = gguf.GGUFWriter.add_tokenizer_model
    monkeypatch.setattr(gguf.GGUFWriter, "add_tokenizer_model", lambda w, _m: add(w, f"evil{private}\n"))
    model = write_gguf(tmp_path / "evil.gguf", TINY)  # its load error quotes the tokenizer's name
    monkeypatch.undo()
    async with running_node(node_config(tmp_path / "data", model)) as node:
        node.user_names = ["anabel"]
        job = DownloadJob("j1", "https://nas.local/models/m.gguf", "m.gguf", state="failed",
                          total_bytes=2 << 20, done_bytes=1 << 20, attempts=3, error=f"HTTP 403{private}")
        node.downloads.jobs[job.id] = job
        trace = node.traces.start(RequestTrace(model="m", operation="chat.completions"))
        node.traces.finish(trace, "error", error_type="InternalError", error_message=f"engine died{private}")
        node.note_activity(f"load failed{private}")  # a row with a newline of its own
        text = await _report(node)
    for section in ("models", "downloads", "recent inference failures", "recent activity"):
        rows = text.split(f"-- {section} --")[1].split("\n\n")[0]
        assert "\\n<path>" in rows and "\\n<private-ip-" in rows and "\\t<user>" in rows, (section, rows)
    for secret in ("anabel", "/home/", "10.1.2.3"):
        assert secret not in text, secret


async def test_every_row_of_the_report_is_one_line(tmp_path, monkeypatch):
    """A field that no section makes one line of its own, the GGUF's architecture name on the models
    row (the file's word, a header a peer sent too), or an activity line quoting it: the report's
    pass over every row is what keeps a newline there from writing a `DIAG: request complete` line
    of its own (review r64: that pass had no test)."""
    import gguf

    from node.inference.synth import write_gguf
    from tests.support.nodes import TINY

    forged = "DIAG: request complete request_id=forged route=local outcome=ok"
    init = gguf.GGUFWriter.__init__
    monkeypatch.setattr(gguf.GGUFWriter, "__init__", lambda w, path, _arch, *a, **k: init(w, path, f"llama\n{forged}", *a, **k))
    model = write_gguf(tmp_path / "evil.gguf", TINY)
    monkeypatch.undo()
    async with running_node(node_config(tmp_path / "data", model)) as node:
        node.note_activity(f"found a model\n{forged}")
        for full in (False, True):
            text = await _report(node, full=full)
            models = text.split("-- models --")[1].split("-- downloads --")[0]
            assert f"arch=llama\\n{forged} layers=" in models, models
            assert f"found a model\\n{forged}" in text.split("-- recent activity --")[1]
            assert not [line for line in text.splitlines() if line.startswith(forged)], text
