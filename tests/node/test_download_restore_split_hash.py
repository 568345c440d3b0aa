"""A split set downloaded from a later part's URL with `--sha256` (the hash is that part's), stopped
mid-way and restored at the next start, still checks the hash when resumed (2026-12-07: only the named
part's sidecar kept it, and the restored job was rebuilt from part 1's URL: the set named part 1, the
hash was lost, and `--resume ID` kept a part 2 of other bytes). Every part's sidecar now names the
part the user's URL named and the hash given. A real node, the Hub stand-in, the admin API."""

from __future__ import annotations

import pytest

from tests.node.test_download_restore import api, finished, job_of, listed
from tests.node.test_download_split import REPO, hub, parts  # noqa: F401 (fixtures)
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="function")

WRONG = "0" * 64  # the user's hash is not part 2's: the resumed download must refuse it


async def _stopped_in(data, hub, names, stalled: int, sizes: dict[str, int]) -> None:  # noqa: F811
    """`download hf://…/big-00002-of-00003.gguf --sha256 WRONG` on a real node, stopped once part
    `stalled` (0-based) is half there (the stand-in holds its connection until the test ends it)."""
    name = names[stalled]
    half = sizes[name] // 2
    hub.stall_path, hub.stall_after = REPO + name, half
    async with running_node(node_config(data)) as node:
        status, body = await api(node, "POST", "/api/admin/models/download",
                                 {"url": f"hf://org/model/{names[1]}", "sha256": WRONG})
        assert status == 202, body

        async def stalled_there():
            job = await job_of(node, body["download"]["id"])
            return job["part"] == stalled + 1 and hub.served.get(REPO + name, 0) >= half
        await wait_until(stalled_there, timeout_s=30, what=f"part {stalled + 1} half there")
    hub.release.set()


@pytest.mark.parametrize("stalled", [0, 1], ids=["in-part-1", "in-part-2"])
async def test_a_restored_split_set_checks_the_named_parts_hash(tmp_path, hub, parts, stalled):  # noqa: F811
    names = list(parts)
    data = tmp_path / "data"
    await _stopped_in(data, hub, names, stalled, {n: len(b) for n, b in parts.items()})
    async with running_node(node_config(data)) as node:
        [job] = await listed(node)
        assert job["state"] == "paused" and job["restored"] and job["parts"] == 3, job
        assert job["url"].endswith(names[1]), job  # the part the user named
        status, body = await api(node, "POST", f"/api/admin/downloads/{job['id']}/resume")
        assert status == 202, body
        done = await finished(node, body["download"]["id"])
    assert done["state"] == "failed" and "sha256 mismatch" in done["error"], done
    assert f"part 2 of 3 ({names[1]})" in done["error"], done  # the hash is part 2's, not part 1's
    assert not list((data / "models").glob("*.gguf"))  # nothing of the set served
