"""Raw pages: what a pull found, as stored, for columnar encoders (the Arrow pull).

A ``RawPage`` is the found messages' consume-queue units (20 bytes each, big-endian
``commitlog_offset i64 | size i32 | tags_hash i64``, in queue order) and the committed
commitlog bytes that hold their records, in ``RecordChunk``s. Nothing is decoded and no
object is made per message: an encoder reads the records' fields straight out of the
chunks, a whole page at a time.

Invariants:
- every unit of a chunk lies inside it:
  ``chunk.commitlog_offset <= unit.commitlog_offset`` and
  ``unit.commitlog_offset + unit.size <= chunk.commitlog_offset + len(chunk.data)``;
- a chunk's records do not overlap and come in commitlog order (units only grow along a
  queue), so they can be cut out of ``data`` by offsets alone;
- a chunk lies within one commitlog segment (a record never straddles two, and one read
  of the log stays in one segment) and spans at most ``max_span_bytes`` unless it holds
  a single record: messages of other queues sit between a queue's records, so a page of
  one queue among many spans more bytes than it holds, and the span is what is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from consumequeue.queue import UNIT, UNIT_SIZE

DEFAULT_MAX_SPAN_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class RecordChunk:
    commitlog_offset: int
    """Where ``data`` starts in the commitlog."""
    data: bytes
    """Committed log bytes holding every record of ``units`` (and whatever lies between)."""
    units: bytes
    """The chunk's consume-queue units, back to back."""

    @property
    def count(self) -> int:
        return len(self.units) // UNIT_SIZE


@dataclass(frozen=True, slots=True)
class RawPage:
    chunks: list[RecordChunk]

    @property
    def count(self) -> int:
        return sum(c.count for c in self.chunks)


@dataclass(frozen=True, slots=True)
class RawPullResult:
    """``PullResult`` with the messages as a ``RawPage`` (empty unless FOUND)."""

    status: str  # FOUND | NO_NEW_MSG | NO_MATCHED_MSG | OFFSET_ILLEGAL
    page: RawPage
    next_offset: int
    min_offset: int
    max_offset: int


def _span(units: bytes, first: int, end: int) -> tuple[int, int]:
    """[start, end) in the commitlog of the records of units ``first .. end - 1``."""
    start, _, _ = UNIT.unpack_from(units, first * UNIT_SIZE)
    last, size, _ = UNIT.unpack_from(units, (end - 1) * UNIT_SIZE)
    return start, last + size


def plan_chunks(
    units: bytes, segment_bytes: int, max_span_bytes: int = DEFAULT_MAX_SPAN_BYTES
) -> list[tuple[int, int]]:
    """Split the units into runs ``[first, end)`` (unit numbers, in order) whose records
    each fit one chunk (see the module docstring): halve a run until it fits. A single
    record always fits, so this ends; it looks at two units per run it tries, O(runs ·
    log n) in all, never at every unit."""
    if len(units) % UNIT_SIZE:
        raise ValueError(f"{len(units)} bytes of units is not a multiple of {UNIT_SIZE}")
    if segment_bytes < 1 or max_span_bytes < 1:
        raise ValueError("segment_bytes and max_span_bytes must be >= 1")
    n = len(units) // UNIT_SIZE
    runs: list[tuple[int, int]] = []
    todo = [(0, n)] if n else []
    while todo:
        first, end = todo.pop()
        start, stop = _span(units, first, end)
        same_segment = start // segment_bytes == (stop - 1) // segment_bytes
        if end - first == 1 or (same_segment and stop - start <= max_span_bytes):
            runs.append((first, end))
        else:
            mid = (first + end) // 2
            todo.append((mid, end))  # popped after the left half: runs stay in order
            todo.append((first, mid))
    return runs


def read_page(
    units: bytes,
    read: Callable[[int, int], bytes],
    segment_bytes: int,
    max_span_bytes: int = DEFAULT_MAX_SPAN_BYTES,
) -> RawPage:
    """The page of ``units``: one ``read(commitlog_offset, size)`` per chunk."""
    chunks = []
    for first, end in plan_chunks(units, segment_bytes, max_span_bytes):
        start, stop = _span(units, first, end)
        mine = units[first * UNIT_SIZE : end * UNIT_SIZE]
        chunks.append(RecordChunk(start, read(start, stop - start), mine))
    return RawPage(chunks)
