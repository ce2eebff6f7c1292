"""``Watermark``: an index that moves forward, and waiting until it reaches a target.

One class for every "wait until N is reached" of a node: the Raft commit index
(``DLedgerServer.wait_committed``), the dispatched index and each consume queue's next
offset (the broker's ``ReputMessageService.wait_dispatched``, ``Arrivals.wait_queue``).
Its owner moves it (``advance``); any number of tasks wait for their own target
(``wait``).

Invariants:
- ``index`` only grows through ``advance`` (a lower value is ignored). ``reset`` is the
  one way down, for a thing measured that was cut back or replaced (a consume queue
  deleted with its topic, or restarted by a snapshot install): waiters whose target is
  then above the index go on waiting for it;
- every change of ``index`` wakes, in the same call, every waiter whose target is
  reached, and only those; one move costs nothing for waiters that stay (targets are
  kept in a heap);
- ``wait`` is bounded: it answers whether ``index >= target`` when it ends, which is
  when the target is reached or ``timeout_s`` has passed (so a target reached as the
  timeout fires is True, and one a ``reset`` took back before the waiter ran is
  False). A target reached already returns True without suspending;
- cancelling a waiting task leaves nothing behind (its future is removed), and a
  cancelled or timed-out waiter is never woken;
- waiters wake in the order they started waiting, per target and targets in increasing
  order: nothing depends on hashing (the broker simulation replays by seed);
- not thread-safe: waits and moves on one event loop. ``advance`` and ``reset`` touch
  no loop while nobody waits, so an owner may move it in a thread before any waiter
  exists (the broker's ``Dispatch.recover``).

Stopping: there is nothing to close. A waiter left when its owner stops ends by its own
timeout or by being cancelled. A wait that returned at once after a stop would make the
loops that wait on it (the dispatcher's) spin; a stopped node's tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import heapq


class Watermark:
    """The highest index reached so far, and waiting until it reaches a target."""

    __slots__ = ("_index", "_targets", "_waiters", "_waiting")

    def __init__(self, index: int = -1) -> None:
        self._index = index
        # Waiters by target, each in the order they came; ``_targets`` is a heap of the
        # keys. A target whose waiters all left keeps an empty entry (so one idle loop
        # waiting for the same target again and again adds nothing) until the index
        # reaches it or ``_compact`` drops it.
        self._waiters: dict[int, dict[asyncio.Future[None], None]] = {}
        self._targets: list[int] = []
        self._waiting = 0

    def __repr__(self) -> str:
        return f"Watermark(index={self._index}, waiting={self._waiting})"

    @property
    def index(self) -> int:
        return self._index

    @property
    def waiting(self) -> int:
        """How many tasks wait now."""
        return self._waiting

    def advance(self, index: int) -> None:
        """Move the index up to ``index`` (no change if it is there or beyond already)."""
        if index > self._index:
            self._index = index
            self._wake()

    def reset(self, index: int) -> None:
        """Set the index to ``index``, below the present one too (see the invariants)."""
        self._index = index
        self._wake()

    async def wait(self, target: int, timeout_s: float) -> bool:
        """Wait until ``index >= target``: True, or False after ``timeout_s``."""
        if self._index >= target:
            return True
        if timeout_s <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        futs = self._waiters.get(target)
        if futs is None:
            futs = self._waiters[target] = {}
            heapq.heappush(self._targets, target)
        futs[fut] = None
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: it can swallow a cancel
                await fut
        except TimeoutError:
            pass
        finally:
            # Still registered unless ``_wake`` took it: a timeout or a cancel.
            futs = self._waiters.get(target)
            if futs is not None and fut in futs:
                del futs[fut]
                self._waiting -= 1
                fut.cancel()
                self._compact()
        return self._index >= target

    def _wake(self) -> None:
        targets, waiters, index = self._targets, self._waiters, self._index
        while targets and targets[0] <= index:
            futs = waiters.pop(heapq.heappop(targets))
            self._waiting -= len(futs)
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)

    def _compact(self) -> None:
        """Drop the targets nobody waits for once they are most of the heap: waits that
        time out on ever new targets would otherwise grow it without bound."""
        if len(self._targets) <= 2 * self._waiting + 64:
            return
        self._waiters = {t: futs for t, futs in self._waiters.items() if futs}
        self._targets = list(self._waiters)
        heapq.heapify(self._targets)
