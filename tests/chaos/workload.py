"""The chaos workload: concurrent clients over HTTP with the project's client
(``ledgermq.client``), every operation recorded in the history (``tests/chaos/history.py``).

- ``producers`` producers, each with its own producer session, send batches of 1 to
  ``batch_max`` unique values (``p<i>-<n>``) one batch at a time. Ok: the results; an
  error the broker gives before writing anything (bad input) is ``fail``; every other
  error — the client retried under its session until its deadline — is ``info``: the
  batch may be in the log (the checker resolves it).
- One group consumer (``auto_commit=False``) polls, then commits what it polled: so the
  group pull and the queue-by-queue sweep both run.
- One puller pulls a queue directly from one node at a time (the node drawn at random),
  from its own position per queue: reads from followers, stale or not.
- One reporter asks every node for the group's committed offsets every
  ``offsets_every_s``.
- ``pop.consumers`` consumers of a POP group on the same topic receive, ack, nack, let
  messages expire and give them new invisible times (``tests/chaos/pop_workload.py``).

Bounds: each task paces itself (``send_pause_s``, ``pull_pause_s``), every request by
the client's settings; ``stop()`` ends them all within ``stop_s`` (the client's deadline
and 10 s), ``cancel()`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ledgermq.client import (
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    ClientSettings,
    LedgerMQError,
    ReceivedMessage,
)
from ledgermq.demo.load import LoadSettings, task_failure

from .history import History, Read
from .pop_workload import PopPlan, pop_consumer

# Refused before anything is written: the send certainly did not happen.
DEFINITE = {"INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE", "TOPIC_NOT_FOUND", "UNAUTHENTICATED"}


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
    return tuple(Read(m.body.decode(), m.queue_id, m.queue_offset) for m in messages)


class Workload:
    def __init__(self, urls: Mapping[str, str], settings: WorkloadSettings, history: History,
                 rng: random.Random) -> None:  # fmt: skip
        self.urls = dict(urls)
        self.s = settings
        self.h = history
        self.rng = rng
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        runs = [self._produce(i) for i in range(self.s.producers)]
        runs += [self._consume(), self._pull(), self._report_offsets()]
        brokers = list(self.urls.values())
        runs += [
            pop_consumer(i, brokers, self.s.pop, self.s.topic, self.h,
                         random.Random(self.rng.getrandbits(64)), self.stopping, self._pause)
            for i in range(self.s.pop.consumers)
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
        async with AsyncProducer(brokers, producer_id=f"chaos-{i}", settings=self.s.client) as p:
            for n in range(10**9):  # bounded by the run: stopping ends it
                if self.stopping.is_set():
                    return
                size = self.rng.randint(1, self.s.batch_max)
                values = tuple(f"p{i}-{n}-{k}" for k in range(size))
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
                done = self.h.invoke("consumer-0", "commit", pending)
                try:
                    await c.commit()
                except LedgerMQError as e:
                    done("info", error=why(e))
                else:
                    done("ok")
        finally:
            with contextlib.suppress(LedgerMQError, TimeoutError):
                await asyncio.wait_for(c.close(), self.s.client.timeout_s)

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
