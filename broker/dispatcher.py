"""The dispatcher: RocketMQ's ReputMessageService over the DLedger log (DESIGN §5).

One asyncio task per node, on the master and on slaves alike, walks the *committed*
entries in index order and, for each:

- skips NOOPs (and, with a logged warning, anything that is not a message record: a
  node must not crash on a committed entry);
- applies ``%SYS%META`` operations to the replicated metadata;
- records producer-session results carried in message properties;
- puts a 20-byte unit into the message's consume queue and its keys into the key index;
- wakes long-polling readers of the queues it touched.

Everything it builds is derived state. A checkpoint (``consumequeue/checkpoint``: the
dispatched index and every queue's max offset, written after the queues and the key
index are fsynced) and the newest metadata snapshot say where to resume. On restart the
dispatcher resumes at the older of the two, first cutting from the consume queues and
the key index everything at or after that entry (a dirty tail written after the last
checkpoint, or beyond what the local log has committed), so the rebuilt tail is exactly
what the log says. A checkpoint that names a queue missing or shorter on disk (files
deleted by hand) restarts dispatch from the log head: the consume queues are rebuilt
byte-identical from the commitlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from consumequeue import ConsumeQueueError, ConsumeQueueStore, KeyIndex, tags_hash
from dledger.store import BODY_OFFSET, MAGIC_NOOP, MAGIC_NORMAL, FileStore, write_atomic

from .message import (
    PROP_BATCH_INDEX,
    PROP_BATCH_SIZE,
    PROP_PRODUCER_ID,
    PROP_PRODUCER_SEQ,
    MessageFormatError,
    decode_message,
    decode_properties,
    peek_dispatch,
    tags_and_keys,
)
from .metadata import SYS_TOPIC, MetadataState, SnapshotFiles

log = logging.getLogger(__name__)

_ENTRY_HEAD = struct.Struct(">iiqqq")  # magic, size, index, term, pos (DESIGN §4)
_SESSION_MARK = PROP_PRODUCER_ID.encode() + b"\x01"


class Dispatcher:
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
        self.dispatched_index = -1  # every committed entry up to here is dispatched
        self.snapshot_index = -1  # the newest metadata snapshot on disk
        self.checkpoint_index = -1
        self.rebuild_until = -1  # entries up to here are a rebuild (see _put_unit)
        self.stats = {"entries": 0, "messages": 0, "skipped": 0, "rebuilds": 0}
        self._progress = asyncio.Event()
        self._persist_lock = asyncio.Lock()
        self._queue_events: dict[tuple[str, int], asyncio.Event] = {}
        self._last_checkpoint = self._last_snapshot = time.monotonic()
        self._begin_pos_seen = -1
        self._commit_event: Callable[[], asyncio.Event] | None = None

    # ---- recovery ----------------------------------------------------------------------

    def recover(self) -> None:
        """Load the newest usable snapshot and checkpoint, cut dirty tails, and set the
        point dispatch resumes from. Runs before the node starts (no loop needed)."""
        store = self.store
        snap = self.snapshots.load_latest(store.ledger_end_index)
        if snap is not None:
            index, raw = snap
            loaded, _extra = MetadataState.from_snapshot(raw, self.meta.max_sessions)
            self._adopt_meta(loaded)
            self.snapshot_index = index
        self.cq.load()
        checkpoint = self._read_checkpoint()
        begin = store.ledger_begin_index
        if checkpoint is None or not self._checkpoint_holds(checkpoint):
            cq_index = begin - 1
            if checkpoint is not None:
                log.warning("consume queues disagree with their checkpoint: rebuilding them")
            self.rebuild_until = store.committed_index
            self.stats["rebuilds"] += 1
        else:
            cq_index = int(checkpoint["dispatched_index"])
        meta_index = self.meta.applied_index
        resume = max(begin - 1, min(cq_index, meta_index, store.committed_index))
        cut = self._pos_of(resume + 1)
        for q in list(self.cq):
            q.truncate_dirty_tail(cut)
        self.keys.truncate_dirty_tail(cut)
        if meta_index >= cq_index:  # the table knows every topic that still exists
            for topic in list(self.cq.topics()):
                if topic not in self.meta.topics:
                    self.cq.delete_topic(topic)
        self.dispatched_index = resume
        self.checkpoint_index = min(cq_index, resume)
        self._update_retention_floor()
        self._correct_min_offsets()
        log.info(
            "dispatch resumes after entry %d (snapshot %d, checkpoint %d, committed %d)",
            resume,
            self.snapshot_index,
            cq_index,
            store.committed_index,
        )

    def _adopt_meta(self, loaded: MetadataState) -> None:
        # The broker holds a reference to self.meta: update it in place.
        m = self.meta
        m.applied_index = loaded.applied_index
        m.topics = loaded.topics
        m.offsets = loaded.offsets
        m.sessions = loaded.sessions

    def _pos_of(self, index: int) -> int:
        """The byte position of entry ``index`` (or of the ledger end past the last)."""
        store = self.store
        if index > store.ledger_end_index:
            return store.ledger_end_pos
        if index < store.ledger_begin_index:
            return store.ledger_begin_pos
        return store.get_meta(index).pos

    def _read_checkpoint(self) -> dict[str, Any] | None:
        try:
            d = orjson.loads(self.checkpoint_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("unreadable dispatch checkpoint %s: %s", self.checkpoint_path, e)
            return None
        return d if isinstance(d, dict) and "dispatched_index" in d else None

    def _checkpoint_holds(self, checkpoint: dict[str, Any]) -> bool:
        for key, max_offset in checkpoint.get("queues", {}).items():
            topic, _, qid = key.rpartition("/")
            q = self.cq.find(topic, int(qid))
            if q is None or q.max_offset < int(max_offset):
                return False
        return int(checkpoint["dispatched_index"]) <= self.store.ledger_end_index

    # ---- the loop ----------------------------------------------------------------------

    async def run(self, wait_committed: Callable[[int, float], Any]) -> None:
        """Dispatch forever: committed entries as they come, checkpoints and snapshots
        on their intervals. ``wait_committed(index, timeout_s)`` is the server's."""
        while True:
            n = self.dispatch_some(self.batch_entries)
            await self._maybe_persist()
            if n >= self.batch_entries:
                await asyncio.sleep(0)  # a long catch-up must not starve the loop
                continue
            await wait_committed(self.dispatched_index + 1, 0.2)

    def dispatch_some(self, max_entries: int) -> int:
        """Dispatch up to ``max_entries`` committed entries; returns how many."""
        store = self.store
        done = 0
        touched: set[tuple[str, int]] = set()
        while done < max_entries:
            first = self.dispatched_index + 1
            last = min(store.committed_index, first + max_entries - done - 1)
            if last < first:
                break
            raw, count, _ = store.read_batch(first, 4 << 20, last - first + 1)
            if count == 0:
                break
            self._dispatch_raw(raw, count, touched)
            done += count
        if done:
            self.stats["entries"] += done
            ev, self._progress = self._progress, asyncio.Event()
            ev.set()
            for key in touched:
                qev = self._queue_events.pop(key, None)
                if qev is not None:
                    qev.set()
        return done

    def _dispatch_raw(self, raw: bytes, count: int, touched: set[tuple[str, int]]) -> None:
        meta, keys = self.meta, self.keys
        off = 0
        unpack_head = _ENTRY_HEAD.unpack_from
        for _ in range(count):
            magic, size, index, _term, pos = unpack_head(raw, off)
            body_at = off + BODY_OFFSET
            off += size
            self.dispatched_index = index
            meta_fresh = index > meta.applied_index
            if meta_fresh:
                meta.applied_index = index
            if magic == MAGIC_NOOP:
                continue
            try:
                if magic != MAGIC_NORMAL:
                    raise MessageFormatError(f"entry magic {magic}")
                info = peek_dispatch(raw, body_at)
                if info.physical_offset != pos + BODY_OFFSET:
                    raise MessageFormatError(
                        f"PHYSICALOFFSET {info.physical_offset} is not pos + 48 = "
                        f"{pos + BODY_OFFSET}"
                    )
            except MessageFormatError as e:
                self.stats["skipped"] += 1
                log.warning("entry %d at pos %d is not a message, skipped: %s", index, pos, e)
                continue
            if info.topic == SYS_TOPIC:
                if meta_fresh:
                    body = self._body(raw, body_at)
                    deleted = meta.apply_op(index, body)
                    if deleted is not None:
                        self._drop_topic(deleted)
                continue
            props = info.properties_raw
            if meta_fresh and _SESSION_MARK in props:
                self._record_session(info, props)
            topic = meta.topics.get(info.topic)
            if topic is None or topic.created_index >= index or info.queue_id >= topic.queues:
                continue  # a deleted (or older) incarnation of the topic: not dispatched
            tags, msg_keys = tags_and_keys(props)
            commitlog_offset = pos + BODY_OFFSET
            key = (info.topic, info.queue_id)
            self._put_unit(
                key,
                queue_offset=info.queue_offset,
                commitlog_offset=commitlog_offset,
                size=size - BODY_OFFSET,
                thash=tags_hash(tags),
                index=index,
            )
            touched.add(key)
            if msg_keys:
                keys.put(msg_keys, commitlog_offset, info.store_timestamp)
            self.stats["messages"] += 1

    @staticmethod
    def _body(raw: bytes, body_at: int) -> bytes:
        return decode_message(raw, body_at, verify_crc=False).body

    def _record_session(self, info: Any, props_raw: bytes) -> None:
        props = decode_properties(props_raw)
        try:
            self.meta.record_session(
                props[PROP_PRODUCER_ID],
                int(props[PROP_PRODUCER_SEQ]),
                int(props.get(PROP_BATCH_INDEX, "0")),
                int(props.get(PROP_BATCH_SIZE, "1")),
                (info.queue_id, info.queue_offset, info.physical_offset),
            )
        except (KeyError, ValueError) as e:
            log.warning("malformed producer session properties ignored: %s", e)

    def _put_unit(
        self,
        key: tuple[str, int],
        *,
        queue_offset: int,
        commitlog_offset: int,
        size: int,
        thash: int,
        index: int,
    ) -> None:
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
            q.put(queue_offset, commitlog_offset, size, thash)
        except ConsumeQueueError:
            # A gap or a different unit at a taken offset means the master assigned queue
            # offsets wrongly: replicas would diverge. Stop the node; an operator looks.
            log.critical("consume queue %s/%d broken at entry %d", key[0], key[1], index)
            raise

    def _drop_topic(self, name: str) -> None:
        self.cq.delete_topic(name)
        for key in [k for k in self._queue_events if k[0] == name]:
            self._queue_events.pop(key).set()
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
        self._correct_min_offsets()

    async def checkpoint(self) -> None:
        """fsync the consume queues and the key index, then record how far they go."""
        async with self._persist_lock:  # the loop's own checkpoint and an explicit one
            index = self.dispatched_index
            if index == self.checkpoint_index:
                return
            queues = {f"{q.topic}/{q.queue_id}": q.max_offset for q in self.cq}
            await asyncio.to_thread(self._flush_derived)
            data = orjson.dumps({"dispatched_index": index, "queues": queues})
            await asyncio.to_thread(write_atomic, self.checkpoint_path, data)
            self.checkpoint_index = index
            self._update_retention_floor()

    def _flush_derived(self) -> None:
        self.cq.flush()
        self.keys.flush()

    async def snapshot(self) -> None:
        async with self._persist_lock:
            index = self.meta.applied_index
            if index == self.snapshot_index:
                return
            data = self.meta.to_snapshot()  # at exactly ``index``: taken on the loop thread
            await asyncio.to_thread(self.snapshots.save, index, data)
            self.snapshot_index = index
            self._update_retention_floor()

    def _update_retention_floor(self) -> None:
        # Never delete log the derived state still needs: not past the checkpointed
        # dispatch point nor past the newest metadata snapshot (DESIGN §5).
        keep_from = min(self.checkpoint_index, self.snapshot_index) + 1
        self.store.set_retention_floor(self._pos_of(keep_from))

    def _correct_min_offsets(self) -> None:
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

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.dispatched_index < index:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):  # not wait_for: it can swallow a cancel
                    await self._progress.wait()
        return True

    async def wait_queue(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Wait until the queue holds a message at ``offset`` (long polling); False on
        timeout. Woken by the dispatch step that puts it, never by polling."""
        deadline = time.monotonic() + timeout_s
        while True:
            q = self.cq.find(topic, queue_id)
            if q is not None and q.max_offset > offset:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ev = self._queue_events.setdefault((topic, queue_id), asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await ev.wait()
