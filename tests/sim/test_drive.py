"""The synchronous driver the broker simulation runs the real produce path with
(``tests/sim/drive.py``): its ``Wait``, ``Task`` and ``Conditions`` contracts, on a tiny
event queue instead of the simulation."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from .drive import Conditions, Lock, Task, Wait


class Clock:
    """A minimal event queue: what the simulation's ``at`` and ``_advance`` do."""

    def __init__(self) -> None:
        self.now_ms = 0
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, t_ms: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t_ms, next(self._seq), fn))

    def run(self, until_ms: int = 1 << 30) -> None:
        while self._events and self._events[0][0] <= until_ms:
            t, _, fn = heapq.heappop(self._events)
            self.now_ms = t
            fn()

    def task(self, coro: Any, out: list[Any], name: str = "t") -> Task:
        def done(value: Any, error: BaseException | None) -> None:
            out.append(error if error is not None else value)

        return Task(name, coro, done, lambda t: self.at(self.now_ms, t.step))

    def conditions(self) -> Conditions:
        return Conditions(lambda ms, what, fn: self.at(self.now_ms + ms, fn))


def test_a_task_runs_to_its_first_wait_and_goes_on_when_it_is_settled() -> None:
    clock, out, w = Clock(), [], Wait[int]("w")

    async def body() -> int:
        return await w + 1

    t = clock.task(body(), out)
    t.step()
    assert out == []
    w.set_result(41)
    assert out == [], "a settled wait schedules the task; it does not run inside set_result"
    clock.run()
    assert out == [42]


def test_a_settled_wait_does_not_suspend_and_errors_are_raised_into_the_task() -> None:
    clock, out = Clock(), []
    ok, bad = Wait[int]("ok"), Wait[int]("bad")
    ok.set_result(1)
    bad.set_exception(ValueError("no"))

    async def body() -> int:
        v = await ok
        try:
            await bad
        except ValueError:
            return v + 1
        return 0

    clock.task(body(), out).step()
    assert out == [2]
    with pytest.raises(AssertionError, match="settled twice"):
        ok.set_result(2)


def test_tasks_parked_on_one_wait_wake_in_the_order_they_parked() -> None:
    clock, out, w = Clock(), [], Wait[str]("slot")

    async def joiner(i: int) -> str:
        return f"{await w.wait()}{i}"

    for i in range(3):
        clock.task(joiner(i), out).step()
    w.set_result("a")
    clock.run()
    assert out == ["a0", "a1", "a2"]


def test_a_killed_task_is_closed_and_never_reports() -> None:
    clock, out, w, closed = Clock(), [], Wait[int]("w"), []

    async def body() -> int:
        try:
            return await w
        finally:
            closed.append(True)

    t = clock.task(body(), out)
    t.step()
    t.kill()
    assert closed == [True]
    w.set_result(1)
    clock.run()
    assert out == []


def test_a_task_killed_while_it_runs_is_closed_when_it_next_waits() -> None:
    clock, out, w = Clock(), [], Wait[int]("w")
    tasks: list[Task] = []

    async def body() -> int:
        tasks[0].kill()  # its node crashes inside its own step (a crash mid-Ready)
        return await w

    t = clock.task(body(), out)
    tasks.append(t)
    t.step()
    assert t.killed and out == []
    w.set_result(1)
    clock.run()
    assert out == []


def test_conditions_keep_the_watermark_contract() -> None:
    clock, out = Clock(), []
    cond = clock.conditions()
    level = [0]

    async def wait_for(target: int, timeout_s: float) -> bool:
        return await cond.until(f"level {target}", lambda: level[0] >= target, timeout_s)

    clock.task(wait_for(0, 1), out).step()  # holds already: True at once
    clock.task(wait_for(5, 0), out).step()  # a time-out of 0: False at once
    assert out == [True, False]
    clock.task(wait_for(2, 0.1), out).step()
    clock.task(wait_for(9, 0.1), out).step()
    clock.run(until_ms=50)
    level[0] = 3
    cond.poll()  # ends the first; the second stays, and still times out after this poll
    clock.run(until_ms=60)
    assert out == [True, False, True]
    clock.run()
    assert out == [True, False, True, False]
    assert clock.now_ms == 100


def test_asyncio_sleep_0_goes_on_in_an_event_of_its_own() -> None:
    """``asyncio.sleep(0)`` (the reads yield once per pull) lets the others run first."""
    clock, out, order = Clock(), [], []

    async def body(name: str) -> str:
        order.append(f"{name}1")
        await asyncio.sleep(0)
        order.append(f"{name}2")
        return name

    a, b = clock.task(body("a"), out), clock.task(body("b"), out)
    a.step()
    b.step()
    assert order == ["a1", "b1"] and out == []
    clock.run()
    assert order == ["a1", "b1", "a2", "b2"] and out == ["a", "b"]


def test_a_lock_is_held_by_one_task_and_handed_on_in_turn() -> None:
    clock, out, lock, order = Clock(), [], Lock(), []
    gates = [Wait[None](f"g{i}") for i in range(3)]

    async def body(i: int) -> int:
        async with lock:
            order.append(i)
            await gates[i]
        return i

    tasks = [clock.task(body(i), out) for i in range(3)]
    for t in tasks:
        t.step()
    assert order == [0] and lock.locked()
    tasks[1].kill()  # it leaves the line
    gates[0].set_result(None)
    clock.run()
    assert order == [0, 2] and out == [0]
    gates[2].set_result(None)
    clock.run()
    assert out == [0, 2] and not lock.locked()


def test_a_task_killed_when_the_lock_was_handed_to_it_passes_it_on() -> None:
    clock, out, lock, gate = Clock(), [], Lock(), Wait[None]("g")

    async def first() -> int:
        async with lock:
            await gate
        return 1

    async def second() -> int:
        async with lock:
            return 2

    a, b, c = clock.task(first(), out), clock.task(second(), out), clock.task(second(), out)
    for t in (a, b, c):
        t.step()
    gate.set_result(None)
    clock.run(until_ms=-1)  # nothing ran yet: a is scheduled
    a.step()  # a releases: the lock goes to b, which is scheduled
    b.kill()  # and dies before it runs: c gets it
    clock.run()
    assert out == [1, 2] and not lock.locked()
