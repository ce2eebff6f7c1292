"""``Dispatch``: the one object the broker holds of dispatch, where its pieces are put
together (docs/architecture.md, "Adding an applier").

It builds the appliers and registers them in their order, the walk
(``ReputMessageService``), the arrivals, the checkpoint and the snapshots; it runs the
loop and installs a leader's snapshot. One asyncio task per node, on the master and on
slaves alike, runs ``run``: committed entries as they come, then the beat
(``housekeep``): checkpoints and snapshots on their intervals, the snapshot Raft
refused offered again, the queues following the log head.

A checkpoint due at the beat runs as a task of its own: dispatch goes on while its
fsyncs of every consume queue written since the last one run in a thread (issue 31:
with 1,000 topics that is hundreds of fsyncs a second, and dispatch, which every
produce waits for, stood still meanwhile). What it records is taken at once, between
two dispatch steps; later units are beyond it, and the files may be flushed while
written (``ConsumeQueueStore``, ``KeyIndex``).

A disk error while dispatching (a full disk failing a consume-queue or key-index roll)
stalls dispatch instead of ending it: the entry is not counted as dispatched, every
applier's step is idempotent (``broker/dispatch/entry.py``), and it is retried with
backoff until space returns (``stall`` says why meanwhile; the broker refuses writes
while it is set). A broken invariant (``ConsumeQueueError``) still ends the task, and
with it the node: it is not a thing to retry.

Invariants:
- the derived files have one writer at a time: a checkpoint, a snapshot and an install
  hold ``_persist_lock``; while an install replaces the files in a thread
  (``installing``) neither dispatch nor a read touches them;
- retention never deletes log the derived state still needs: nothing past the dispatch
  checkpoint, the newest metadata snapshot, or the snapshot Raft serves (or a follower
  behind would wait for the next one).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consumequeue import ConsumeQueueStore, KeyIndex
from dledger.store import FileStore

from ..metadata import MetadataState, SnapshotFiles
from ..positions import pos_of
from .appliers import KeyIndexApplier, state_appliers
from .arrivals import Arrivals
from .entry import Applier
from .queues import ConsumeQueueApplier, queue_table
from .recovery import StoreCheckpoint
from .snapshots import SnapshotManager, parse_queue_table
from .walk import ReputMessageService

log = logging.getLogger(__name__)

STALL_RETRY_MAX_S = 1.0  # backoff cap while a disk error stalls dispatch
STALL_LOG_INTERVAL_S = 10.0  # a stall, or failing checkpoints, are logged this often


class Dispatch:
    """Dispatch of one node: the pieces (the module docstring) and their lifecycle."""

    def __init__(
        self,
        store: FileStore,
        cq: ConsumeQueueStore,
        keys: KeyIndex,
        meta: MetadataState,
        snapshots: SnapshotFiles,
        *,
        checkpoint_path: Path,
        batch_entries: int = 2048,
        checkpoint_interval_ms: int = 1000,
        snapshot_interval_entries: int = 100_000,
        snapshot_interval_ms: int = 60_000,
        on_topic_deleted: Callable[[str], None] | None = None,
        serve_snapshot: Callable[[int, bytes], bool] | None = None,
    ) -> None:
        self.store = store
        self.cq = cq
        self.keys = keys
        self.meta = meta
        self.batch_entries = batch_entries
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.snapshot_interval_entries = snapshot_interval_entries
        self.snapshot_interval_ms = snapshot_interval_ms
        self.on_topic_deleted = on_topic_deleted
        self.stats = {
            "entries": 0,
            "messages": 0,
            "skipped": 0,
            "rebuilds": 0,
            "stalls": 0,
            "persist_failures": 0,
        }
        self.arrivals = Arrivals(cq)
        self.queues = ConsumeQueueApplier(cq, meta, self.arrivals, self.stats, on_topic_deleted)
        # The appliers, in the order each entry reaches them: the replicated state's
        # (registered in ``state_appliers``), then the derived files'.
        self.state = state_appliers(meta, self.queues.topic_deleted)
        derived: list[Applier] = [KeyIndexApplier(keys), self.queues]
        self.walk = ReputMessageService(store, meta, self.state, derived, self.stats)
        self.checkpoints = StoreCheckpoint(store, cq, keys, meta, checkpoint_path)
        self.snapshot_manager = SnapshotManager(
            store,
            snapshots,
            meta,
            self.state,
            queue_table=functools.partial(queue_table, cq),
            serve=serve_snapshot,
        )
        # A log position (or None) that retention keeps and that every snapshot handed to
        # Raft precedes: the first pending delay message's entry (broker/timers).
        self.pinned: Callable[[], int | None] | None = None
        self.snapshot_manager.pinned = self._pinned
        # Why dispatch cannot move now (a disk error it retries), None while it can.
        self.stall: OSError | None = None
        # A leader's snapshot is being installed: the consume queues and the key index
        # change in a thread, and nobody on the loop may touch them (``install``).
        self.installing = False
        self._stall_logged_at = self._persist_logged_at = -1e18
        self._persist_lock = asyncio.Lock()
        # The checkpoint the beat started, running beside dispatch (module docstring).
        self._checkpointing: asyncio.Task[None] | None = None
        self._last_checkpoint = self._last_snapshot = time.monotonic()
        self._begin_pos_seen = -1

    # ---- what the broker reads and waits for ------------------------------------------

    @property
    def dispatched_index(self) -> int:
        """Every committed entry up to here is dispatched."""
        return self.walk.dispatched_index

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        return await self.walk.wait_dispatched(index, timeout_s)

    async def wait_queue(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> bool:
        return await self.arrivals.wait_queue(topic, queue_id, queue_offset, timeout_s)

    @property
    def snapshot_index(self) -> int:
        """The newest metadata snapshot on disk."""
        return self.snapshot_manager.snapshot_index

    # ---- a restart, an install ----------------------------------------------------------

    def recover(self) -> None:
        """Bring the consume queues, the key index and the metadata back to one entry and
        resume dispatch after it (``broker/dispatch/recovery.py``). Runs before the node
        starts (no loop needed)."""
        snapshot = self.snapshot_manager.load_newest()
        if self.checkpoints.recover(snapshot, self.walk, self.queues):
            self.stats["rebuilds"] += 1
        self._update_retention_floor()
        self.correct_min_offsets()
        log.info(
            "dispatch resumes after entry %d (snapshot %d, committed %d, rebuilds %d)",
            self.checkpoints.index,
            self.snapshot_index,
            self.store.committed_index,
            self.stats["rebuilds"],
        )

    async def install(self, last_index: int, data: bytes) -> None:
        """Make a leader's snapshot (see ``SnapshotManager.take``) this node's state after
        entry ``last_index``, durably: DLedger then restarts the log right after it
        (``DLedgerServer.set_snapshot_installer``). Raises ``ValueError`` on data that is
        not such a snapshot, before anything changed.

        The consume queues restart empty at the snapshot's next offsets and the key
        index restarts empty: queries by key find the messages from here on. A crash
        part way leaves no checkpoint (or one past the old log) and the snapshot past
        the old log's end: ``recover`` deletes the snapshot and rebuilds from the old
        log, and the leader, which still finds this node behind its head, sends the
        snapshot again."""
        snapshot = self.snapshot_manager.parse(data)
        table = parse_queue_table(snapshot.extra.get("queues"))
        if snapshot.applied_index != last_index:
            raise ValueError(f"snapshot of entry {snapshot.applied_index} sent as {last_index}")
        await self.snapshot_manager.keep(last_index, data)
        async with self._persist_lock:  # no checkpoint or snapshot meanwhile
            # The files change in a thread (deletes, resets and their fsyncs would stall
            # the loop for as long as there are queues); meanwhile ``installing`` keeps
            # dispatch and every read of the queues and the key index away, so none sees
            # a half-installed state. Raft handles no Ready until this returns.
            self.installing = True
            try:
                await asyncio.to_thread(self._install_files, table, last_index)
            finally:
                self.installing = False
            before = {name: t.created_index for name, t in self.meta.topics.items()}
            snapshot.adopt(self.meta)
            self.walk.reset(last_index)
            self.queues.held_index, self.queues.rebuild_until = last_index, -1
            self.snapshot_manager.installed(last_index)  # the core keeps it too
            self.checkpoints.index = last_index
            self._begin_pos_seen = -1  # the log's begin moves next: correct min offsets
        for name, created_index in before.items():
            t = self.meta.topics.get(name)
            if (t is None or t.created_index != created_index) and self.on_topic_deleted:
                self.on_topic_deleted(name)
        self.arrivals.all_changed()  # their readers wait on from the new next offsets
        log.info("installed the snapshot of entry %d (%d queues)", last_index, len(table))

    def _install_files(self, table: dict[tuple[str, int], int], last_index: int) -> None:
        """``install``'s file work, in a thread while ``installing`` holds everyone off.
        The old checkpoint goes first, durably: it describes queues about to change."""
        self.checkpoints.delete()
        self.queues.install(table)
        self.keys.clear()
        self.checkpoints.replace(last_index)

    # ---- the loop ----------------------------------------------------------------------

    async def run(self, wait_committed: Callable[[int, float], Any]) -> None:
        """Dispatch forever: committed entries as they come, then the beat.
        ``wait_committed(index, timeout_s)`` is the server's. A disk error stalls and
        retries (module docstring); anything else ends the task."""
        delay_s = 0.0
        while True:
            try:
                n = self.dispatch_some(self.batch_entries)
            except OSError as e:
                self._stalled(e)
                delay_s = min(max(2 * delay_s, 0.05), STALL_RETRY_MAX_S)
                await asyncio.sleep(delay_s)
                continue
            if self.stall is not None:
                log.warning(
                    "dispatch resumed at entry %d after a stall (%s)",
                    self.dispatched_index,
                    self.stall.strerror or self.stall,
                )
                self.stall, delay_s = None, 0.0
            try:
                await self.housekeep()
            except OSError as e:  # the old checkpoint and snapshot stay valid: retry later
                self._persist_failed("checkpoint or snapshot", e)
            if n >= self.batch_entries:
                await asyncio.sleep(0)  # a long catch-up must not starve the loop
                continue
            await wait_committed(self.dispatched_index + 1, 0.2)

    def _stalled(self, e: OSError) -> None:
        if self.stall is None:
            self.stats["stalls"] += 1
        self.stall = e
        now = time.monotonic()
        if now - self._stall_logged_at >= STALL_LOG_INTERVAL_S:
            self._stall_logged_at = now
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            log.warning(
                "dispatch stalled before entry %d: %s%s; retrying (writes are refused until"
                " it moves again)",
                self.dispatched_index + 1,
                e,
                " (the disk is full: free space to go on)" if full else "",
            )

    def dispatch_some(self, max_entries: int) -> int:
        """``ReputMessageService.dispatch_some``, unless an install holds the files."""
        if self.installing:
            return 0  # the files are being replaced in a thread (``install``)
        return self.walk.dispatch_some(max_entries)

    async def housekeep(self, force: bool = False) -> None:
        """The beat after every dispatch step: a checkpoint and a snapshot when due
        (``force``: now), the snapshot Raft refused offered again, the queues and the key
        index following the log head. It waits for nothing unless a checkpoint or a
        snapshot is due (the broker simulation runs it without a loop)."""
        now = time.monotonic()
        running = self._checkpoint_running()
        if force:
            self._last_checkpoint = now
            task = self._checkpointing
            if running and task is not None:
                await asyncio.shield(task)
                self._checkpoint_running()
            await self.checkpoint()
        elif not running and (now - self._last_checkpoint) * 1000 >= self.checkpoint_interval_ms:
            self._last_checkpoint = now
            self._checkpointing = asyncio.create_task(
                self._background_checkpoint(), name="dispatch-checkpoint"
            )
            running = True
        due_entries = self.meta.applied_index - self.snapshot_index
        due_time = (now - self._last_snapshot) * 1000 >= self.snapshot_interval_ms
        due = force or due_time or due_entries >= self.snapshot_interval_entries
        # A snapshot waits for a running checkpoint's lock: not while dispatch would too.
        if due_entries > 0 and due and (force or not running):
            self._last_snapshot = now
            await self.snapshot()
        if self.snapshot_manager.unserved:  # after a restart, until Raft's commit reaches it
            self.offer_snapshot()
            self._update_retention_floor()
        self.correct_min_offsets()

    async def close(self) -> None:
        """Checkpoint and snapshot on the way out, so a restart replays nothing."""
        with contextlib.suppress(Exception):
            await self.housekeep(force=True)
        if self._checkpointing is not None and not self._checkpointing.done():
            self._checkpointing.cancel()
            with contextlib.suppress(BaseException):
                await self._checkpointing

    def _checkpoint_running(self) -> bool:
        """Whether the beat's checkpoint still runs; one that ended is forgotten, and an
        unexpected error of it raised here (it ends dispatch, as it did inline)."""
        task = self._checkpointing
        if task is None:
            return False
        if not task.done():
            return True
        self._checkpointing = None
        if not task.cancelled():
            task.result()
        return False

    async def _background_checkpoint(self) -> None:
        """``checkpoint`` beside dispatch; a disk error is counted and logged, and the
        next beat tries again (the old checkpoint stays valid), as for one inline."""
        try:
            await self.checkpoint()
        except OSError as e:
            self._persist_failed("checkpoint", e)

    def _persist_failed(self, what: str, e: OSError) -> None:
        """A checkpoint or snapshot that failed: counted, logged now and then; the next
        beat tries again."""
        self.stats["persist_failures"] += 1
        now = time.monotonic()
        if now - self._persist_logged_at >= STALL_LOG_INTERVAL_S:
            self._persist_logged_at = now
            log.warning("dispatch %s failed, retrying: %s", what, e)

    # ---- checkpoints, snapshots, retention --------------------------------------------

    async def checkpoint(self) -> None:
        """``StoreCheckpoint.write`` at the dispatched index."""
        async with self._persist_lock:  # the loop's own checkpoint and an explicit one
            if await self.checkpoints.write(self.dispatched_index):
                self._update_retention_floor()

    async def snapshot(self) -> None:
        """``SnapshotManager.take`` at the dispatched index."""
        async with self._persist_lock:
            if await self.snapshot_manager.take(self.dispatched_index):
                self._update_retention_floor()

    def offer_snapshot(self) -> None:
        """Hand the newest snapshot to Raft, if it does not hold it yet."""
        self.snapshot_manager.offer()

    def _pinned(self) -> int | None:
        return None if self.pinned is None else self.pinned()

    def _update_retention_floor(self) -> None:
        snapshots = self.snapshot_manager
        keep_from = min(self.checkpoints.index, snapshots.snapshot_index)
        if snapshots.serve is not None:
            keep_from = min(keep_from, snapshots.served_index)
        floor = pos_of(self.store, keep_from + 1)
        pinned = self._pinned()
        self.store.set_retention_floor(floor if pinned is None else min(floor, pinned))

    def correct_min_offsets(self) -> None:
        """Retention moved the log head: every queue starts at its first unit at or after
        it, and key files wholly below it go. Runs at each beat, and at once when a read
        found its record deleted (``Reads``)."""
        begin_pos = self.store.ledger_begin_pos
        if begin_pos == self._begin_pos_seen:
            return
        self._begin_pos_seen = begin_pos
        for q in list(self.cq):
            q.correct_min_offset(begin_pos)
        self.keys.delete_files_below(begin_pos)
