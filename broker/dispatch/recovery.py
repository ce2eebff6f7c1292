"""Checkpoint and recovery: how far dispatch got, durably (the dispatch checkpoint,
RocketMQ's ``StoreCheckpoint``), and where it resumes after a restart
(docs/architecture.md, docs/formats.md "The dispatch checkpoint").

``consumequeue/checkpoint-<group>`` records the dispatched index, every queue's length
and the key index's position; it is written after the store's commit point, the queues
and the key index are fsynced (``StoreCheckpoint.write``). On a restart
(``StoreCheckpoint.recover``) the queues and the key index are cut back to exactly that
(a dirty tail, torn sectors after a power loss, queues made since), the metadata comes
from the newest snapshot (``snapshots.py``), and the entries between the
two are replayed for the metadata alone (and for the keys a damaged index lost). A
snapshot newer than the checkpoint is fine too (the consume queues' rule,
``broker/dispatch/queues.py``), with the queues of topics it says were deleted since
dropped. A checkpoint that cannot be trusted restarts dispatch from the log head: the
queues and the key index are rebuilt from the commitlog, each queue from its next offset
before the head, which the snapshot's queue table gives, when retention or an install
deleted entries before it.

Invariants:
- a checkpoint is trusted only when every entry it covers is committed in the local log
  and every queue it names is there, at least as long, and holds no later unit;
  otherwise recovery rebuilds from the log head (and deletes the checkpoint first,
  durably: the rebuilt files are not synced);
- the key index depends on no metadata (every message's keys): what it lost is indexed
  again by the replay, from the last message it holds;
- recovery runs before the node starts: nothing waits on the loop yet.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson

from consumequeue import ConsumeQueueError, ConsumeQueueStore, KeyIndex
from dledger.store import FileStore, write_atomic
from dledger.store.meta import fsync_dir

from ..message import MessageFormatError
from ..metadata import MetadataState
from ..positions import last_index_within, pos_of
from .entry import ENTRY_HEAD, decode
from .queues import ConsumeQueueApplier, queue_of, queue_table
from .snapshots import LoadedSnapshot, parse_queue_table
from .walk import READ_BYTES, ReputMessageService

log = logging.getLogger(__name__)

Checkpoint = tuple[int, dict[str, int], tuple[int, int]]
"""(dispatched index, ``{"topic/queue_id": length}``, the key index's position)."""


def checkpoint_bytes(index: int, queues: dict[str, int], keys_position: tuple[int, int]) -> bytes:
    """The checkpoint file: every entry up to ``index`` dispatched into queues of these
    lengths and a key index at this position."""
    return orjson.dumps({"dispatched_index": index, "queues": queues, "keys": list(keys_position)})


def read_checkpoint(path: Path) -> Checkpoint | None:
    """What the checkpoint at ``path`` records; None when there is none or it cannot be
    read (a rebuild), never an exception."""
    try:
        d = orjson.loads(path.read_bytes())
        file, count = d["keys"]
        return (
            int(d["dispatched_index"]),
            {str(k): int(v) for k, v in d["queues"].items()},
            (int(file), int(count)),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("unusable dispatch checkpoint %s: %s", path, e)
        return None


class StoreCheckpoint:
    """The dispatch checkpoint file, and the restart that resumes from it over the store
    (read only), the derived files it cuts back and the metadata it holds."""

    def __init__(
        self,
        store: FileStore,
        cq: ConsumeQueueStore,
        keys: KeyIndex,
        meta: MetadataState,
        path: Path,
    ) -> None:
        self.store = store
        self.cq = cq
        self.keys = keys
        self.meta = meta
        self.path = path
        self.index = -1  # the dispatched index the file on disk records

    def data(self, index: int) -> bytes:
        """What the queues and the key index hold now, as dispatched up to ``index``."""
        return checkpoint_bytes(index, queue_table(self.cq), self.keys.position())

    async def write(self, index: int) -> bool:
        """fsync the consume queues and the key index, then record exactly what they hold
        (every queue's length, the key index's position): ``recover`` cuts them back to
        that, whatever part of later writes a power loss kept. False, doing nothing, when
        the checkpoint is at ``index`` already. What it records is taken on the loop
        thread between two dispatch steps, before the first await; dispatch may go on
        while the files are synced (what it adds is beyond the record), but the caller
        keeps away every other change to them (an install, a snapshot)."""
        if index == self.index:
            return False
        data = self.data(index)
        await asyncio.to_thread(self._flush)
        await asyncio.to_thread(write_atomic, self.path, data)
        self.index = index
        self.cq.trim()  # queues synced now may be unmapped (``max_open_queues``)
        return True

    def _flush(self) -> None:
        # The store's checkpoint first: it makes the commit point durable, and recovery
        # can resume from this checkpoint only if the local log knows its entries are
        # committed (so it never serves an entry its own log does not call committed).
        self.store.flush()
        self.cq.flush()
        self.keys.flush()

    def delete(self) -> None:
        """Durably: what it recorded is about to change."""
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)

    def replace(self, index: int) -> None:
        """Sync the queues and the key index, whatever they hold (an install has just
        replaced them), and record them as dispatched up to ``index``. In a thread."""
        self.cq.flush()
        self.keys.flush()
        write_atomic(self.path, self.data(index))

    # ---- a restart ---------------------------------------------------------------------

    def recover(
        self,
        snapshot: LoadedSnapshot | None,
        walk: ReputMessageService,
        queues: ConsumeQueueApplier,
    ) -> bool:
        """Bring the consume queues and the key index back to the checkpoint (or, when it
        cannot be trusted, to nothing: True, a rebuild) and replay what the metadata,
        adopted from ``snapshot`` already, and the key index lack. Dispatch resumes at
        the checkpoint (the module docstring)."""
        store = self.store
        begin = store.ledger_begin_index
        restored = self._restore()
        if restored is None:
            index = keys_index = begin - 1
            self._start_over(snapshot)
            queues.rebuild_until = store.committed_index
        else:
            index, keys_index = restored
        queues.held_index = index
        walk.reset(max(begin - 1, min(self.meta.applied_index, keys_index, index)))
        walk.replay(index)
        if keys_index < index:
            # Keys the checkpoint says are durable were indexed again: make them so before
            # anything relies on it (the next checkpoint waits for the next entry).
            self.keys.flush()
        self._drop_stale_topics(index)
        self.index = index
        return restored is None

    def _restore(self) -> tuple[int, int] | None:
        """Cut the consume queues and the key index back to exactly what the checkpoint
        recorded: its dispatched index and the last entry whose keys the key index holds
        (the same, unless key files were dropped as damaged); None when it cannot be
        trusted."""
        checkpoint = read_checkpoint(self.path)
        try:
            self.cq.load()
        except ConsumeQueueError as e:  # derived data: never a reason not to start
            log.warning("consume queues do not load (%s): rebuilding them", e)
            return None
        if checkpoint is None:
            return None
        store = self.store
        index, queues, keys = checkpoint
        if not store.ledger_begin_index - 1 <= index <= store.committed_index:
            # Entries it covers are not all in the local log, or not known committed here
            # (``write`` makes the store's commit point durable first, so only a damaged
            # store gets here).
            log.warning("dispatch checkpoint %d is outside the local log: rebuilding", index)
            return None
        cut = pos_of(store, index + 1)  # where the first entry after the checkpoint starts
        for q in list(self.cq):
            length = queues.pop(f"{q.topic}/{q.queue_id}", None)
            if length is None:
                # No queue at the checkpoint: made since (all its units are later) or a
                # deleted one a power loss brought back.
                self.cq.delete_queue(q.topic, q.queue_id)
            elif q.truncate(length) != length or q.max_commitlog_offset_end > cut:
                # Short, or not the queue it recorded: the topic was deleted and made
                # again since, and the new queue has as many units (all later ones).
                log.warning("consume queue %s does not match its checkpoint: rebuilding", q)
                return None
        if any(queues.values()):
            log.warning("consume queues of the checkpoint are missing: rebuilding")
            return None
        keys_restored = self.keys.restore(keys)
        if self.keys.last_commitlog_offset >= cut:  # not the files it recorded: index anew
            self.keys.clear()
            keys_restored = False
        if keys_restored:
            return index, index
        # Key index files dropped as damaged: the replay indexes again what is not there.
        keys_index = last_index_within(store, self.keys.last_commitlog_offset, index)
        log.warning("key index restored up to entry %d only: indexing the rest", keys_index)
        return index, keys_index

    def _start_over(self, snapshot: LoadedSnapshot | None) -> None:
        """No checkpoint to trust: empty queues and key index, to be rebuilt from the log
        head. The old checkpoint goes first, durably: the rebuilt files are not synced,
        and a later restart must not take them for what it recorded."""
        self.delete()
        self.cq.delete_all()
        self.keys.clear()
        if snapshot is not None:
            self._start_queues_at_head(snapshot)

    def _start_queues_at_head(self, snapshot: LoadedSnapshot) -> None:
        """A rebuild over a log whose head is gone (retention, an install) starts every
        queue at its next offset before the log's first entry. Rebuilt from the log
        alone, a queue none of whose messages the log still holds came back empty at 0:
        a message of it committed later was a gap (the dispatcher stopped) and, as
        master, this node handed out its queue offsets again (broker simulation seed 35:
        a power loss between an install and the log reset, then a rebuild). The snapshot
        loaded (at ``s``, never before the log head: retention keeps it) has every
        queue's next offset at ``s``; the messages the log holds up to ``s`` come off.
        Only when entries up to ``s`` are committed here: otherwise they may not be the
        ones the snapshot saw (the leader sends its snapshot again)."""
        store = self.store
        begin, s, raw_table = store.ledger_begin_index, snapshot.index, snapshot.queues
        if begin == 0 or raw_table is None or s > store.committed_index:
            return
        try:
            table = parse_queue_table(raw_table)
        except ValueError as e:
            log.warning("metadata snapshot %d: %s; queues restart from the log alone", s, e)
            return
        held: dict[tuple[str, int], int] = {}  # messages up to ``s`` in the log, per queue
        index = begin
        while index <= s:
            raw, count, _ = store.read_batch(index, READ_BYTES, s - index + 1)
            assert count > 0, f"committed entry {index} is not in the log"
            off = 0
            for _ in range(count):
                magic, size, i, _term, pos = ENTRY_HEAD.unpack_from(raw, off)
                found = self._queue_of(raw, off, magic, size, i, pos)
                off += size
                if found is not None:
                    key, messages = found
                    held[key] = held.get(key, 0) + messages
            index += count
        for key, next_offset in sorted(table.items()):
            first = next_offset - held.get(key, 0)
            if first > 0:
                self.cq.queue(*key).reset(first)

    def _queue_of(  # noqa: PLR0917 - the entry header's fields, as the caller unpacks them
        self, raw: bytes, off: int, magic: int, size: int, index: int, pos: int
    ) -> tuple[tuple[str, int], int] | None:
        """The queue the entry at ``raw[off:]`` goes into, by the metadata held
        (dispatch's rule, ``queue_of``), and how many messages it holds."""
        try:
            e = decode(raw, off, magic, index, pos, size)
        except MessageFormatError:
            return None  # not a message record: dispatch skips it
        key = queue_of(e, self.meta)
        return None if key is None else (key, e.count)

    def _drop_stale_topics(self, index: int) -> None:
        """Drop the queues of topics the metadata says were deleted (or deleted and
        created anew) after ``index``: a newer snapshot's deletes are not replayed."""
        for name in list(self.cq.topics()):
            t = self.meta.topics.get(name)
            if t is None or t.created_index >= index:
                self.cq.delete_topic(name)
