"""The ``Broker`` facade: one node's whole broker, what the API layer calls.

It owns the ``DLedgerServer`` (Raft), the ``DLedgerCommitLog`` (append hook, queue
offsets), the consume queues and the key index, the replicated metadata, the
``ReputService`` and the ``RoleChangeHandler``. Writes (produce, topic admin, offset
commits, leadership transfer) need the MASTER role; reads are served by every node from
committed, dispatched data.

Here: the lifecycle, roles and the checks every write makes, topics, metadata appends and
the node's status. The rest is delegated, each collaborator reaching the broker through
a narrow host (``broker/host.py``):

- ``Producer`` (``broker/produce.py``): validation, encoding, producer sessions, the put;
- ``Reads`` (``broker/reads.py``): pulls, pages, damaged entries, the lookups by time,
  message id and key;
- ``ConsumerGroups`` (``broker/groups.py``): committed offsets and group pulls.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import orjson

from consumequeue import ConsumeQueueStore, KeyIndex
from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import Role
from dledger.runtime.server import AppendOutcomeUnknownError, DLedgerServer, NotLeaderError
from dledger.store import FileStore

from . import errors
from .commitlog import DLedgerCommitLog
from .groups import ConsumerGroups, GroupPullResult
from .message import encode_message
from .metadata import (
    SYS_PREFIX,
    SYS_TOPIC,
    TOPIC_NAME,
    MetadataState,
    SnapshotFiles,
    TopicMeta,
    op_create_topic,
    op_delete_topic,
)
from .pages import RawPullResult
from .produce import NewMessage, Producer, ProduceResult, now_ms
from .promotion import own_term_committed, queue_table_from
from .reads import MessageMaker, PulledMessage, PullResult, Reads
from .reput import ReputService
from .role import BrokerRole, RoleChangeHandler
from .settings import BrokerSettings
from .status import BrokerStatus, PeerStatus

__all__ = [
    "Broker",
    "GroupPullResult",
    "MessageMaker",
    "NewMessage",
    "ProduceResult",
    "PullResult",
    "PulledMessage",
]

log = logging.getLogger(__name__)

_M = TypeVar("_M")

# The Retry-After hints of 503 NO_MASTER (the client waits at least this, or its backoff):
PROMOTING_RETRY_AFTER_MS = 20  # this node leads and is becoming MASTER
NO_LEADER_RETRY_AFTER_MS = 50  # no leader known: an election is under way
TRANSFER_RETRY_AFTER_MS = 50  # leadership is being handed over: it ends in a beat or two


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
        self.store_host = ("127.0.0.1", 0)  # STOREHOST of the records this node writes
        self._disk_checked_at = -1e18
        self._disk_free_bytes = 1 << 62
        self.stats = {"produced": 0, "pulled": 0, "deduplicated": 0, "corrupt_reads": 0}
        self.producer = Producer(
            self, settings=settings, commitlog=self.commitlog, meta=self.meta, stats=self.stats
        )
        self.reads = Reads(
            self,
            settings=settings,
            commitlog=self.commitlog,
            cq=self.cq,
            keys=self.keys,
            stats=self.stats,
        )
        self.groups = ConsumerGroups(self, settings=settings, meta=self.meta, reads=self.reads)

    # ---- lifecycle ---------------------------------------------------------------------

    @property
    def store(self) -> FileStore:
        assert self.server.store is not None, "broker not started"
        return self.server.store

    async def start(self) -> None:
        s = self.settings
        host, _, port = s.peer_map[s.node_id].rpartition(":")
        self.store_host = (host, int(port))
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

    async def require_master_soon(self) -> None:
        """``require_master``, after waiting (``transfer_hold_ms`` at most) for a
        leadership transfer under way here to end: a write then goes to the new
        master (a redirect) or is taken here if the transfer failed."""
        if self.role is BrokerRole.MASTER and self.server.transferee is not None:
            await self.server.wait_no_transfer(self.settings.transfer_hold_ms / 1000)
        self.require_master()

    def require_master(self) -> None:
        """Refuse a write unless this node is MASTER and can make it readable:
        ``NotMasterError`` (the master's address) on a SLAVE, ``NoMasterError`` (a short
        Retry-After) while there is none or while leadership is being handed over,
        ``DiskFullError`` or ``NodeFailedError``."""
        self._require_master_role()
        transferee = self.server.transferee
        if transferee is not None:
            # Raft refuses appends while it hands leadership over; the transfer ends
            # (either way) within a heartbeat or two, and the client's retry finds
            # the new master, or this one serving again.
            raise errors.NoMasterError(
                f"leadership is being handed to {transferee}; retry shortly",
                retry_after_ms=TRANSFER_RETRY_AFTER_MS,
            )
        self._require_writable()

    def _require_master_role(self) -> None:
        """``NotMasterError`` or ``NoMasterError`` unless the broker role is MASTER."""
        if self.role is not BrokerRole.MASTER:
            raise self._not_master()

    def _not_master(self) -> errors.BrokerError:
        """Where a write goes when this node does not take it, from Raft's view now."""
        core = self.server.core
        leader = core.member_state.leader_id if core is not None else None
        if leader is None or leader == self.settings.node_id:
            # No leader, or we lead but are still catching up: nobody takes writes yet.
            # The promotion takes milliseconds, an election after a crash tens (issue 18):
            # the client's own backoff, which grows, covers longer waits.
            retry_ms = PROMOTING_RETRY_AFTER_MS if leader is not None else NO_LEADER_RETRY_AFTER_MS
            return errors.NoMasterError(
                "no master at the moment; retry shortly", retry_after_ms=retry_ms
            )
        return errors.NotMasterError(
            f"this broker is a SLAVE; the master is {leader}",
            leader_id=leader,
            leader_addr=self.settings.peer_map.get(leader),
            leader_url=self.settings.peer_urls.get(leader),
        )

    @property
    def installing(self) -> bool:
        """A leader's snapshot is replacing the consume queues and the key index."""
        return self.dispatcher is not None and self.dispatcher.installing

    async def wait_queue(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> bool:
        return await self.dispatcher.wait_queue(topic, queue_id, queue_offset, timeout_s)

    def correct_min_offsets(self) -> None:
        self.dispatcher.correct_min_offsets()

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

    def append_error(self, e: DLedgerError) -> errors.BrokerError:
        """What the client is told when the log refused an append. The broker role is
        not touched here: it follows Raft's role changes alone (``RoleChangeHandler``).
        A refusal during a leadership transfer is not a lost leadership, and a transfer
        that fails changes no role, so setting SLAVE here would last for good (issue 26);
        a real loss of leadership reaches the handler as a role change anyway."""
        if isinstance(e, AppendOutcomeUnknownError):
            return errors.UnknownOutcomeError(
                f"commit unknown ({e.code.name}); retry may duplicate"
            )
        if e.code is DLedgerCode.LEADER_TRANSFERRING:
            return errors.NoMasterError(
                f"leadership is being handed over ({e.message}); retry shortly",
                retry_after_ms=TRANSFER_RETRY_AFTER_MS,
            )
        if isinstance(e, NotLeaderError):
            return self._not_master()
        if e.code is DLedgerCode.LEADER_PENDING_FULL:
            return errors.BusyError("too many appends waiting for a quorum", retry_after_ms=100)
        if e.code is DLedgerCode.DISK_FULL:
            return errors.DiskFullError(e.message, retry_after_ms=1000)
        if e.code in (DLedgerCode.DISK_ERROR, DLedgerCode.UNEXPECTED_ARGUMENT):
            return errors.StorageError(e.message)
        return errors.NoMasterError(f"append refused: {e.code.name}", retry_after_ms=200)

    async def append_meta(self, op: dict[str, Any]) -> int:
        """Append a ``%SYS%META`` operation; returns its index once it is dispatched
        (applied to the metadata here), or after ``append_timeout_ms`` at most."""
        await self.require_master_soon()
        record = encode_message(
            topic=SYS_TOPIC,
            body=orjson.dumps(op),
            born_timestamp=now_ms(),
            store_timestamp=now_ms(),
            store_host=self.store_host,
        )
        try:
            index, _pos = await self.commitlog.append_system(record)
        except DLedgerError as e:
            raise self.append_error(e) from None
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
        await self.require_master_soon()  # a write, even when it exists: the master says
        existing = self.meta.topics.get(name)
        if existing is None:
            self._check_room_for(n)
            await self.append_meta(op_create_topic(name, n))
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

    async def delete_topic(self, name: str) -> None:
        # A write: redirect first. A slave may not know a topic the master just made.
        await self.require_master_soon()
        self.topic(name)
        await self.append_meta(op_delete_topic(name))

    # ---- produce (broker/produce.py) -------------------------------------------------

    async def produce(
        self,
        topic_name: str,
        messages: Sequence[NewMessage],
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[ProduceResult]:
        """Append after validation; results after quorum commit (and dispatch)."""
        self._check_topic_name(topic_name)
        self.producer.check_request(messages, producer_id, sequence)
        await self.require_master_soon()
        topic = self.meta.topics.get(topic_name)
        if topic is None:
            if not self.settings.auto_create_topics:
                raise errors.TopicNotFoundError(
                    f"topic {topic_name} does not exist", topic=topic_name
                )
            topic, _ = await self.create_topic(topic_name, None)
        return await self.producer.produce(topic, messages, producer_id, sequence)

    # ---- reads (broker/reads.py) -------------------------------------------------------

    async def pull(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
        max_bytes: int | None = None,
    ) -> PullResult[PulledMessage]:
        """``Reads.pull``: messages of one queue from ``queue_offset``."""
        return await self.reads.pull(
            self.reads.pulled_message,
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            wait_ms=wait_ms,
            tags=tags,
            max_bytes=max_bytes,
        )

    async def pull_as(
        self,
        make: MessageMaker[_M],
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> PullResult[_M]:
        """``Reads.pull``: ``pull``, each message made by ``make`` (``MessageMaker``)."""
        return await self.reads.pull(
            make,
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            wait_ms=wait_ms,
            tags=tags,
        )

    async def pull_page(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> RawPullResult:
        """``Reads.pull_page``: ``pull`` with the messages as stored."""
        return await self.reads.pull_page(
            topic, queue_id, queue_offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
        )

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self.reads.queue_bounds(topic, queue_id)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self.reads.offset_for_time(topic, queue_id, timestamp_ms)

    def get_message(self, msg_id: str) -> PulledMessage:
        return self.reads.get_message(self.reads.pulled_message, msg_id)

    def query_by_key(self, topic: str, key: str, max_results: int = 64) -> list[PulledMessage]:
        return self.reads.query_by_key(self.reads.pulled_message, topic, key, max_results)

    # ---- consumer groups (broker/groups.py) --------------------------------------------

    def list_groups(self) -> list[str]:
        return self.groups.list_groups()

    def group_offsets(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        return self.groups.group_offsets(group, topic)

    async def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        await self.groups.commit_offsets(group, topic, offsets)

    async def reset_offsets(self, group: str, topic: str, to: str | int) -> dict[int, int]:
        """Move a group's offsets to ``earliest``, ``latest`` or a store timestamp."""
        return await self.groups.reset_offsets(group, topic, to)

    async def group_pull(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = False,
    ) -> GroupPullResult[PulledMessage]:
        """``ConsumerGroups.group_pull``: from the group's committed offsets."""
        return await self.groups.group_pull(
            self.reads.pulled_message,
            group,
            topic,
            max_messages=max_messages,
            wait_ms=wait_ms,
            queue_ids=queue_ids,
            auto_commit=auto_commit,
        )

    # ---- cluster -----------------------------------------------------------------------

    async def transfer_leadership(self, to: str, timeout_s: float = 5.0) -> None:
        """Returns once ``to`` leads (at once when ``to`` is this master). Otherwise
        ``TransferFailedError`` says why, and this node is still the master: a failed
        transfer changes no role (issue 26). A full disk does not stop a transfer (moving
        leadership off a full node is what an operator may want)."""
        peers = self.settings.peer_map
        if to not in peers:
            raise errors.UnknownNodeError(f"{to} is not a member: {sorted(peers)}")
        self._require_master_role()
        if to == self.settings.node_id:
            return
        code: DLedgerCode
        try:
            done = await self.server.transfer_leadership(to, timeout_s)
        except DLedgerError as e:
            if e.code is DLedgerCode.NOT_LEADER:  # deposed since the check above
                raise self._not_master() from None
            if e.code is DLedgerCode.ILLEGAL_MEMBER_STATE:
                raise errors.NodeFailedError(e.message) from None
            code, reason = e.code, e.message
        else:
            if done.code is DLedgerCode.SUCCESS:
                return
            code, reason = done.code, done.reason
        core = self.server.core
        leader = core.member_state.leader_id if core is not None else None
        if leader == to:
            return  # it leads all the same (its answer was lost, say)
        now = f"{leader} leads" if leader is not None else "no leader at the moment"
        raise errors.TransferFailedError(
            f"leadership transfer to {to} failed ({code.name}: {reason or 'no reason given'})"
            f"; {now}",
            to=to,
            reason=code.name,
            leader_id=leader,
        )

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
