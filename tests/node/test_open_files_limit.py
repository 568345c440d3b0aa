"""A node started under the usual soft limit of open files (256 on macOS, 1024 on Linux) with a local
app that leaves a few hundred connections open: every accept() failed with EMFILE ("socket.accept()
out of system resource" logged each time) and no other client was served until the app let go. The
node raises its soft limit towards the hard one at start (node.runtime.configure_process)."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import aiohttp
import pytest

from tests.support.nodes import tiny_model
from tests.support.processes import NodeProcess

resource = pytest.importorskip("resource")

pytestmark = [pytest.mark.asyncio, pytest.mark.llama,
              pytest.mark.skipif(sys.platform == "win32", reason="no RLIMIT_NOFILE")]

SOFT = 256  # macOS's default
LEFT_OPEN = 300


@contextlib.contextmanager
def _soft_open_files_limit(limit: int):
    """This process's soft limit lowered while a child starts (the child inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * LEFT_OPEN:
        pytest.skip(f"the hard limit of open files here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_connections_left_open_do_not_lock_other_clients_out(tmp_path):
    with _soft_open_files_limit(SOFT):
        proc = NodeProcess(tmp_path / "data", args=["--model", str(tiny_model(tmp_path)), "--no-default-model",
                                                    "--no-mdns", "--n-threads", "1"])
    left_open = []
    try:
        await proc.async_wait_ready(90)
        for _ in range(LEFT_OPEN):  # an app that leaks its connections
            left_open.append(await asyncio.open_connection("127.0.0.1", proc.port))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session, \
                session.get(f"{proc.base}/v1/models", headers=proc.auth) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["data"]
        assert "out of system resource" not in proc.output()
    finally:
        for _, writer in left_open:
            writer.close()
        await asyncio.to_thread(proc.terminate)  # it waits for the process: not on the loop
