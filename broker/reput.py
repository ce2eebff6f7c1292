"""The dispatcher: RocketMQ's ReputMessageService over the DLedger log (docs/architecture.md).

One asyncio task per node, on the master and on slaves alike, walks the *committed*
entries in index order and, for each:

- skips NOOPs (and, with a logged warning, anything that is not a message record: a
  node must not crash on a committed entry);
- applies ``%SYS%META`` operations to the replicated metadata;
- records producer-session results carried in message properties;
- puts a 20-byte unit into the consume queue of the message's topic incarnation, and
  the keys of every message into the key index;
- wakes long-polling readers of the queues it touched.

A disk error while dispatching (a full disk failing a consume-queue or key-index roll)
stalls dispatch instead of ending it: the entry is not counted as dispatched, every step
of it is idempotent (metadata by ``applied_index``, queue units and keys by offset), and
it is retried with backoff until space returns (``stall`` says why meanwhile; the broker
refuses writes while it is set). A broken invariant (``ConsumeQueueError``) still ends
the task, and with it the node: it is not a thing to retry.

Everything it builds is derived state, and a replay must build it byte for byte as live
dispatch did. Two facts make that possible:

- a message goes into a queue iff its topic's incarnation at its entry still exists: the
  current incarnation (``TopicMeta.created_index``) was created before the entry. This
  needs the metadata at or *after* the entry, never before it;
- the key index depends on no metadata at all (every message's keys).

A checkpoint (``consumequeue/checkpoint-<group>``, written after the store's commit
point, the queues and the key index are fsynced) records the dispatched index, every
queue's length and the key index's position. On restart the queues and the key index are
cut back to exactly that (a dirty tail, torn sectors after a power loss, queues made
since), the metadata comes from the newest snapshot, and the entries between the two
are replayed for the metadata alone; a snapshot newer than the checkpoint is fine by the
first fact, with the queues of topics it says were deleted since dropped. A checkpoint
that cannot be trusted (missing, outside the local log, or naming a queue that is gone
or short) restarts dispatch from the log head: the queues and the key index are rebuilt
from the commitlog (each queue from its next offset before the head, which the metadata
snapshot's queue table gives, when retention or an install deleted entries before it).
The files' side of a restart, and the checkpoint's format, are ``broker/recovery.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from consumequeue import ConsumeQueueError, ConsumeQueueStore, KeyIndex, tags_hash
from dledger.runtime.watermark import Watermark
from dledger.store import BODY_OFFSET, MAGIC_NOOP, MAGIC_NORMAL, FileStore, write_atomic
from dledger.store.meta import fsync_dir

from .batch import INNER_BATCH_FLAG, InnerRecord, batch_inners
from .message import (
    PROP_BATCH_INDEX,
    PROP_BATCH_SIZE,
    PROP_PRODUCER_ID,
    PROP_PRODUCER_SEQ,
    MessageFormatError,
    RecordHead,
    decode_head,
    decode_message,
    decode_properties,
    tags_and_keys,
)
from .metadata import SYS_TOPIC, MetadataState, SnapshotFiles
from .recovery import (
    ENTRY_HEAD,
    Recovery,
    checkpoint_bytes,
    last_index_within,
    parse_queue_table,
    pos_of,
)

log = logging.getLogger(__name__)

STALL_RETRY_MAX_S = 1.0  # backoff cap while a disk error stalls dispatch
STALL_LOG_INTERVAL_S = 10.0  # a stall, or failing checkpoints, are logged this often
_SESSION_MARK = PROP_PRODUCER_ID.encode() + b"\x01"


class ReputService:
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
        self.snapshots = snapshots
        self.checkpoint_path = checkpoint_path
        self.batch_entries = batch_entries
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.snapshot_interval_entries = snapshot_interval_entries
        self.snapshot_interval_ms = snapshot_interval_ms
        self.on_topic_deleted = on_topic_deleted
        # Hands a snapshot to Raft for followers behind the log head; False: not now.
        self.serve_snapshot = serve_snapshot
        self.served_index = -1  # the snapshot Raft holds (with serve_snapshot set)
        self._unserved: tuple[int, bytes] | None = None
        # Every committed entry up to its index is dispatched (``dispatched_index``).
        self._dispatched = Watermark()
        self.snapshot_index = -1  # the newest metadata snapshot on disk
        self.checkpoint_index = -1
        # The consume queues hold every entry up to here already: recovery's replay below
        # it changes no queue (set by ``recover``).
        self.derived_index = -1
        self.rebuild_until = -1  # entries up to here are a rebuild (see _put_units)
        self.stats = {
            "entries": 0,
            "messages": 0,
            "skipped": 0,
            "rebuilds": 0,
            "stalls": 0,
            "persist_failures": 0,
        }
        # Why dispatch cannot move now (a disk error it retries), None while it can.
        self.stall: OSError | None = None
        # A leader's snapshot is being installed: the consume queues and the key index
        # change in a thread, and nobody on the loop may touch them (``install``).
        self.installing = False
        self._stall_logged_at = self._persist_logged_at = -1e18
        self._persist_lock = asyncio.Lock()
        # Each waited-on queue's next offset (``wait_queue``); a queue's entry goes when
        # a dispatch step finds nobody waiting on it.
        self._queue_marks: dict[tuple[str, int], Watermark] = {}
        self._last_checkpoint = self._last_snapshot = time.monotonic()
        self._begin_pos_seen = -1

    # ---- recovery ----------------------------------------------------------------------

    def recover(self) -> None:
        """Bring the consume queues, the key index and the metadata back to one entry and
        resume dispatch after it. Runs before the node starts (no loop needed).

        The queues and the key index go back to exactly what the dispatch checkpoint
        recorded (or, when it cannot be trusted, to nothing: a full rebuild). The
        metadata comes from the newest snapshot, which may be older than the checkpoint
        (its entries are replayed here for the metadata alone) or newer (then dispatch
        judges each later message by the topic incarnation it belongs to, see
        ``_dispatch_raw``). Keys the index lost are indexed again by the same replay.
        The files' side of it: ``broker/recovery.py``."""
        store = self.store
        begin = store.ledger_begin_index
        r = Recovery(
            store,
            self.cq,
            self.keys,
            self.meta,
            self.snapshots,
            checkpoint_path=self.checkpoint_path,
        )
        snap = r.load_snapshot()
        if snap is not None:
            self.snapshot_index = snap.index
            if snap.servable:
                self._unserved = (snap.index, snap.raw)
        index = r.restore_checkpoint()
        if index is None:
            index = keys_index = begin - 1
            r.start_over(snap)
            self.rebuild_until = store.committed_index
            self.stats["rebuilds"] += 1
        elif r.keys_restored:
            keys_index = index
        else:  # key index files dropped as damaged: index again what is not there
            keys_index = last_index_within(store, self.keys.last_commitlog_offset, index)
            log.warning("key index restored up to entry %d only: indexing the rest", keys_index)
        self.derived_index = index
        self._dispatched.reset(max(begin - 1, min(self.meta.applied_index, keys_index, index)))
        self._replay(index)
        if keys_index < index:
            # Keys the checkpoint says are durable were indexed again: make them so before
            # anything relies on it (the next checkpoint waits for the next entry).
            self.keys.flush()
        r.drop_stale_topics(index)
        self.checkpoint_index = index
        self._update_retention_floor()
        self.correct_min_offsets()
        log.info(
            "dispatch resumes after entry %d (snapshot %d, committed %d, rebuilds %d)",
            index,
            self.snapshot_index,
            store.committed_index,
            self.stats["rebuilds"],
        )

    def _replay(self, until: int) -> None:
        """Dispatch the entries up to ``until``, which the queues hold already: for the
        metadata an older snapshot lacks and the keys a damaged index lost."""
        store = self.store
        while self.dispatched_index < until:
            first = self.dispatched_index + 1
            raw, count, _ = store.read_batch(first, 4 << 20, until - first + 1)
            assert count > 0, f"committed entry {first} is not in the log"
            self._dispatch_raw(raw, count, set())

    # ---- installing a leader's snapshot ------------------------------------------------

    async def install(self, last_index: int, data: bytes) -> None:
        """Make a leader's snapshot (see ``snapshot``) this node's state after entry
        ``last_index``, durably: DLedger then restarts the log right after it
        (``DLedgerServer.set_snapshot_installer``). Raises ``ValueError`` on data that is
        not such a snapshot, before anything changed.

        The consume queues restart empty at the snapshot's next offsets (the units before
        refer to log this node never gets) and the key index restarts empty: queries by
        key find the messages from here on. A crash part way leaves no checkpoint (or
        one past the old log) and the snapshot past the old log's end: ``recover``
        deletes the snapshot and rebuilds from the old log, and the leader, which still
        finds this node behind its head, sends the snapshot again."""
        loaded, extra = MetadataState.from_snapshot(data, self.meta.max_sessions)
        table = parse_queue_table(extra.get("queues"))
        if loaded.applied_index != last_index:
            raise ValueError(f"snapshot of entry {loaded.applied_index} sent as {last_index}")
        # Not pruned here: until the log restarts, the older snapshots are the ones a
        # restart can use.
        await asyncio.to_thread(self.snapshots.save, last_index, data, prune=False)
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
            gone = [
                name
                for name, t in self.meta.topics.items()
                if (new := loaded.topics.get(name)) is None or new.created_index != t.created_index
            ]
            self.meta.adopt(loaded)
            self._dispatched.reset(last_index)
            self.derived_index = last_index
            self.snapshot_index = self.served_index = last_index  # the core keeps it too
            self._unserved = None
            self.rebuild_until = -1
            self._begin_pos_seen = -1  # the log's begin moves next: correct min offsets
            self.checkpoint_index = last_index
        for name in gone:
            if self.on_topic_deleted is not None:
                self.on_topic_deleted(name)
        # Every waited-on queue restarted: its readers wait on from its new next offset.
        for key in list(self._queue_marks):
            self._mark_queue(key)
        log.info("installed the snapshot of entry %d (%d queues)", last_index, len(table))

    def _install_files(self, table: dict[tuple[str, int], int], last_index: int) -> None:
        """``install``'s file work, in a thread while ``installing`` holds everyone off.
        The old checkpoint goes first, durably: it describes queues about to change."""
        self.checkpoint_path.unlink(missing_ok=True)
        fsync_dir(self.checkpoint_path.parent)
        for q in list(self.cq):
            if (q.topic, q.queue_id) not in table:
                self.cq.delete_queue(q.topic, q.queue_id)
        for (topic, queue_id), next_offset in table.items():
            if next_offset or self.cq.find(topic, queue_id) is not None:
                self.cq.queue(topic, queue_id).reset(next_offset)
        self.keys.clear()
        self.cq.flush()
        self.keys.flush()
        write_atomic(self.checkpoint_path, self._checkpoint_data(last_index))

    # ---- the loop ----------------------------------------------------------------------

    async def run(self, wait_committed: Callable[[int, float], Any]) -> None:
        """Dispatch forever: committed entries as they come, checkpoints and snapshots
        on their intervals. ``wait_committed(index, timeout_s)`` is the server's. A disk
        error stalls and retries (module docstring); anything else ends the task."""
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
                await self._maybe_persist()
            except OSError as e:  # the old checkpoint and snapshot stay valid: retry later
                self.stats["persist_failures"] += 1
                now = time.monotonic()
                if now - self._persist_logged_at >= STALL_LOG_INTERVAL_S:
                    self._persist_logged_at = now
                    log.warning("dispatch checkpoint or snapshot failed, retrying: %s", e)
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
        """Dispatch up to ``max_entries`` committed entries; returns how many. On a disk
        error (raised) the entries before the failing one stay dispatched, and their
        readers are woken."""
        if self.installing:
            return 0  # the files are being replaced in a thread (``install``)
        store = self.store
        start = self.dispatched_index
        touched: set[tuple[str, int]] = set()
        try:
            while self.dispatched_index - start < max_entries:
                first = self.dispatched_index + 1
                last = min(store.committed_index, start + max_entries)
                if last < first:
                    break
                raw, count, _ = store.read_batch(first, 4 << 20, last - first + 1)
                if count == 0:
                    break
                self._dispatch_raw(raw, count, touched)
        finally:
            done = self.dispatched_index - start
            if done:
                self.stats["entries"] += done
                for key in touched:
                    self._mark_queue(key)
        return done

    def _dispatch_raw(self, raw: bytes, count: int, touched: set[tuple[str, int]]) -> None:
        off = 0
        unpack_head = ENTRY_HEAD.unpack_from
        done = self.dispatched_index
        try:
            for _ in range(count):
                head = unpack_head(raw, off)
                # An OSError leaves this entry undispatched; its retry repeats only the
                # steps that did not happen (each is idempotent: see the module docstring).
                self._dispatch_entry(raw, off, head, touched)
                done = head[2]
                off += head[1]
        finally:
            self._dispatched.advance(done)  # wakes wait_dispatched

    def _dispatch_entry(
        self,
        raw: bytes,
        off: int,
        head: tuple[int, int, int, int, int],
        touched: set[tuple[str, int]],
    ) -> None:
        """One committed entry at ``raw[off:]`` whose header is ``head`` (magic, size,
        index, term, pos)."""
        magic, size, index, _term, pos = head
        meta, keys = self.meta, self.keys
        body_at = off + BODY_OFFSET
        meta_fresh = index > meta.applied_index
        if meta_fresh:
            meta.applied_index = index
        if magic == MAGIC_NOOP:
            return
        inners: list[InnerRecord] | None = None
        try:
            if magic != MAGIC_NORMAL:
                raise MessageFormatError(f"entry magic {magic}")
            info = decode_head(raw, body_at)
            if info.physical_offset != pos + BODY_OFFSET:
                raise MessageFormatError(
                    f"PHYSICALOFFSET {info.physical_offset} is not pos + 48 = {pos + BODY_OFFSET}"
                )
            if info.sys_flag & INNER_BATCH_FLAG:
                _base, inners = batch_inners(raw, body_at)
        except MessageFormatError as e:
            self.stats["skipped"] += 1
            log.warning("entry %d at pos %d is not a message, skipped: %s", index, pos, e)
            return
        if info.topic == SYS_TOPIC:
            if meta_fresh:
                deleted = meta.apply_op(index, self._body(raw, body_at))
                if deleted is not None and index > self.derived_index:
                    self._drop_topic(deleted)
            return
        props = raw[info.props_at : info.props_at + info.props_len]
        if meta_fresh and _SESSION_MARK in props:
            self._record_session(info, props, 1 if inners is None else len(inners))
        commitlog_offset = pos + BODY_OFFSET
        if inners is not None:
            self._dispatch_batch(raw, info, inners, commitlog_offset, size, index, touched)
            return
        tags, msg_keys = tags_and_keys(props)
        if msg_keys:
            # Every message's keys, whatever becomes of its topic: the key index is a
            # function of the log alone, so every replica and every replay builds the
            # same files. (A query reads each candidate and checks its topic.)
            keys.put(msg_keys, commitlog_offset, info.store_timestamp)
        self._queue_units(info, commitlog_offset, size, (tags_hash(tags),), index, touched)

    def _queue_units(  # noqa: PLR0917 - the entry's parts, as _dispatch_entry has them
        self,
        info: RecordHead,
        commitlog_offset: int,
        size: int,
        hashes: Sequence[int],
        index: int,
        touched: set[tuple[str, int]],
    ) -> None:
        """The units of the record's messages (a tags hash each) into its queue, unless
        recovery replays an entry the queues hold, or the topic's incarnation is gone."""
        if index <= self.derived_index:
            return  # recovery's replay: the queues hold this entry already
        if not self.meta.queued(info.topic, info.queue_id, index):
            return  # an incarnation deleted by now (``recover`` dropped its queues)
        key = (info.topic, info.queue_id)
        self._put_units(
            key,
            queue_offset=info.queue_offset,
            commitlog_offset=commitlog_offset,
            size=size - BODY_OFFSET,
            hashes=hashes,
            index=index,
        )
        touched.add(key)
        self.stats["messages"] += len(hashes)

    def _dispatch_batch(  # noqa: PLR0917 - the entry's parts, as _dispatch_entry has them
        self,
        raw: bytes,
        info: RecordHead,
        inners: list[InnerRecord],
        commitlog_offset: int,
        size: int,
        index: int,
        touched: set[tuple[str, int]],
    ) -> None:
        """A batch record (``broker.batch``): message i's keys at address
        ``commitlog_offset + i``, and one unit per message, each pointing at the record
        with its own tags hash, at queue offsets ``base + i``."""
        hashes = []
        put_keys, ts = self.keys.put, info.store_timestamp
        for i, r in enumerate(inners):
            if not r.props_len:
                hashes.append(0)  # tags_hash(None)
                continue
            tags, msg_keys = tags_and_keys(raw[r.props_at : r.props_at + r.props_len])
            if msg_keys:
                put_keys(msg_keys, commitlog_offset + i, ts)
            hashes.append(tags_hash(tags))
        self._queue_units(info, commitlog_offset, size, hashes, index, touched)

    @staticmethod
    def _body(raw: bytes, body_at: int) -> bytes:
        return decode_message(raw, body_at, verify_crc=False).body

    def _record_session(self, info: RecordHead, props_raw: bytes, count: int) -> None:
        """The session results of a record's ``count`` messages (a batch record's are
        at queue offsets base + i and addresses offset + i)."""
        props = decode_properties(props_raw)
        try:
            pid, seq = props[PROP_PRODUCER_ID], int(props[PROP_PRODUCER_SEQ])
            first, batch_size = (
                int(props.get(PROP_BATCH_INDEX, "0")),
                int(props.get(PROP_BATCH_SIZE, "1")),
            )
        except (KeyError, ValueError) as e:
            log.warning("malformed producer session properties ignored: %s", e)
            return
        for i in range(count):
            self.meta.record_session(
                pid,
                seq,
                first + i,
                batch_size,
                (info.queue_id, info.queue_offset + i, info.physical_offset + i),
            )

    def _put_units(
        self,
        key: tuple[str, int],
        *,
        queue_offset: int,
        commitlog_offset: int,
        size: int,
        hashes: Sequence[int],
        index: int,
    ) -> None:
        """The units of one record's messages (one per tags hash, from ``queue_offset``
        on), all pointing at the record."""
        q = self.cq.queue(*key)
        if (
            index <= self.rebuild_until
            and q.min_offset == q.max_offset
            and queue_offset > q.max_offset
        ):
            # Rebuilding a queue whose first messages retention already deleted from the
            # log: the queue starts where the log's first message of it says.
            q.reset(queue_offset)
        try:
            q.put_batch(queue_offset, ((commitlog_offset, size, thash) for thash in hashes))
        except ConsumeQueueError:
            # A gap or a different unit at a taken offset means the master assigned queue
            # offsets wrongly: replicas would diverge. Stop the node; an operator looks.
            log.critical("consume queue %s/%d broken at entry %d", key[0], key[1], index)
            raise

    def _drop_topic(self, name: str) -> None:
        self.cq.delete_topic(name)
        for key in [k for k in self._queue_marks if k[0] == name]:
            self._mark_queue(key)  # gone: back to 0, as a topic made again starts
        if self.on_topic_deleted is not None:
            self.on_topic_deleted(name)

    # ---- checkpoints, snapshots, retention --------------------------------------------

    async def _maybe_persist(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or (now - self._last_checkpoint) * 1000 >= self.checkpoint_interval_ms:
            self._last_checkpoint = now
            await self.checkpoint()
        due_entries = self.meta.applied_index - self.snapshot_index
        due_time = (now - self._last_snapshot) * 1000 >= self.snapshot_interval_ms
        if due_entries > 0 and (force or due_time or due_entries >= self.snapshot_interval_entries):
            self._last_snapshot = now
            await self.snapshot()
        if self._unserved is not None:  # after a restart, until Raft's commit reaches it
            self.offer_snapshot()
            self._update_retention_floor()
        self.correct_min_offsets()

    async def checkpoint(self) -> None:
        """fsync the consume queues and the key index, then record exactly what they hold
        (every queue's length, the key index's position): ``recover`` cuts them back to
        that, whatever part of later writes a power loss kept."""
        async with self._persist_lock:  # the loop's own checkpoint and an explicit one
            index = self.dispatched_index
            if index == self.checkpoint_index:
                return
            data = self._checkpoint_data(index)
            await asyncio.to_thread(self._flush_derived)
            await asyncio.to_thread(write_atomic, self.checkpoint_path, data)
            self.checkpoint_index = index
            self._update_retention_floor()

    def _checkpoint_data(self, index: int) -> bytes:
        return checkpoint_bytes(index, self.queue_table(), self.keys.position())

    def _flush_derived(self) -> None:
        # The store's checkpoint first: it makes the commit point durable, and recovery
        # can resume from this checkpoint only if the local log knows its entries are
        # committed (so it never serves an entry its own log does not call committed).
        self.store.flush()
        self.cq.flush()
        self.keys.flush()

    async def snapshot(self) -> None:
        """Write the metadata and every queue's next offset at the dispatched index, then
        hand it to Raft: it is what a follower behind the log head installs."""
        async with self._persist_lock:
            index = self.meta.applied_index
            if index == self.snapshot_index or index != self.dispatched_index:
                return
            # At exactly ``index``: taken on the loop thread, between two dispatch steps.
            data = self.meta.to_snapshot({"queues": self.queue_table()})
            # The store's commit point first (as ``checkpoint`` does): after a restart the
            # log knows every entry the snapshot covers is committed, so Raft takes it
            # back at once and a rebuild can start the queues from its table (see
            # ``_start_queues_at_head``; seed 270 of the broker simulation with an 8 s
            # fault phase: a snapshot past the durable commit point, a rebuild).
            await asyncio.to_thread(self.store.flush)
            await asyncio.to_thread(self.snapshots.save, index, data)
            self.snapshot_index = index
            self._unserved = (index, data)
            self.offer_snapshot()
            self._update_retention_floor()

    def queue_table(self) -> dict[str, int]:
        """Every consume queue's next offset, as ``{"topic/queue_id": offset}``."""
        return {f"{q.topic}/{q.queue_id}": q.max_offset for q in self.cq}

    def offer_snapshot(self) -> None:
        """Hand the newest snapshot to Raft, if it does not hold it yet."""
        unserved = self._unserved
        if unserved is None or self.serve_snapshot is None:
            return
        if unserved[0] < self.store.ledger_begin_index - 1:
            self._unserved = None  # the log no longer continues it: a newer one will do
        elif self.serve_snapshot(*unserved):
            self._unserved = None
            self.served_index = unserved[0]

    def _update_retention_floor(self) -> None:
        # Never delete log the derived state still needs: not past the checkpointed
        # dispatch point nor past the newest metadata snapshot (docs/architecture.md); and not past
        # the snapshot Raft serves, or a follower behind would wait for the next one.
        keep_from = min(self.checkpoint_index, self.snapshot_index)
        if self.serve_snapshot is not None:
            keep_from = min(keep_from, self.served_index)
        self.store.set_retention_floor(pos_of(self.store, keep_from + 1))

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

    async def close(self) -> None:
        """Checkpoint and snapshot on the way out, so a restart replays nothing."""
        with contextlib.suppress(Exception):
            await self._maybe_persist(force=True)

    # ---- waiting -------------------------------------------------------------------------

    @property
    def dispatched_index(self) -> int:
        """Every committed entry up to here is dispatched."""
        return self._dispatched.index

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        """Wait until ``dispatched_index >= index``; False on timeout."""
        return await self._dispatched.wait(index, timeout_s)

    async def wait_queue(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> bool:
        """Wait until the queue holds a message at ``queue_offset`` (long polling); False
        on timeout. Woken by the dispatch step that puts it, never by polling."""
        key = (topic, queue_id)
        mark = self._queue_marks.get(key)
        if mark is None:
            mark = self._queue_marks[key] = Watermark(self._next_offset(key))
        return await mark.wait(queue_offset + 1, timeout_s)

    def waiting_on(self, topic: str, queue_id: int) -> int:
        """How many readers wait for the queue's next message."""
        mark = self._queue_marks.get((topic, queue_id))
        return 0 if mark is None else mark.waiting

    def _next_offset(self, key: tuple[str, int]) -> int:
        q = self.cq.find(*key)
        return 0 if q is None else q.max_offset  # a queue not made yet starts at 0

    def _mark_queue(self, key: tuple[str, int]) -> None:
        """The queue changed (grew, or was deleted or restarted): tell its waiters, and
        forget it when none is left (``wait_queue`` looks at the queue again)."""
        mark = self._queue_marks.get(key)
        if mark is not None:
            mark.reset(self._next_offset(key))
            if not mark.waiting:
                del self._queue_marks[key]
