"""``Watermark``: the invariants of its docstring, one test each."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dledger.runtime.watermark import Watermark

pytestmark = pytest.mark.asyncio

LONG_S = 30.0  # a wait that must end by a move, never by its timeout


async def settle() -> None:
    """Let every task that can run now run (woken waiters return)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_reached_target_returns_at_once() -> None:
    w = Watermark(5)
    assert await w.wait(5, 0)
    assert await w.wait(-1, LONG_S)
    assert w.waiting == 0
    assert not await w.wait(6, 0)  # no time to wait: not reached


async def test_a_waiter_times_out_and_leaves_nothing() -> None:
    w = Watermark()
    assert not await w.wait(3, 0.01)
    assert w.waiting == 0
    w.advance(3)  # nobody to wake, nothing to fail
    assert await w.wait(3, 0.01)


async def test_advance_wakes_exactly_the_waiters_reached_in_order() -> None:
    w = Watermark()
    woke: list[int] = []

    async def waiter(n: int, target: int) -> None:
        assert await w.wait(target, LONG_S)
        woke.append(n)

    targets = [5, 1, 3, 3, 9, 1, 7]
    tasks = [asyncio.create_task(waiter(n, t)) for n, t in enumerate(targets)]
    await settle()
    assert w.waiting == len(targets)
    w.advance(3)
    await settle()
    # Targets in increasing order, each target's waiters in the order they came.
    assert woke == [1, 5, 2, 3]
    assert w.waiting == 3
    w.advance(2)  # backwards: ignored
    assert w.index == 3
    w.advance(100)
    await asyncio.gather(*tasks)
    assert woke == [1, 5, 2, 3, 0, 6, 4]
    assert w.waiting == 0


async def test_many_waiters_one_move() -> None:
    w = Watermark()
    waits = [asyncio.create_task(w.wait(i % 50, LONG_S)) for i in range(1000)]
    await settle()
    assert w.waiting == 1000
    w.advance(49)
    assert all(await asyncio.gather(*waits))
    assert w.waiting == 0


async def test_cancelled_waiter_is_removed_and_never_woken() -> None:
    w = Watermark()
    t = asyncio.create_task(w.wait(1, LONG_S))
    other = asyncio.create_task(w.wait(1, LONG_S))
    await settle()
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert w.waiting == 1
    w.advance(1)
    assert await other
    assert w.waiting == 0


async def test_cancel_and_move_in_the_same_turn() -> None:
    w = Watermark()
    t = asyncio.create_task(w.wait(1, LONG_S))
    await settle()
    t.cancel()  # its future is cancelled now, its finally runs later
    w.advance(1)  # must not set a result on the cancelled future
    with pytest.raises(asyncio.CancelledError):
        await t
    assert w.waiting == 0


async def test_reset_goes_down_and_waiters_above_wait_on() -> None:
    w = Watermark(10)
    t = asyncio.create_task(w.wait(12, LONG_S))
    await settle()
    w.reset(0)  # truncated: the index goes down, the waiter stays
    await settle()
    assert w.index == 0 and not t.done() and w.waiting == 1
    assert not await w.wait(5, 0)
    w.advance(11)
    await settle()
    assert not t.done()
    w.reset(12)
    assert await t


async def test_a_target_reached_as_the_timeout_fires_is_true() -> None:
    w = Watermark()
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, w.advance, 1)
    # Whichever comes first, the answer says whether the index is there.
    assert await w.wait(1, 0.02) == (w.index >= 1)


async def test_idle_waits_on_one_target_add_nothing() -> None:
    w = Watermark()
    for _ in range(20):
        assert not await w.wait(1, 0.001)
    assert len(w._targets) == 1 and w.waiting == 0


async def test_timed_out_targets_are_compacted() -> None:
    w = Watermark()
    assert not any(await asyncio.gather(*(w.wait(t, 0.01) for t in range(1, 1001))))
    assert w.waiting == 0
    assert len(w._targets) <= 65  # dropped once they are most of the heap


async def test_moves_from_a_thread_before_anyone_waits() -> None:
    w = Watermark()

    def climb() -> None:
        for i in range(100):
            w.advance(i)

    th = threading.Thread(target=climb)
    th.start()
    th.join()
    assert w.index == 99
    assert await w.wait(99, 0)
