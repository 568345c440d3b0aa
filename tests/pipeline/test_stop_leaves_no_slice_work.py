"""What Node.stop leaves of its slices' work (2026-12-07): nothing runs after it. A paused `--layers`
slice waits for its peers' sessions to end before it is freed (Contributions' drains); no stop step
ended that wait, so it outlived the stop, woke later, and unloaded the slice into the executor the
stop had shut down (RuntimeError, an announce to peers already gone) or, in the app, was destroyed
pending with the loop. Real node in this process, real slice engine, a real session on the slice."""

from __future__ import annotations

import asyncio
import threading

from node import const
from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until


def _pending(name: str) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()]


async def test_a_paused_slice_waiting_for_its_sessions_is_not_freed_after_the_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "NODE_DRAIN_S", 0.2)  # (the stop's drain: the session below never ends)
    model = split_model(tmp_path)
    config = node_config(tmp_path / "n", model, layers="0-5", slice_dtype="f32", activation_bits=32)
    async with running_node(config) as node:
        [hosted] = node.slice_host.slices.values()
        assert hosted.state == "loaded", hosted.error
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(hosted.executor, hosted.model.new_session, "a-peers-chat")
        await node.contributions.async_set_paused(True)  # "Pause contributing": freed once its session ends
        await wait_until(lambda: hosted.state == "draining", 10, what="the slice to drain")
        assert _pending("contribute-release"), "the paused slice's wait for its session"
    # stopped
    assert not _pending("contribute-release"), "the paused slice's wait outlived the node's stop"


async def test_a_slice_unload_cancelled_still_frees_its_weights_and_thread(tmp_path):
    """A slice's unload cancelled while its free waits behind a step on the slice's thread (the node's
    stop cancels the autoserve and contributions tasks that free drained slices; a step of a
    session still ran): the free was cancelled with it and the executor never shut down, so the
    slice, gone from the host, kept its weights and a parked thread for good."""
    from node.inference.pipeline.host import SliceHost
    from node.models.catalog import ModelCatalog
    from tests.support.policing import parked_in_live_pool

    entry = ModelCatalog(None).scan([(split_model(tmp_path), "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)
    hosted = await host.async_load(entry, 0, 3)
    assert hosted.state == "loaded", hosted.error
    [thread] = hosted.executor._threads  # noqa: SLF001 (the one worker)
    step_runs, step_may_end = threading.Event(), threading.Event()
    hosted.executor.submit(lambda: (step_runs.set(), step_may_end.wait(30)))  # a session's step
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, step_runs.wait, 10)
        unload = asyncio.create_task(host.async_unload(hosted))
        await wait_until(lambda: hosted.state == "unloaded", 10, what="the unload to wait for its free")
        unload.cancel()  # the stop
        await asyncio.gather(unload, return_exceptions=True)
    finally:
        step_may_end.set()
    await wait_until(lambda: hosted.model is None, 10, what="the cancelled unload's free to run after the step")
    await wait_until(lambda: not thread.is_alive(), 10, what="the slice's thread to end")
    assert not parked_in_live_pool(thread)
    await host.async_close()


async def test_a_slice_load_under_way_at_the_stop_is_not_served_after_it(tmp_path, monkeypatch):
    """The tray's "Resume contributing" loads the `--layers` slice again (a task of the app's, which
    the node's stop does not end); Quit while its weights load: the load finished after the stop,
    the slice was "loaded" on a stopped node, its weights held, and a KV sweeper ran on for good."""
    from node.inference.slice import SliceModel

    monkeypatch.setattr(const, "NODE_DRAIN_S", 0.2)
    loading, go, gated = threading.Event(), threading.Event(), threading.Event()
    real = SliceModel.load.__func__

    def load(cls, *args, **kwargs):
        if gated.is_set():
            loading.set()
            assert go.wait(30)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(SliceModel, "load", classmethod(load))
    model = split_model(tmp_path)
    config = node_config(tmp_path / "n", model, layers="0-5", slice_dtype="f32", activation_bits=32)
    loop = asyncio.get_running_loop()
    try:
        async with running_node(config) as node:
            await node.contributions.async_set_paused(True)
            await wait_until(lambda: not node.slice_host.slices, 10, what="the paused slice to be freed")
            gated.set()
            resume = asyncio.create_task(node.contributions.async_set_paused(False))  # (the app's spawn)
            assert await loop.run_in_executor(None, loading.wait, 30)
            [hosted] = node.slice_host.slices.values()
            await node.stop()  # Quit, the weights loading
            go.set()
            await asyncio.gather(resume, return_exceptions=True)
            assert hosted.state != "loaded" and hosted.model is None, "a slice loaded on a stopped node"
            assert not _pending("kv-sweeper"), "a KV sweeper outlived the node's stop"
            assert not node.slice_host.slices
    finally:
        go.set()


async def test_a_pause_is_kept_in_config_toml_before_its_slices_are_freed(tmp_path, monkeypatch):
    """"Pause contributing" is saved at once, not after the slices' release: that waits for the
    peers' sessions to end (minutes) and a resume reloads slices (or fails). Until 2026-12-07 the
    choice reached config.toml only after them, so a Quit meanwhile (the stop cancels the change)
    started the node contributing again next time (and a CI run on a loaded machine read the file
    before it was written). Real node, real slice."""
    import tomllib

    from node.contribute import Contributions

    model = split_model(tmp_path)
    config = node_config(tmp_path / "n", model, layers="0-5", slice_dtype="f32", activation_bits=32)
    async with running_node(config) as node:
        releasing, release = asyncio.Event(), asyncio.Event()
        real_release = Contributions._async_release_all

        async def slow_release(self) -> None:
            releasing.set()
            await release.wait()
            await real_release(self)
        monkeypatch.setattr(Contributions, "_async_release_all", slow_release)
        change = asyncio.create_task(node.contributions.async_set_paused(True))
        try:
            await wait_until(releasing.is_set, 10, what="the release to start")
            settings = tmp_path / "n" / "config.toml"
            await wait_until(lambda: settings.exists() and tomllib.loads(settings.read_text())
                             .get("desktop", {}).get("contribute") is False, 10,
                             what="config.toml to keep the pause while the slices are released")
        finally:
            release.set()
            await change
        assert node.contributions.paused
