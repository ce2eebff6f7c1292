"""A synchronous driver for the broker's async code: the broker simulation runs the real
produce path (``broker/produce.py``, ``broker/topics.py``) without an event loop, the way
the client's drivers run its sans-I/O operations (``ledgermq/client/drivers.py``).

The driven code awaits only its collaborators, and the simulation hands it ones whose
every wait bottoms out in a ``Wait``: a plain object that the coroutine yields
(``coro.send`` returns it to the driver) and that the simulation settles on its own
events: a proposal done, a dispatch step, a time-out on the simulated clock
(``Conditions``). Settling a ``Wait`` wakes each task parked on it, and the simulation
schedules the task's next ``step`` as an event of its own, as asyncio's ``call_soon``
does: a task never runs inside another task's step. ``asyncio.sleep(0)`` (the reads
yield once per pull) is a bare yield: the task goes on in an event of its own at once.
``Lock`` is ``asyncio.Lock`` for driven tasks (a contended ``asyncio.Lock`` needs a loop),
and ``Wake`` the ``asyncio.Event`` of a loop the simulation runs one turn at a time.

Invariants:
- a task runs only in ``step``: up to its next unsettled ``Wait`` or to its end, which
  goes to its ``done`` (the result, or the error it raised); a ``Wait`` settled already
  when awaited does not suspend;
- a ``Wait`` is settled once, and its parked tasks wake in the order they parked;
- a killed task (its node crashed) never runs again and never reports; its coroutine is
  closed at once or, if it is the one running (the crash happened inside its step),
  when it next suspends: either way every coroutine the driver started is finished or
  closed (none is left for the garbage collector to close at some other time);
- ``Conditions.until`` keeps ``Watermark.wait``'s contract, on the simulated clock;
- ``Lock`` is held by one task at a time and handed to the waiting ones in the order
  they came; a waiting task that is closed (killed) leaves the line, or passes the
  lock on if it was handed it already.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class Wait(Generic[T]):
    """Something a driven coroutine waits for: settled once with a value or an error.
    It is also the simulation's ``AnswerSlot`` (``broker/produce.py``): the requests
    that join a running attempt await its ``wait()``."""

    __slots__ = ("_error", "_parked", "_value", "settled", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.settled = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self._parked: list[Task] = []

    def __repr__(self) -> str:
        return f"Wait({self.what!r}, settled={self.settled})"

    def __await__(self) -> Generator[Wait[Any], None, T]:
        if not self.settled:
            yield self
        assert self.settled, f"{self.what}: resumed before it was settled"
        if self._error is not None:
            raise self._error
        return cast(T, self._value)

    def wait(self) -> Wait[T]:
        return self

    def set_result(self, value: T) -> None:
        self._settle(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, value: T | None, error: BaseException | None) -> None:
        assert not self.settled, f"{self.what}: settled twice"
        self.settled, self._value, self._error = True, value, error
        parked, self._parked = self._parked, []
        for task in parked:
            task.wake()

    def park(self, task: Task) -> None:
        assert not self.settled
        self._parked.append(task)


Done = Callable[[Any, BaseException | None], None]


class Task:
    """One driven coroutine (a request's handler on one node)."""

    __slots__ = ("_coro", "_done", "_schedule", "ended", "killed", "name", "running", "steps")

    def __init__(
        self,
        name: str,
        coro: Coroutine[Any, Any, Any],
        done: Done,
        schedule: Callable[[Task], None],
    ) -> None:
        self.name = name
        self._coro = coro
        self._done = done  # (result, None) or (None, the error it raised)
        self._schedule = schedule  # run ``step`` soon (an event of the simulation)
        self.running = self.ended = self.killed = False
        self.steps = 0  # how often it ran (a bound on a task that never ends)

    def __repr__(self) -> str:
        return f"Task({self.name!r})"

    def step(self) -> None:
        """Run to the next unsettled ``Wait`` (parked on it) or to the end."""
        if self._gone():
            return
        self.running = True
        self.steps += 1
        try:
            waiting = self._coro.send(None)
        except StopIteration as stop:
            self._end(stop.value, None)
            return
        except BaseException as e:
            self._end(None, e)
            return
        finally:
            self.running = False
        if self._gone():  # its node crashed while it ran
            self._coro.close()
            return
        if waiting is None:  # ``asyncio.sleep(0)``: go on in an event of its own
            self._schedule(self)
            return
        assert isinstance(waiting, Wait), f"{self.name} awaited {waiting!r}, not a Wait"
        waiting.park(self)

    def wake(self) -> None:
        if not self._gone():
            self._schedule(self)

    def kill(self) -> None:
        """Its node crashed: it never runs or reports again."""
        if self._gone():
            return
        self.killed = True
        if not self.running:
            self._coro.close()

    def _gone(self) -> bool:
        return self.ended or self.killed

    def _end(self, value: Any, error: BaseException | None) -> None:
        self.ended = True
        if not self.killed:
            self._done(value, error)
        elif isinstance(error, AssertionError):
            raise error  # a broken invariant, even on a node that is gone


class Conditions:
    """Waits until a condition holds or a time-out passes on the simulated clock, with
    ``Watermark.wait``'s contract: a condition that holds already answers True at once,
    a time-out of 0 False at once, and a wait that ends answers whether it holds then.
    ``poll`` ends the waits whose condition holds, in the order they began; the owner
    calls it after every event that may change one. Every wait has a time-out, so at
    most as many are pending as waits began within the longest one."""

    def __init__(self, timer: Callable[[int, str, Callable[[], None]], None]) -> None:
        self._timer = timer  # (after_ms, what, fn): call fn then, on the simulated clock
        self._pending: list[tuple[Callable[[], bool], Wait[None]]] = []

    async def until(self, what: str, holds: Callable[[], bool], timeout_s: float) -> bool:
        if holds():
            return True
        if timeout_s <= 0:
            return False
        w: Wait[None] = Wait(what)
        entry = (holds, w)
        self._pending.append(entry)
        self._timer(round(timeout_s * 1000), f"timeout {what}", lambda: self._end(entry))
        await w
        return holds()

    def poll(self) -> None:
        if not self._pending:
            return
        keep: list[tuple[Callable[[], bool], Wait[None]]] = []
        ready: list[Wait[None]] = []
        for entry in self._pending:  # the entries themselves: ``_end`` finds them by identity
            if entry[0]():
                ready.append(entry[1])
            else:
                keep.append(entry)
        self._pending = keep
        for w in ready:
            w.set_result(None)

    def _end(self, entry: tuple[Callable[[], bool], Wait[None]]) -> None:
        for i, e in enumerate(self._pending):
            if e is entry:
                del self._pending[i]
                entry[1].set_result(None)
                return


class Lock:
    """``asyncio.Lock`` for driven tasks: ``async with`` it; a task that finds it held
    waits on a ``Wait`` and is handed the lock when its turn comes (FIFO)."""

    __slots__ = ("_locked", "_waiters")

    def __init__(self) -> None:
        self._locked = False
        self._waiters: deque[Wait[None]] = deque()

    def locked(self) -> bool:
        return self._locked

    async def __aenter__(self) -> None:
        if not self._locked:
            self._locked = True
            return
        w: Wait[None] = Wait("lock")
        self._waiters.append(w)
        try:
            await w  # handed over by ``_release``: held from here
        except BaseException:  # closed while it waited
            if w.settled:
                self._release()
            else:
                self._waiters.remove(w)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        assert self._locked, "released a lock that is not held"
        if self._waiters:
            self._waiters.popleft().set_result(None)  # it stays held, by the next one
        else:
            self._locked = False


class Wake:
    """``asyncio.Event`` for a loop the simulation drives in turns (``Timers.run``'s
    wake, ``broker/timers/service.py``): nobody awaits it; ``set`` tells ``on_set``, and
    the driver starts the loop's next turn at once if the loop waits between turns."""

    __slots__ = ("_set", "on_set")

    def __init__(self) -> None:
        self._set = False
        self.on_set: Callable[[], None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self.on_set is not None:
            self.on_set()

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        raise AssertionError("a driven loop waits between turns in its driver, not here")
