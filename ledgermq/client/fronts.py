"""The public classes: ``Admin``, ``Producer``, ``Consumer``, ``PopConsumer`` and their
async twins. Each is a driver (``ledgermq.client.drivers``) holding one operations
object, whose operations it binds as its methods; the twins share their constructor and
properties (the ``*Front`` classes)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any
from typing import Unpack as UnpackKw

from .consuming import ConsumerOps, Pacer, Start
from .drivers import (
    AsyncDriver,
    Front,
    SyncDriver,
    TaskWorkers,
    ThreadWorkers,
    awaiting,
    blocking,
)
from .exchange import Outcome
from .operations import AdminOps, ProducerOps
from .popping import Collect, Ended, PopOps, RunAction, RunOptions, RunSettings, RunStats, Spawn
from .settings import ClientOptions, ClientSettings
from .transacting import TransactionOps
from .types import MessageLike, PopMessage, ReceivedMessage, SendResult


def _settings(settings: ClientSettings | None, options: ClientOptions) -> ClientSettings:
    return replace(settings or ClientSettings(), **options)


class _AdminFront(Front):
    _ops: AdminOps
    _serialize = False

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = AdminOps(ex)


class Admin(SyncDriver[AdminOps], _AdminFront):
    """Topics, groups, cluster status, leadership and queries (blocking)."""

    create_topic = blocking(AdminOps.create_topic)
    list_topics = blocking(AdminOps.list_topics)
    describe_topic = blocking(AdminOps.describe_topic)
    delete_topic = blocking(AdminOps.delete_topic)
    cluster = blocking(AdminOps.cluster)
    cluster_all = blocking(AdminOps.cluster_all)
    transfer_leadership = blocking(AdminOps.transfer_leadership)
    members = blocking(AdminOps.members)
    add_member = blocking(AdminOps.add_member)
    promote_member = blocking(AdminOps.promote_member)
    remove_member = blocking(AdminOps.remove_member)
    groups = blocking(AdminOps.groups)
    group_offsets = blocking(AdminOps.group_offsets)
    configure_group = blocking(AdminOps.configure_group)
    describe_group = blocking(AdminOps.describe_group)
    redrive_dead_letters = blocking(AdminOps.redrive_dead_letters)
    pending_transactions = blocking(AdminOps.pending_transactions)
    end_transaction = blocking(AdminOps.end_transaction)
    commit_offsets = blocking(AdminOps.commit_offsets)
    reset_offsets = blocking(AdminOps.reset_offsets)
    get_message = blocking(AdminOps.get_message)
    query_by_key = blocking(AdminOps.query_by_key)
    offset_for_timestamp = blocking(AdminOps.offset_for_timestamp)
    pull = blocking(AdminOps.pull)
    pull_arrow = blocking(AdminOps.pull_arrow)


class AsyncAdmin(AsyncDriver[AdminOps], _AdminFront):
    """``Admin`` for asyncio."""

    create_topic = awaiting(AdminOps.create_topic)
    list_topics = awaiting(AdminOps.list_topics)
    describe_topic = awaiting(AdminOps.describe_topic)
    delete_topic = awaiting(AdminOps.delete_topic)
    cluster = awaiting(AdminOps.cluster)
    cluster_all = awaiting(AdminOps.cluster_all)
    transfer_leadership = awaiting(AdminOps.transfer_leadership)
    members = awaiting(AdminOps.members)
    add_member = awaiting(AdminOps.add_member)
    promote_member = awaiting(AdminOps.promote_member)
    remove_member = awaiting(AdminOps.remove_member)
    groups = awaiting(AdminOps.groups)
    group_offsets = awaiting(AdminOps.group_offsets)
    configure_group = awaiting(AdminOps.configure_group)
    describe_group = awaiting(AdminOps.describe_group)
    redrive_dead_letters = awaiting(AdminOps.redrive_dead_letters)
    pending_transactions = awaiting(AdminOps.pending_transactions)
    end_transaction = awaiting(AdminOps.end_transaction)
    commit_offsets = awaiting(AdminOps.commit_offsets)
    reset_offsets = awaiting(AdminOps.reset_offsets)
    get_message = awaiting(AdminOps.get_message)
    query_by_key = awaiting(AdminOps.query_by_key)
    offset_for_timestamp = awaiting(AdminOps.offset_for_timestamp)
    pull = awaiting(AdminOps.pull)
    pull_arrow = awaiting(AdminOps.pull_arrow)


class _ProducerFront(Front):
    _ops: ProducerOps

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        producer_id: str | None = None,
        first_sequence: int = 0,
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        """``producer_id`` names the session (default: a fresh ``p-<uuid4>``); a caller
        resuming a session after a restart passes its id and the sequence after the
        last one it used as ``first_sequence``."""
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = ProducerOps(ex, producer_id, first_sequence)

    @property
    def producer_id(self) -> str:
        return self._ops.producer_id

    @property
    def sequence(self) -> int:
        """The sequence number the next batch will carry."""
        return self._ops.sequence


class Producer(SyncDriver[ProducerOps], _ProducerFront):
    """Sends batches through the master, deduplicated across retries (blocking)."""

    send = blocking(ProducerOps.send)
    send_one = blocking(ProducerOps.send_one)
    recall = blocking(ProducerOps.recall)


class AsyncProducer(AsyncDriver[ProducerOps], _ProducerFront):
    """``Producer`` for asyncio."""

    send = awaiting(ProducerOps.send)
    send_one = awaiting(ProducerOps.send_one)
    recall = awaiting(ProducerOps.recall)


class _TransactionFront(Front):
    _ops: TransactionOps

    def __init__(
        self,
        brokers: str | Sequence[str],
        producer_group: str,
        *,
        producer_id: str | None = None,
        first_sequence: int = 0,
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        """A producer of transactions for ``producer_group`` (whose producers the broker
        checks about unresolved ones), in a producer session as ``Producer``'s."""
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = TransactionOps(ex, producer_group, ProducerOps(ex, producer_id, first_sequence))


class Transaction:
    """The messages of one ``TransactionProducer.transaction()`` block: each ``send``
    stores a batch as half messages; the block's end commits them all, an exception
    rolls them back."""

    def __init__(self) -> None:
        self.ids: list[str] = []


class TransactionProducer(SyncDriver[TransactionOps], _TransactionFront):
    """Sends transactions: half messages, then commit or rollback (blocking)."""

    begin = blocking(TransactionOps.begin)
    commit = blocking(TransactionOps.commit)
    rollback = blocking(TransactionOps.rollback)
    checks = blocking(TransactionOps.checks)
    answer_checks = blocking(TransactionOps.answer_checks)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_SyncTransaction]:
        """``with p.transaction() as tx: tx.send(topic, messages)``: committed at the end
        of the block, rolled back on an exception (and the exception goes on)."""
        tx = _SyncTransaction(self)
        try:
            yield tx
        except BaseException:
            for tid in tx.ids:
                self.rollback(tid)
            raise
        for tid in tx.ids:
            self.commit(tid)


class _SyncTransaction(Transaction):
    def __init__(self, producer: TransactionProducer) -> None:
        super().__init__()
        self._producer = producer

    def send(self, topic: str, messages: Iterable[MessageLike]) -> list[SendResult]:
        begun = self._producer.begin(topic, messages)
        self.ids.append(begun.transaction_id)
        return begun.results


class AsyncTransactionProducer(AsyncDriver[TransactionOps], _TransactionFront):
    """``TransactionProducer`` for asyncio."""

    begin = awaiting(TransactionOps.begin)
    commit = awaiting(TransactionOps.commit)
    rollback = awaiting(TransactionOps.rollback)
    checks = awaiting(TransactionOps.checks)
    answer_checks = awaiting(TransactionOps.answer_checks)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_AsyncTransaction]:
        """``async with p.transaction() as tx: await tx.send(topic, messages)``."""
        tx = _AsyncTransaction(self)
        try:
            yield tx
        except BaseException:
            for tid in tx.ids:
                await self.rollback(tid)
            raise
        for tid in tx.ids:
            await self.commit(tid)


class _AsyncTransaction(Transaction):
    def __init__(self, producer: AsyncTransactionProducer) -> None:
        super().__init__()
        self._producer = producer

    async def send(self, topic: str, messages: Iterable[MessageLike]) -> list[SendResult]:
        begun = await self._producer.begin(topic, messages)
        self.ids.append(begun.transaction_id)
        return begun.results


class _ConsumerFront(Front):
    _ops: ConsumerOps

    def __init__(
        self,
        brokers: str | Sequence[str],
        group: str | None,
        topic: str,
        *,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = True,
        start: Start = "earliest",
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        """``group=None`` reads without a group from ``start`` and commits nothing.
        With ``auto_commit`` (the default) every poll first commits what the previous
        polls returned, and ``close()`` commits the rest: at-least-once delivery."""
        if start not in ("earliest", "latest"):
            raise ValueError(f"start is earliest or latest, not {start!r}")
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = ConsumerOps(
            ex, group, topic, queue_ids=queue_ids, auto_commit=auto_commit, start=start
        )

    @property
    def group(self) -> str | None:
        return self._ops.group

    @property
    def topic(self) -> str:
        return self._ops.topic

    @property
    def positions(self) -> dict[int, int]:
        """Per queue, the offset after the last message delivered."""
        return dict(self._ops.positions)

    @property
    def committed(self) -> dict[int, int]:
        """Per queue, the committed offset as this consumer knows it."""
        return dict(self._ops.committed)


class Consumer(SyncDriver[ConsumerOps], _ConsumerFront):
    """Long-poll consumption of a topic by a group, with commits (blocking).
    ``for m in consumer`` runs until the caller breaks; ``messages(max_idle_s=...)``
    stops by itself."""

    poll = blocking(ConsumerOps.poll)
    commit = blocking(ConsumerOps.commit)
    pull = blocking(ConsumerOps.pull)

    def messages(
        self,
        *,
        max_idle_s: float | None = None,
        max_messages: int | None = None,
        wait_ms: int = 1000,
        batch: int = 32,
    ) -> Iterator[ReceivedMessage]:
        """Messages one by one; a message counts as delivered when it is yielded, so a
        caller that breaks out commits (at ``close``) only what it has seen."""
        pacer = Pacer(self._exchange.clock, max_idle_s, max_messages, wait_ms, batch)
        while (want := pacer.next_fetch()) is not None:
            yield from self._ops.hand_out(self._run(self._ops.fetch(*want)), pacer)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return self.messages()

    def close(self) -> None:
        """Commit what was delivered (with ``auto_commit``), then close."""
        try:
            if self._ops.auto_commit:
                self.commit()
        finally:
            super().close()

    def __exit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:  # failing: commit nothing more
            super().close()
        else:
            self.close()


class AsyncConsumer(AsyncDriver[ConsumerOps], _ConsumerFront):
    """``Consumer`` for asyncio; ``async for m in consumer``."""

    poll = awaiting(ConsumerOps.poll)
    commit = awaiting(ConsumerOps.commit)
    pull = awaiting(ConsumerOps.pull)

    async def messages(
        self,
        *,
        max_idle_s: float | None = None,
        max_messages: int | None = None,
        wait_ms: int = 1000,
        batch: int = 32,
    ) -> AsyncIterator[ReceivedMessage]:
        """As ``Consumer.messages``."""
        clock = self._exchange.clock
        pacer = Pacer(clock, max_idle_s, max_messages, wait_ms, batch)
        while (want := pacer.next_fetch()) is not None:
            fetched = await self._run(self._ops.fetch(*want))
            for m in self._ops.hand_out(fetched, pacer):
                yield m

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        return self.messages()

    async def close(self) -> None:
        try:
            if self._ops.auto_commit:
                await self.commit()
        finally:
            await super().close()

    async def __aexit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:
            await super().close()
        else:
            await self.close()


class _PopConsumerFront(Front):
    _ops: PopOps
    _serialize = False  # no state between operations: a handler may ack or extend too
    _workers: ThreadWorkers | TaskWorkers | None = None  # while a run goes on

    def __init__(
        self,
        brokers: str | Sequence[str],
        group: str,
        topic: str,
        *,
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        """A consumer of ``topic`` in the POP group ``group`` (created with the broker's
        defaults on its first use; ``Admin.configure_group`` sets it up otherwise)."""
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = PopOps(ex, group, topic)
        self._stop = False
        self._stats = RunStats()

    @property
    def group(self) -> str:
        return self._ops.group

    @property
    def topic(self) -> str:
        return self._ops.topic

    @property
    def stats(self) -> RunStats:
        """What the current (or the last) ``run`` did so far."""
        return self._stats

    def _start_run(self, settings: RunSettings | None, options: RunOptions) -> RunSettings:
        if self._workers is not None:
            raise RuntimeError("this consumer is running already")
        self._stats = RunStats()
        return replace(settings or RunSettings(), **options)

    def _stopping(self) -> bool:
        return self._stop

    def stop(self) -> None:
        """End the ``run`` going on (or the next one): no more receives; the running
        handlers are waited for and settled. From any thread, a handler's too."""
        self._stop = True
        if (w := self._workers) is not None:
            w.wake()


class PopConsumer(SyncDriver[PopOps], _PopConsumerFront):
    """Shared consumption of a topic by a POP group (blocking): every message goes to
    one consumer of the group at a time until it is acked, or its invisible time ends.
    ``run(handler)`` is the loop most callers want."""

    receive = blocking(PopOps.receive)
    ack = blocking(PopOps.ack)
    nack = blocking(PopOps.nack)
    extend = blocking(PopOps.extend)
    dead_letter = blocking(PopOps.dead_letter)

    def run(
        self,
        handler: Callable[[PopMessage], object],
        settings: RunSettings | None = None,
        **options: UnpackKw[RunOptions],
    ) -> RunStats:
        """Receive in a loop and call ``handler(message)`` in up to ``concurrency``
        threads: ack when it returns, nack when it raises, extend the invisible time
        while it runs. Runs until ``stop()`` (or ``max_messages``, ``max_idle_s``), then
        waits up to ``stop_timeout_s`` for the running handlers and settles them. An
        error the client gives up on (after its retries) is raised; handlers still
        running then end on their own, unsettled: their messages come again after their
        invisible time."""
        s = self._start_run(settings, options)
        workers = ThreadWorkers(handler, s.concurrency)
        self._workers = workers

        def perform(action: RunAction) -> list[Ended] | Outcome | None:
            if isinstance(action, Spawn | Collect):
                return workers.perform(action)
            return self._perform(action)

        try:
            return self._drive(self._ops.run(s, self._stats, self._stopping), perform)
        finally:
            self._workers = None
            self._stop = False
            workers.close()


class AsyncPopConsumer(AsyncDriver[PopOps], _PopConsumerFront):
    """``PopConsumer`` for asyncio: handlers are coroutine functions, run as tasks."""

    receive = awaiting(PopOps.receive)
    ack = awaiting(PopOps.ack)
    nack = awaiting(PopOps.nack)
    extend = awaiting(PopOps.extend)
    dead_letter = awaiting(PopOps.dead_letter)

    async def run(
        self,
        handler: Callable[[PopMessage], Awaitable[object]],
        settings: RunSettings | None = None,
        **options: UnpackKw[RunOptions],
    ) -> RunStats:
        """As ``PopConsumer.run``, with ``concurrency`` tasks; handlers still running
        after ``stop_timeout_s`` (or when an error ends the run) are cancelled."""
        s = self._start_run(settings, options)
        workers = TaskWorkers(handler)
        self._workers = workers

        async def perform(action: RunAction) -> list[Ended] | Outcome | None:
            if isinstance(action, Spawn | Collect):
                return await workers.perform(action)
            return await self._perform(action)

        try:
            return await self._drive(self._ops.run(s, self._stats, self._stopping), perform)
        finally:
            self._workers = None
            self._stop = False
            await workers.close(s.stop_timeout_s)
