"""The produce path: check a request, encode its messages (``broker/encode.py``, pure),
append them through the commit log (which assigns queue offsets), and answer once they
are committed and dispatched, so a read right after the answer finds them.

Producer sessions (docs/architecture.md): a produce request may carry ``producer_id`` and
``sequence``. The session's last batch and its results are replicated state; a retry of
the same sequence is answered with the original results, a batch of which only a prefix
reached the log (a failover mid-batch) is completed with its missing tail, and a retry
of a batch this master appended waits for the original instead of appending again: for
its answer while it runs, and after it gave up (an unknown outcome) for its entries to
settle, as long as this master's term lasts (``_attempt``; the rule is
``broker/sessions.py``). A producer id ``%id%<message id>`` is a RocketMQ client's send
(``broker/sendwindow.py``): the same rule over the send window instead of the table.
The broker simulation runs this module as it is (``Producer``'s docstring says how).

Bounds: a request holds at most ``max_messages_per_request`` messages and
``max_request_bytes`` of bodies; a session request takes at most three rounds of the
rule before it is told to retry; every wait is bounded by ``append_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dledger.codes import DLedgerError
from dledger.runtime.server import DLedgerServer

from . import errors, sessions
from .commitlog import DLedgerCommitLog, OutgoingMessage, PutResult
from .encode import NewMessage, encode_request, validate_messages
from .gate import WriteGate
from .metadata import HALF_TOPIC, PRODUCER_ID, MetadataState, TopicMeta
from .msgid import msg_id_maker, msg_id_prefix, new_uniq_key
from .names import check_topic_name
from .records import InnerBatch, encode_inner_batch
from .sendwindow import SEND_ID_PREFIX, is_send_id
from .settings import BrokerSettings
from .topics import Topics

RECORD_MARGIN = 64 * 1024  # a batch record's header and properties, with room to spare

if TYPE_CHECKING:
    from .dispatch import Dispatch

__all__ = ["AnswerSlot", "LoopAnswerSlot", "NewMessage", "ProduceResult", "Producer", "now_ms"]


@dataclass(frozen=True, slots=True)
class ProduceResult:
    msg_id: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int


def now_ms() -> int:
    """Wall-clock milliseconds: BORNTIMESTAMP and STORETIMESTAMP."""
    return int(time.time() * 1000)


class AnswerSlot(Protocol):
    """Where a running attempt puts its answer (results or an error, once) for the
    requests that joined it; each awaits ``wait()``, and one of them being cancelled
    leaves the answer to the others."""

    def set_result(self, results: list[sessions.Result]) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...

    def wait(self) -> Awaitable[list[sessions.Result]]: ...


class LoopAnswerSlot:
    """``AnswerSlot`` on the running asyncio loop: the broker's (the simulation drives
    ``Producer`` without a loop and passes its own)."""

    __slots__ = ("_fut",)

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._fut: asyncio.Future[list[sessions.Result]] = loop.create_future()

    def set_result(self, results: list[sessions.Result]) -> None:
        self._fut.set_result(results)

    def set_exception(self, error: BaseException) -> None:
        self._fut.set_exception(error)
        self._fut.exception()  # retrieved: joiners, if any, get it too

    def wait(self) -> Awaitable[list[sessions.Result]]:
        return asyncio.shield(self._fut)


class Producer:
    """The broker's produce path. It is handed what it works with: the ``WriteGate``
    (master, term, append errors), the topics, the commit log and its Raft server, the
    dispatcher (a result is answered once readable), the replicated metadata (the
    session table), the node's counters, the clock and the UNIQ_KEY source, and where a
    running attempt's answer waits for its joiners.

    It awaits nothing but those collaborators and its answer slots: the broker
    simulation (``tests/sim/broker_sim.py``) hands it the real gate, topics and commit
    log over a simulated Raft server, a dispatcher whose waits end on the simulated
    clock, and its own clock, keys and slots, and drives its coroutines without an
    event loop."""

    def __init__(
        self,
        *,
        settings: BrokerSettings,
        gate: WriteGate,
        topics: Topics,
        commitlog: DLedgerCommitLog,
        server: DLedgerServer,
        dispatch: Dispatch,
        meta: MetadataState,
        stats: dict[str, int],
        clock: Callable[[], int] = now_ms,
        uniq_key: Callable[[], str] = new_uniq_key,
        answer_slot: Callable[[], AnswerSlot] = LoopAnswerSlot,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.topics = topics
        self.commitlog = commitlog
        self.server = server
        self.dispatch = dispatch
        self.meta = meta
        self.stats = stats  # the node's: "produced", "deduplicated" counted here
        self.clock = clock
        self.uniq_key = uniq_key
        self.answer_slot = answer_slot
        self.store_host = settings.store_host
        self._msg_id = msg_id_maker(settings.group)
        self.msg_id_prefix = msg_id_prefix(settings.group)  # every message id's start
        # This master's attempts at session batches (the rule: broker/sessions.py), and
        # the answer each running one will give to the requests that join it.
        self.sessions = sessions.ProducerSessions(settings.max_producer_sessions)
        self._attempt_answers: dict[sessions.Attempt, AnswerSlot] = {}

    def check_request(
        self, messages: Sequence[NewMessage], producer_id: str | None, sequence: int | None
    ) -> None:
        """Refuse a request no node would take (before anything else is asked); a
        record-format request was checked when it was parsed (``broker.records``)."""
        if not isinstance(messages, InnerBatch):
            validate_messages(messages, self.settings.limits)
        if (producer_id is None) != (sequence is None):
            raise errors.InvalidArgumentError("producer_id and sequence go together")
        if (
            producer_id is not None
            and not PRODUCER_ID.fullmatch(producer_id)
            and not is_send_id(producer_id)
        ):
            raise errors.InvalidArgumentError(f"invalid producer_id {producer_id!r}")
        if sequence is not None and sequence < 0:
            raise errors.InvalidArgumentError("sequence must be >= 0")

    async def produce(
        self,
        topic_name: str,
        messages: Sequence[NewMessage],
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[ProduceResult]:
        """Append after validation; results after quorum commit (and dispatch). A topic
        that does not exist is created when ``auto_create_topics`` allows."""
        return self._results(await self.produce_placed(topic_name, messages, producer_id, sequence))

    async def produce_placed(
        self,
        topic_name: str,
        messages: Sequence[NewMessage],
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[sessions.Result]:
        """``produce``, answering where each message lies, ``(queue id, queue offset,
        message address)``, without a result object per message."""
        check_topic_name(topic_name)
        self.check_request(messages, producer_id, sequence)
        await self.gate.require_master_soon()
        topic = await self.topics.get_or_create(topic_name)
        return await self._place(topic, messages, producer_id, sequence)

    async def produce_to(
        self,
        topic: TopicMeta,
        messages: Sequence[NewMessage],
        producer_id: str | None,
        sequence: int | None,
    ) -> list[ProduceResult]:
        """Append a checked request (``check_request``) to an existing topic; results
        after quorum commit (and dispatch)."""
        return self._results(await self._place(topic, messages, producer_id, sequence))

    async def _place(
        self,
        topic: TopicMeta,
        messages: Sequence[NewMessage],
        producer_id: str | None,
        sequence: int | None,
    ) -> list[sessions.Result]:
        if producer_id is None or sequence is None:
            return await self._put(topic, messages, None, 0)
        return await self._produce_in_session(topic, messages, producer_id, sequence)

    async def _produce_in_session(
        self, topic: TopicMeta, messages: Sequence[NewMessage], pid: str, seq: int
    ) -> list[sessions.Result]:
        """Drive ``ProducerSessions`` (``broker/sessions.py``: the rule, shared with the
        simulation) for one request: answer, join, settle first, or append."""
        key = (pid, seq)
        table = self._table(pid)
        for _ in range(3):  # each round ends an attempt or answers; more is a busy batch
            d = self.sessions.begin(
                key,
                len(messages),
                term=self.gate.role_term,
                table=table,
                settled=self._settled,
            )
            if isinstance(d, sessions.Answer):
                self.stats["deduplicated"] += len(d.results)
                return list(d.results)
            if isinstance(d, sessions.Refuse):
                raise d.error
            if isinstance(d, sessions.Join):
                return await self._attempt_answers[d.attempt].wait()
            if isinstance(d, sessions.SettleFirst):
                if not await self._settle(d.attempt.term, d.index):
                    raise errors.UnknownOutcomeError(
                        f"producer {pid} sequence {seq}: an earlier attempt is not settled"
                        " yet; retry with the same sequence"
                    )
                continue
            return await self._attempt(topic, messages, d)
        raise errors.UnknownOutcomeError(
            f"producer {pid} sequence {seq}: attempts keep overlapping; retry"
        )

    async def _attempt(
        self, topic: TopicMeta, messages: Sequence[NewMessage], d: sessions.Append
    ) -> list[sessions.Result]:
        """Append the batch's missing tail as ``d.attempt``; its answer goes to every
        request that joined it, and ``ProducerSessions.end`` hears how it ended."""
        a, done = d.attempt, d.done
        pid, seq = a.key
        answer_slot = self._attempt_answers[a] = self.answer_slot()
        self.stats["deduplicated"] += len(done)
        answer: list[sessions.Result] | None = None
        appended = True
        try:
            try:
                placed = await self._put(
                    topic, messages[len(done) :], (pid, seq, len(messages)), len(done)
                )
            except errors.UnknownOutcomeError:
                # Still master in the same term: the entries are in our log and commit or
                # vanish with our leadership. Wait for all appended so far; if the batch
                # made it, the session table has the answer, else the client retries.
                if await self._settle(a.term):
                    answer = self.sessions.answer_from_table(a, len(messages), self._table(pid))
                if answer is None:
                    raise
            else:
                answer = done + placed
        except BaseException as e:
            # A refusal before the append (not master, busy, disk full) appended nothing;
            # an unknown outcome or a cancel mid-append may have.
            appended = not isinstance(e, errors.BrokerError) or isinstance(
                e, errors.UnknownOutcomeError
            )
            told = e if isinstance(e, errors.BrokerError) else None
            answer_slot.set_exception(
                told or errors.UnknownOutcomeError(f"produce interrupted ({type(e).__name__})")
            )
            raise
        else:
            answer_slot.set_result(answer)
            return answer
        finally:
            self.sessions.end(
                a,
                answer=answer,
                appended=appended,
                master_term=self.gate.role_term if self.gate.is_master else None,
                ledger_end=self.server.ledger_end_index,
                settled=self._settled,
            )
            self._attempt_answers.pop(a, None)

    def _table(self, pid: str) -> Mapping[str, sessions.BatchRecord]:
        """The replicated table of producer ``pid``'s batches: the send window for a
        client's message id (``broker/sendwindow.py``), else the session table."""
        return self.meta.send_window if pid.startswith(SEND_ID_PREFIX) else self.meta.sessions

    def _settled(self, index: int) -> bool:
        return self.server.committed_index >= index and self.dispatch.dispatched_index >= index

    async def _settle(self, term: int, target: int | None = None) -> bool:
        """Wait (bounded) until all that this master appended, up to ``target`` when
        given, is committed and dispatched; False if it is not master in ``term``."""
        if not self.gate.is_master or self.gate.role_term != term:
            return False
        if target is None:
            target = self.server.ledger_end_index
        timeout_s = self.settings.append_timeout_ms / 1000
        if not await self.server.wait_committed(target, timeout_s):
            return False
        return await self.dispatch.wait_dispatched(target, timeout_s)

    @property
    def max_record_bytes(self) -> int:
        """The inner records one batch record may hold: what one entry of the log holds
        (``StoreSettings.max_body_bytes``, and half a data file, which must hold the
        entry), less ``RECORD_MARGIN`` for the record's own header and properties. A
        request's run for one queue past it is several records (a request within the
        limits was refused 507 by the store before)."""
        store = self.settings.store
        return max(
            RECORD_MARGIN, min(store.max_body_bytes, store.data_file_size // 2) - RECORD_MARGIN
        )

    def _results(self, results: Sequence[sessions.Result]) -> list[ProduceResult]:
        return [self._result(q, o, c) for q, o, c in results]

    def _result(self, queue_id: int, queue_offset: int, commitlog_offset: int) -> ProduceResult:
        return ProduceResult(
            self._msg_id(commitlog_offset),
            queue_id,
            queue_offset,
            commitlog_offset,
        )

    async def _put(
        self,
        topic: TopicMeta,
        messages: Sequence[NewMessage],
        session: tuple[str, int, int] | None,
        first_in_batch: int,
    ) -> list[sessions.Result]:
        commitlog = self.commitlog
        # a record-format request's inner records are stored as they came
        encode: Callable[..., list[OutgoingMessage]] = (
            encode_inner_batch if isinstance(messages, InnerBatch) else encode_request
        )
        batch = encode(
            topic,
            messages,
            session=session,
            first_in_batch=first_in_batch,
            now=self.clock(),
            store_host=self.store_host,
            uniq_key=self.uniq_key,
            limits=self.settings.limits,
            # (a transaction's half messages are always one record: one entry, all or none)
            batch_records=self.settings.batch_records or topic.name == HALF_TOPIC,
            select_queues=lambda qs: commitlog.select_queues(topic, qs, sticky=True),
            max_record_bytes=self.max_record_bytes,
        )
        if topic.name == HALF_TOPIC and len(batch) > 1:
            raise errors.PayloadTooLargeError(
                f"a transaction's messages are one record of at most {self.max_record_bytes}"
                " bytes of messages; these are more"
            )
        self.gate.require_master()  # encoding took no await, but be explicit before appending
        try:
            placed: list[PutResult] = await commitlog.put_messages(topic, batch)
        except DLedgerError as e:
            raise self.gate.append_error(e) from None
        # Wait until dispatched, so a read right after the answer finds the messages and
        # a retry finds the session's results (bounded; the commit already happened).
        timeout_s = self.settings.append_timeout_ms / 1000
        await self.dispatch.wait_dispatched(placed[-1].index, timeout_s)
        self.stats["produced"] += len(messages)
        # Message i of a batch record: queue offset base + i, address record offset + i.
        return [
            (p.queue_id, p.queue_offset + i, p.commitlog_offset + i)
            for m, p in zip(batch, placed, strict=True)
            for i in range(m.count)
        ]
