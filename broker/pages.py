"""Raw pages: what a pull found, as stored, for columnar encoders (the Arrow pull).

A ``RawPage`` is the found messages' consume-queue units (20 bytes each, big-endian
``commitlog_offset i64 | size i32 | tags_hash i64``, in queue order) and a way to look at
the committed log bytes holding their records. ``RawPage.encode`` hands an encoder one
``RecordChunk`` at a time: a zero-copy view of a stretch of the log (``FileStore.view``)
and the units of the records in it. Nothing is decoded, copied or made per message here:
the encoder reads the fields it needs straight out of the view, a chunk at a time, and
copies only the bytes it keeps. (Messages of other queues sit between a queue's records,
so a page of one queue among eight spans eight times the bytes it holds: copying the
span first would cost more than encoding it.)

Invariants:
- the messages of a batch record (``broker.batch``) each have a unit, all naming the
  record: its bytes count once, and the unit's queue offset says which message it is;
- every unit of a chunk lies inside its view: ``base <= commitlog_offset`` and
  ``commitlog_offset + size <= base + len(data)``;
- a chunk's records do not overlap and come in commitlog order (units only grow along a
  queue), so they can be cut out of the view by offsets alone;
- a chunk lies within one commitlog segment (a view never crosses one) and spans at most
  ``max_span_bytes`` unless it holds a single record: the log's lock is held while a view
  is open, and this bounds how long;
- a view is valid only during the encoder's call, which must copy what it keeps;
- with a ``check``, every record of a chunk is verified before the encoder sees it: the
  view then starts at the first record's DLedger entry header (48 bytes before it; the
  later records' headers lie between records anyway) and each record must match its
  header's body CRC, so a damaged copy is never served (the JSON pull checks too).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

from consumequeue.queue import UNIT, UNIT_SIZE
from dledger.store import BODY_OFFSET

DEFAULT_MAX_SPAN_BYTES = 16 << 20

View = Callable[[int, int], AbstractContextManager[memoryview]]
Check = Callable[[memoryview, bytes, int], None]
"""``check(data, units, base)``: raise if a record of the chunk is damaged."""
R = TypeVar("R")

_ENTRY_TAIL = struct.Struct(">II")  # body crc, body size: the entry header's last 8 bytes


def units_within(units: bytes, max_bytes: int) -> bytes:
    """The first of ``units`` whose records hold at most ``max_bytes`` together, and
    at least one: a record bigger than the budget is a page of its own.

    A queue's records lie in commitlog order, so together they hold at most the span
    from the first one's start to the last one's end: a page whose span fits (every
    page but a rare one of huge messages) is taken whole without a look at each unit.
    The messages of a batch record share its unit's record, counted once."""
    if not units:
        return units
    first, _, _ = UNIT.unpack_from(units, 0)
    last, last_size, _ = UNIT.unpack_from(units, len(units) - UNIT_SIZE)
    if last + last_size - first <= max_bytes:
        return units
    total, previous = 0, -1
    for i, (offset, size, _) in enumerate(UNIT.iter_unpack(units)):
        if offset == previous:
            continue
        previous = offset
        total += size
        if total > max_bytes and i:
            return units[: i * UNIT_SIZE]
    return units


def damaged_record(data: memoryview, units: bytes, base: int) -> int | None:
    """The commitlog offset of the first record in ``data`` (from commitlog offset
    ``base`` on) whose entry header's body CRC or size does not hold, None if all hold.
    Each record's header ends right before it (docs/formats.md: BODY_OFFSET = 48)."""
    crc32, unpack_tail = zlib.crc32, _ENTRY_TAIL.unpack_from
    for offset, size in distinct_records(units):
        rel = offset - base
        body_crc, body_size = unpack_tail(data, rel - 8)
        if body_size != size or crc32(data[rel : rel + size]) != body_crc:
            return int(offset)
    return None


def distinct_records(units: bytes) -> list[tuple[int, int]]:
    """``(commitlog_offset, size)`` of each record the units name, once each, in order:
    the messages of a batch record share its unit's record (two C calls and a dict, not
    a Python step per unit)."""
    n = len(units) // UNIT_SIZE
    offsets = struct.unpack_from(">" + "q12x" * n, units)
    sizes = struct.unpack_from(">" + "8xi8x" * n, units)
    return list(dict.fromkeys(zip(offsets, sizes, strict=True)))


@dataclass(frozen=True, slots=True)
class RecordChunk:
    data: memoryview
    """A view of the log from ``base`` on, valid during the encoder's call only."""
    units: bytes
    """The consume-queue units of the chunk's records, back to back."""
    base: int
    """The commitlog offset of ``data[0]``: a record starts at ``commitlog_offset - base``."""
    queue_offsets: Sequence[int] = ()
    """The units' queue offsets (``RawPage.queue_offsets``), when the page has them."""

    @property
    def count(self) -> int:
        return len(self.units) // UNIT_SIZE


@dataclass(frozen=True, slots=True)
class RawPage:
    units: bytes
    view: View | None = None
    segment_bytes: int = 1
    max_span_bytes: int = DEFAULT_MAX_SPAN_BYTES
    check: Check | None = None
    queue_offsets: Sequence[int] = ()
    """Each unit's queue offset: what tells which message of a batch record a unit is
    (``broker.batch``: message ``queue_offset - base`` of the record)."""

    @property
    def count(self) -> int:
        return len(self.units) // UNIT_SIZE

    def encode(self, encode_chunk: Callable[[RecordChunk], R]) -> list[R]:
        """``encode_chunk`` of every chunk of the page, in order (see the module
        docstring): one view of the log per chunk, open during the call."""
        if not self.count:
            return []
        assert self.view is not None, "a page with messages has a view of the log"
        out = []
        for first, end in plan_chunks(self.units, self.segment_bytes, self.max_span_bytes):
            start, stop = _span(self.units, first, end)
            units = self.units[first * UNIT_SIZE : end * UNIT_SIZE]
            error: Exception | None = None
            head = BODY_OFFSET if self.check is not None else 0
            with self.view(start - head, stop - start + head) as data:
                records = data[head:]
                try:
                    if self.check is not None:
                        self.check(data, units, start - head)
                    offsets = self.queue_offsets[first:end]
                    out.append(encode_chunk(RecordChunk(records, units, start, offsets)))
                except Exception as e:
                    # Raised after the view's release: the traceback's frames (and those
                    # of the errors it chains to) hold buffers made from the view, which
                    # would make the release fail.
                    error = _without_tracebacks(e)
                records.release()
            if error is not None:
                raise error
        return out


def _without_tracebacks(error: Exception) -> Exception:
    """``error`` and the errors it chains to, with their tracebacks dropped."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]
    return error


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
