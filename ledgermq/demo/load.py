"""The failover demo's workload and its books (``ledgermq demo``).

One producer with a producer session and one consumer group run in the background over
HTTP with the project's own client (``AsyncProducer``, ``AsyncConsumer``), while the
story (``ledgermq.demo``) kills and restarts nodes. Every message body names its run and its
number (``<run>:<n>``), so what the consumer reads can be matched with what the producer
was told, one message at a time.

The books (Jepsen's queue checker's vocabulary), kept per message number:

- *acknowledged*: the producer got its result (queue and queue offset) after quorum
  commit; *in doubt*: its batch failed after every retry, so it may or may not be in
  the log (allowed either way, never twice);
- *lost*: acknowledged, never consumed — never allowed;
- *duplicated*: consumed more than once — never allowed (the producer session answers
  a retried batch with its original results; the group's offsets are replicated and
  the client drops what a lagging node repeats);
- *misplaced*: consumed at another (queue, offset) than the producer was told;
- *unexpected*: a message of this run the producer never sent.

Bounds: memory is 9 bytes per message sent (an ``array`` of positions and a
``bytearray`` of delivery counts), capped by ``LoadSettings.max_messages``; the
producer's pace by ``rate_per_s``; every wait by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..client import (
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    ClientSettings,
    LedgerMQError,
    ReceivedMessage,
    SendResult,
    TopicNotFoundError,
)

# A (queue, queue offset) packed in one int64: queue ids stay far below 2**23, offsets
# below 2**40 (a trillion messages per queue).
_OFFSET_BITS = 40
IN_DOUBT = -1  # the batch failed after every retry: it may be in the log
PENDING = -2  # the batch is on its way: its outcome is not known yet
MAX_COUNT = 255  # delivery counts saturate (a bytearray holds one byte per message)


def pack_position(queue_id: int, queue_offset: int) -> int:
    return (queue_id << _OFFSET_BITS) | queue_offset


def unpack_position(packed: int) -> tuple[int, int]:
    return packed >> _OFFSET_BITS, packed & ((1 << _OFFSET_BITS) - 1)


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """The workload's knobs; every one a ``ledgermq demo`` option."""

    topic: str = "demo"
    queues: int = 4
    group: str = "ledgermq-demo"  # the demo gives each run its own
    batch: int = 20  # messages per produce request
    body_bytes: int = 64  # the body names run and number, padded to this size
    # Messages per second; 0 sends the next batch as soon as the last one is acknowledged.
    rate_per_s: int = 2000
    # The books take 9 bytes per message: the producer stops at this many.
    max_messages: int = 5_000_000
    poll_max_messages: int = 500
    poll_wait_ms: int = 500
    # Each client operation (a send, a poll) gives up after this long; a failover takes
    # a second or two, so this only trips when no master comes back at all. Backoff is
    # capped at 0.5 s instead of the client's 2 s (a default for many clients retrying
    # at once): one producer may retry sooner, so the window measured is the
    # cluster's failover more than the client's sleep.
    client: ClientSettings = field(
        default_factory=lambda: ClientSettings(
            timeout_s=5.0, connect_timeout_s=1.0, deadline_s=30.0, backoff_cap_s=0.5
        )
    )

    def __post_init__(self) -> None:
        if self.batch < 1 or self.queues < 1 or self.max_messages < 1:
            raise ValueError("batch, queues and max_messages must be >= 1")
        if self.rate_per_s < 0:
            raise ValueError("rate_per_s must be >= 0 (0: no pacing)")
        if self.body_bytes < 24:
            raise ValueError("body_bytes must be >= 24 (the body names run and number)")


class History:
    """Per message number: where the producer was told it went (or in doubt), and how
    often the consumer read it. Numbers are handed out in order, so both are arrays.

    A batch's numbers are reserved (``PENDING``) before it is sent: the consumer may
    read a message before the producer has processed its acknowledgement, and must then
    find it already sent. Where such a message was read waits in ``early`` (at most the
    batch in flight) until the acknowledgement says where it should have been."""

    def __init__(self, run: str, settings: LoadSettings) -> None:
        self.run = run
        self.prefix = f"{run}:".encode()
        self.settings = settings
        self.positions = array("q")  # per number sent: packed position, PENDING or IN_DOUBT
        self.deliveries = bytearray()  # per number: times consumed, saturating
        self.early: dict[int, int] = {}  # number → packed position read while PENDING
        self.acknowledged = 0
        self.in_doubt = 0
        self.consumed = 0  # distinct messages of this run
        self.duplicated = 0  # messages consumed more than once
        self.misplaced = 0
        self.unexpected = 0
        self.foreign = 0  # messages in the topic from other producers or runs

    @property
    def sent(self) -> int:
        return len(self.positions)

    def body(self, n: int) -> str:
        head = f"{self.run}:{n:012d}:"
        return head + "." * max(0, self.settings.body_bytes - len(head))

    def number(self, body: bytes) -> int | None:
        """The message number of one of this run's bodies; None for any other body."""
        if not body.startswith(self.prefix):
            return None
        digits = body[len(self.prefix) : len(self.prefix) + 12]
        return int(digits) if digits.isdigit() else None

    def next_batch(self, size: int) -> tuple[int, list[str]]:
        """Reserve the next ``size`` numbers; their bodies."""
        first = self.sent
        self.positions.extend([PENDING] * size)
        self.deliveries.extend(bytes(size))
        return first, [self.body(first + i) for i in range(size)]

    def acknowledge(self, first: int, results: Sequence[SendResult]) -> None:
        for i, r in enumerate(results):
            n = first + i
            assert self.positions[n] == PENDING, f"message {n} acknowledged twice"
            packed = pack_position(r.queue_id, r.queue_offset)
            self.positions[n] = packed
            read_at = self.early.pop(n, None)
            if read_at is not None and read_at != packed:
                self.misplaced += 1
        self.acknowledged += len(results)

    def doubt(self, first: int, count: int) -> None:
        for n in range(first, first + count):
            self.positions[n] = IN_DOUBT
            self.early.pop(n, None)
        self.in_doubt += count

    def deliver(self, m: ReceivedMessage) -> None:
        n = self.number(m.body)
        if n is None:
            self.foreign += 1
            return
        if n >= self.sent:
            self.unexpected += 1
            return
        seen = self.deliveries[n]
        if seen == 0:
            self.consumed += 1
        elif seen == 1:
            self.duplicated += 1
        self.deliveries[n] = min(MAX_COUNT, seen + 1)
        want, got = self.positions[n], pack_position(m.queue_id, m.queue_offset)
        if want == PENDING:
            self.early[n] = got
        elif want not in (IN_DOUBT, got):
            self.misplaced += 1

    def lost(self) -> list[int]:
        """Acknowledged message numbers never consumed (the first hundred)."""
        out: list[int] = []
        for n, packed in enumerate(self.positions):
            if packed >= 0 and self.deliveries[n] == 0:
                out.append(n)
                if len(out) >= 100:
                    break
        return out

    def lost_count(self) -> int:
        return sum(
            1 for n, packed in enumerate(self.positions) if packed >= 0 and self.deliveries[n] == 0
        )

    def recovered(self) -> int:
        """In-doubt messages that turned out to be in the log (read once)."""
        return sum(
            1
            for n, packed in enumerate(self.positions)
            if packed == IN_DOUBT and self.deliveries[n] > 0
        )


@dataclass(slots=True)
class Ack:
    """One acknowledged batch: when, by which master, how many messages."""

    at: float
    master: str | None
    count: int


class Workload:
    """The producer and consumer tasks over one topic, and the ways the story waits on
    them. ``on_event`` receives one line per thing worth telling (a failed batch),
    ``on_ack`` every acknowledged batch."""

    def __init__(
        self,
        brokers: str | Sequence[str],
        settings: LoadSettings,
        *,
        run: str | None = None,
        on_event: Callable[[str], None] = lambda _line: None,
        on_ack: Callable[[Ack], None] = lambda _ack: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.brokers = brokers
        self.settings = settings
        self.history = History(run or secrets.token_hex(4), settings)
        self.on_event = on_event
        self.on_ack = on_ack
        self.clock = clock
        self.producer = AsyncProducer(
            brokers, producer_id=f"demo-{self.history.run}", settings=settings.client
        )
        self.consumer = AsyncConsumer(
            brokers, settings.group, settings.topic, settings=settings.client
        )
        self.last_ack: Ack | None = None
        self.errors = 0
        self._acked = asyncio.Condition()
        self._polled = asyncio.Condition()
        self._stop_producing = asyncio.Event()
        self._stop_consuming = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- running ----------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._produce(), name="demo-producer"),
            asyncio.create_task(self._consume(), name="demo-consumer"),
        ]

    @property
    def producing(self) -> bool:
        return bool(self._tasks) and not self._tasks[0].done()

    def failed(self) -> BaseException | None:
        """A task's unexpected error (a bug, not a broker refusal), if any."""
        return task_failure(self._tasks)

    async def _produce(self) -> None:
        s, h = self.settings, self.history
        interval_s = s.batch / s.rate_per_s if s.rate_per_s else 0.0
        next_at = self.clock()
        while not self._stop_producing.is_set():
            size = min(s.batch, s.max_messages - h.sent)
            if size <= 0:
                self.on_event(f"the producer stops at --max-messages {s.max_messages:,}")
                return
            first, bodies = h.next_batch(size)
            try:
                results = await self.producer.send(s.topic, bodies)
            except LedgerMQError as e:
                # Every retry under the session failed within the deadline: the batch may
                # or may not be in the log. The next batch takes the next sequence.
                h.doubt(first, size)
                self.errors += 1
                self.on_event(f"a batch of {size} failed after every retry ({e.code}): in doubt")
            else:
                h.acknowledge(first, results)
                ack = Ack(self.clock(), self.producer.master, size)
                self.on_ack(ack)
                async with self._acked:
                    self.last_ack = ack
                    self._acked.notify_all()
            if interval_s:
                # Pace to the rate; after a stall (a failover) start afresh, no burst.
                next_at = max(next_at + interval_s, self.clock() - 1.0)
                delay = next_at - self.clock()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop_producing.wait(), delay)

    async def _consume(self) -> None:
        s = self.settings
        while not self._stop_consuming.is_set():
            try:
                got = await self.consumer.poll(
                    max_messages=s.poll_max_messages, wait_ms=s.poll_wait_ms
                )
            except LedgerMQError as e:
                self.errors += 1
                self.on_event(f"a poll failed after every retry ({e.code}); polling on")
                continue
            for m in got:
                self.history.deliver(m)
            async with self._polled:
                self._polled.notify_all()

    async def next_ack(self, after: float, not_from: str | None, timeout_s: float) -> Ack:
        """The first batch acknowledged after ``after`` by a master other than
        ``not_from`` (an answer the old master sent just before it died does not count)."""
        async with self._acked:
            await asyncio.wait_for(
                self._acked.wait_for(
                    lambda: (
                        self.last_ack is not None
                        and self.last_ack.at > after
                        and (not_from is None or self.last_ack.master != not_from)
                    )
                ),
                timeout_s,
            )
            assert self.last_ack is not None
            return self.last_ack

    async def stop_producing(self) -> None:
        self._stop_producing.set()
        if self._tasks:
            await asyncio.wait([self._tasks[0]])

    async def drain(self, ends: dict[int, int], timeout_s: float) -> bool:
        """Wait (bounded) until the consumer has read every queue up to ``ends`` (the
        master's end offsets once the producer stopped), then commit. False on timeout."""

        def drained() -> bool:
            pos = self.consumer.positions
            return all(pos.get(q, 0) >= end for q, end in ends.items())

        try:
            async with self._polled:
                await asyncio.wait_for(self._polled.wait_for(drained), timeout_s)
        except TimeoutError:
            return False
        self._stop_consuming.set()
        if len(self._tasks) > 1:
            await asyncio.wait([self._tasks[1]], timeout=self.settings.client.deadline_s)
        with contextlib.suppress(LedgerMQError):
            await self.consumer.commit()
        return True

    async def close(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.producer.close()
        # Closing commits what was delivered and not yet committed (nothing, after a
        # drain); bounded, as there may be no master to take it when we are failing.
        with contextlib.suppress(LedgerMQError, TimeoutError):
            await asyncio.wait_for(self.consumer.close(), self.settings.client.timeout_s)


async def topic_ends(master_url: str, topic: str, settings: ClientSettings) -> dict[int, int]:
    """Each queue's next offset on one node (the master: it has everything committed)."""
    async with AsyncAdmin([master_url], settings=settings) as admin:
        desc = await admin.describe_topic(topic)
    return {q.queue_id: q.max_offset for q in desc.queues}


async def ensure_topic(
    brokers: str | Sequence[str], topic: str, queues: int, settings: ClientSettings
) -> int:
    """Create the topic, or take it as it is; its queue count."""
    async with AsyncAdmin(brokers, settings=settings) as admin:
        with contextlib.suppress(TopicNotFoundError):
            return len((await admin.describe_topic(topic)).queues)
        return (await admin.create_topic(topic, queues)).queues


def task_failure(tasks: Iterable[asyncio.Task[None]]) -> BaseException | None:
    """The first error a finished task ended with (not a cancel), if any."""
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            return t.exception()
    return None


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-quantile (0..1) by the nearest-rank method (no interpolation)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    return xs[max(1, math.ceil(q * len(xs))) - 1]
