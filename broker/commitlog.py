"""``DLedgerCommitLog``: RocketMQ's CommitLog on top of the replicated DLedger log
(docs/formats.md).

Each record is one DLedger entry whose body is a RocketMQ CommitLog record: one message,
or a batch record holding several (``broker.batch``). Two fields are fixed on the
master, at the last moment:

- QUEUEOFFSET (byte 20) — assigned from the next-queue-offset table just before the
  batch is proposed, in the same event-loop step, so batches get contiguous offsets in
  the order they enter the log. A batch the log refuses gives its offsets back. A batch
  record's ``INNER_BASE`` property is the same number, written with it
  (``broker.batch.set_queue_base``).
- PHYSICALOFFSET (byte 28) — written by the append hook, which the store runs after it
  has fixed the entry's ``pos`` and before the bytes are written: ``pos + 48``, the
  message's real position inside the DLedger data files. Followers write the leader's
  bytes as they are, so the field is right on every replica and reading a message by
  its commitlog offset needs no lookup at all.

The next-queue-offset table is valid only on the MASTER: the ``RoleChangeHandler``
clears it when the node stops leading and rebuilds it from the consume queues before
the node becomes MASTER again.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from dledger.runtime.server import DLedgerServer
from dledger.store import BODY_OFFSET, MAGIC_NORMAL, EntryMeta

from .batch import is_batch_record, set_queue_base
from .message import PHYSICAL_OFFSET_POS, set_physical_offset, set_queue_id_and_offset
from .metadata import TopicMeta


@dataclass(frozen=True, slots=True)
class PutResult:
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    index: int  # the DLedger entry index


@dataclass(slots=True)
class OutgoingMessage:
    """An encoded record waiting for its queue: a pinned ``queue_id``, a ``sharding_key``
    (hashed to a fixed queue, for ordered messages), or neither (round-robin)."""

    record: bytearray
    queue_id: int | None = None
    sharding_key: str | None = None
    count: int = 1  # messages in the record: a batch record (``broker.batch``) holds more


def sharding_queue(key: str, queues: int) -> int:
    """A fixed queue per key: CRC-32 of the UTF-8 key, the same on every master."""
    return zlib.crc32(key.encode()) % queues


class DLedgerCommitLog:
    def __init__(self, server: DLedgerServer) -> None:
        self.server = server
        # (topic, queue id) → the next queue offset; MASTER only (see the module doc).
        self.queue_table: dict[tuple[str, int], int] = {}
        self._round_robin: dict[str, int] = {}
        server.add_append_hook(self._append_hook)

    @staticmethod
    def _append_hook(meta: EntryMeta, entry: memoryview, body_offset: int) -> None:
        # NOOP entries (and anything too short to be a message) carry no record.
        if meta.magic != MAGIC_NORMAL or len(entry) < body_offset + PHYSICAL_OFFSET_POS + 8:
            return
        set_physical_offset(entry, meta.pos + body_offset, body_offset)

    def select_queues(
        self,
        topic: TopicMeta,
        batch: Sequence[tuple[int | None, str | None]],
        *,
        sticky: bool = False,
    ) -> list[int]:
        """The queue of each ``(queue_id, sharding_key)``: the pinned one, the key's, or
        the next in round robin; ``sticky``: one round-robin pick for the whole batch."""
        queues = topic.queues
        out = []
        picked: int | None = None
        for queue_id, sharding_key in batch:
            if queue_id is not None:
                qid = queue_id
            elif sharding_key is not None:
                qid = sharding_queue(sharding_key, queues)
            elif sticky and picked is not None:
                qid = picked
            else:
                qid = picked = self._round_robin.get(topic.name, 0) % queues
                self._round_robin[topic.name] = qid + 1
            out.append(qid)
        return out

    def assign_queue_offsets(
        self, topic: TopicMeta, batch: Sequence[OutgoingMessage]
    ) -> tuple[list[tuple[int, int]], Callable[[], None]]:
        """Pick each record's queue, bake (queue id, queue offset) into it and advance
        the table (by the record's message count: a batch record takes one offset per
        message, its QUEUEOFFSET the first). Returns the (queue id, queue offset) pairs
        and an ``undo`` that gives the offsets back — valid only until anything else is
        assigned, so the caller proposes (or undoes) in the same event-loop step."""
        qids = self.select_queues(topic, [(m.queue_id, m.sharding_key) for m in batch])
        table = self.queue_table
        saved: dict[tuple[str, int], int | None] = {}
        placed = []

        def undo() -> None:
            for key, old in saved.items():
                if old is None:
                    table.pop(key, None)
                else:
                    table[key] = old

        try:
            for m, qid in zip(batch, qids, strict=True):
                key = (topic.name, qid)
                if key not in saved:
                    saved[key] = table.get(key)
                queue_offset = table.get(key, 0)
                if is_batch_record(m.record):
                    set_queue_base(m.record, queue_offset)
                set_queue_id_and_offset(m.record, qid, queue_offset)
                table[key] = queue_offset + m.count
                placed.append((qid, queue_offset))
        except BaseException:
            undo()
            raise

        return placed, undo

    async def put_messages(
        self, topic: TopicMeta, batch: Sequence[OutgoingMessage]
    ) -> list[PutResult]:
        """Assign queue offsets, append, and resolve after quorum commit.

        Raises what ``DLedgerServer.append_nowait`` raises; a refused batch changes
        nothing, a proposed one fails only with ``AppendOutcomeUnknownError``."""
        queues, undo = self.assign_queue_offsets(topic, batch)
        try:
            # No await between the assignment above and this proposal: no other batch can
            # take offsets in between, so offsets follow the log order exactly.
            fut = self.server.append_nowait([m.record for m in batch])
        except BaseException:
            undo()
            raise
        placed = await fut
        return [
            PutResult(qid, queue_offset, pos + BODY_OFFSET, index)
            for (index, pos), (qid, queue_offset) in zip(placed, queues, strict=True)
        ]

    async def append_system(self, record: bytearray) -> tuple[int, int]:
        """Append one record that takes no queue offset (a metadata operation)."""
        [(index, pos)] = await self.server.append_nowait([record])
        return index, pos

    def read_record(self, commitlog_offset: int, size: int | None = None) -> memoryview:
        """The committed record at a commitlog offset, straight from the DLedger data
        files and checked: its entry's header agrees with its index unit and its body
        (the whole record) with the entry's CRC. Every read of a message goes through
        here, so no reader is served damaged bytes.

        ``size``: the record's size as a consume-queue unit gives it (a claim that a
        record starts there; without it the offset may be anyone's guess, a message id).
        Raises ``CorruptEntryError`` when this replica's copy is damaged (another
        replica's is not: read it there) and ``DLedgerError(INDEX_OUT_OF_RANGE)`` when no
        committed entry starts there (see ``DLedgerServer.read_entries``)."""
        [raw] = self.server.read_entries([(commitlog_offset - BODY_OFFSET, size)])
        return memoryview(raw)[BODY_OFFSET:]

    def read_records(self, spans: Sequence[tuple[int, int]]) -> list[memoryview]:
        """``read_record(commitlog_offset, size)`` for each ``(commitlog_offset, size)``
        of a page (consume-queue units), checked the same way, in one read of the log
        (``DLedgerServer.read_entries``); the first damaged or missing one raises."""
        raws = self.server.read_entries([(off - BODY_OFFSET, size) for off, size in spans])
        return [memoryview(raw)[BODY_OFFSET:] for raw in raws]

    def view(self, commitlog_offset: int, size: int) -> AbstractContextManager[memoryview]:
        """A zero-copy view of committed log bytes, for decoding in place: the log's lock
        is held while it is open (see ``FileStore.view``)."""
        return self.server.view(commitlog_offset, size)

    def reset_queue_table(self, table: dict[tuple[str, int], int]) -> None:
        self.queue_table = dict(table)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's queues start again at 0 if it is created anew."""
        for key in [k for k in self.queue_table if k[0] == topic]:
            del self.queue_table[key]
        self._round_robin.pop(topic, None)

    def clear_queue_table(self) -> None:
        self.queue_table = {}
