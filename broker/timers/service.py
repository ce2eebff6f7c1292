"""``Timers``: the master's side of delay messages (docs/producing.md, "Delay messages").

A produce whose messages carry a time stores each as a record of ``TIMER_TOPIC``
(``schedule``), with its topic, pinned queue and sharding key as properties; the answer
names the timer (``recall_handle``). On the master, ``run`` delivers each at its time:
it appends a copy into the message's topic carrying ``TIMER_ORIGIN``, which ends the
timer when applied (``broker/timers/applier.py``), so the queue offset is assigned then.
A timer's copy is appended only once this node's log is applied and the timer is still
pending; a new master has applied every entry of the terms before its own: a failover
delivers nothing twice and loses nothing, and the new master goes on from the same
replicated state. ``cancel`` ends a timer without a copy.

The near window: the timers due before ``window_end`` wait in a heap (in memory, bounded
by what falls due within ``timer_window_ms``); the rest stay in the log, their times in
the timer topic's consume queue (its tag code), and a refill reads that queue from the
first pending timer when the window moves on. So a million timers cost the heap of the
next window, not a million objects. Every node keeps the heap (a promotion starts with
a refill anyway).

Invariants:
- a timer's copy is appended at or after its time (by the master's clock) and only
  while it is pending and this node is MASTER;
- the heap holds each pending timer due before ``window_end`` at least once (a timer
  scheduled during a refill is pushed when applied; one already there is skipped);
- the first pending timer's record is never deleted by retention, and no snapshot a
  follower could install covers it (``pinned_entry_pos``): a new master can always read
  every pending timer's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from consumequeue import ConsumeQueueStore
from dledger.codes import DLedgerError
from dledger.store import BODY_OFFSET

from .. import errors
from ..copies import PROP_REAL_TOPIC, copy_of, held
from ..encode import check_pinned_queue
from ..gate import WriteGate
from ..message import MessageFormatError
from ..metadata import TIMER_TOPIC, MetadataState, TopicMeta
from ..names import check_topic_name
from ..produce import NewMessage, Producer
from ..reads import PulledMessage, Reads
from ..settings import BrokerSettings
from ..topics import MetadataLog, Topics
from .applier import PROP_TIMER_DELIVER_MS, PROP_TIMER_ORIGIN, TimerApplier, parse_timer
from .state import TimerState

if TYPE_CHECKING:
    from ..dispatch import Dispatch

log = logging.getLogger(__name__)

RECALL_PREFIX = "t1:"
IDLE_S = 1.0  # the release loop looks again at least this often
RETRY_S = 0.1  # ... and this long after a failed release
SCAN_SLICE = 4096  # consume-queue units read per turn of the loop by a refill


def recall_handle(timer: int) -> str:
    return f"{RECALL_PREFIX}{timer}"


def parse_recall_handle(text: str) -> int | None:
    digits = text.removeprefix(RECALL_PREFIX)
    if text.startswith(RECALL_PREFIX) and digits.isdigit() and len(digits) < 19:
        return int(digits)
    return None


class Wake(Protocol):
    """What the release loop sleeps on between turns: ``asyncio.Event`` (the simulation
    hands ``Timers`` one that schedules the next turn when set)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    async def wait(self) -> object: ...


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A delay message stored: its id (the scheduled record's), time and handle."""

    msg_id: str
    commitlog_offset: int
    deliver_at_ms: int
    recall_handle: str


class Timers:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        gate: WriteGate,
        topics: Topics,
        metalog: MetadataLog,
        meta: MetadataState,
        reads: Reads,
        cq: ConsumeQueueStore,
        producer: Producer,
        dispatch: Dispatch,
        applier: TimerApplier,
        clock: Callable[[], int],
        lock: Callable[[], AbstractAsyncContextManager[Any]] = asyncio.Lock,
        wake: Callable[[], Wake] = asyncio.Event,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.topics = topics
        self.metalog = metalog
        self.meta = meta
        self.reads = reads
        self.cq = cq
        self.producer = producer
        self.dispatch = dispatch
        self.applier = applier
        self.clock = clock
        self.window_ms = settings.timer_window_ms
        self._heap: list[tuple[int, int, int]] = []  # (deliver_ms, timer, commitlog offset)
        self._in_heap: set[int] = set()
        self._window_end = 0
        self._was_master = False  # at the release loop's last turn
        self._wake = wake()
        # Held by a release from reading the log end to appending its copies, and by a
        # cancel while it appends: a cancel is either in the log a release waits for, or
        # after the release's copies (``release``).
        self._appending = lock()
        self.released = 0  # copies this node appended (a counter for tests and metrics)
        applier.on_scheduled = self._scheduled

    @property
    def state(self) -> TimerState:
        return self.meta.timers

    # ---- produce and cancel -------------------------------------------------------------

    async def produce(
        self,
        topic_name: str,
        messages: Sequence[NewMessage],
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[Scheduled]:
        """A produce of delay messages (every message has ``deliver_at_ms``): each is
        stored as a timer and delivered at its time (a time past is now). The topic is
        made as a produce would make it."""
        check_topic_name(topic_name)
        self.producer.check_request(messages, producer_id, sequence)
        now, limit = self.clock(), self.settings.limits.max_delay_ms
        times = []
        for i, m in enumerate(messages):
            if m.deliver_at_ms is None:
                raise errors.InvalidArgumentError(
                    f"messages[{i}] has no delivery time: a request's messages all have one,"
                    " or none has"
                )
            if m.deliver_at_ms - now > limit:
                raise errors.InvalidArgumentError(
                    f"messages[{i}]: delivered {m.deliver_at_ms - now} ms from now, over"
                    f" max_delay_ms ({limit})"
                )
            times.append(max(now, m.deliver_at_ms))
        await self.gate.require_master_soon()
        topic = await self.topics.get_or_create(topic_name)
        for i, m in enumerate(messages):  # (a plain produce checks it when it encodes)
            check_pinned_queue(m, i, topic.queues)
        return await self.schedule(
            topic, list(zip(messages, times, strict=True)), producer_id, sequence
        )

    async def schedule(
        self,
        topic: TopicMeta,
        messages: Sequence[tuple[NewMessage, int]],
        producer_id: str | None,
        sequence: int | None,
    ) -> list[Scheduled]:
        """Store each (message, time) as a timer of ``topic``; results after commit."""
        timer_topic = await self.topics.system(TIMER_TOPIC)
        records = [
            held(
                m,
                topic.name,
                {PROP_TIMER_DELIVER_MS: str(at)},
                m.born_timestamp if m.born_timestamp is not None else self.clock(),
            )
            for m, at in messages
        ]
        results = await self.producer.produce_to(timer_topic, records, producer_id, sequence)
        return [
            Scheduled(
                r.msg_id,
                r.commitlog_offset,
                self._time_of(r.queue_offset, r.commitlog_offset, at),
                recall_handle(r.queue_offset),
            )
            for r, (_, at) in zip(results, messages, strict=True)
        ]

    def _time_of(self, timer: int, offset: int, asked: int) -> int:
        """The time the timer's record holds: ``asked``, unless a retry was answered from
        the producer-session table, with the record of an earlier attempt (a time past
        was that attempt's now). From the timer queue's unit, else the record."""
        unit = self._unit(timer)
        if unit is not None and unit[0] == offset:
            return unit[2]
        m = self.reads.message_at(offset)
        at = None if m is None else parse_timer(m.properties.get(PROP_TIMER_DELIVER_MS, ""))
        return asked if at is None else at

    async def _timer_of(self, handle: str) -> int:
        """The timer a recall handle names; ``RecallHandleNotFoundError`` for none. A
        produce is answered once its records are committed, perhaps before they are
        applied here: a timer not known yet is looked for again once what is committed
        is applied (``append_timeout_ms`` at most), and a slave, which may not have it
        yet, sends the request to the master (``require_master``'s refusal)."""
        timer = parse_recall_handle(handle)
        if timer is not None and timer >= self.state.end:
            committed = self.gate.server.committed_index
            await self.dispatch.wait_dispatched(committed, self.settings.append_timeout_ms / 1000)
            if timer >= self.state.end:
                self.gate.require_master()
        if timer is None or timer >= self.state.end:
            raise errors.RecallHandleNotFoundError(f"no delay message {handle!r}")
        return timer

    async def held_message(self, handle: str) -> PulledMessage | None:
        """The record of the delay message a recall handle names (None when it is not
        readable here: done long ago); ``NotFoundError`` for no timer."""
        timer = await self._timer_of(handle)
        unit = self._unit(timer)
        return None if unit is None else self.reads.message_at(unit[0])

    async def topic_of(self, handle: str) -> str | None:
        """The topic of the delay message a recall handle names (None when its record is
        not readable here: done long ago); ``NotFoundError`` for no timer."""
        m = await self.held_message(handle)
        return None if m is None else m.properties.get(PROP_REAL_TOPIC)

    async def cancel(self, handle: str) -> None:
        """Cancel a delay message before its delivery: ``AlreadyDeliveredError`` after it,
        nothing again for one cancelled already."""
        if parse_recall_handle(handle) is None:
            raise errors.RecallHandleNotFoundError(f"no delay message {handle!r}")
        await self.gate.require_master_soon()
        timer = await self._timer_of(handle)
        async with self._appending:
            index = None
            if not self.state.is_done(timer):
                index = await self.metalog.append({"op": "timer.cancel", "timer": timer})
        ended = None if index is None else self.applier.outcome(index)
        if ended:
            self._wake.set()
            return
        if index is not None and ended is None and not self.state.is_done(timer):
            # Committed, not applied here within append_timeout_ms: it may yet cancel it.
            raise errors.UnknownOutcomeError(
                f"the cancel of delay message {handle} is not applied yet; retry"
            )
        if self.state.was_cancelled(timer):
            return
        raise errors.AlreadyDeliveredError(f"delay message {handle} was delivered already")

    # ---- the near window ------------------------------------------------------------------

    def _unit(self, timer: int) -> tuple[int, int, int] | None:
        q = self.cq.find(TIMER_TOPIC, 0)
        return None if q is None else q.get(timer)

    def _scheduled(self, timer: int, deliver_ms: int, offset: int) -> None:
        if deliver_ms < self._window_end and timer not in self._in_heap:
            self._push(deliver_ms, timer, offset)

    def _push(self, deliver_ms: int, timer: int, offset: int) -> None:
        if not self._heap or deliver_ms < self._heap[0][0]:
            self._wake.set()  # (the release loop sleeps until the first one)
        heapq.heappush(self._heap, (deliver_ms, timer, offset))
        self._in_heap.add(timer)

    async def refill(self, now: int) -> int:
        """Move the window to ``now + timer_window_ms``: every pending timer due before it
        into the heap, read from the timer queue from the first pending one. The number
        of timers read."""
        self._window_end = end = now + self.window_ms
        q = self.cq.find(TIMER_TOPIC, 0)
        if q is None:
            return 0
        read = 0
        offset, top = self.state.floor, q.max_offset
        while offset < top:
            units = q.read(offset, SCAN_SLICE)
            if not units:
                break
            for timer, offset_in_log, _, deliver in units:
                if deliver < end and timer not in self._in_heap and not self.state.is_done(timer):
                    self._push(deliver, timer, offset_in_log)
            read += len(units)
            offset = units[-1][0] + 1
            await asyncio.sleep(0)  # (a refill of a million timers takes turns of the loop)
        return read

    def pinned_entry_pos(self) -> int | None:
        """The log position of the first pending timer's entry (None: none pending):
        retention keeps it and every entry after it, and a snapshot is handed to Raft only
        if a follower that installs it still receives this entry."""
        if self.state.pending <= 0:
            return None
        unit = self._unit(self.state.floor)
        return None if unit is None else unit[0] - BODY_OFFSET

    # ---- delivering -------------------------------------------------------------------------

    async def run(self) -> None:
        """The release loop: on the master, deliver every timer at its time (``step``),
        looking again when the first timer in the heap falls due, when woken (a timer
        scheduled earlier, a cancel) or after ``IDLE_S``; after a failed release, after
        ``RETRY_S``."""
        while True:
            try:
                wait = await self.step()
            except errors.BrokerError as e:  # not master any more, a full disk, ...
                log.info("delay messages not delivered now: %s", e)
                await asyncio.sleep(RETRY_S)
                continue
            if wait == 0:
                continue
            self._wake.clear()
            # Not wait_for: cancelled as the wake is set, it returns, and the loop goes on
            # (Broker.stop waited for it for ever after a recall).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_S if wait is None else min(IDLE_S, wait)):
                    await self._wake.wait()

    async def step(self) -> float | None:
        """One turn of the release loop (``run``; the simulation drives it on its own
        clock): on the master, refill the window when it moves on (and on becoming
        master) and release what is due. Returns the seconds until the first timer in
        the heap falls due: 0 after a release (more may be due), None for none, and on
        a slave, which releases nothing (a deposed master's heap may hold timers due
        long ago: a wait of 0 would turn the loop at once, again and again). A failed
        release puts its timers back in the heap and raises its ``BrokerError``."""
        master = self.gate.is_master
        now = self.clock()
        if master and (not self._was_master or now >= self._window_end - self.window_ms // 2):
            await self.refill(now)
        self._was_master = master
        if not master:
            return None
        due = self._due(now)
        if due:
            try:
                await self.release(due)
            except errors.BrokerError:
                for item in due:
                    self._push(*item)
                raise
            return 0.0
        return max(0.0, (self._heap[0][0] - now) / 1000) if self._heap else None

    def _due(self, now: int) -> list[tuple[int, int, int]]:
        """The heap's timers due at ``now`` and still pending, in time order, at most a
        produce request's worth."""
        out: list[tuple[int, int, int]] = []
        cap = self.settings.limits.max_messages_per_request
        while self._heap and self._heap[0][0] <= now and len(out) < cap:
            item = heapq.heappop(self._heap)
            self._in_heap.discard(item[1])
            if not self.state.is_done(item[1]):
                out.append(item)
        return out

    async def release(self, due: Sequence[tuple[int, int, int]]) -> None:
        """Append the copies of ``due`` into their topics, once this node's log is applied
        and each is still pending. A cancel appended here meanwhile would come before a
        copy in the log, and the copy would deliver a cancelled message: cancels wait
        (``_appending``) from the read of the log end to the last copy's append."""
        async with self._appending:
            await self._release(due)

    async def _release(self, due: Sequence[tuple[int, int, int]]) -> None:
        end = self.gate.server.ledger_end_index
        if not await self.dispatch.wait_dispatched(end, self.settings.append_timeout_ms / 1000):
            raise errors.UnknownOutcomeError("the log is not applied here yet")
        self.gate.require_master()
        by_topic: dict[str, list[NewMessage]] = {}
        pending = [(timer, offset) for _, timer, offset in due if not self.state.is_done(timer)]
        for timer, m in self._records(pending):
            if m is None:  # (retention keeps a pending timer's record: not expected)
                log.error("delay message %d: its record is gone; dropped", timer)
                await self.metalog.append({"op": "timer.drop", "timer": timer})
                continue
            topic, copy = copy_of(m, (PROP_TIMER_ORIGIN, str(timer)), keep_key=True)
            by_topic.setdefault(topic, []).append(copy)
        for name, copies in by_topic.items():
            t = self.meta.topics.get(name)
            # Dropped, counted: a copy whose topic was deleted since, or made again without
            # the queue it is pinned to (its append would be refused, again and again).
            keep = [c for c in copies if t is not None and (c.queue_id or 0) < t.queues]
            for c in copies:
                if t is None or (c.queue_id or 0) >= t.queues:
                    await self.metalog.append(
                        {"op": "timer.drop", "timer": int(c.properties[PROP_TIMER_ORIGIN])}
                    )
            if t is not None and keep:
                await self.producer.produce_to(t, keep, None, None)
                self.released += len(keep)

    def _records(self, pending: list[tuple[int, int]]) -> list[tuple[int, PulledMessage | None]]:
        """The record of each ``(timer, commitlog offset)``: a run of consecutive timers
        (timers scheduled together and due together) read with one read of their units
        and records; a run that does not read so, one record at a time (None: gone)."""
        q = self.cq.find(TIMER_TOPIC, 0)
        out: list[tuple[int, PulledMessage | None]] = []
        i = 0
        while i < len(pending):
            j = i + 1
            while j < len(pending) and pending[j][0] == pending[j - 1][0] + 1:
                j += 1
            run = pending[i:j]
            units = [] if q is None else q.read(run[0][0], j - i)
            found: list[PulledMessage] | list[PulledMessage | None] | None = None
            if [(u[0], u[1]) for u in units] == run:
                with contextlib.suppress(DLedgerError, MessageFormatError):
                    found = self.reads.messages_of([(t, c, size) for t, c, size, _ in units])
            if found is None:
                found = [self.reads.message_at(offset) for _, offset in run]
            out.extend(zip([t for t, _ in run], found, strict=True))
            i = j
        return out
