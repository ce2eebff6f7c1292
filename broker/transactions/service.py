"""``Transactions``: the master's side of transactional messages (docs/http.md,
"Transactions").

``produce`` stores a request's messages as one record of ``HALF_TOPIC`` (visible to no
consumer) and answers its id. ``end`` commits or rolls it back: a commit appends
``tx.commit`` and then the copies of its messages into their topic, each carrying
``TX_ORIGIN`` (``broker/transactions/applier.py``); a rollback appends ``tx.rollback``.
``run`` (the master's loop) copies what a committed transaction still lacks (after a
failover, say) and checks what stays pending: it appends ``tx.check`` (the count and
the next time are replicated) and hands the check to the producers of its group that
poll ``checks``; past ``tx_max_checks`` it rolls the transaction back.

Retention and snapshots keep the first live transaction's record (``pinned_entry_pos``):
a commit, a check and a new master always read its messages.

A copy is appended only once this node's log is applied and the message is still
uncopied, one transaction at a time on this master (``_delivering``); a new master has
applied every entry of the terms before its own: no message is copied twice, none is
lost.

Invariants:
- what a check hands out, and whether a transaction is pending, committed or rolled
  back, is the replicated state's (the check queues are this master's, for its
  pollers, and start empty on a new master: the next check goes out when it is due);
- every write passes the ``WriteGate``: a SLAVE redirects, as for produce.

The appends of one turn run together (one group commit) through ``gather``
(``asyncio.gather``; the simulation, which drives this code without an event loop,
hands one of its own: ``tests/sim/tx_sim.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dledger.store import BODY_OFFSET

from .. import errors
from ..batch import INNER_MIN_SIZE
from ..copies import ROUTING, copy_of, held
from ..encode import check_pinned_queue
from ..gate import WriteGate
from ..metadata import HALF_TOPIC, MetadataState
from ..names import check_group_name, check_topic_name
from ..produce import AnswerSlot, NewMessage, Producer, ProduceResult
from ..reads import PulledMessage, Reads
from ..settings import BrokerSettings
from ..topics import MetadataLog, Topics
from .applier import PROP_TX_CHECK_AT, PROP_TX_GROUP, PROP_TX_ORIGIN, TransactionApplier
from .state import COMMITTED, ROLLED_BACK, Transaction, TransactionState

if TYPE_CHECKING:
    from ..dispatch import Dispatch

log = logging.getLogger(__name__)

TX_PREFIX = "tx1:"
TICK_S = 0.5  # the loop looks for due checks and uncopied messages this often at most
CHECKS_PER_TICK = 256  # checks (or expiries) appended per turn, in one group commit
CHECKS_QUEUED = 10_000  # checks waiting for a poller, per producer group (oldest dropped)
TX_MARKS = (PROP_TX_GROUP, PROP_TX_CHECK_AT)  # a half message's, beside its routing
# What a half message carries for the broker, not for its consumers.
ROUTING_PROPERTIES = (*ROUTING, *TX_MARKS)
ACTIONS = {"commit": COMMITTED, "rollback": ROLLED_BACK}
# RocketMQ's mark of a transaction's message (a RocketMQ 5 client's, api/rocketmq): its
# copy keeps the unique key, the id the client gave it, as RocketMQ's commit does.
PROP_TRAN_MSG = "TRAN_MSG"
# Runs appends together and answers their results in order (the first error raised).
Gather = Callable[..., Awaitable[list[Any]]]


def _gather(*coros: Coroutine[Any, Any, Any]) -> Awaitable[list[Any]]:
    return asyncio.gather(*coros)


def transaction_id(base: int) -> str:
    return f"{TX_PREFIX}{base}"


def parse_transaction_id(text: str) -> int | None:
    digits = text.removeprefix(TX_PREFIX)
    if text.startswith(TX_PREFIX) and digits.isdigit() and len(digits) < 19:
        return int(digits)
    return None


@dataclass(frozen=True, slots=True)
class Begun:
    """A transaction stored: its id and where each half message lies."""

    transaction_id: str
    results: list[ProduceResult]


@dataclass(frozen=True, slots=True)
class Check:
    """A check for a producer: the transaction, its messages and how many checks it had."""

    transaction: Transaction
    messages: list[PulledMessage]


class Transactions:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        gate: WriteGate,
        topics: Topics,
        metalog: MetadataLog,
        meta: MetadataState,
        reads: Reads,
        producer: Producer,
        dispatch: Dispatch,
        applier: TransactionApplier,
        clock: Callable[[], int],
        gather: Gather = _gather,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.topics = topics
        self.metalog = metalog
        self.meta = meta
        self.reads = reads
        self.producer = producer
        self.dispatch = dispatch
        self.applier = applier
        self.clock = clock
        self.gather = gather
        self._delivering: dict[int, AnswerSlot] = {}  # base → the delivery under way
        self._queued: dict[str, deque[int]] = {}  # producer group → checks to hand out
        self._arrived: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()

    @property
    def state(self) -> TransactionState:
        return self.meta.transactions

    # ---- produce, commit, rollback --------------------------------------------------------

    async def produce(
        self,
        topic_name: str,
        messages: Sequence[NewMessage],
        producer_group: str,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> Begun:
        """Store ``messages`` as one transaction's half messages (visible to no consumer
        until it is committed); the topic is made as a produce would make it."""
        check_topic_name(topic_name)
        check_group_name(producer_group, "producer group")
        self.producer.check_request(messages, producer_id, sequence)
        if any(m.deliver_at_ms is not None for m in messages):
            raise errors.InvalidArgumentError("a transaction's messages have no delivery time")
        cap = self.producer.max_record_bytes  # (one record: checked before anything is made)
        if sum(INNER_MIN_SIZE + len(m.body) for m in messages) > cap:
            raise errors.PayloadTooLargeError(
                f"a transaction's messages are one record of at most {cap} bytes of messages;"
                " these are more"
            )
        most = self.settings.max_pending_transactions
        if len(self.state.live) >= most:
            raise errors.LimitReachedError(f"{most} transactions are pending", limit=most)
        await self.gate.require_master_soon()
        topic = await self.topics.get_or_create(topic_name)
        for i, m in enumerate(messages):  # (a plain produce checks it when it encodes)
            check_pinned_queue(m, i, topic.queues)
        half = await self.topics.system(HALF_TOPIC)
        check_at = str(self.clock() + self.settings.tx_first_check_ms)
        marks = {PROP_TX_GROUP: producer_group, PROP_TX_CHECK_AT: check_at}
        records = [held(m, topic.name, marks) for m in messages]
        results = await self.producer.produce_to(half, records, producer_id, sequence)
        return Begun(transaction_id(results[0].queue_offset), results)

    def pinned_entry_pos(self) -> int | None:
        """The log position of the first live transaction's record (None: none live):
        retention keeps it and every entry after it, and a snapshot is handed to Raft
        only if a follower that installs it still receives this entry (a pending
        transaction's messages are read when it is checked and when it is committed)."""
        first = next(iter(self.state.live), None)  # (live is in half-offset order)
        q = None if first is None else self.reads.cq.find(HALF_TOPIC, 0)
        unit = None if q is None or first is None else q.get(first)
        return None if unit is None else unit[0] - BODY_OFFSET

    async def topic_of(self, tx_id: str) -> str:
        """The topic of a transaction known here (``_known``); "" for one resolved (its
        topic is not kept: the route asks for admin then)."""
        t = self.state.live.get(await self._known(tx_id))
        return "" if t is None else t.topic

    async def _known(self, tx_id: str) -> int:
        """The transaction an id names; ``TransactionNotFoundError`` for none. A begin is
        answered once its record is committed, perhaps before it is applied here: an id
        not known yet is looked for again once what is committed is applied
        (``append_timeout_ms`` at most), and a slave, which may not have it yet, sends the
        request to the master (``require_master``'s refusal), not a 404."""
        base = parse_transaction_id(tx_id)
        if base is not None and base >= self.state.end:
            committed = self.gate.server.committed_index
            await self.dispatch.wait_dispatched(committed, self.settings.append_timeout_ms / 1000)
            if base >= self.state.end:
                self.gate.require_master()
        if base is None or self.state.state_of(base) is None:
            raise errors.TransactionNotFoundError(f"no transaction {tx_id!r}")
        return base

    async def end(self, tx_id: str, action: str) -> str:
        """Commit or roll back (``action``); the transaction's state after. A repeat
        answers the same; the other resolution of one resolved is
        ``TransactionResolvedError``; a resolution committed but not applied here within
        ``append_timeout_ms`` is ``UnknownOutcomeError`` (a retry answers it)."""
        wanted = ACTIONS.get(action)
        if wanted is None:
            raise errors.InvalidArgumentError("action: commit or rollback")
        if parse_transaction_id(tx_id) is None:
            raise errors.TransactionNotFoundError(f"no transaction {tx_id!r}")
        await self.gate.require_master_soon()
        base = await self._known(tx_id)
        now = self.state.state_of(base)
        if now == "pending":
            op = "tx.commit" if wanted == COMMITTED else "tx.rollback"
            index = await self.metalog.append({"op": op, "base": base})
            if self.dispatch.dispatched_index < index:  # committed, not applied in time
                raise errors.UnknownOutcomeError(f"transaction {tx_id}: not applied yet; retry")
            outcome = self.applier.outcome(index)
            now = outcome if isinstance(outcome, str) else self.state.state_of(base)
        if now != wanted:
            raise errors.TransactionResolvedError(f"transaction {tx_id} is {now}", state=now)
        if wanted == COMMITTED:
            await self.deliver(base)
        return now

    async def deliver(self, base: int) -> int:
        """Copy what the committed transaction ``base`` has not copied yet into its topic;
        how many copies were appended."""
        running = self._delivering.get(base)
        if running is not None:  # one under way (the loop's, a commit's): its outcome
            await running.wait()
            return 0
        slot = self._delivering[base] = self.producer.answer_slot()
        try:
            copied = await self._deliver(base)
        except errors.BrokerError as e:
            slot.set_exception(e)
            raise
        except BaseException:  # cancelled (a crash, a shutdown): not known to be done
            slot.set_exception(errors.UnknownOutcomeError("the delivery was interrupted; retry"))
            raise
        finally:
            del self._delivering[base]
        slot.set_result([])
        return copied

    async def _deliver(self, base: int) -> int:
        end = self.gate.server.ledger_end_index
        if not await self.dispatch.wait_dispatched(end, self.settings.append_timeout_ms / 1000):
            raise errors.UnknownOutcomeError("the log is not applied here yet; retry")
        self.gate.require_master()
        t = self.state.live.get(base)
        if t is None or t.state != COMMITTED:
            return 0
        halves = await self._messages(t)
        copies = [
            copy_of(
                m,
                (PROP_TX_ORIGIN, f"{base}:{i}"),
                TX_MARKS,
                keep_key=m.properties.get(PROP_TRAN_MSG) == "true",
            )[1]
            for m in halves
            if (i := m.queue_offset - base) not in t.copied
        ]
        topic = self.meta.topics.get(t.topic)
        unfit = topic is not None and any((c.queue_id or 0) >= topic.queues for c in copies)
        if topic is None or unfit:
            # Deleted since, or made again without a queue a message is pinned to (its
            # append would be refused on every try, and the transaction, never finished,
            # would hold retention back): what is left of it is dropped, counted.
            why = "is gone" if topic is None else "lacks a queue its messages are pinned to"
            log.warning("transaction %d: topic %s %s; its messages are dropped", base, t.topic, why)
            await self.metalog.append({"op": "tx.drop", "base": base})
            return 0
        if copies:
            await self.producer.produce_to(topic, copies, None, None)
        return len(copies)

    async def _messages(self, t: Transaction) -> list[PulledMessage]:
        r = await self.reads.pull(
            self.reads.pulled_message, HALF_TOPIC, 0, t.base, max_messages=t.count
        )
        return [m for m in r.messages if t.base <= m.queue_offset < t.base + t.count]

    # ---- checks --------------------------------------------------------------------------

    async def checks(self, group: str, wait_ms: int, most: int) -> list[Check]:
        """The checks waiting for ``group``'s producers, waiting up to ``wait_ms`` for one
        (a long poll, on the master)."""
        check_group_name(group, "producer group")
        await self.gate.require_master_soon()
        queued = self._queued.setdefault(group, deque(maxlen=CHECKS_QUEUED))
        if not queued and wait_ms > 0:
            arrived = self._arrived.setdefault(group, asyncio.Event())
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_ms / 1000):  # (wait_for can swallow a cancel)
                    await arrived.wait()
        out: list[Check] = []
        while queued and len(out) < most:
            t = self.state.live.get(queued.popleft())
            if t is not None and t.state == "pending":
                out.append(Check(t, await self._messages(t)))
        return out

    def pending(self, group: str | None = None) -> list[Transaction]:
        """The transactions not resolved yet (of ``group``), oldest first."""
        return [t for t in self.state.pending() if group is None or t.group == group]

    # ---- the master's loop ---------------------------------------------------------------

    async def run(self) -> None:
        """On the master: copy what committed transactions lack, check (or expire) the
        pending ones when due."""
        while True:
            if self.gate.is_master:
                try:
                    await self.step(self.clock())
                except errors.BrokerError as e:  # not master any more, a full disk, ...
                    log.info("transactions: %s", e)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):  # (wait_for can swallow a cancel)
                    await self._wake.wait()

    async def step(self, now: int) -> None:
        # What this master appended before (a check's count, a copy) is applied first:
        # a turn deciding on a state that lacks its own last turn's checks would check a
        # transaction past tx_max_checks.
        end = self.gate.server.ledger_end_index
        if not await self.dispatch.wait_dispatched(end, self.settings.append_timeout_ms / 1000):
            return
        for t in list(self.state.uncopied()):
            await self.deliver(t.base)
        due = [t for t in self.state.pending() if t.next_check <= now][:CHECKS_PER_TICK]
        if not due:
            return
        s = self.settings
        ops = []
        for t in due:
            if t.checks >= s.tx_max_checks:
                log.warning(
                    "transaction %s rolled back: unresolved after %d checks",
                    transaction_id(t.base),
                    t.checks,
                )
                ops.append({"op": "tx.rollback", "base": t.base, "expired": True})
            else:
                ops.append(
                    {"op": "tx.check", "base": t.base, "interval_ms": s.tx_check_interval_ms}
                )
        await self.gather(*(self.metalog.append(op) for op in ops))
        for t, op in zip(due, ops, strict=True):
            if op["op"] == "tx.check":
                self._queued.setdefault(t.group, deque(maxlen=CHECKS_QUEUED)).append(t.base)
                self._arrived.setdefault(t.group, asyncio.Event()).set()
