"""Stopping a chaos run on time, and on a signal: the ``Supervisor``.

Every phase of a run (the cluster's start, the load under the nemesis, the heal, the
convergence, the drain, the nodes' stop, the file comparison) is a blocking function
that ``Supervisor.run`` starts in a thread of its own and waits for, with a bound, in
the main thread. The main thread does nothing else: it notices a signal (SIGINT,
SIGTERM, SIGHUP) within ``POLL_S``, and a phase over its bound when the bound passes;
either way it halts the run (``halted``, and the halt callbacks a phase registered: the
load phase cancels its tasks, the nemesis stops), gives the phase ``settle_s`` to end by
itself, then leaves it (``HaltedError``) and goes on to the cleanup, which it does itself.
An abandoned thread ends by itself: every call it makes is bounded, and it may no longer
start a node (``ChaosCluster.closing``).

Why the signal handler only takes note: it runs in the main thread between two
bytecodes, perhaps inside a lock, a ``print`` or a cleanup's ``finally``. Raising there
could cut the cleanup short, and taking a lock or writing there could deadlock; the
waiting main thread sees the note at its next look.

``in_thread`` is the same idea on an event loop: a blocking function awaited from a
thread of its own, which a cancelled or timed-out await abandons; ``asyncio.to_thread``
would not do, as the loop waits for its executor's threads when it closes.

Invariants: ``run`` returns or raises within ``bound_s`` (plus ``POLL_S``, plus
``settle_s`` after a halt); a phase's error reaches the waiter, never the thread's top;
halt callbacks run in the thread that halts, which is the main thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Generic, TypeVar, cast

T = TypeVar("T")

POLL_S = 0.1  # the main thread looks for a signal this often
SETTLE_S = 5.0  # a halted phase's time to end by itself before it is left
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class HaltedError(Exception):
    """The run was halted (a signal, a phase over its bound) and a phase left."""


class _Box(Generic[T]):
    """A function's outcome, filled by the thread that ran it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def fill(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as e:
            self._error = e
        finally:
            self.done.set()

    def get(self) -> T:
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


class Supervisor:
    """One run's phases, waited for in the main thread with bounds; see the module."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.say = say
        self.halted = threading.Event()
        self.reason: str | None = None  # why it halted: the first reason only
        self.halted_s: float | None = None  # when (monotonic)
        self.signal: int | None = None  # the first signal, once noticed
        self.phase = "setup"
        self._noted: int | None = None  # written by the signal handler only
        self._on_halt: list[Callable[[], None]] = []

    # ---- signals ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def catching_signals(self) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP halt the run instead of ending the process; the
        previous handlers come back after. Only the main thread can catch signals."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._note)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        if self._noted is None:
            self._noted = signum

    def poll(self) -> None:
        """A signal noted since the last look halts the run (main thread)."""
        if self._noted is not None and self.signal is None:
            self.signal = self._noted
            self.halt(f"{signal.Signals(self._noted).name} during the {self.phase}")

    # ---- halting ---------------------------------------------------------------------------

    def halt(self, reason: str) -> None:
        """Stop the run: ``halted`` is set and every halt callback runs (once)."""
        if self.halted.is_set():
            return
        self.reason, self.halted_s = reason, time.monotonic()
        self.halted.set()
        self.say(f"stopping: {reason}")
        for callback in list(self._on_halt):
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile
                callback()

    @contextlib.contextmanager
    def on_halt(self, callback: Callable[[], None]) -> Iterator[None]:
        """``callback`` runs if the run halts within the block (at once if it has)."""
        self._on_halt.append(callback)
        try:
            if self.halted.is_set():
                callback()
            yield
        finally:
            self._on_halt.remove(callback)

    # ---- phases ----------------------------------------------------------------------------

    def run(self, phase: str, fn: Callable[[], T], bound_s: float,
            settle_s: float = SETTLE_S) -> T:  # fmt: skip
        """``fn()`` in a thread of its own: its value, or its exception. ``HaltedError`` if
        the run halts first (a signal, or ``bound_s`` passing), once the thread ended or
        ``settle_s`` passed."""
        self.phase = phase
        self.poll()
        if self.halted.is_set():
            raise HaltedError(self.reason)
        box: _Box[T] = _Box()
        threading.Thread(target=box.fill, args=(fn,), name=f"chaos-{phase}", daemon=True).start()
        deadline = time.monotonic() + bound_s
        while not box.done.wait(POLL_S):  # bounded: the deadline halts
            self.poll()
            if time.monotonic() >= deadline:
                self.halt(f"the {phase} did not end within {bound_s:g} s")
            if self.halted.is_set():
                box.done.wait(settle_s)
                raise HaltedError(self.reason)
        self.poll()
        return box.get()


async def in_thread(fn: Callable[[], T], name: str) -> T:
    """``fn()`` in a daemon thread, awaited; cancelling the await leaves the thread to
    end by itself (its calls being bounded), and whatever it ends with is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    box: _Box[T] = _Box()

    def settle() -> None:
        if future.done():
            return
        try:
            future.set_result(box.get())
        except BaseException as e:
            future.set_exception(e)

    def target() -> None:
        box.fill(fn)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future
