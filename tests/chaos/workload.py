"""The chaos workload: concurrent clients over HTTP with the project's client
(``ledgermq.client``), every operation recorded in the history (``tests/chaos/history.py``).

- ``producers`` producers, each with its own producer session, send batches of 1 to
  ``batch_max`` unique values (``p<i>-<n>``) one batch at a time. Ok: the results; an
  error the broker gives before writing anything (bad input) is ``fail``; every other
  error — the client retried under its session until its deadline — is ``info``: the
  batch may be in the log (the checker resolves it). A share of the batches
  (``delay.share``) are delay messages, each due 0 to ``delay.max_ms`` later (the batch
  asks ``delay_ms`` or ``deliver_at_ms``, drawn); after a share of those
  (``delay.recall_share``) the producer recalls one of its messages at a time drawn
  around its due time, so that some recalls come before it and some race it.
- One group consumer (``auto_commit=False``) polls, then commits what it polled: so the
  group pull and the queue-by-queue sweep both run.
- One stale committer (``stale``), as a second consumer of the group committing from an
  old pull would: every 0 to ``2 * stale.every_s`` (drawn) it commits positions the
  consumer polled earlier (one of its last ``stale.keep`` polls, drawn), of the queues
  where that position is below what the consumer has had acknowledged since. The
  broker must leave the group where it is and answer where each queue stands (the
  history keeps the answer: ``stale-commit``). Its draws are a stream of their own
  (``stale_rng``).
- One puller pulls a queue directly from one node at a time (the node drawn at random),
  from its own position per queue: reads from followers, stale or not.
- One reporter asks every node for the group's committed offsets every
  ``offsets_every_s``.
- Once the faults stop, ``wait_for_delays`` waits for the delay messages still due.
- ``pop.consumers`` consumers of a POP group on the same topic receive, ack, nack, let
  messages expire and give them new invisible times (``tests/chaos/pop_workload.py``).
- ``tx.producers`` transactional producers on a topic of their own, the checker thread
  answering the broker's checks and a puller of that topic
  (``tests/chaos/tx_workload.py``); once the faults stop, ``resolve_transactions``
  answers checks until no transaction is pending.

Bounds: each task paces itself (``send_pause_s``, ``pull_pause_s``), every request by
the client's settings; ``stop()`` ends them all within ``stop_s`` (the client's deadline
and 10 s), ``cancel()`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ledgermq.client import (
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    ClientSettings,
    LedgerMQError,
    Message,
    ReceivedMessage,
)
from ledgermq.demo.load import LoadSettings, task_failure

from .delay_checker import read_delays, to_deliver
from .history import Delay, History, Op, Read, Scheduled
from .pop_workload import PopPlan, pop_consumer
from .tx_workload import TxPlan, tx_check_answerer, tx_producer, tx_puller

# Refused before anything is written: the send certainly did not happen.
DEFINITE = {"INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE", "TOPIC_NOT_FOUND", "UNAUTHENTICATED"}
# A recall answered so certainly cancelled nothing.
NOT_CANCELLED = {"ALREADY_DELIVERED", "RECALL_HANDLE_NOT_FOUND"}


@dataclass(frozen=True, slots=True)
class DelayPlan:
    """The producers' delay messages."""

    share: float = 0.25  # of the batches
    max_ms: int = 3_000  # each message due 0 to this much later
    recall_share: float = 0.4  # of the delay batches: one message of it recalled


@dataclass(frozen=True, slots=True)
class StalePlan:
    """The stale committer's commits."""

    every_s: float = 1.0  # between two, on average (drawn 0 to twice this)
    keep: int = 50  # the consumer's last polls it draws positions from


@dataclass(slots=True)
class Recall:
    """A recall a producer will send (at ``at``, monotonic)."""

    value: str
    handle: str
    at: float


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    topic: str = "chaos"
    queues: int = 4
    group: str = "chaos-group"
    producers: int = 2
    batch_max: int = 4
    send_pause_s: float = 0.05
    poll_max_messages: int = 100
    poll_wait_ms: int = 300
    pull_pause_s: float = 0.1
    offsets_every_s: float = 0.5
    pop: PopPlan = field(default_factory=PopPlan)  # the POP group (``pop_plan(seed)``)
    delay: DelayPlan = field(default_factory=DelayPlan)
    stale: StalePlan = field(default_factory=StalePlan)
    tx: TxPlan = field(default_factory=TxPlan)
    # The demo's client (a failover takes a second or two; backoff capped at 0.5 s), an
    # operation given up after 20 s (then it is recorded as info).
    client: ClientSettings = field(
        default_factory=lambda: replace(LoadSettings().client, deadline_s=20.0)
    )
    # One node, one try: the puller and the reporter ask a node, not the cluster.
    probe: ClientSettings = field(
        default_factory=lambda: ClientSettings(
            timeout_s=2.0, connect_timeout_s=1.0, deadline_s=3.0, max_attempts=1
        )
    )

    @property
    def stop_s(self) -> float:
        """The bound on ``Workload.stop``: an operation's deadline, and its cleanup."""
        return self.client.deadline_s + 10


def why(e: LedgerMQError) -> str:
    return f"{e.code}: {e}"[:300]


def reads(messages: list[ReceivedMessage]) -> tuple[Read, ...]:
    return tuple(
        Read(m.body.decode(), m.queue_id, m.queue_offset, m.store_timestamp) for m in messages
    )


class Workload:
    def __init__(self, urls: Mapping[str, str], settings: WorkloadSettings, history: History,
                 rng: random.Random, tx_rng: random.Random | None = None,
                 stale_rng: random.Random | None = None) -> None:  # fmt: skip
        """``tx_rng``: the transactional clients' draws, ``stale_rng`` the stale
        committer's (each a stream of its own, so that the other clients' draws stay as
        they were)."""
        self.urls = dict(urls)
        self.s = settings
        self.h = history
        self.rng = rng
        self.tx_rng = tx_rng or random.Random(0)
        self.stale_rng = stale_rng or random.Random(1)
        # The consumer's positions after each of its last polls, and its offsets the
        # broker acknowledged (by queue, the highest): what the stale committer draws on.
        self.polled: deque[dict[int, int]] = deque(maxlen=settings.stale.keep)
        self.acked: dict[int, int] = {}
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        runs = [self._produce(i) for i in range(self.s.producers)]
        runs += [self._consume(), self._commit_stale(), self._pull(), self._report_offsets()]
        brokers = list(self.urls.values())
        runs += [
            pop_consumer(i, brokers, self.s.pop, self.s.topic, self.h,
                         random.Random(self.rng.getrandbits(64)), self.stopping, self._pause)
            for i in range(self.s.pop.consumers)
        ]  # fmt: skip
        tx, client = self.s.tx, self.s.client
        runs += [
            tx_producer(i, brokers, tx, client, self.h,
                        random.Random(self.tx_rng.getrandbits(64)), self.stopping, self._pause)
            for i in range(tx.producers)
        ]  # fmt: skip
        runs += [
            tx_check_answerer(brokers, tx, client, self.h, self.stopping),
            tx_puller(self.urls, tx, self.s.probe, self.h,
                      random.Random(self.tx_rng.getrandbits(64)), self.stopping, self._pause),
        ]  # fmt: skip
        self.tasks = [asyncio.create_task(r) for r in runs]

    def failed(self) -> BaseException | None:
        """A task's unexpected error (a bug in the client or here), if any."""
        return task_failure(self.tasks)

    async def stop(self) -> None:
        """Each task ends after its operation under way (within ``stop_s``: then it is
        cancelled)."""
        self.stopping.set()
        _done, pending = await asyncio.wait(self.tasks, timeout=self.s.stop_s)
        await self._cancel(pending)

    async def cancel(self) -> None:
        """Every task cancelled now (a run that stopped early: the operations under way
        stay invoked, never completed)."""
        self.stopping.set()
        await self._cancel([t for t in self.tasks if not t.done()])

    @staticmethod
    async def _cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
        pending = list(tasks)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    # ---- the processes --------------------------------------------------------------------

    async def _produce(self, i: int) -> None:
        process = f"producer-{i}"
        brokers = list(self.urls.values())
        recalls: list[Recall] = []
        async with AsyncProducer(brokers, producer_id=f"chaos-{i}", settings=self.s.client) as p:
            for n in range(10**9):  # bounded by the run: stopping ends it
                if self.stopping.is_set():
                    return
                for r in [r for r in recalls if r.at <= time.monotonic()]:
                    recalls.remove(r)
                    await self._recall(p, process, r)
                size = self.rng.randint(1, self.s.batch_max)
                values = tuple(f"p{i}-{n}-{k}" for k in range(size))
                if self.rng.random() < self.s.delay.share:
                    recalls += await self._send_delayed(p, process, values)
                    await self._pause(self.s.send_pause_s)
                    continue
                done = self.h.invoke(process, "send", values)
                try:
                    results = await p.send(self.s.topic, list(values))
                except LedgerMQError as e:
                    done("fail" if e.code in DEFINITE else "info", error=why(e))
                else:
                    rs = (
                        Read(x, r.queue_id, r.queue_offset)
                        for x, r in zip(values, results, strict=True)
                    )
                    done("ok", tuple(rs))
                await self._pause(self.s.send_pause_s)

    async def _send_delayed(self, p: AsyncProducer, process: str,
                            values: tuple[str, ...]) -> list[Recall]:  # fmt: skip
        """A batch of delay messages; the recall of one of them to send later, if drawn."""
        plan, rng = self.s.delay, self.rng
        delays = [rng.randint(0, plan.max_ms) for _ in values]
        if rng.random() < 0.5:  # each way of asking, half the batches
            now_ms = int(time.time() * 1000)
            asked = tuple(Delay(x, now_ms + d, None) for x, d in zip(values, delays, strict=True))
        else:
            asked = tuple(Delay(x, None, d) for x, d in zip(values, delays, strict=True))
        messages = [Message(a.value, deliver_at_ms=a.deliver_at_ms, delay_ms=a.delay_ms)
                    for a in asked]  # fmt: skip
        done = self.h.invoke(process, "delay", asked)
        try:
            results = await p.send(self.s.topic, messages)
        except LedgerMQError as e:
            done("fail" if e.code in DEFINITE else "info", error=why(e))
            return []
        scheduled = tuple(
            Scheduled(x, r.deliver_at_ms or 0, r.recall_handle or "")
            for x, r in zip(values, results, strict=True)
        )
        done("ok", scheduled)
        if rng.random() >= plan.recall_share:
            return []
        k = rng.randrange(len(values))
        # Around its due time: before it (cancelled) or after (already delivered), or racing.
        in_s = max(0, scheduled[k].deliver_at_ms - int(time.time() * 1000)) / 1000
        at = time.monotonic() + rng.uniform(0.0, in_s + 0.3)
        return [Recall(values[k], scheduled[k].recall_handle, at)]

    async def _recall(self, p: AsyncProducer, process: str, r: Recall) -> None:
        done = self.h.invoke(process, "recall", {"value": r.value, "handle": r.handle})
        try:
            await p.recall(r.handle)
        except LedgerMQError as e:
            done("fail" if e.code in NOT_CANCELLED else "info", error=why(e))
        else:
            done("ok")

    async def _consume(self) -> None:
        brokers = list(self.urls.values())
        c = AsyncConsumer(brokers, self.s.group, self.s.topic, settings=self.s.client,
                          auto_commit=False)  # fmt: skip
        try:
            while not self.stopping.is_set():
                done = self.h.invoke("consumer-0", "poll", None)
                try:
                    got = await c.poll(self.s.poll_max_messages, self.s.poll_wait_ms)
                except LedgerMQError as e:
                    done("fail", error=why(e))
                    continue
                done("ok", reads(got), c.master)
                pending = dict(c.positions)
                self.polled.append(pending)
                done = self.h.invoke("consumer-0", "commit", pending)
                try:
                    await c.commit()
                except LedgerMQError as e:
                    done("info", error=why(e))
                else:
                    done("ok")
                    for q, o in pending.items():
                        self.acked[q] = max(self.acked.get(q, 0), o)
        finally:
            with contextlib.suppress(LedgerMQError, TimeoutError):
                await asyncio.wait_for(c.close(), self.s.client.timeout_s)

    async def _commit_stale(self) -> None:
        """Positions the consumer polled earlier, committed where they are below what it
        has had acknowledged since; the broker's answer recorded (where each queue
        stands after the commit)."""
        rng, plan = self.stale_rng, self.s.stale
        async with AsyncAdmin(list(self.urls.values()), settings=self.s.client) as admin:
            while not self.stopping.is_set():
                await self._pause(rng.uniform(0, 2 * plan.every_s))
                if self.stopping.is_set() or not self.polled:
                    continue
                then = self.polled[rng.randrange(len(self.polled))]
                stale = {q: o for q, o in sorted(then.items()) if o < self.acked.get(q, 0)}
                if not stale:
                    continue
                done = self.h.invoke("committer-1", "stale-commit", stale)
                try:
                    answer = await admin.commit_offsets(self.s.group, self.s.topic, stale)
                except LedgerMQError as e:
                    done("fail" if e.code in DEFINITE else "info", error=why(e))
                else:
                    done("ok", answer)

    async def _pull(self) -> None:
        admins = {n: AsyncAdmin([u], settings=self.s.probe) for n, u in self.urls.items()}
        positions = dict.fromkeys(range(self.s.queues), 0)
        try:
            while not self.stopping.is_set():
                node = self.rng.choice(sorted(admins))
                q = self.rng.randrange(self.s.queues)
                done = self.h.invoke("puller-0", "pull", (q, positions[q]))
                try:
                    r = await admins[node].pull(self.s.topic, q, positions[q], max_messages=50)
                except LedgerMQError as e:
                    done("fail", None, node, why(e))
                else:
                    done("ok", reads(r.messages), node)
                    if r.messages:
                        positions[q] = r.messages[-1].queue_offset + 1
                await self._pause(self.s.pull_pause_s)
        finally:
            for a in admins.values():
                await a.close()

    async def _report_offsets(self) -> None:
        admins = {n: AsyncAdmin([u], settings=self.s.probe) for n, u in self.urls.items()}
        try:
            while not self.stopping.is_set():
                await asyncio.gather(
                    *(report_offsets(self.h, self.s, n, a) for n, a in admins.items())
                )
                await self._pause(self.s.offsets_every_s)
        finally:
            for a in admins.values():
                await a.close()


async def report_offsets(h: History, s: WorkloadSettings, node: str, admin: AsyncAdmin) -> None:
    """One node's view of the group's committed offsets into the history, if it has one."""
    try:
        offsets = await admin.group_offsets(s.group, s.topic)
    except LedgerMQError:
        return
    committed = {o.queue_id: o.committed_offset for o in offsets}
    if committed and None not in committed.values():
        h.ok("offsets", "offsets", committed, node)


async def wait_for_delays(urls: Mapping[str, str], s: WorkloadSettings, ops: Sequence[Op],
                          timeout_s: float) -> tuple[int, int]:  # fmt: skip
    """Once the faults stop: until every delay message certain to be delivered is in the
    topic (each queue read from where the last look ended, from any node) and every
    one that may have been stored is due, or ``timeout_s``. Then the POP drain finds
    them all. (How many were awaited, how many of them seen.)"""
    delays = read_delays(ops)
    now_ms = time.time() * 1000
    latest = max((x for d in delays.values() if (x := d.latest_ms(now_ms)) is not None),
                 default=0.0)  # fmt: skip
    awaited = to_deliver(delays)
    seen: set[str] = set()
    positions = dict.fromkeys(range(s.queues), 0)
    deadline = time.monotonic() + timeout_s
    async with AsyncAdmin(list(urls.values()), settings=s.probe) as admin:
        while time.monotonic() < deadline:
            for q in positions:
                with contextlib.suppress(LedgerMQError):
                    r = await admin.pull(s.topic, q, positions[q], max_messages=1000)
                    seen.update(m.body.decode() for m in r.messages)
                    if r.messages:
                        positions[q] = r.messages[-1].queue_offset + 1
            if awaited <= seen and time.time() * 1000 >= latest:
                break
            await asyncio.sleep(0.2)
    return len(awaited), len(awaited & seen)
