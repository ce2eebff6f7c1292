"""The ``Broker`` facade: one node's whole broker, what the API layer calls.

It owns the ``DLedgerServer`` (Raft), the ``DLedgerCommitLog`` (append hook, queue
offsets), the consume queues and the key index, the replicated metadata, the
``ReputService`` and the ``RoleChangeHandler``. Writes (produce, topic admin, offset
commits, leadership transfer) need the MASTER role; reads are served by every node from
committed, dispatched data.

Producer sessions (docs/architecture.md): a produce request may carry ``producer_id`` and
``sequence``. The session's last batch and its results are replicated state; a retry of
the same sequence is answered with the original results, a batch of which only a prefix
reached the log (a failover mid-batch) is completed with its missing tail, and a retry
of a batch this master appended waits for the original instead of appending again: for
its answer while it runs, and after it gave up (an unknown outcome) for its entries to
settle, as long as this master's term lasts (see ``_join_inflight``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from consumequeue import UNIT_SIZE, ConsumeQueueStore, KeyIndex, parse_tag_expression
from consumequeue.queue import UNIT as PAGE_UNIT
from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import Role
from dledger.runtime.server import AppendOutcomeUnknownError, DLedgerServer, NotLeaderError
from dledger.store import CorruptEntryError, FileStore

from . import errors, sessions
from .commitlog import DLedgerCommitLog, OutgoingMessage, PutResult
from .message import (
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    STORE_TIMESTAMP_POS,
    SYSTEM_PROPERTIES,
    MessageFormatError,
    StoredMessage,
    decode_message,
    encode_message,
    encode_properties,
    message_properties,
)
from .metadata import (
    GROUP_NAME,
    PRODUCER_ID,
    SYS_PREFIX,
    SYS_TOPIC,
    TOPIC_NAME,
    MetadataState,
    SnapshotFiles,
    TopicMeta,
    op_commit_offsets,
    op_create_topic,
    op_delete_topic,
)
from .msgid import make_msg_id, new_uniq_key, parse_msg_id
from .pages import RawPage, RawPullResult, damaged_record, units_within
from .promotion import own_term_committed, queue_table_from
from .reput import ReputService
from .role import BrokerRole, RoleChangeHandler
from .settings import BrokerSettings
from .status import BrokerStatus, PeerStatus

log = logging.getLogger(__name__)

# The Retry-After hints of 503 NO_MASTER (the client waits at least this, or its backoff):
PROMOTING_RETRY_AFTER_MS = 20  # this node leads and is becoming MASTER
NO_LEADER_RETRY_AFTER_MS = 50  # no leader known: an election is under way

CORRUPT_LOG_INTERVAL_S = 10.0  # refused reads of damaged entries are logged this often
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


@dataclass(frozen=True, slots=True)
class PulledMessage:
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    commitlog_offset: int
    body: bytes
    tags: str | None
    keys: list[str]
    uniq_key: str | None
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    size: int  # the stored record's bytes: what response budgets count


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND | NO_NEW_MSG | NO_MATCHED_MSG | OFFSET_ILLEGAL
    messages: list[PulledMessage]
    next_offset: int
    min_offset: int
    max_offset: int


_Found = TypeVar("_Found")
_Found_co = TypeVar("_Found_co", covariant=True)


class _Scan(Protocol[_Found_co]):
    """One look at a queue: (what was found, how many messages, the next offset)."""

    def __call__(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> tuple[_Found_co, int, int]: ...


@dataclass(frozen=True, slots=True)
class GroupPullResult:
    messages: list[PulledMessage]
    next_offsets: dict[int, int]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error_text(e: BaseException | None) -> str | None:
    if e is None:
        return None
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
    return str(e) or type(e).__name__


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.server = DLedgerServer(settings.server_config())
        self.commitlog = DLedgerCommitLog(self.server)
        root = settings.data_dir
        self.cq = ConsumeQueueStore(root / "consumequeue" / settings.group, settings.consume_queue)
        self.keys = KeyIndex(root / "index" / settings.group, settings.key_index)
        self.meta = MetadataState(settings.max_producer_sessions)
        self.snapshots = SnapshotFiles(root / "metadata" / settings.group, settings.snapshots_kept)
        self.dispatcher: ReputService = None  # type: ignore[assignment]  # set in start()
        self.role = BrokerRole.SLAVE
        self.role_term = -1
        self.role_handler = RoleChangeHandler(self, settings.master_catch_up_timeout_ms)
        self.server.add_role_change_handler(self.role_handler)
        self.server.set_snapshot_installer(self._install_snapshot)
        self._recovered = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # This master's attempts at session batches (the rule: broker/sessions.py), and
        # the answer each running one will give to the requests that join it.
        self.sessions = sessions.ProducerSessions(settings.max_producer_sessions)
        self._attempt_answers: dict[sessions.Attempt, asyncio.Future[list[sessions.Result]]] = {}
        self._store_host = ("127.0.0.1", 0)
        self._disk_checked_at = -1e18
        self._disk_free_bytes = 1 << 62
        self.stats = {"produced": 0, "pulled": 0, "deduplicated": 0, "corrupt_reads": 0}
        self._corrupt_logged_at = -1e18

    # ---- lifecycle ---------------------------------------------------------------------

    @property
    def store(self) -> FileStore:
        assert self.server.store is not None, "broker not started"
        return self.server.store

    async def start(self) -> None:
        s = self.settings
        host, _, port = s.peer_map[s.node_id].rpartition(":")
        self._store_host = (host, int(port))
        await self.server.start()
        self.dispatcher = ReputService(
            self.store,
            self.cq,
            self.keys,
            self.meta,
            self.snapshots,
            checkpoint_path=s.data_dir / "consumequeue" / f"checkpoint-{s.group}",
            batch_entries=s.dispatch_batch_entries,
            checkpoint_interval_ms=s.dispatch_checkpoint_interval_ms,
            snapshot_interval_entries=s.snapshot_interval_entries,
            snapshot_interval_ms=s.snapshot_interval_ms,
            on_topic_deleted=self.commitlog.forget_topic,
            serve_snapshot=self._serve_snapshot,
        )
        await asyncio.to_thread(self.dispatcher.recover)
        self._recovered.set()
        self.dispatcher.offer_snapshot()
        task = asyncio.create_task(
            self.dispatcher.run(self.server.wait_committed), name="broker-dispatch"
        )
        # The dispatcher ends only on a broken invariant: without it nothing committed
        # becomes readable, so the node must fail loudly, not go on half alive.
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        e = task.exception() or RuntimeError("returned")
        self.server.fail(f"task {task.get_name()} ended", e)

    @property
    def failed(self) -> BaseException | None:
        """Why the node stopped working (it is exiting), or None."""
        return self.server.failed

    async def stop(self) -> None:
        await self.role_handler.close()
        for t in self._tasks:
            t.cancel()
        # A task that died already was reported (it failed the node); stop goes on.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.dispatcher is not None:
            await self.dispatcher.close()
        await self.server.stop()
        self.cq.close()
        self.keys.close()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- snapshots (docs/architecture.md) --------------------------------------------------------

    def _serve_snapshot(self, index: int, data: bytes) -> bool:
        """Raft keeps the dispatcher's newest snapshot for followers behind the log head;
        False while it cannot (after a restart, until the local commit index is back)."""
        try:
            self.server.set_snapshot(index, data)
        except DLedgerError as e:
            log.debug("snapshot %d not served yet: %s", index, e.message)
            return False
        return True

    async def _install_snapshot(self, last_index: int, data: bytes) -> None:
        """The leader no longer has the entries this node needs: take its snapshot.
        Raft handles nothing else until this returns, and it can arrive as soon as the
        server is up, so it waits for recovery first (which needs no Raft progress)."""
        await self._recovered.wait()
        log.info(
            "node %s installs the leader's snapshot of entry %d (%d bytes)",
            self.settings.node_id,
            last_index,
            len(data),
        )
        await self.dispatcher.install(last_index, data)
        self.commitlog.clear_queue_table()

    # ---- roles -------------------------------------------------------------------------

    def set_role(self, role: BrokerRole, term: int, why: str) -> None:
        if role is not BrokerRole.MASTER:
            self.commitlog.clear_queue_table()
        if role is not self.role or term != self.role_term:
            log.info(
                "node %s term %d: broker role %s → %s (%s)",
                self.settings.node_id,
                term,
                self.role.value,
                role.value,
                why,
            )
        self.role, self.role_term = role, term

    # RoleHost (broker/role.py): what the promotion to MASTER reads and waits for.

    def leading(self, term: int) -> bool:
        core = self.server.core
        return (
            core is not None
            and core.member_state.role is Role.LEADER
            and core.member_state.curr_term == term
        )

    def own_term_committed(self, term: int) -> bool:
        return own_term_committed(self.store, term)

    @property
    def committed_index(self) -> int:
        return self.store.committed_index

    @property
    def dispatched_index(self) -> int:
        return self.dispatcher.dispatched_index

    async def wait_committed(self, index: int, timeout_s: float) -> bool:
        return await self.server.wait_committed(index, timeout_s)

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        return await self.dispatcher.wait_dispatched(index, timeout_s)

    def rebuild_queue_table(self) -> int:
        table = queue_table_from(self.meta, self.cq)
        self.commitlog.reset_queue_table(table)
        return len(table)

    def _require_master(self) -> None:
        if self.role is BrokerRole.MASTER:
            self._require_writable()
            return
        core = self.server.core
        leader = core.member_state.leader_id if core is not None else None
        if leader is None or leader == self.settings.node_id:
            # No leader, or we lead but are still catching up: nobody takes writes yet.
            # The promotion takes milliseconds, an election after a crash tens (issue 18):
            # the client's own backoff, which grows, covers longer waits.
            retry_ms = PROMOTING_RETRY_AFTER_MS if leader is not None else NO_LEADER_RETRY_AFTER_MS
            raise errors.NoMasterError(
                "no master at the moment; retry shortly", retry_after_ms=retry_ms
            )
        raise errors.NotMasterError(
            f"this broker is a SLAVE; the master is {leader}",
            leader_id=leader,
            leader_addr=self.settings.peer_map.get(leader),
            leader_url=self.settings.peer_urls.get(leader),
        )

    def _require_derived(self) -> None:
        """Reads of the consume queues and the key index wait out a snapshot install
        (its thread is replacing the files): 429 BUSY with a short Retry-After."""
        if self.dispatcher is not None and self.dispatcher.installing:
            raise errors.BusyError(
                "installing a snapshot from the leader; retry shortly", retry_after_ms=200
            )

    def _require_writable(self) -> None:
        """Refuse a write the node could not make readable: while dispatch is stalled on
        a disk error nothing new reaches the consume queues (it resumes by itself)."""
        if self.server.failed is not None:
            raise errors.NodeFailedError(f"node failed: {self.server.failed!r}")
        free = self._disk_free()
        if free < self.settings.disk_reserve:
            raise errors.DiskFullError(
                f"writes refused: {free >> 20} MiB free in {self.settings.data_dir}, under the"
                f" reserve of {self.settings.disk_reserve >> 20} MiB kept for the consume"
                " queues and the key index; reads go on, writes resume when space returns",
                retry_after_ms=1000,
            )
        stall = self.dispatcher.stall if self.dispatcher is not None else None
        if stall is not None:
            raise errors.DiskFullError(
                f"writes refused: dispatch is stalled on a disk error ({stall.strerror or stall});"
                " reads go on, writes resume when it moves again",
                retry_after_ms=1000,
            )

    def _disk_free(self) -> int:
        """Free bytes where the data lives, looked up at most once per interval."""
        now = time.monotonic()
        if now - self._disk_checked_at >= self.settings.disk_check_interval_ms / 1000:
            self._disk_checked_at = now
            try:
                self._disk_free_bytes = shutil.disk_usage(self.settings.data_dir).free
            except OSError as e:  # the directory went away: say so, refuse nothing more
                log.warning("cannot read the free space of %s: %s", self.settings.data_dir, e)
        return self._disk_free_bytes

    # ---- appends -----------------------------------------------------------------------

    def _translate(self, e: DLedgerError) -> errors.BrokerError:
        if isinstance(e, AppendOutcomeUnknownError):
            return errors.UnknownOutcomeError(
                f"commit unknown ({e.code.name}); retry may duplicate"
            )
        if isinstance(e, NotLeaderError):
            self.set_role(BrokerRole.SLAVE, self.role_term, "the log refused: not leader")
            try:
                self._require_master()
            except errors.BrokerError as err:
                return err
        if e.code is DLedgerCode.LEADER_PENDING_FULL:
            return errors.BusyError("too many appends waiting for a quorum", retry_after_ms=100)
        if e.code is DLedgerCode.DISK_FULL:
            return errors.DiskFullError(e.message, retry_after_ms=1000)
        if e.code in (DLedgerCode.DISK_ERROR, DLedgerCode.UNEXPECTED_ARGUMENT):
            return errors.StorageError(e.message)
        return errors.NoMasterError(f"append refused: {e.code.name}", retry_after_ms=200)

    async def _append_meta(self, op: dict[str, Any]) -> int:
        self._require_master()
        record = encode_message(
            topic=SYS_TOPIC,
            body=orjson.dumps(op),
            born_timestamp=_now_ms(),
            store_timestamp=_now_ms(),
            store_host=self._store_host,
        )
        try:
            index, _pos = await self.commitlog.append_system(record)
        except DLedgerError as e:
            raise self._translate(e) from None
        await self.dispatcher.wait_dispatched(index, self.settings.append_timeout_ms / 1000)
        return index

    # ---- topics ------------------------------------------------------------------------

    def _check_topic_name(self, name: str) -> None:
        if not TOPIC_NAME.fullmatch(name):
            raise errors.InvalidArgumentError(
                f"invalid topic name {name!r}: want [A-Za-z0-9_%|-]{{1,127}}"
            )
        if name.startswith(SYS_PREFIX):
            raise errors.InvalidArgumentError(f"the topic prefix {SYS_PREFIX} is reserved")

    async def create_topic(self, name: str, queues: int | None = None) -> tuple[TopicMeta, bool]:
        """Create a topic; returns (topic, created). Same again → (topic, False); another
        queue count → ``TopicConflictError``."""
        self._check_topic_name(name)
        n = self.settings.default_queues if queues is None else queues
        if not 1 <= n <= self.settings.limits.max_queues_per_topic:
            raise errors.InvalidArgumentError(
                f"queues must be 1..{self.settings.limits.max_queues_per_topic}, not {n}"
            )
        self._require_master()  # a write, even when it turns out to exist: the master says
        existing = self.meta.topics.get(name)
        if existing is None:
            self._check_room_for(n)
            await self._append_meta(op_create_topic(name, n))
            existing = self.meta.topics.get(name)
            created = True
        else:
            created = False
        if existing is None:
            raise errors.UnknownOutcomeError(f"topic {name} not visible after its create committed")
        if existing.queues != n:
            raise errors.TopicConflictError(
                f"topic {name} exists with {existing.queues} queues, not {n}",
                queues=existing.queues,
            )
        return existing, created

    def _check_room_for(self, queues: int) -> None:
        """``LimitReachedError`` (429) when one more topic, or ``queues`` more queues,
        would pass the node's limits: each queue holds file descriptors and a
        preallocated consume-queue segment, and running out of descriptors breaks
        segment creation for every topic. Checked by the master before the create is
        written (replicas apply what the master wrote)."""
        lim = self.settings.limits
        topics = self.meta.topics.values()
        if len(topics) >= lim.max_topics:
            raise errors.LimitReachedError(
                f"{len(topics)} topics, the node's limit", limit=lim.max_topics
            )
        total = sum(t.queues for t in topics)
        if total + queues > lim.max_total_queues:
            raise errors.LimitReachedError(
                f"{total} queues and {queues} more would pass the node's limit of "
                f"{lim.max_total_queues}",
                limit=lim.max_total_queues,
            )

    def list_topics(self) -> list[TopicMeta]:
        return sorted(self.meta.topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicMeta:
        t = self.meta.topics.get(name)
        if t is None:
            raise errors.TopicNotFoundError(f"topic {name} does not exist", topic=name)
        return t

    def describe_topic(self, name: str) -> dict[str, Any]:
        t = self.topic(name)
        return {
            "name": t.name,
            "queues": [
                {"queue_id": q, "min_offset": lo, "max_offset": hi}
                for q in range(t.queues)
                for lo, hi in [self.queue_bounds(name, q)]
            ],
        }

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        self._require_derived()
        q = self.cq.find(topic, queue_id)
        return (0, 0) if q is None else (q.min_offset, q.max_offset)

    async def delete_topic(self, name: str) -> None:
        # A write: redirect first. A slave may not know a topic the master just made.
        self._require_master()
        self.topic(name)
        await self._append_meta(op_delete_topic(name))

    # ---- produce -----------------------------------------------------------------------

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

    def _encode(
        self,
        topic: TopicMeta,
        m: NewMessage,
        index_in_batch: int,
        session: tuple[str, int, int] | None,
        now: int,
    ) -> OutgoingMessage:
        lim = self.settings.limits
        props = message_properties(
            m.properties,
            tags=m.tags,
            keys=m.keys,
            uniq_key=new_uniq_key(),
            session=None if session is None else (*session[:2], index_in_batch, session[2]),
        )
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
        record = encode_message(
            topic=topic.name,
            body=m.body,
            properties=raw_props,
            born_timestamp=m.born_timestamp if m.born_timestamp is not None else now,
            store_timestamp=now,
            store_host=self._store_host,
        )
        return OutgoingMessage(record, m.queue_id, m.sharding_key)

    async def produce(
        self,
        topic_name: str,
        messages: Sequence[NewMessage],
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[ProduceResult]:
        """Append after validation; results after quorum commit (and dispatch)."""
        self._check_topic_name(topic_name)
        self._validate_batch(messages)
        if (producer_id is None) != (sequence is None):
            raise errors.InvalidArgumentError("producer_id and sequence go together")
        if producer_id is not None and not PRODUCER_ID.fullmatch(producer_id):
            raise errors.InvalidArgumentError(f"invalid producer_id {producer_id!r}")
        if sequence is not None and sequence < 0:
            raise errors.InvalidArgumentError("sequence must be >= 0")
        self._require_master()
        topic = self.meta.topics.get(topic_name)
        if topic is None:
            if not self.settings.auto_create_topics:
                raise errors.TopicNotFoundError(
                    f"topic {topic_name} does not exist", topic=topic_name
                )
            topic, _ = await self.create_topic(topic_name, None)
        if producer_id is None or sequence is None:
            return self._results(await self._put(topic, messages, None, 0))
        return await self._produce_in_session(topic, messages, producer_id, sequence)

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
                term=self.role_term,
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
                master_term=self.role_term if self.is_master else None,
                ledger_end=self.store.ledger_end_index,
                settled=self._settled,
            )
            self._attempt_answers.pop(a, None)

    def _settled(self, index: int) -> bool:
        return self.store.committed_index >= index and self.dispatcher.dispatched_index >= index

    async def _settle(self, term: int, target: int | None = None) -> bool:
        """Wait (bounded) until all that this master appended, up to ``target`` when
        given, is committed and dispatched; False if it is not master in ``term``."""
        if not self.is_master or self.role_term != term:
            return False
        if target is None:
            target = self.store.ledger_end_index
        timeout_s = self.settings.append_timeout_ms / 1000
        if not await self.server.wait_committed(target, timeout_s):
            return False
        return await self.dispatcher.wait_dispatched(target, timeout_s)

    def _results(self, results: Sequence[sessions.Result]) -> list[ProduceResult]:
        return [self._result(q, o, c) for q, o, c in results]

    def _result(self, queue_id: int, queue_offset: int, commitlog_offset: int) -> ProduceResult:
        return ProduceResult(
            make_msg_id(self.settings.group, commitlog_offset),
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
        now = _now_ms()
        batch = [
            self._encode(topic, m, first_in_batch + i, session, now) for i, m in enumerate(messages)
        ]
        self._require_master()  # encoding took no await, but be explicit before appending
        try:
            placed: list[PutResult] = await self.commitlog.put_messages(topic, batch)
        except DLedgerError as e:
            raise self._translate(e) from None
        # Wait until dispatched, so a read right after the answer finds the messages and
        # a retry finds the session's results (bounded; the commit already happened).
        await self.dispatcher.wait_dispatched(
            placed[-1].index, self.settings.append_timeout_ms / 1000
        )
        self.stats["produced"] += len(placed)
        return [(p.queue_id, p.queue_offset, p.commitlog_offset) for p in placed]

    # ---- reads -------------------------------------------------------------------------

    def _record(self, commitlog_offset: int, size: int | None = None) -> memoryview:
        """A committed record, checked (``DLedgerCommitLog.read_record``: the entry CRC
        covers the whole record, so the record's own BODYCRC adds nothing). A damaged
        copy is counted, logged and refused with ``CORRUPT_ENTRY``: never served, and
        another replica serves it."""
        try:
            return self.commitlog.read_record(commitlog_offset, size)
        except CorruptEntryError as e:
            raise self._damaged(commitlog_offset, e.index, e.message) from None

    def _check_page(self, data: memoryview, units: bytes, base: int) -> None:
        """The Arrow pull's check of a chunk of records (``RawPage.check``): the same
        refusal as ``_record`` for the first damaged one."""
        bad = damaged_record(data, units, base)
        if bad is not None:
            raise self._damaged(bad, -1, f"the entry holding commitlog offset {bad} fails its CRC")

    def _damaged(self, commitlog_offset: int, index: int, why: str) -> errors.CorruptEntryError:
        self.stats["corrupt_reads"] += 1
        now = time.monotonic()
        if now - self._corrupt_logged_at >= CORRUPT_LOG_INTERVAL_S:
            self._corrupt_logged_at = now
            log.error(
                "refused to serve a damaged entry (%d such reads so far): %s",
                self.stats["corrupt_reads"],
                why,
            )
        return errors.CorruptEntryError(
            f"the message at commitlog offset {commitlog_offset} is damaged on node"
            f" {self.settings.node_id} (entry {index}: its CRC does not hold); read it"
            " from another replica",
            node_id=self.settings.node_id,
            commitlog_offset=commitlog_offset,
        )

    def _read_message(self, commitlog_offset: int, size: int) -> StoredMessage:
        return decode_message(self._record(commitlog_offset, size), verify_crc=False)

    def _pulled(self, m: StoredMessage) -> PulledMessage:
        return PulledMessage(
            topic=m.topic,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            msg_id=make_msg_id(self.settings.group, m.commitlog_offset),
            commitlog_offset=m.commitlog_offset,
            body=m.body,
            tags=m.tags,
            keys=m.keys,
            uniq_key=m.uniq_key,
            properties=m.user_properties,
            born_timestamp=m.born_timestamp,
            store_timestamp=m.store_timestamp,
            size=m.size,
        )

    def _check_queue(self, topic: str, queue_id: int) -> TopicMeta:
        t = self.topic(topic)
        if not 0 <= queue_id < t.queues:
            raise errors.InvalidArgumentError(f"queue_id {queue_id} is not in 0..{t.queues - 1}")
        return t

    def _check_pull_args(self, max_messages: int, wait_ms: int, limit: int | None = None) -> None:
        lim = self.settings.limits
        most = lim.max_pull_messages if limit is None else limit
        if not 1 <= max_messages <= most:
            raise errors.InvalidArgumentError(f"max_messages must be 1..{most}")
        if not 0 <= wait_ms <= lim.max_wait_ms:
            raise errors.InvalidArgumentError(f"wait_ms must be 0..{lim.max_wait_ms}")

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
        max_bytes: int | None = None,
    ) -> PullResult:
        """Messages of one queue from ``offset`` (RocketMQ's PullStatus vocabulary):
        ``max_messages`` of them, fewer when their stored bytes would pass ``max_bytes``
        (default ``max_response_bytes``), but always one: a message bigger than the
        budget is answered alone, so a consumer never stalls on it."""
        status, found, next_offset, lo, hi = await self._pull_loop(
            self._scan,
            topic,
            queue_id,
            offset,
            max_messages=max_messages,
            max_bytes=self.settings.limits.max_response_bytes if max_bytes is None else max_bytes,
            wait_ms=wait_ms,
            tags=tags,
        )
        return PullResult(status, found or [], next_offset, lo, hi)

    async def pull_page(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> RawPullResult:
        """``pull``, with the messages as stored (``broker.pages``) for columnar encoders;
        a page's records hold at most ``max_arrow_page_bytes`` (or one record)."""
        status, page, next_offset, lo, hi = await self._pull_loop(
            self._scan_page,
            topic,
            queue_id,
            offset,
            max_messages=max_messages,
            max_bytes=self.settings.limits.max_arrow_page_bytes,
            wait_ms=wait_ms,
            tags=tags,
            limit=self.settings.limits.max_arrow_pull_messages,
        )
        return RawPullResult(status, page or RawPage(b""), next_offset, lo, hi)

    async def _pull_loop(
        self,
        scan: _Scan[_Found],
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        wait_ms: int,
        tags: str | None,
        limit: int | None = None,
    ) -> tuple[str, _Found | None, int, int, int]:
        """The pull protocol, whatever form the messages take: (status, what ``scan``
        found or None, next offset, min offset, max offset). ``limit`` bounds
        ``max_messages`` (default: the JSON pull's ``max_pull_messages``)."""
        # Yield once per pull: a caller pulling back to back in-process would otherwise
        # hold the event loop (and the Raft node on it) for as long as data is there.
        await asyncio.sleep(0)
        self._check_queue(topic, queue_id)
        self._check_pull_args(max_messages, wait_ms, limit)
        hashes = parse_tag_expression(tags)
        wanted = None
        if hashes is not None and tags:
            wanted = {t.strip() for t in tags.split("||") if t.strip()}
        deadline = time.monotonic() + wait_ms / 1000
        scanned = 0  # units a tag filter passed over: bounded per pull
        while True:
            lo, hi = self.queue_bounds(topic, queue_id)
            if offset < lo or offset > hi:
                return "OFFSET_ILLEGAL", None, lo if offset < lo else hi, lo, hi
            if offset < hi:
                found, count, next_offset = scan(
                    topic,
                    queue_id,
                    offset,
                    max_messages=max_messages,
                    max_bytes=max_bytes,
                    hashes=hashes,
                    wanted=wanted,
                )
                if count:
                    self.stats["pulled"] += count
                    return "FOUND", found, next_offset, lo, hi
                scanned += next_offset - offset
                offset = next_offset
                status = "NO_MATCHED_MSG"
                if scanned >= self.settings.limits.max_filter_scan_units:
                    # A filter that matches nothing in a long backlog: answer where the
                    # scan got to (the client goes on from there) instead of holding
                    # the loop through all of it.
                    return status, None, offset, lo, hi
                if offset < hi:
                    await asyncio.sleep(0)  # more backlog to scan: let the loop run first
                    continue
            else:
                status = "NO_NEW_MSG"
            left = deadline - time.monotonic()
            if left <= 0:
                lo, hi = self.queue_bounds(topic, queue_id)
                return status, None, offset, lo, hi
            await self.dispatcher.wait_queue(topic, queue_id, offset, left)

    def _scan(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> tuple[list[PulledMessage], int, int]:
        self._require_derived()
        q = self.cq.find(topic, queue_id)
        if q is None:
            return [], 0, offset
        scan_limit = max_messages if hashes is None else max(max_messages * 4, 1024)
        units = q.read(offset, scan_limit)
        out: list[PulledMessage] = []
        next_offset = offset
        budget = max_bytes
        for queue_offset, commitlog_offset, size, thash in units:
            if out and size > budget:
                break  # the budget is spent: this message starts the next pull
            next_offset = queue_offset + 1
            if hashes is not None and thash not in hashes:
                continue
            m = self._read_message(commitlog_offset, size)
            if wanted is not None and m.tags not in wanted:
                continue  # a tags-hash collision: the exact tags decide
            out.append(self._pulled(m))
            budget -= size
            if len(out) >= max_messages:
                break
        return out, len(out), next_offset

    def _scan_page(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> tuple[RawPage, int, int]:
        """``_scan`` for ``pull_page``: without a tag filter the units are taken as they
        are, one slice, with no object per message; with one, unit by unit as ``_scan``."""
        self._require_derived()
        q = self.cq.find(topic, queue_id)
        if q is None:
            return RawPage(b""), 0, offset
        if hashes is None:
            first, units = q.read_raw(offset, max_messages)
            units = units_within(units, max_bytes)
            count = len(units) // UNIT_SIZE
            next_offset = first + count if count else offset
        else:
            kept: list[bytes] = []
            next_offset = offset
            budget = max_bytes
            for queue_offset, commitlog_offset, size, thash in q.read(
                offset, max(max_messages * 4, 1024)
            ):
                if kept and size > budget:
                    break  # the budget is spent: this message starts the next pull
                next_offset = queue_offset + 1
                if thash not in hashes:
                    continue
                exact = wanted is None or self._read_message(commitlog_offset, size).tags in wanted
                if not exact:
                    continue  # a tags-hash collision: the exact tags decide
                kept.append(PAGE_UNIT.pack(commitlog_offset, size, thash))
                budget -= size
                if len(kept) >= max_messages:
                    break
            units, count = b"".join(kept), len(kept)
        if not count:
            return RawPage(b""), 0, next_offset
        page = RawPage(
            units, self.commitlog.view, self.settings.store.data_file_size, check=self._check_page
        )
        return page, count, next_offset

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is at or after ``timestamp_ms``."""
        self._check_queue(topic, queue_id)
        self._require_derived()
        q = self.cq.find(topic, queue_id)
        if q is None:
            return 0

        def reached(commitlog_offset: int, size: int) -> bool:
            raw = self._record(commitlog_offset, size)[STORE_TIMESTAMP_POS:][:8]
            return int.from_bytes(raw, "big", signed=True) >= timestamp_ms

        return q.first_offset_at_or_after(reached)

    def get_message(self, msg_id: str) -> PulledMessage:
        try:
            group, commitlog_offset = parse_msg_id(msg_id)
        except MessageFormatError as e:
            raise errors.InvalidArgumentError(f"invalid msg_id: {e}") from None
        if group != self.settings.group:
            raise errors.MessageNotFoundError(f"msg_id {msg_id} belongs to group {group}")
        m = self._message_at(commitlog_offset)
        if m is None:
            raise errors.MessageNotFoundError(f"no message {msg_id}")
        return self._pulled(m)

    def _message_at(self, commitlog_offset: int) -> StoredMessage | None:
        store = self.store
        if commitlog_offset < store.ledger_begin_pos + 48 or commitlog_offset + 4 > (
            store.committed_pos
        ):
            return None
        try:
            # No size: the offset is a client's (a message id), so no entry there is
            # "not found", and only an entry found there and damaged is CORRUPT_ENTRY.
            m = decode_message(self._record(commitlog_offset), verify_crc=False)
        except (DLedgerError, MessageFormatError):
            return None
        if m.commitlog_offset != commitlog_offset or m.topic == SYS_TOPIC:
            return None
        return m

    def query_by_key(self, topic: str, key: str, max_results: int = 64) -> list[PulledMessage]:
        t = self.topic(topic)
        limit = self.settings.limits.max_key_query_results
        if not 1 <= max_results <= limit:
            raise errors.InvalidArgumentError(f"max must be 1..{limit}")
        # The key index holds every message's keys, whatever became of its topic: a
        # message before the current incarnation's create entry belongs to a deleted one.
        store = self.store
        floor = -1
        if t.created_index >= store.ledger_begin_index:
            floor = store.get_meta(t.created_index).pos
        out: list[PulledMessage] = []
        budget = self.settings.limits.max_response_bytes
        self._require_derived()
        for commitlog_offset in self.keys.query(key, max_results * 2):
            if commitlog_offset <= floor:
                continue
            m = self._message_at(commitlog_offset)
            if m is None or m.topic != topic:
                continue
            if key in m.keys or m.uniq_key == key:  # the index may return hash collisions
                if out and m.size > budget:
                    break  # the response budget is spent: fewer than asked
                out.append(self._pulled(m))
                budget -= m.size
                if len(out) >= max_results:
                    break
        return out

    # ---- consumer groups ---------------------------------------------------------------

    def _check_group(self, group: str) -> None:
        if not GROUP_NAME.fullmatch(group):
            raise errors.InvalidArgumentError(f"invalid group name {group!r}")

    def list_groups(self) -> list[str]:
        return sorted(self.meta.offsets)

    def group_offsets(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        self._check_group(group)
        topics = self.meta.offsets.get(group)
        if topics is None:
            raise errors.GroupNotFoundError(f"group {group} has committed no offsets")
        out = []
        for name in sorted(topics):
            if topic is not None and name != topic:
                continue
            t = self.meta.topics.get(name)
            if t is None:
                continue
            for qid in range(t.queues):
                committed = topics[name].get(qid)
                _, hi = self.queue_bounds(name, qid)
                out.append(
                    {
                        "topic": name,
                        "queue_id": qid,
                        "committed_offset": committed,
                        "max_offset": hi,
                        "lag": hi - (committed or 0),
                    }
                )
        return out

    async def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        self._require_master()  # a write: redirect before looking at the topic (see above)
        self._check_group(group)
        t = self.topic(topic)
        clean: dict[int, int] = {}
        for qid, off in offsets.items():
            if not 0 <= qid < t.queues:
                raise errors.InvalidArgumentError(f"queue_id {qid} is not in 0..{t.queues - 1}")
            if off < 0:
                raise errors.InvalidArgumentError(f"offset {off} for queue {qid} is negative")
            clean[qid] = off
        if not clean:
            raise errors.InvalidArgumentError("no offsets")
        await self._append_meta(op_commit_offsets(group, topic, clean))

    async def reset_offsets(self, group: str, topic: str, to: str | int) -> dict[int, int]:
        """Move a group's offsets to ``earliest``, ``latest`` or a store timestamp."""
        self._require_master()  # a write: redirect before computing anything
        t = self.topic(topic)
        offsets = {}
        for qid in range(t.queues):
            lo, hi = self.queue_bounds(topic, qid)
            if to == "earliest":
                offsets[qid] = lo
            elif to == "latest":
                offsets[qid] = hi
            elif isinstance(to, int):
                offsets[qid] = self.offset_for_time(topic, qid, to)
            else:
                raise errors.InvalidArgumentError(
                    f"reset to {to!r}: want earliest, latest or a time"
                )
        await self.commit_offsets(group, topic, offsets)
        return offsets

    async def group_pull(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = False,
    ) -> GroupPullResult:
        """Messages from the group's committed offsets (a new group starts at the
        earliest retained message), across the chosen queues."""
        if auto_commit:
            self._require_master()  # the commit is a write: go to the master before pulling
        self._check_group(group)
        self._check_pull_args(max_messages, wait_ms)
        t = self.topic(topic)
        qids = list(range(t.queues)) if queue_ids is None else list(queue_ids)
        for qid in qids:
            self._check_queue(topic, qid)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            out: list[PulledMessage] = []
            next_offsets: dict[int, int] = {}
            # One response budget across the queues: once spent, the other queues wait
            # for the next pull (a queue's one message may pass what is left of it).
            budget = self.settings.limits.max_response_bytes
            for qid in qids:
                lo, _ = self.queue_bounds(topic, qid)
                start = self.meta.committed_offset(group, topic, qid)
                start = lo if start is None or start < lo else start
                r = await self.pull(
                    topic, qid, start, max_messages=max_messages - len(out), max_bytes=budget
                )
                next_offsets[qid] = r.next_offset
                out.extend(r.messages)
                budget -= sum(m.size for m in r.messages)
                if len(out) >= max_messages or budget <= 0:
                    break
            left = deadline - time.monotonic()
            if out or left <= 0:
                break
            await self._wait_any(topic, next_offsets, left)
        if auto_commit and out:
            await self.commit_offsets(group, topic, next_offsets)
        return GroupPullResult(out, next_offsets)

    async def _wait_any(self, topic: str, offsets: dict[int, int], timeout_s: float) -> None:
        waits = [
            asyncio.ensure_future(self.dispatcher.wait_queue(topic, q, o, timeout_s))
            for q, o in offsets.items()
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    # ---- cluster -----------------------------------------------------------------------

    async def transfer_leadership(self, to: str, timeout_s: float = 5.0) -> None:
        """Returns once ``to`` leads (at once when ``to`` is this master)."""
        peers = self.settings.peer_map
        if to not in peers:
            raise errors.UnknownNodeError(f"{to} is not a member: {sorted(peers)}")
        self._require_master()
        if to == self.settings.node_id:
            return
        code = await self.server.transfer_leadership(to, timeout_s)
        if code is not DLedgerCode.SUCCESS:
            raise errors.NoMasterError(f"leadership transfer to {to} failed: {code.name}")

    def status(self) -> BrokerStatus:
        core = self.server.core
        store = self.store
        leader = core.member_state.leader_id if core is not None else None
        st = self.server.status()
        d = self.dispatcher
        return BrokerStatus(
            group=self.settings.group,
            node_id=self.settings.node_id,
            raft_role=core.member_state.role.value.upper() if core is not None else "FOLLOWER",
            broker_role=self.role.value,
            term=core.member_state.curr_term if core is not None else -1,
            leader_id=leader,
            leader_url=self.settings.peer_urls.get(leader) if leader else None,
            ledger_begin_index=store.ledger_begin_index,
            ledger_end_index=store.ledger_end_index,
            committed_index=store.committed_index,
            dispatched_index=d.dispatched_index if d else -1,
            snapshot_index=d.snapshot_index if d else -1,
            snapshots_installed=self.server.stats.get("snapshot_installs", 0),
            peers={
                p: PeerStatus(v["state"], v["match_index"], v["in_flight"], v["snapshots_sent"])
                for p, v in st.get("peers", {}).items()
            },
            stats={**self.stats, **(d.stats if d else {}), **self.role_handler.last_promotion},
            dispatch_stall=_error_text(d.stall if d else None),
            failed=_error_text(self.server.failed),
            refused=dict(st.get("refused", {})),
        )

    @property
    def is_master(self) -> bool:
        return self.role is BrokerRole.MASTER

    @property
    def raft_role(self) -> Role:
        return self.server.role
