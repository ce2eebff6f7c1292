"""Where dispatch resumes after a restart: the dispatch checkpoint, the metadata snapshot
and the derived files cut back to agree with them (docs/architecture.md).

``ReputService.recover`` drives a ``Recovery`` over the node's files, before the node
starts; this module holds what that needs of the files and nothing of dispatch itself:

- the dispatch checkpoint (``consumequeue/checkpoint-<group>``): its format
  (``checkpoint_bytes``, ``read_checkpoint``), and cutting the consume queues and the key
  index back to exactly what it recorded (``Recovery.restore_checkpoint``);
- the newest metadata snapshot the local log continues (``Recovery.load_snapshot``), and
  its queue table (``parse_queue_table``), from which a rebuild starts every queue at its
  next offset before the log head (``Recovery.start_over``).

Invariants:
- a checkpoint is trusted only when every entry it covers is committed in the local log
  and every queue it names is there, at least as long, and holds no later unit;
  otherwise recovery rebuilds from the log head (and deletes the checkpoint first,
  durably: the rebuilt files are not synced);
- a snapshot past the log end is deleted (no local log continues it); one before the
  log head ends the search (the entries after it are gone).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from consumequeue import ConsumeQueueError, ConsumeQueueStore, KeyIndex
from dledger.store import BODY_OFFSET, MAGIC_NORMAL, FileStore
from dledger.store.meta import fsync_dir

from .batch import INNER_BATCH_FLAG, batch_inners
from .message import MessageFormatError, decode_head
from .metadata import MetadataState, SnapshotFiles

log = logging.getLogger(__name__)

ENTRY_HEAD = struct.Struct(">iiqqq")  # magic, size, index, term, pos (docs/formats.md)

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


def parse_queue_table(raw: Any) -> dict[tuple[str, int], int]:
    """``{"topic/queue_id": next_offset}`` → ``{(topic, queue_id): next_offset}``."""
    if not isinstance(raw, dict):
        raise ValueError("the snapshot has no queue table")
    out: dict[tuple[str, int], int] = {}
    for key, next_offset in raw.items():
        topic, _, queue_id = str(key).rpartition("/")
        if (
            not topic
            or not queue_id.isdigit()
            or not isinstance(next_offset, int)
            or next_offset < 0
        ):
            raise ValueError(f"bad queue table entry {key!r}: {next_offset!r}")
        out[topic, int(queue_id)] = next_offset
    return out


def last_index_within(store: FileStore, commitlog_offset: int, hi: int) -> int:
    """The last entry up to ``hi`` whose message starts at or before
    ``commitlog_offset`` (``begin - 1`` when none): a binary search over the log."""
    lo = store.ledger_begin_index - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if store.get_meta(mid).pos + BODY_OFFSET <= commitlog_offset:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pos_of(store: FileStore, index: int) -> int:
    """The byte position of entry ``index`` (or of the ledger end past the last)."""
    if index > store.ledger_end_index:
        return store.ledger_end_pos
    if index < store.ledger_begin_index:
        return store.ledger_begin_pos
    return store.get_meta(index).pos


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    index: int
    raw: bytes
    servable: bool  # it has a queue table (older snapshots lack it): Raft may send it
    queues: Any  # that queue table as stored


class Recovery:
    """One restart's look at the files: the store (read only), the derived files it cuts
    back, the metadata it replaces with a snapshot's."""

    def __init__(
        self,
        store: FileStore,
        cq: ConsumeQueueStore,
        keys: KeyIndex,
        meta: MetadataState,
        snapshots: SnapshotFiles,
        *,
        checkpoint_path: Path,
    ) -> None:
        self.store = store
        self.cq = cq
        self.keys = keys
        self.meta = meta
        self.snapshots = snapshots
        self.checkpoint_path = checkpoint_path
        self.keys_restored = True  # False: key index files were dropped as damaged

    def load_snapshot(self) -> LoadedSnapshot | None:
        """Adopt the newest readable metadata snapshot the local log can continue."""
        store = self.store
        for index in reversed(self.snapshots.indexes()):
            if index > store.ledger_end_index:
                # No local log continues it: an install that crashed before the log was
                # reset (Raft sends it again), or entries a power loss took. Kept, it
                # would crowd the usable snapshots out of the few that are kept.
                log.warning("metadata snapshot %d is past the log end: deleted", index)
                self.snapshots.path(index).unlink(missing_ok=True)
                continue
            if index < store.ledger_begin_index - 1:
                break  # the entries after it are gone
            try:
                raw = self.snapshots.path(index).read_bytes()
                loaded, extra = MetadataState.from_snapshot(raw, self.meta.max_sessions)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("metadata snapshot %d unusable, trying an older one: %s", index, e)
                continue
            self.meta.adopt(loaded)
            return LoadedSnapshot(index, raw, "queues" in extra, extra.get("queues"))
        if store.ledger_begin_index > 0:
            log.error(
                "no metadata snapshot for a log that begins at entry %d", store.ledger_begin_index
            )
        return None

    def restore_checkpoint(self) -> int | None:
        """Cut the consume queues and the key index back to exactly what the checkpoint
        recorded; its dispatched index, or None when it cannot be trusted."""
        checkpoint = read_checkpoint(self.checkpoint_path)
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
            # (``checkpoint`` makes the store's commit point durable first, so only a
            # damaged store gets here).
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
        self.keys_restored = self.keys.restore(keys)
        if self.keys.last_commitlog_offset >= cut:  # not the files it recorded: index anew
            self.keys.clear()
            self.keys_restored = False
        return index

    def start_over(self, snapshot: LoadedSnapshot | None) -> None:
        """No checkpoint to trust: empty queues and key index, to be rebuilt from the log
        head. The old checkpoint goes first, durably: the rebuilt files are not synced,
        and a later restart must not take them for what it recorded."""
        self.checkpoint_path.unlink(missing_ok=True)
        fsync_dir(self.checkpoint_path.parent)
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
            raw, count, _ = store.read_batch(index, 4 << 20, s - index + 1)
            assert count > 0, f"committed entry {index} is not in the log"
            off = 0
            for _ in range(count):
                magic, size, i, _term, pos = ENTRY_HEAD.unpack_from(raw, off)
                found = self._queue_of(raw, off + BODY_OFFSET, magic, i, pos)
                off += size
                if found is not None:
                    key, messages = found
                    held[key] = held.get(key, 0) + messages
            index += count
        for key, next_offset in sorted(table.items()):
            first = next_offset - held.get(key, 0)
            if first > 0:
                self.cq.queue(*key).reset(first)

    def _queue_of(
        self, raw: bytes, body_at: int, magic: int, index: int, pos: int
    ) -> tuple[tuple[str, int], int] | None:
        """The queue the entry at ``raw[body_at - 48:]`` goes into, by the metadata held
        (dispatch's rule, ``MetadataState.queued``), and how many messages it holds."""
        if magic != MAGIC_NORMAL:
            return None
        try:
            info = decode_head(raw, body_at)
            count = len(batch_inners(raw, body_at)[1]) if info.sys_flag & INNER_BATCH_FLAG else 1
        except MessageFormatError:
            return None
        if info.physical_offset != pos + BODY_OFFSET or not self.meta.queued(
            info.topic, info.queue_id, index
        ):
            return None
        return (info.topic, info.queue_id), count

    def drop_stale_topics(self, index: int) -> None:
        """Drop the queues of topics the metadata says were deleted (or deleted and
        created anew) after ``index``: a newer snapshot's deletes are not replayed."""
        for name in list(self.cq.topics()):
            t = self.meta.topics.get(name)
            if t is None or t.created_index >= index:
                self.cq.delete_topic(name)
