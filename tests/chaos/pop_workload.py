"""The chaos run's POP group (issue 28): its configuration, drawn from the seed
(``pop_plan``), its consumers under the nemesis (``pop_consumer``, started by
``Workload``), the drain of the group once the faults stop (``drain_pop``) and what is
read at the end (``read_dead_letters``, ``report_pop_lag``). Every operation goes into
the history (``tests/chaos/history.py``) as the consumer saw it;
``tests/chaos/pop_checker.py`` checks them.

The group reads the workload's topic from its earliest message, with short invisible
times and retry delays, so that expiries and redeliveries happen under faults, and
sometimes few delivery attempts, so that dead letters do; FIFO or not. Each consumer
receives with a long poll and, for each message it got, draws what it does with it
(``FATES``): ack it soon, nack it (with a delay), let its invisible time pass, give it
a new invisible time and then ack it, or ack it only after its invisible time (a late
ack racing the redelivery). What it holds it acts on at the drawn time; it holds at most
``MAX_HELD`` messages (then it receives nothing).

Outcomes: an ack, nack or new invisible time answered is ``ok`` with what the broker
said; any error is ``info`` (the client retries under its deadline; a retried request
whose first attempt applied answers ``INVALID_RECEIPT_HANDLE``, so even that answer may
hide an effect). A receive refused before anything was written is ``fail``, any other
error ``info`` (it may have handed messages out that nobody saw: they come back after
their invisible time).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgermq.client import (
    AsyncAdmin,
    AsyncPopConsumer,
    ClientSettings,
    LedgerMQError,
    PopMessage,
    ReceivedMessage,
    TopicNotFoundError,
)
from ledgermq.client.popping import dlq_topic

from .history import DeadLetter, History, Popped

# What a consumer does with a message it received (``PopPlan.fates`` weighs them).
FATES = ("ack", "nack", "expire", "extend", "late")
MAX_HELD = 64  # messages a consumer holds at most (it stops receiving)
RECEIVE_MAX = 16  # messages a receive asks for at most
RECEIVE_WAIT_MS = 300  # a receive's long poll (shorter when something held is due)
ERROR_PAUSE_S = 0.1  # after an error, before the next request
NACK_DELAYS_MS = (0, 100, 300)
DRAIN_RECEIVE_MAX = 64
DRAIN_WAIT_MS = 500
# The consumers' operations need the master and go through failovers: a dead master
# costs an election, a paused one its request timeout. Within the workload's deadline.
POP_CLIENT = ClientSettings(timeout_s=3.0, connect_timeout_s=1.0, deadline_s=20.0,
                            backoff_cap_s=0.5)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PopPlan:
    """The POP group of a run and how its consumers treat what they get."""

    group: str = "chaos-pop"
    fifo: bool = False
    max_delivery_attempts: int = 3
    retry_delay_ms: int = 200  # the group's retry delay, every attempt
    invisible_ms: int = 1_000  # what every receive asks (and every new invisible time)
    consumers: int = 2
    fates: tuple[int, ...] = (80, 5, 5, 5, 5)  # FATES' weights

    def config(self) -> dict[str, Any]:
        """The group's configuration (``PUT /v1/groups/{group}``, less its mode)."""
        return {
            "fifo": self.fifo,
            "max_delivery_attempts": self.max_delivery_attempts,
            "retry": {"policy": "list", "delays_ms": (self.retry_delay_ms,)},
            "start": "earliest",
        }

    def describe(self, topic: str) -> dict[str, Any]:
        """The ``pop-config`` op's value: what the checker needs."""
        return {
            "group": self.group,
            "topic": topic,
            **self.config(),
            "invisible_ms": self.invisible_ms,
        }


def pop_plan(seed: int) -> PopPlan:
    """The seed's POP group (from a stream of its own: the nemesis's schedule and the
    workload's draws stay as they were)."""
    rng = random.Random(f"{seed}/pop")
    fifo = rng.random() < 0.5
    return PopPlan(
        fifo=fifo,
        max_delivery_attempts=rng.choice((2, 3, 8)),
        retry_delay_ms=rng.choice((100, 400)),
        invisible_ms=rng.choice((800, 1_500)),
        consumers=rng.choice((2, 3)),
        # FIFO: a message held back holds its whole queue, so fewer are.
        fates=(90, 3, 3, 2, 2) if fifo else (80, 5, 5, 5, 5),
    )


def popped(m: PopMessage) -> Popped:
    return Popped(m.body.decode(), m.queue_id, m.queue_offset, m.receipt_handle,
                  m.delivery_attempt, m.invisible_until, m.msg_id,
                  m.store_timestamp)  # fmt: skip


def _why(e: LedgerMQError) -> str:
    return f"{e.code}: {e}"[:300]


# Refused before anything was written: the receive certainly handed nothing out.
DEFINITE = {"INVALID_ARGUMENT", "TOPIC_NOT_FOUND", "GROUP_NOT_FOUND", "UNAUTHENTICATED"}


@dataclass(slots=True)
class Held:
    """A message a consumer holds: its current handle, what it will do, and when."""

    handle: str
    fate: str
    act_at: float  # monotonic


@dataclass(slots=True)
class PopClient:
    """One POP consumer's operations, each recorded in the history as ``process``."""

    consumer: AsyncPopConsumer
    process: str
    h: History
    invisible_ms: int

    async def receive(self, max_messages: int, wait_ms: int) -> list[PopMessage] | None:
        """What a receive handed out (None: an error, recorded)."""
        done = self.h.invoke(self.process, "receive", self.invisible_ms)
        try:
            got = await self.consumer.receive(max_messages, self.invisible_ms, wait_ms)
        except LedgerMQError as e:
            done("fail" if e.code in DEFINITE else "info", error=_why(e))
            return None
        done("ok", tuple(popped(m) for m in got))
        return got

    async def settle(self, f: str, handles: list[str], delay_ms: int | None = None) -> None:
        """An ack or a nack (``f``) of ``handles``."""
        value: Any = tuple(handles) if f == "ack" else {"handles": tuple(handles),
                                                         "delay_ms": delay_ms}  # fmt: skip
        done = self.h.invoke(self.process, f, value)
        try:
            if f == "ack":
                results = await self.consumer.ack(handles)
            else:
                results = await self.consumer.nack(handles, delay_ms)
        except LedgerMQError as e:
            done("info", error=_why(e))
            return
        done("ok", {r.receipt_handle: r.status for r in results})

    async def extend(self, handle: str) -> str | None:
        """A new invisible time: the new handle (None: an error, recorded)."""
        asked = {"handle": handle, "invisible_ms": self.invisible_ms}
        done = self.h.invoke(self.process, "extend", asked)
        try:
            new = await self.consumer.extend(handle, self.invisible_ms)
        except LedgerMQError as e:
            done("info", error=_why(e))
            return None
        done("ok", new)
        return new


@dataclass(slots=True)
class PopConsumerRun:
    """One consumer under the nemesis (module docstring)."""

    client: PopClient
    plan: PopPlan
    rng: random.Random
    stopping: asyncio.Event
    pause: Callable[[float], Awaitable[None]]
    held: list[Held] = field(default_factory=list)

    async def run(self) -> None:
        while not self.stopping.is_set():
            await self._act(time.monotonic())
            room = MAX_HELD - len(self.held)
            wait_s = RECEIVE_WAIT_MS / 1000
            if self.held:
                wait_s = min(wait_s, max(0.0, min(x.act_at for x in self.held) - time.monotonic()))
            if room <= 0:
                await self.pause(wait_s)
                continue
            got = await self.client.receive(min(RECEIVE_MAX, room), int(wait_s * 1000))
            if got is None:
                await self.pause(ERROR_PAUSE_S)
                continue
            now = time.monotonic()
            for m in got:
                fate = self.rng.choices(FATES, self.plan.fates)[0]
                if fate != "expire":
                    self.held.append(Held(m.receipt_handle, fate, now + self._work_s(fate)))

    def _work_s(self, fate: str) -> float:
        inv_s = self.plan.invisible_ms / 1000
        if fate == "late":  # after the invisible time: racing the redelivery
            return inv_s + self.rng.uniform(0.0, self.plan.retry_delay_ms / 1000 + 0.2)
        return self.rng.uniform(0.0, 0.3 * inv_s)

    async def _act(self, now: float) -> None:
        """Everything held that is due: the acks in one request, the nacks in one, each
        new invisible time on its own (the new handle is acked later)."""
        due = [x for x in self.held if x.act_at <= now]
        if not due:
            return
        self.held = [x for x in self.held if x.act_at > now]
        acks = [x.handle for x in due if x.fate in ("ack", "late")]
        nacks = [x.handle for x in due if x.fate == "nack"]
        if acks:
            await self.client.settle("ack", acks)
        if nacks:
            await self.client.settle("nack", nacks, self.rng.choice(NACK_DELAYS_MS))
        for x in due:
            if x.fate == "extend" and not self.stopping.is_set():
                new = await self.client.extend(x.handle)
                if new is not None:
                    self.held.append(Held(new, "ack", time.monotonic() + self._work_s("ack")))


async def pop_consumer(i: int, urls: Sequence[str], plan: PopPlan, topic: str, h: History,
                       rng: random.Random, stopping: asyncio.Event,
                       pause: Callable[[float], Awaitable[None]]) -> None:  # fmt: skip
    """Consumer ``i`` of the group until ``stopping``; what it holds then is left to its
    invisible time (the drain gets it)."""
    async with AsyncPopConsumer(list(urls), plan.group, topic, settings=POP_CLIENT) as c:
        client = PopClient(c, f"pop-{i}", h, plan.invisible_ms)
        await PopConsumerRun(client, plan, rng, stopping, pause).run()


# ---- the end ------------------------------------------------------------------------------


async def configure_group(urls: Sequence[str], plan: PopPlan, topic: str, h: History,
                          settings: ClientSettings) -> None:  # fmt: skip
    """The group, before any message is sent; ``pop-config`` in the history."""
    async with AsyncAdmin(list(urls), settings=settings) as admin:
        await admin.configure_group(plan.group, **plan.config())
    h.ok("pop-config", "pop-config", plan.describe(topic))


async def pop_lags(admin: AsyncAdmin, plan: PopPlan, topic: str) -> dict[int, int] | None:
    """One node's lag per queue for the group (None: no answer)."""
    try:
        offsets = await admin.group_offsets(plan.group, topic)
    except LedgerMQError:
        return None
    return {o.queue_id: o.lag for o in offsets}


async def drain_pop(urls: Mapping[str, str], plan: PopPlan, topic: str, queues: int,
                    h: History, timeout_s: float) -> bool:  # fmt: skip
    """Once the faults stop: one consumer receives and acks everything until every
    node says the group's lag is 0 on every queue (True), or ``timeout_s`` (False).
    What is in flight comes back after its invisible time; what has spent its attempts
    goes to the dead letters."""
    probe = ClientSettings(timeout_s=2.0, connect_timeout_s=1.0, deadline_s=3.0, max_attempts=1)
    admins = [AsyncAdmin([u], settings=probe) for u in urls.values()]
    deadline = time.monotonic() + timeout_s
    try:
        async with AsyncPopConsumer(list(urls.values()), plan.group, topic,
                                    settings=POP_CLIENT) as c:  # fmt: skip
            client = PopClient(c, "pop-drain", h, plan.invisible_ms)
            while time.monotonic() < deadline:
                got = await client.receive(DRAIN_RECEIVE_MAX, DRAIN_WAIT_MS)
                if got:
                    await client.settle("ack", [m.receipt_handle for m in got])
                    continue
                lags = await asyncio.gather(*(pop_lags(a, plan, topic) for a in admins))
                if all(x is not None and len(x) == queues and not any(x.values()) for x in lags):
                    return True
                if got is None:
                    await asyncio.sleep(ERROR_PAUSE_S)
    finally:
        for a in admins:
            await a.close()
    return False


def dead_letter(m: ReceivedMessage) -> DeadLetter:
    p = m.properties

    def number(name: str) -> int:
        try:
            return int(p.get(name, ""))
        except ValueError:
            return -1

    return DeadLetter(
        m.body.decode(),
        p.get("DLQ_ORIGIN_TOPIC", ""),
        number("DLQ_ORIGIN_QUEUE_ID"),
        number("DLQ_ORIGIN_QUEUE_OFFSET"),
        p.get("DLQ_ORIGIN_MSG_ID", ""),
        number("DELIVERY_ATTEMPTS"),
        number("POP_EPOCH"),
    )


async def read_dead_letters(url: str, plan: PopPlan, h: History, settings: ClientSettings,
                            node: str) -> None:  # fmt: skip
    """Every message of ``%DLQ%<group>`` on one node (its one queue) into the history."""
    got: list[DeadLetter] = []
    async with AsyncAdmin([url], settings=settings) as admin:
        with contextlib.suppress(TopicNotFoundError):  # no dead letter: no topic
            for _ in range(100_000):  # bounded: each pull moves on or ends the loop
                r = await admin.pull(dlq_topic(plan.group), 0, len(got), max_messages=256)
                got += [dead_letter(m) for m in r.messages]
                if not r.messages or r.next_offset >= r.max_offset:
                    break
    h.ok("pop-end", "dlq", tuple(got), node)


async def report_pop_lag(admin: AsyncAdmin, plan: PopPlan, topic: str, h: History,
                         node: str) -> None:  # fmt: skip
    """One node's lag per queue for the group into the history (an empty report when
    it does not answer: the checker wants every node's)."""
    h.ok("pop-end", "pop-lag", await pop_lags(admin, plan, topic) or {}, node)
