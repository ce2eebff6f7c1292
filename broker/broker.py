"""The ``Broker``: one node's broker, its lifecycle and its status.

``start`` opens the replicated log, builds every collaborator once and hands each what
it works with (as hashicorp/raft's ``NewRaft(conf, fsm, logs, stable, snaps, trans)``
is handed its parts), then joins the Raft group. Nothing calls back into the
``Broker``; the API reaches the collaborators themselves (``api/routes/common.py``):

- ``WriteGate`` (``broker/gate.py``): the broker role, the checks every write makes and
  what a client is told when one is refused;
- ``RoleChangeHandler`` (``broker/role.py``): Raft roles → the gate's broker role;
- ``MetadataLog`` and ``Topics`` (``broker/topics.py``): ``%SYS%META`` appends, topics;
- ``Producer`` (``broker/produce.py``): validation, encoding, producer sessions, the put;
- ``Reads`` (``broker/reads.py``): pulls, pages, damaged entries, the lookups by time,
  message id and key;
- ``ConsumerGroups`` (``broker/groups.py``): committed offsets and group pulls;
- ``Leadership`` (``broker/leadership.py``): leadership transfer;
- ``Membership`` (``broker/membership.py``): adding, promoting and removing members;
- ``Dispatch`` (``broker/dispatch/``): committed entries → consume queues, key
  index, metadata; snapshots, checkpoints, long-poll wake-ups.

Writes need the MASTER role; reads are served by every node from committed, dispatched
data.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, TypeVar

from consumequeue import ConsumeQueueStore, KeyIndex
from dledger.codes import DLedgerError
from dledger.core.messages import Role
from dledger.runtime.server import DLedgerServer
from dledger.store import FileStore

from .commitlog import DLedgerCommitLog
from .copies import first_pinned
from .dispatch import Dispatch
from .gate import BrokerRole, WriteGate
from .groups import ConsumerGroups, GroupPullResult
from .history import RoleHistory
from .leadership import Leadership
from .membership import Membership
from .metadata import MetadataState, SnapshotFiles
from .pop.applier import PopApplier
from .pop.service import PopGroups
from .produce import NewMessage, Producer, ProduceResult, now_ms
from .promotion import queue_table_from
from .reads import MessageMaker, PulledMessage, PullResult, Reads
from .role import RoleChangeHandler
from .settings import BrokerSettings
from .status import BrokerStatus, PeerStatus
from .timers.applier import TimerApplier
from .timers.service import Timers
from .topics import MetadataLog, Topics
from .transactions.applier import TransactionApplier
from .transactions.service import Transactions

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

# In the data directory: when the node last failed (Unix seconds) and why, one line.
FAILURE_FILE = "last-failure"


def read_last_failure(data_dir: Path) -> float | None:
    """When ``data_dir``'s node last failed (``FAILURE_FILE``), or None: never, or unreadable."""
    try:
        return float((data_dir / FAILURE_FILE).read_text(encoding="utf-8").split(maxsplit=1)[0])
    except (OSError, ValueError, IndexError):
        return None


_M = TypeVar("_M")


def _divergence_text(d: dict[str, Any] | None) -> str | None:
    if d is None:
        return None
    return (
        f"{d['why']} (entry {d['index']}; committed here up to {d['committed_index']};"
        f" leader {d['leader_id']} of term {d['leader_term']}; seen {d['count']} times)"
    )


def _error_text(e: BaseException | None) -> str | None:
    if e is None:
        return None
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
    return str(e) or type(e).__name__


class Broker:
    # Built by ``start`` (they need the open log); reading one before is an error.
    dispatcher: Dispatch
    role_handler: RoleChangeHandler
    metalog: MetadataLog
    topics: Topics
    producer: Producer
    reads: Reads
    groups: ConsumerGroups
    leadership: Leadership
    membership: Membership
    pop: PopGroups

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.server = DLedgerServer(settings.server_config())
        self.commitlog = DLedgerCommitLog(self.server)
        root = settings.data_dir
        self.cq = ConsumeQueueStore(root / "consumequeue" / settings.group, settings.consume_queue)
        self.keys = KeyIndex(root / "index" / settings.group, settings.key_index)
        self.meta = MetadataState(
            settings.max_producer_sessions,
            settings.send_window_ids,
            settings.send_window_ms,
            settings.max_session_results,
        )
        self.snapshots = SnapshotFiles(root / "metadata" / settings.group, settings.snapshots_kept)
        self.gate = WriteGate(settings, self.server, self.commitlog)
        self.server.set_snapshot_installer(self._install_snapshot)
        self._recovered = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.stats = {"produced": 0, "pulled": 0, "deduplicated": 0, "corrupt_reads": 0}
        # When this data directory's node last failed (Unix s): this process's failure,
        # else what the one before wrote (``ledgermq_last_failure_timestamp_seconds``).
        self.last_failure_at = read_last_failure(root)
        self.server.add_failure_handler(self._record_failure)
        # The last role changes this node saw (GET /v1/cluster/history), in memory.
        self.history = RoleHistory(settings.role_history_size, now_ms)

    # ---- lifecycle ---------------------------------------------------------------------

    @property
    def store(self) -> FileStore:
        assert self.server.store is not None, "broker not started"
        return self.server.store

    def _dispatcher_over(self, store: FileStore) -> Dispatch:
        """The dispatcher of the open log: committed entries → what the reads serve."""
        s = self.settings
        return Dispatch(
            store,
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

    def _assemble(self, store: FileStore) -> None:
        """Build the collaborators over the open log, each handed what it works with."""
        s, server, commitlog, meta = self.settings, self.server, self.commitlog, self.meta
        self.dispatcher = dispatch = self._dispatcher_over(store)
        gate = self.gate
        gate.watch(dispatch)

        def rebuild_queue_table() -> int:
            table = queue_table_from(meta, self.cq)
            commitlog.reset_queue_table(table)
            return len(table)

        history = self.history
        server.add_role_change_handler(history.role_changed)  # first: its time is the change's
        self.role_handler = RoleChangeHandler(
            gate,
            server,
            dispatch,
            rebuild_queue_table,
            s.master_catch_up_timeout_ms,
            on_master=lambda term: history.became_master(term, s.node_id),
        )
        server.add_role_change_handler(self.role_handler)
        self.metalog = MetadataLog(s, gate, commitlog, dispatch, now_ms)
        self.topics = topics = Topics(s, gate, meta, self.metalog)
        self.producer = Producer(
            settings=s,
            gate=gate,
            topics=topics,
            commitlog=commitlog,
            server=server,
            dispatch=dispatch,
            meta=meta,
            stats=self.stats,
        )
        self.reads = Reads(
            settings=s,
            commitlog=commitlog,
            store=store,
            cq=self.cq,
            keys=self.keys,
            topics=topics,
            dispatch=dispatch,
            stats=self.stats,
        )
        self.groups = ConsumerGroups(
            settings=s,
            gate=gate,
            topics=topics,
            metalog=self.metalog,
            meta=meta,
            reads=self.reads,
            dispatch=dispatch,
        )
        self.leadership = Leadership(s, gate, server, history)
        self.membership = Membership(s, gate, server, self.leadership)
        self.pop = PopGroups(
            settings=s,
            gate=gate,
            topics=topics,
            metalog=self.metalog,
            meta=meta,
            reads=self.reads,
            producer=self.producer,
            dispatch=dispatch,
            applier=next(a for a in dispatch.state if isinstance(a, PopApplier)),
            clock=now_ms,
        )
        self.timers = Timers(
            settings=s,
            gate=gate,
            topics=topics,
            metalog=self.metalog,
            meta=meta,
            reads=self.reads,
            cq=self.cq,
            producer=self.producer,
            dispatch=dispatch,
            applier=next(a for a in dispatch.state if isinstance(a, TimerApplier)),
            clock=now_ms,
        )
        self.transactions = Transactions(
            settings=s,
            gate=gate,
            topics=topics,
            metalog=self.metalog,
            meta=meta,
            reads=self.reads,
            producer=self.producer,
            dispatch=dispatch,
            applier=next(a for a in dispatch.state if isinstance(a, TransactionApplier)),
            clock=now_ms,
        )
        # Retention and snapshots keep the records of what is held: delay messages
        # pending, transactions live.
        dispatch.pinned = first_pinned(
            self.timers.pinned_entry_pos, self.transactions.pinned_entry_pos
        )

    async def start(self) -> None:
        self._assemble(await self.server.open())
        self._started = True
        await self.server.start()
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
        for loop, name in ((self.timers.run, "timers"), (self.transactions.run, "transactions")):
            task = asyncio.create_task(loop(), name=f"broker-{name}")  # (likewise)
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

    def _record_failure(self, e: BaseException) -> None:
        """Write when and why the node failed to ``FAILURE_FILE`` in its data directory,
        for the process a supervisor starts next: this one exits now, and its
        ``ledgermq_node_failed`` with it. Best effort (a failing disk may refuse it too);
        not synced: it has to outlive the process, not the machine."""
        self.last_failure_at = now = time.time()
        path = self.settings.data_dir / FAILURE_FILE
        try:
            part = path.with_name(FAILURE_FILE + ".part")
            part.write_text(f"{now:.3f} {e!r}\n", encoding="utf-8")
            os.replace(part, path)
        except OSError as err:
            log.warning("cannot record the node's failure in %s: %s", path, err)

    async def stop(self) -> None:
        if self._started:
            await self.role_handler.close()
        for t in self._tasks:
            t.cancel()
        # A task that died already was reported (it failed the node); stop goes on.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._started:
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

    # ---- status ------------------------------------------------------------------------

    def member_urls(self) -> list[str]:
        """The HTTP URLs the configuration in force gives its members (a member added
        while running brings its own; none before the server starts)."""
        core = self.server.core
        if core is None:
            return []
        return [m.url for m in core.member_state.config.members.values() if m.url]

    def status(self) -> BrokerStatus:
        core = self.server.core
        store = self.store
        leader = self.gate.leader_id
        st = self.server.status()
        d = self.dispatcher
        return BrokerStatus(
            group=self.settings.group,
            node_id=self.settings.node_id,
            raft_role=core.member_state.role.value.upper() if core is not None else "FOLLOWER",
            broker_role=self.gate.role.value,
            term=core.member_state.curr_term if core is not None else -1,
            leader_id=leader,
            leader_url=self.membership.url_of(leader) if leader else None,
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
            diverged=_divergence_text(st.get("diverged")),
            refused=dict(st.get("refused", {})),
        )

    def disk_full(self) -> bool:
        """Whether this node refuses to write for lack of disk, in any role: above
        ``disk_full_ratio`` its log refuses appends (a follower the leader's pushes, so it
        falls behind), and under the reserve a master refuses writes (507 DISK_FULL)."""
        try:
            return self.store.disk_full() or self.gate.disk_short()
        except OSError as e:  # the data directory went away: the store fails on its own
            log.warning("cannot read the disk usage of %s: %s", self.settings.data_dir, e)
            return False

    def disk(self) -> dict[str, Any] | None:
        """The data directory's file system and this node's log on it (GET /v1/cluster),
        or None when it cannot be read."""
        s, store = self.settings, self.store
        try:
            u = shutil.disk_usage(s.data_dir)
        except OSError:
            return None
        return {
            "total_bytes": u.total,
            "free_bytes": u.free,
            "used_ratio": round((u.total - u.free) / u.total, 4) if u.total else 0.0,
            "full_ratio": s.store.disk_full_ratio,
            "reserve_bytes": s.disk_reserve,
            "log_bytes": max(0, store.ledger_end_pos - store.ledger_begin_pos),
            "full": self.disk_full(),
        }

    @property
    def is_master(self) -> bool:
        return self.gate.role is BrokerRole.MASTER

    @property
    def raft_role(self) -> Role:
        return self.server.role
