"""The produce path: check a request, encode its messages, append them through the
commit log (which assigns queue offsets), and answer once they are committed and
dispatched, so a read right after the answer finds them.

Producer sessions (docs/architecture.md): a produce request may carry ``producer_id`` and
``sequence``. The session's last batch and its results are replicated state; a retry of
the same sequence is answered with the original results, a batch of which only a prefix
reached the log (a failover mid-batch) is completed with its missing tail, and a retry
of a batch this master appended waits for the original instead of appending again: for
its answer while it runs, and after it gave up (an unknown outcome) for its entries to
settle, as long as this master's term lasts (``_attempt``; the rule, shared with the
broker simulation, is ``broker/sessions.py``).

Bounds: a request holds at most ``max_messages_per_request`` messages and
``max_request_bytes`` of bodies; a session request takes at most three rounds of the
rule before it is told to retry; every wait is bounded by ``append_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dledger.codes import DLedgerError
from dledger.runtime.server import DLedgerServer

from . import errors, sessions
from .batch import encode_batch_record, queue_runs
from .commitlog import DLedgerCommitLog, OutgoingMessage, PutResult
from .gate import WriteGate
from .message import (
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    SYSTEM_PROPERTIES,
    MessageFormatError,
    encode_message,
    encode_properties,
    message_properties,
)
from .metadata import PRODUCER_ID, MetadataState, TopicMeta
from .msgid import msg_id_maker, new_uniq_key
from .properties import inner_properties
from .settings import BrokerSettings
from .topics import Topics, check_topic_name

if TYPE_CHECKING:
    from .dispatch import Dispatch

_PROPERTY_NAME_RESERVED = SYSTEM_PROPERTIES | {PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY}


@dataclass(slots=True)
class NewMessage:
    """A message a producer hands the broker, before it is encoded (an ``OutgoingMessage``)
    and stored (a ``StoredMessage`` once decoded)."""

    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    sharding_key: str | None = None
    born_timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class ProduceResult:
    msg_id: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int


def now_ms() -> int:
    """Wall-clock milliseconds: BORNTIMESTAMP and STORETIMESTAMP."""
    return int(time.time() * 1000)


class Producer:
    """The broker's produce path. It is handed what it works with: the ``WriteGate``
    (master, term, append errors), the topics, the commit log and its Raft server, the
    dispatcher (a result is answered once readable), the replicated metadata (the
    session table), the node's counters, and the clock and the UNIQ_KEY source (the
    simulation passes its own)."""

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
        self.store_host = settings.store_host
        self._msg_id = msg_id_maker(settings.group)
        # This master's attempts at session batches (the rule: broker/sessions.py), and
        # the answer each running one will give to the requests that join it.
        self.sessions = sessions.ProducerSessions(settings.max_producer_sessions)
        self._attempt_answers: dict[sessions.Attempt, asyncio.Future[list[sessions.Result]]] = {}

    def check_request(
        self, messages: Sequence[NewMessage], producer_id: str | None, sequence: int | None
    ) -> None:
        """Refuse a request no node would take (before anything else is asked)."""
        self._validate_batch(messages)
        if (producer_id is None) != (sequence is None):
            raise errors.InvalidArgumentError("producer_id and sequence go together")
        if producer_id is not None and not PRODUCER_ID.fullmatch(producer_id):
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
        check_topic_name(topic_name)
        self.check_request(messages, producer_id, sequence)
        await self.gate.require_master_soon()
        topic = await self.topics.get_or_create(topic_name)
        return await self.produce_to(topic, messages, producer_id, sequence)

    async def produce_to(
        self,
        topic: TopicMeta,
        messages: Sequence[NewMessage],
        producer_id: str | None,
        sequence: int | None,
    ) -> list[ProduceResult]:
        """Append a checked request (``check_request``) to an existing topic; results
        after quorum commit (and dispatch)."""
        if producer_id is None or sequence is None:
            return self._results(await self._put(topic, messages, None, 0))
        return await self._produce_in_session(topic, messages, producer_id, sequence)

    def _validate_batch(self, messages: Sequence[NewMessage]) -> None:
        lim = self.settings.limits
        if not messages:
            raise errors.InvalidArgumentError("no messages")
        if len(messages) > lim.max_messages_per_request:
            raise errors.PayloadTooLargeError(
                f"{len(messages)} messages, over the limit of {lim.max_messages_per_request}"
            )
        total = 0
        for i, m in enumerate(messages):
            if len(m.body) > lim.max_body_bytes:
                raise errors.PayloadTooLargeError(
                    f"message {i}: body of {len(m.body)} bytes, over {lim.max_body_bytes}"
                )
            total += len(m.body)
            if len(m.keys) > lim.max_keys_per_message:
                raise errors.InvalidArgumentError(
                    f"message {i}: over {lim.max_keys_per_message} keys"
                )
            for k in m.keys:
                if not k or " " in k or "\x01" in k or "\x02" in k:
                    raise errors.InvalidArgumentError(f"message {i}: invalid key {k!r}")
            for name in m.properties:
                if name in _PROPERTY_NAME_RESERVED:
                    raise errors.InvalidArgumentError(f"message {i}: property {name} is reserved")
        if total > lim.max_request_bytes:
            raise errors.PayloadTooLargeError(
                f"request of {total} bytes, over the limit of {lim.max_request_bytes}"
            )

    def _checked_properties(
        self, topic: TopicMeta, m: NewMessage, index_in_batch: int, props: dict[str, str]
    ) -> bytes:
        """``props`` encoded, within ``max_properties_bytes``, and the message's pinned
        queue checked: what every message of a request must pass."""
        lim = self.settings.limits
        try:
            raw_props = encode_properties(props)
        except MessageFormatError as e:
            raise errors.InvalidArgumentError(f"message {index_in_batch}: {e}") from None
        if len(raw_props) > lim.max_properties_bytes:
            raise errors.PayloadTooLargeError(
                f"message {index_in_batch}: properties of {len(raw_props)} bytes, "
                f"over {lim.max_properties_bytes}"
            )
        if m.queue_id is not None and not 0 <= m.queue_id < topic.queues:
            raise errors.InvalidArgumentError(
                f"message {index_in_batch}: queue_id {m.queue_id} is not in 0..{topic.queues - 1}"
            )
        return raw_props

    def _encode(
        self,
        topic: TopicMeta,
        m: NewMessage,
        index_in_batch: int,
        session: tuple[str, int, int] | None,
        now: int,
        *,
        queue_id: int | None = None,
    ) -> OutgoingMessage:
        props = message_properties(
            m.properties,
            tags=m.tags,
            keys=m.keys,
            uniq_key=self.uniq_key(),
            session=None if session is None else (*session[:2], index_in_batch, session[2]),
        )
        raw_props = self._checked_properties(topic, m, index_in_batch, props)
        record = encode_message(
            topic=topic.name,
            body=m.body,
            properties=raw_props,
            born_timestamp=m.born_timestamp if m.born_timestamp is not None else now,
            store_timestamp=now,
            store_host=self.store_host,
        )
        if queue_id is not None:
            return OutgoingMessage(record, queue_id)
        return OutgoingMessage(record, m.queue_id, m.sharding_key)

    def _encode_batched(
        self,
        topic: TopicMeta,
        messages: Sequence[NewMessage],
        session: tuple[str, int, int] | None,
        first_in_batch: int,
        now: int,
    ) -> list[OutgoingMessage]:
        """The request as batch records (``broker.batch``): each run of consecutive
        messages bound for one queue becomes one record, a run of one (or a message with
        its own born time, which an inner record cannot hold) a single record. Unpinned
        messages share one round-robin queue (``select_queues(sticky=True)``)."""
        raw = [
            self._checked_properties(
                topic,
                m,
                first_in_batch + i,
                inner_properties(m.properties, tags=m.tags, keys=m.keys),
            )
            for i, m in enumerate(messages)
        ]
        qids = self.commitlog.select_queues(
            topic, [(m.queue_id, m.sharding_key) for m in messages], sticky=True
        )
        out: list[OutgoingMessage] = []
        alone = [m.born_timestamp is not None for m in messages]
        for i, j in queue_runs(qids, alone):
            if j - i == 1:
                out.append(
                    self._encode(
                        topic, messages[i], first_in_batch + i, session, now, queue_id=qids[i]
                    )
                )
            else:
                out.append(
                    self._batch_record(
                        topic,
                        messages[i:j],
                        raw[i:j],
                        index_in_batch=first_in_batch + i,
                        session=session,
                        now=now,
                        queue_id=qids[i],
                    )
                )
        return out

    def _batch_record(
        self,
        topic: TopicMeta,
        run: Sequence[NewMessage],
        raw_props: Sequence[bytes],
        *,
        index_in_batch: int,
        session: tuple[str, int, int] | None,
        now: int,
        queue_id: int,
    ) -> OutgoingMessage:
        record = encode_batch_record(
            topic.name,
            [(m.body, p) for m, p in zip(run, raw_props, strict=True)],
            session=None if session is None else (*session[:2], index_in_batch, session[2]),
            timestamp=now,
            store_host=self.store_host,
        )
        return OutgoingMessage(record, queue_id, count=len(run))

    async def _produce_in_session(
        self, topic: TopicMeta, messages: Sequence[NewMessage], pid: str, seq: int
    ) -> list[ProduceResult]:
        """Drive ``ProducerSessions`` (``broker/sessions.py``: the rule, shared with the
        simulation) for one request: answer, join, settle first, or append."""
        key = (pid, seq)
        for _ in range(3):  # each round ends an attempt or answers; more is a busy batch
            d = self.sessions.begin(
                key,
                len(messages),
                term=self.gate.role_term,
                table=self.meta.sessions,
                settled=self._settled,
            )
            if isinstance(d, sessions.Answer):
                self.stats["deduplicated"] += len(d.results)
                return self._results(d.results)
            if isinstance(d, sessions.Refuse):
                raise d.error
            if isinstance(d, sessions.Join):
                return self._results(await asyncio.shield(self._attempt_answers[d.attempt]))
            if isinstance(d, sessions.SettleFirst):
                if not await self._settle(d.attempt.term, d.index):
                    raise errors.UnknownOutcomeError(
                        f"producer {pid} sequence {seq}: an earlier attempt is not settled"
                        " yet; retry with the same sequence"
                    )
                continue
            return self._results(await self._attempt(topic, messages, d))
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
        answer_fut: asyncio.Future[list[sessions.Result]] = (
            asyncio.get_running_loop().create_future()
        )
        self._attempt_answers[a] = answer_fut
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
                    answer = self.sessions.answer_from_table(a, len(messages), self.meta.sessions)
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
            answer_fut.set_exception(
                told or errors.UnknownOutcomeError(f"produce interrupted ({type(e).__name__})")
            )
            answer_fut.exception()  # retrieved: joiners, if any, get it too
            raise
        else:
            answer_fut.set_result(answer)
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
        now = self.clock()
        if self.settings.batch_records and len(messages) > 1:
            batch = self._encode_batched(topic, messages, session, first_in_batch, now)
        else:
            batch = [
                self._encode(topic, m, first_in_batch + i, session, now)
                for i, m in enumerate(messages)
            ]
        self.gate.require_master()  # encoding took no await, but be explicit before appending
        try:
            placed: list[PutResult] = await self.commitlog.put_messages(topic, batch)
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
