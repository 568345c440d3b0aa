"""node.locks.KeyedLocks: one holder per key at a time, other keys at once, and nothing kept once
nobody holds or waits (a node adding files for weeks, or opening partial models by many URLs, must not
keep a lock per key it ever saw; the partial models' per-directory locks were a dict that only grew)."""
import asyncio

from node.locks import KeyedLocks


async def test_one_holder_per_key_and_other_keys_at_once():
    locks = KeyedLocks()
    order: list[str] = []
    first_in = asyncio.Event()
    let_go = asyncio.Event()

    async def first():
        async with locks.hold("a"):
            order.append("first in")
            first_in.set()
            await let_go.wait()
            order.append("first out")

    async def second():
        await first_in.wait()
        async with locks.hold("a"):
            order.append("second in")

    async def other_key():
        await first_in.wait()
        async with locks.hold("b"):
            order.append("other key in")
        let_go.set()

    await asyncio.wait_for(asyncio.gather(first(), second(), other_key()), 10)
    assert order == ["first in", "other key in", "first out", "second in"]
    assert len(locks) == 0


async def test_a_cancelled_waiter_and_a_failing_holder_leave_nothing_behind():
    locks = KeyedLocks()
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder():
        async with locks.hold("k"):
            held.set()
            await release.wait()
            raise RuntimeError("the holder fails")

    holding = asyncio.create_task(holder())
    await held.wait()
    waiter_entered = asyncio.Event()

    async def waiter():
        async with locks.hold("k"):
            waiter_entered.set()

    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # (the waiter is queued on the lock)
    assert len(locks) == 1
    waiting.cancel()
    release.set()
    results = await asyncio.gather(holding, waiting, return_exceptions=True)
    assert isinstance(results[0], RuntimeError) and isinstance(results[1], asyncio.CancelledError)
    assert not waiter_entered.is_set()
    assert len(locks) == 0
    async with locks.hold("k"):  # and the key is free again
        assert len(locks) == 1
    async with locks.hold(None):  # None holds nothing
        assert len(locks) == 0
