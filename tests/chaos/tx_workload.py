"""The chaos run's transactional producers (issue 29): a producer of transactions, the
checker thread that answers the broker's checks, and a puller of the transactions'
topic, under the nemesis (started by ``Workload``); once the faults stop,
``resolve_transactions`` answers checks until no node has one pending, and the drain
reads the topic and the pending transactions from every node (``drain_transactions``).
Every operation goes into the history (``tests/chaos/history.py``);
``tests/chaos/tx_checker.py`` checks them.

A transaction is named ``x<producer>-<n>``, its messages ``x<producer>-<n>-<k>`` (1 to
``batch_max`` of them) in the topic ``TxPlan.topic`` (not the workload's: its readers
and the POP group see no transaction). Its *fate* is a function of its name
(``fate_of``), so that the checker thread, the producer and the history's checker
agree without sharing anything: ``commit`` and ``rollback`` (the producer ends it
right after its begin), ``check-commit`` and ``check-rollback`` (the producer leaves it
to the broker's checks, which the checker thread answers so), ``check-none`` (the
checker thread answers no check: the broker rolls it back after its last one). A check
of a ``commit`` or ``rollback`` one (its producer's end lost or slow) is answered as its
producer would.

Outcomes: a begin answered is ``ok`` with the transaction's id; refused before anything
was written (``DEFINITE``) is ``fail``; any other error ``info`` (it may be stored: the
broker's checks find it, and the checker thread answers them from the name). A commit
or rollback answered is ``ok`` with the state; ``TRANSACTION_RESOLVED`` (resolved the
other way) and ``TRANSACTION_NOT_FOUND`` are ``fail`` (the state the broker gave, if
any); any other error ``info``.

The cluster's nodes check soon and often (``NODE_ARGS``: a first check after 1 s, then
every second, a rollback after the fifth), so that checks and their expiry happen within
the run and every transaction is resolved a few seconds after the faults stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledgermq.client import (
    AsyncAdmin,
    AsyncTransactionProducer,
    ClientSettings,
    LedgerMQError,
    ReceivedMessage,
    TransactionResolvedError,
)
from ledgermq.demo.load import topic_ends
from ledgermq.replicas import read_queues

from .history import History, Read, TxCheck

FATES = ("commit", "rollback", "check-commit", "check-rollback", "check-none")
FATE_WEIGHTS = (35, 20, 20, 15, 10)
# The broker's check schedule on the chaos nodes (ledgermq broker options).
FIRST_CHECK_MS = 1_000
CHECK_INTERVAL_MS = 1_000
MAX_CHECKS = 5
NODE_ARGS = (
    "--tx-first-check-ms", str(FIRST_CHECK_MS),
    "--tx-check-interval-ms", str(CHECK_INTERVAL_MS),
    "--tx-max-checks", str(MAX_CHECKS),
)  # fmt: skip
# Refused before anything is written: the begin certainly stored nothing.
DEFINITE = {"INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE", "TOPIC_NOT_FOUND", "UNAUTHENTICATED"}
# An end answered so changed nothing (the state, if the broker gave it, says why).
NOT_ENDED = {"TRANSACTION_RESOLVED", "TRANSACTION_NOT_FOUND"}
ERROR_PAUSE_S = 0.1  # after an error, before the next request
PENDING_EVERY_S = 0.5  # how often the end asks every node for its pending transactions


@dataclass(frozen=True, slots=True)
class TxPlan:
    """The transactional producers of a run."""

    topic: str = "chaos-tx"
    queues: int = 2
    producer_group: str = "chaos-tx-pg"
    producers: int = 1
    batch_max: int = 3
    pause_s: float = 0.1  # between two transactions of a producer
    check_wait_ms: int = 500  # the checker thread's long poll
    pull_pause_s: float = 0.2
    fates: tuple[int, ...] = FATE_WEIGHTS  # FATES' weights


def fate_of(name: str, weights: Sequence[int] = FATE_WEIGHTS) -> str:
    """What happens to the transaction ``name`` (the module's docstring): a pure
    function of it, the same in every process and every run."""
    x = zlib.crc32(name.encode()) % sum(weights)
    for fate, w in zip(FATES, weights, strict=True):
        if x < w:
            return fate
        x -= w
    raise AssertionError("unreachable")


def check_answer(fate: str) -> str | None:
    """What the checker thread answers a check of a transaction of ``fate``."""
    if fate in ("commit", "check-commit"):
        return "commit"
    if fate in ("rollback", "check-rollback"):
        return "rollback"
    return None


def name_of(value: str) -> str:
    """The transaction a message's value belongs to."""
    return value.rpartition("-")[0]


def _why(e: LedgerMQError) -> str:
    return f"{e.code}: {e}"[:300]


def tx_reads(messages: Sequence[ReceivedMessage]) -> tuple[Read, ...]:
    return tuple(
        Read(m.body.decode(), m.queue_id, m.queue_offset, m.store_timestamp) for m in messages
    )


async def end_transaction(h: History, p: AsyncTransactionProducer, process: str, name: str,
                          tx_id: str, action: str) -> None:  # fmt: skip
    """Commit or roll back (``action``), recorded as ``tx-end``."""
    asked = {"name": name, "id": tx_id, "action": action}
    done = h.invoke(process, "tx-end", asked)
    try:
        state = await (p.commit(tx_id) if action == "commit" else p.rollback(tx_id))
    except TransactionResolvedError as e:
        done("fail", {**asked, "state": e.fields.get("state")}, error=_why(e))
    except LedgerMQError as e:
        done("fail" if e.code in NOT_ENDED else "info", error=_why(e))
    else:
        done("ok", {**asked, "state": state})


async def tx_producer(i: int, brokers: Sequence[str], plan: TxPlan, client: ClientSettings,
                      h: History, rng: random.Random, stopping: asyncio.Event,
                      pause: Callable[[float], Awaitable[None]]) -> None:  # fmt: skip
    """Transactions one at a time, each begun and ended (or left) as its fate says."""
    process = f"txproducer-{i}"
    async with AsyncTransactionProducer(brokers, plan.producer_group, producer_id=f"chaos-tx-{i}",
                                        settings=client) as p:  # fmt: skip
        for n in range(10**9):  # bounded by the run: stopping ends it
            if stopping.is_set():
                return
            name = f"x{i}-{n}"
            values = tuple(f"{name}-{k}" for k in range(rng.randint(1, plan.batch_max)))
            fate = fate_of(name, plan.fates)
            done = h.invoke(process, "tx-begin", {"name": name, "values": values, "fate": fate})
            try:
                begun = await p.begin(plan.topic, list(values))
            except LedgerMQError as e:
                done("fail" if e.code in DEFINITE else "info", error=_why(e))
            else:
                done("ok", {"name": name, "id": begun.transaction_id})
                if fate in ("commit", "rollback"):
                    await end_transaction(h, p, process, name, begun.transaction_id, fate)
            await pause(plan.pause_s)


async def tx_check_answerer(brokers: Sequence[str], plan: TxPlan, client: ClientSettings,
                            h: History, stopping: asyncio.Event,
                            process: str = "txchecker-0") -> None:  # fmt: skip
    """The producer group's checker thread: polls the checks, answers each as the
    transaction's fate says (``check_answer``), until ``stopping``."""
    async with AsyncTransactionProducer(brokers, plan.producer_group, producer_id=process,
                                        settings=client) as p:  # fmt: skip
        while not stopping.is_set():
            done = h.invoke(process, "tx-checks", None)
            try:
                got = await p.checks(wait_ms=plan.check_wait_ms)
            except LedgerMQError as e:
                done("fail", error=_why(e))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), ERROR_PAUSE_S)
                continue
            checks = tuple(
                TxCheck(c.transaction_id, tuple(m.body.decode() for m in c.messages),
                        c.check_count)
                for c in got
            )  # fmt: skip
            done("ok", checks)
            for c in checks:
                name = name_of(c.values[0]) if c.values else ""
                action = check_answer(fate_of(name, plan.fates)) if name else None
                if action is not None:
                    await end_transaction(h, p, process, name, c.transaction_id, action)


async def tx_puller(urls: Mapping[str, str], plan: TxPlan, probe: ClientSettings, h: History,
                    rng: random.Random, stopping: asyncio.Event,
                    pause: Callable[[float], Awaitable[None]]) -> None:  # fmt: skip
    """The transactions' topic, a queue at a time from a node drawn at random (``tx-pull``):
    what it reads while the transactions are under way."""
    admins = {n: AsyncAdmin([u], settings=probe) for n, u in urls.items()}
    positions = dict.fromkeys(range(plan.queues), 0)
    try:
        while not stopping.is_set():
            node = rng.choice(sorted(admins))
            q = rng.randrange(plan.queues)
            done = h.invoke("txpuller-0", "tx-pull", (q, positions[q]))
            try:
                r = await admins[node].pull(plan.topic, q, positions[q], max_messages=50)
            except LedgerMQError as e:
                done("fail", None, node, _why(e))
            else:
                done("ok", tx_reads(r.messages), node)
                if r.messages:
                    positions[q] = r.messages[-1].queue_offset + 1
            await pause(plan.pull_pause_s)
    finally:
        for a in admins.values():
            await a.close()


async def _pending(admin: AsyncAdmin, plan: TxPlan) -> list[str] | None:
    """One node's pending transactions of the group (None: it did not answer)."""
    try:
        return [
            str(t["transaction_id"]) for t in await admin.pending_transactions(plan.producer_group)
        ]
    except LedgerMQError:
        return None


async def resolve_transactions(urls: Mapping[str, str], plan: TxPlan, client: ClientSettings,
                               probe: ClientSettings, h: History,
                               timeout_s: float) -> int | None:  # fmt: skip
    """Once the faults stop: the checker thread answers checks until no node has a
    transaction of the group pending, or ``timeout_s``. How many were pending when it
    started on the node that had most (None: still pending at the end)."""
    stopping = asyncio.Event()
    answerer = asyncio.create_task(
        tx_check_answerer(list(urls.values()), plan, client, h, stopping, "txchecker-end")
    )
    admins = [AsyncAdmin([u], settings=probe) for u in urls.values()]
    first: int | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not answerer.done():
            pending = await asyncio.gather(*(_pending(a, plan) for a in admins))
            if first is None and all(p is not None for p in pending):
                first = max(len(p or ()) for p in pending)
            if all(p == [] for p in pending):
                return first or 0
            await asyncio.sleep(PENDING_EVERY_S)
        return None
    finally:
        stopping.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(answerer, return_exceptions=True),
                                   client.deadline_s + 5)  # fmt: skip
        answerer.cancel()
        for a in admins:
            await a.close()


async def drain_transactions(urls: Mapping[str, str], master: str, plan: TxPlan,
                             client: ClientSettings, probe: ClientSettings,
                             h: History) -> dict[str, Any]:  # fmt: skip
    """The transactions' topic from every node (``tx-drain``) and every node's pending
    transactions of the group (``tx-pending``); each node's consume-queue image."""
    ends = await topic_ends(urls[master], plan.topic, client)
    ranges = {q: (0, end) for q, end in ends.items()}
    images: dict[str, Any] = {}
    for node, url in urls.items():
        got: list[ReceivedMessage] = []
        images[node] = await read_queues(url, plan.topic, ranges, client, got.append)
        h.ok("drain", "tx-drain", tx_reads(got), node)
    for node, url in urls.items():
        async with AsyncAdmin([url], settings=probe) as admin:
            pending = await _pending(admin, plan)
        if pending is not None:
            h.ok("tx-pending", "tx-pending", tuple(pending), node)
    return images
