"""``ConsumeQueue``: the index of one (topic, queue_id), queue offset → message position.

Layout (docs/formats.md): ``<root>/<topic>/<queue_id>/<20-digit start byte position>`` segment
files of ``segment_units`` 20-byte units, each ``commitlog_offset i64 | size i32 |
tags_hash i64`` big-endian; queue offset N lives at byte N*20 of the logical file. The
segments are ``dledger.store.mmapfile`` segments (RocketMQ's MappedFileQueue), so a queue
reuses the log's truncation, head deletion and fsync bookkeeping.

What a queue costs (issue 31: topics must be cheap): a segment is a sparse file, and disk
blocks are allocated (``posix_fallocate``) only ahead of the write position, in chunks
that double from one page up to ``max_reserve_units`` units, so a nearly empty queue
takes a page of disk, not a 6 MB segment. Its mapping is ``MADV_RANDOM``: a store to a
fresh page faults in that page alone. With the kernel's default read-around (the
device's ``read_ahead_kb``, 8 MiB on the VM measured), the first store into a new
segment zero-filled the whole 6 MB segment into the page cache (82 % of the master's
event-loop CPU with 1,000 topics), once per queue.

A queue whose units are all synced can be ``suspend``ed: its segments are unmapped and
their descriptors closed (the store does it to the least recently used queues past
``max_open_queues``); its positions stay in memory, and any use maps the segments
again (``_resume``), with no recovery: nothing changed on disk meanwhile.

Invariants:
- the queue holds exactly the units ``[min_offset, max_offset)``; every one has
  ``size > 0`` and ``commitlog_offset >= 0``, so a written unit is never all zero and a
  zero unit marks the unwritten tail of a preallocated segment;
- units only grow along a queue: a unit's ``commitlog_offset`` is at or after the end
  (``commitlog_offset + size``) of the unit before it, because queue offsets are assigned
  in log order, or it repeats that unit's record (the same end: the messages of one
  batch record each have a unit pointing at it). Every lookup by commitlog offset or
  store time is a binary search on this; ``put`` refuses a unit that would break it;
- ``put`` is idempotent: re-dispatching a committed entry finds its unit already there
  and changes nothing; a different unit at the same offset is a broken invariant;
- bytes after ``max_offset`` in the tail segment are zero (truncation zeroes what it
  drops, recovery zeroes what a crash left), so a reader never mistakes stale bytes for
  units.

Recovery (on open): the tail of the last ``recovery_tail_segments`` segments is checked;
the log ends at the first all-zero unit, then torn units before it (size <= 0, negative
or shrinking commitlog offset) are dropped, a short file is cut back to a whole unit, and
stale bytes after the end are zeroed. A crash can still leave a unit whose tags hash was
torn but whose offset and size look valid, or units ahead of the committed log: the
queue is derived state, so the broker compares it against the commitlog on restart
(``truncate_dirty_tail``) and can always rebuild it.

``min_offset`` after reopen is the first unit on disk (or the ``reset`` point, kept in a
small ``reset_offset`` file next to the segments); the broker re-derives the retention
head by calling ``correct_min_offset`` with the log's begin position on startup.

Thread safety: the owner serialises every call; only ``flush`` may run on another thread
(it takes the segment list's ``flush_lock``, which deletions also take).
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from dledger.store.mmapfile import (
    NAME_DIGITS,
    MmapFile,
    MmapFileList,
    StoreFileError,
    first_zero_record,
    segment_name,
)

from .errors import ConsumeQueueError, ConsumeQueueGapError

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size
RESET_FILE = "reset_offset"
_ZERO_CHUNK = 1 << 16
_ZEROS = bytes(_ZERO_CHUNK)
_PAGE = mmap.PAGESIZE
assert UNIT_SIZE == 20

Unit = tuple[int, int, int]
"""(commitlog_offset, size, tags_hash)."""


@dataclass(frozen=True, slots=True)
class ConsumeQueueSettings:
    """Limits of one consume queue; the defaults are RocketMQ's where it has one."""

    segment_units: int = 300_000
    """Units per segment file (RocketMQ: 300,000 units = 6,000,000 bytes)."""
    recovery_tail_segments: int = 3
    """How many trailing segments recovery checks for a torn or unwritten tail
    (RocketMQ starts its consume-queue check at the third-last file)."""
    max_read_units: int = 65_536
    """Upper bound on the units one ``read`` returns, whatever the caller asks for."""
    max_reserve_units: int = 16_384
    """Disk blocks are allocated ahead of the write position in chunks that double from
    one page up to this many units (320 KiB): an idle queue holds a page of disk, a busy
    one allocates rarely."""
    max_open_queues: int = 4096
    """Queues whose segments are mapped at once (each segment holds two descriptors and
    a mapping); past it the store suspends the least recently used queues whose units
    are synced (``ConsumeQueueStore``), which map theirs again when used."""

    def __post_init__(self) -> None:
        if self.segment_units < 1:
            raise ValueError(f"segment_units must be >= 1, got {self.segment_units}")
        if self.recovery_tail_segments < 1:
            raise ValueError(
                f"recovery_tail_segments must be >= 1, got {self.recovery_tail_segments}"
            )
        if self.max_read_units < 1:
            raise ValueError(f"max_read_units must be >= 1, got {self.max_read_units}")
        if self.max_reserve_units < 1:
            raise ValueError(f"max_reserve_units must be >= 1, got {self.max_reserve_units}")
        if self.max_open_queues < 1:
            raise ValueError(f"max_open_queues must be >= 1, got {self.max_open_queues}")

    @property
    def segment_bytes(self) -> int:
        return self.segment_units * UNIT_SIZE


class ConsumeQueue:
    """One (topic, queue_id) index under ``<directory>/<topic>/<queue_id>/``."""

    def __init__(
        self, directory: Path, topic: str, queue_id: int, settings: ConsumeQueueSettings
    ) -> None:
        if queue_id < 0:
            raise ValueError(f"queue_id must be >= 0, got {queue_id}")
        self.topic = topic
        self.queue_id = queue_id
        self.settings = settings
        self.path = directory / topic / str(queue_id)
        self._segment_bytes = settings.segment_bytes
        self._max_reserve = max(_PAGE, settings.max_reserve_units * UNIT_SIZE)
        self._files = MmapFileList(self.path, self._segment_bytes)
        self._min_offset = 0
        self._max_offset = 0
        # End of the last unit in [min, max), -1 when the queue is empty; the next unit
        # may not start before it (units only grow).
        self._last_end = -1
        # The segment ``put`` writes to and its mapping, cached: the hot path does one
        # pack_into and three attribute updates.
        self._tail: MmapFile | None = None
        self._tail_mm: mmap.mmap | None = None
        self._dir_dirty = False
        self._closed = False
        # Suspended: the segments starting here are closed (``suspend``), reopened on use.
        self._suspended: list[int] | None = None
        self._suspended_head = 0  # the first unit's commitlog offset, while suspended
        self.on_resume: Callable[[ConsumeQueue], None] | None = None  # the store's LRU
        try:
            self._load()
        except BaseException:
            self._files.close()
            raise

    def __repr__(self) -> str:
        return (
            f"ConsumeQueue({self.topic}/{self.queue_id}, [{self._min_offset}, {self._max_offset}))"
        )

    # ---- positions -----------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The first queue offset still held."""
        return self._min_offset

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written (one past the last unit)."""
        return self._max_offset

    @property
    def max_commitlog_offset_end(self) -> int:
        """``commitlog_offset + size`` of the last unit, or -1 when the queue holds no unit
        (new, reset, or emptied by ``correct_min_offset``/``truncate_dirty_tail``)."""
        return self._last_end

    # ---- writing ---------------------------------------------------------------------------

    def put(self, queue_offset: int, commitlog_offset: int, size: int, tags_hash: int) -> bool:
        """Dispatch one unit. Appends and returns True at ``max_offset``; returns False when
        the same unit is already there (re-dispatch) or the offset is below ``min_offset``
        (already dropped by retention or before a ``reset``).

        Raises ``ConsumeQueueGapError`` past ``max_offset`` and ``ConsumeQueueError`` when a
        different unit is already there or the unit would break the order invariant.
        """
        if queue_offset == self._max_offset:
            if (
                size <= 0
                or commitlog_offset < 0
                or (commitlog_offset < self._last_end and commitlog_offset + size != self._last_end)
            ):
                self._refuse_append(queue_offset, commitlog_offset, size)
            f, mm = self._tail, self._tail_mm
            if f is None or mm is None or f.wrote == self._segment_bytes:
                f, mm = self._tail_for_append()
            if f.wrote + UNIT_SIZE > f.reserved:
                self._reserve(f)
            # A store through the mapping, ~5x cheaper than a pwrite per unit; its disk
            # blocks were allocated by ``_reserve``, so a full disk fails that, not this
            # store (a store into a hole of a full disk is SIGBUS, not an exception).
            UNIT.pack_into(mm, f.wrote, commitlog_offset, size, tags_hash)
            f.wrote += UNIT_SIZE
            self._max_offset = queue_offset + 1
            self._last_end = commitlog_offset + size
            return True
        return self._put_existing(queue_offset, (commitlog_offset, size, tags_hash))

    def put_batch(self, queue_offset: int, units: Iterable[Unit]) -> int:
        """``put`` consecutive units from ``queue_offset`` on; returns how many were
        appended (the others were already there)."""
        appended = 0
        put = self.put
        for commitlog_offset, size, tags_hash in units:
            appended += put(queue_offset, commitlog_offset, size, tags_hash)
            queue_offset += 1
        return appended

    def _put_existing(self, queue_offset: int, unit: Unit) -> bool:
        if queue_offset > self._max_offset:
            raise ConsumeQueueGapError(self.topic, self.queue_id, self._max_offset, queue_offset)
        if queue_offset < self._min_offset:
            return False
        held = self._unit(queue_offset)
        if held != unit:
            raise ConsumeQueueError(
                f"consume queue {self.topic}/{self.queue_id}: queue offset {queue_offset}"
                f" holds (commitlog_offset, size, tags_hash) = {held}, a re-dispatch put {unit}"
            )
        return False

    def _refuse_append(self, queue_offset: int, commitlog_offset: int, size: int) -> NoReturn:
        raise ConsumeQueueError(
            f"consume queue {self.topic}/{self.queue_id}: unit at queue offset {queue_offset}"
            f" (commitlog_offset {commitlog_offset}, size {size}) must have size > 0 and"
            f" start at or after the previous unit's end {max(self._last_end, 0)} (or repeat"
            " its record)"
        )

    def _reserve(self, f: MmapFile) -> None:
        """Allocate disk blocks from ``f.wrote`` on: a page at first, then as many bytes
        as the segment holds already (the chunks double), at most ``max_reserve_units``
        units. Raises ``OSError`` (``ENOSPC``) having changed nothing."""
        ahead = min(max(_PAGE, f.wrote - f.wrote % _PAGE), self._max_reserve)
        f.reserve(f.wrote + UNIT_SIZE, ahead)

    def _tail_for_append(self) -> tuple[MmapFile, mmap.mmap]:
        """The segment ``put`` writes to when the cached one is not it: the tail of a
        suspended queue, mapped again, or a new segment."""
        if self._suspended is not None:
            self._resume()
            f, mm = self._tail, self._tail_mm
            if f is not None and mm is not None and f.wrote < self._segment_bytes:
                return f, mm
        return self._roll()

    def _roll(self) -> tuple[MmapFile, mmap.mmap]:
        """Create the segment that holds ``max_offset`` (after the last one, or the one a
        ``reset`` point falls in): sparse, its blocks allocated by ``_reserve``."""
        pos = self._max_offset * UNIT_SIZE
        start = pos - pos % self._segment_bytes
        f = _open_segment(self.path / segment_name(start), start, self._segment_bytes, True)
        f.wrote = f.flushed = pos - start
        self._files.files.append(f)
        self._dir_dirty = True
        self._set_tail()
        return f, f.mm

    def _set_tail(self) -> None:
        files = self._files.files
        self._tail = files[-1] if files else None
        self._tail_mm = self._tail.mm if self._tail is not None else None

    # ---- reading ---------------------------------------------------------------------------

    def _unit(self, queue_offset: int) -> Unit:
        if self._suspended is not None:
            self._resume()
        pos = queue_offset * UNIT_SIZE
        f = self._files.segment_for(pos)
        assert f is not None, (self, queue_offset)
        c, s, t = UNIT.unpack_from(f.mm, pos - f.start)
        return c, s, t

    def get(self, queue_offset: int) -> Unit | None:
        """(commitlog_offset, size, tags_hash) at ``queue_offset``, None outside
        ``[min_offset, max_offset)``."""
        if not self._min_offset <= queue_offset < self._max_offset:
            return None
        return self._unit(queue_offset)

    def read(self, from_queue_offset: int, max_units: int) -> list[tuple[int, int, int, int]]:
        """(queue_offset, commitlog_offset, size, tags_hash) for the offsets from
        ``max(from_queue_offset, min_offset)`` on, at most ``max_units`` (clamped to the
        ``max_read_units`` setting); one slice per segment."""
        if self._suspended is not None:
            self._resume()
        queue_offset = max(from_queue_offset, self._min_offset)
        end = min(self._max_offset, queue_offset + min(max_units, self.settings.max_read_units))
        out: list[tuple[int, int, int, int]] = []
        while queue_offset < end:
            pos = queue_offset * UNIT_SIZE
            f = self._files.segment_for(pos)
            assert f is not None, (self, queue_offset)
            seg_end = min(end, f.limit // UNIT_SIZE)
            buf = f.mm[pos - f.start : seg_end * UNIT_SIZE - f.start]
            units = UNIT.iter_unpack(buf)
            out.extend(
                (n, c, s, t)
                for n, (c, s, t) in zip(range(queue_offset, seg_end), units, strict=True)
            )
            queue_offset = seg_end
        return out

    def read_raw(self, from_queue_offset: int, max_units: int) -> tuple[int, bytes]:
        """``read`` without unpacking: (first queue offset, the units' 20-byte big-endian
        bytes back to back). One copy per segment and no object per unit, for callers
        that decode a whole page at once (the Arrow pull)."""
        if self._suspended is not None:
            self._resume()
        queue_offset = first = max(from_queue_offset, self._min_offset)
        end = min(self._max_offset, queue_offset + min(max_units, self.settings.max_read_units))
        parts: list[bytes] = []
        while queue_offset < end:
            pos = queue_offset * UNIT_SIZE
            f = self._files.segment_for(pos)
            assert f is not None, (self, queue_offset)
            seg_end = min(end, f.limit // UNIT_SIZE)
            parts.append(f.mm[pos - f.start : seg_end * UNIT_SIZE - f.start])
            queue_offset = seg_end
        return first, parts[0] if len(parts) == 1 else b"".join(parts)

    def first_offset_at_or_after(self, predicate_reached: Callable[[int, int], bool]) -> int:
        """The first queue offset in ``[min_offset, max_offset)`` whose unit's
        (commitlog_offset, size) satisfies ``predicate_reached``, or ``max_offset`` if
        none. The predicate must be monotonic along the queue (false…false, true…true),
        e.g. "the message's store time is >= T"; it is called O(log n) times."""
        lo, hi = self._min_offset, self._max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            c, s, _ = self._unit(mid)
            if predicate_reached(c, s):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _first_at_or_after_commitlog(self, commitlog_offset: int) -> int:
        return self.first_offset_at_or_after(lambda c, _s: c >= commitlog_offset)

    # ---- truncation, retention, reset ------------------------------------------------------

    def truncate_dirty_tail(self, commitlog_offset: int) -> int:
        """Drop every unit whose commitlog offset is at or after ``commitlog_offset`` (a
        suffix, since units only grow); returns the new ``max_offset``."""
        return self.truncate(self._first_at_or_after_commitlog(commitlog_offset))

    def truncate(self, max_offset: int) -> int:
        """Drop the units at and after ``max_offset`` (not below ``min_offset``), zeroing
        them; returns the new ``max_offset``. Recovery cuts a queue back to the length a
        checkpoint recorded this way: no search through units a power loss may have torn."""
        new_max = max(max_offset, self._min_offset)
        if new_max < self._max_offset:
            if self._suspended is not None:
                self._resume()
            self._files.truncate(new_max * UNIT_SIZE)
            self._max_offset = new_max
            self._set_tail()
            self._last_end = self._end_of_last_unit()
        return self._max_offset

    def correct_min_offset(self, min_commitlog_offset: int) -> int:
        """Retention moved the commitlog head to ``min_commitlog_offset``: the queue now
        starts at its first unit at or after it; segment files wholly below the new
        ``min_offset`` are deleted (never the last one). Returns the new ``min_offset``.
        Never moves ``min_offset`` back. A suspended queue whose first unit is at or
        after it stays suspended: retention moving the log head does not map every
        queue of the node again."""
        if self._suspended is not None:
            if min_commitlog_offset <= self._suspended_head:
                return self._min_offset
            self._resume()
        new_min = self._first_at_or_after_commitlog(min_commitlog_offset)
        if new_min > self._min_offset:
            self._min_offset = new_min
            self._last_end = self._end_of_last_unit()
        self._files.delete_head(self._min_offset * UNIT_SIZE, len(self._files.files))
        return self._min_offset

    def reset(self, queue_offset: int) -> None:
        """Delete every segment; the queue restarts empty at ``queue_offset`` (a follower
        installed a snapshot). The point is kept in ``reset_offset`` so a reopen finds
        it. Not atomic across a crash: the files go first, so a crash in between leaves
        an empty queue at the previous reset point, which the broker's re-run fixes."""
        if queue_offset < 0:
            raise ValueError(f"queue offset must be >= 0, got {queue_offset}")
        if self._suspended is not None:
            self._resume()
        self._files.reset(queue_offset * UNIT_SIZE)
        self._set_tail()
        self._files.fsync_dir()
        tmp = self.path / (RESET_FILE + ".tmp")
        with open(tmp, "w") as out:
            out.write(f"{queue_offset}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path / RESET_FILE)
        self._files.fsync_dir()
        self._min_offset = self._max_offset = queue_offset
        self._last_end = -1

    # ---- durability, lifecycle -------------------------------------------------------------

    def flush(self) -> None:
        """fsync the segments with unsynced units (and the directory after a roll)."""
        todo = self._files.unflushed()
        if todo:
            self._files.sync(todo)
        if self._dir_dirty:
            self._dir_dirty = False
            self._files.fsync_dir()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def suspended(self) -> bool:
        """Its segments are closed until it is used again (``suspend``)."""
        return self._suspended is not None

    def suspend(self) -> bool:
        """Unmap and close the segments if every unit is synced (the directory too), to
        map them again on the next use; False, changing nothing, when some are not (or
        it is closed or suspended already)."""
        files = self._files.files
        if self._closed or self._suspended is not None or self._dir_dirty:
            return False
        if self._files.unflushed():
            return False
        starts = [f.start for f in files]
        # The first unit's commitlog offset (any when empty): ``correct_min_offset``
        # below it has nothing to do.
        empty = self._max_offset <= self._min_offset
        self._suspended_head = 1 << 62 if empty else self._unit(self._min_offset)[0]
        self._files.close()
        self._tail = self._tail_mm = None
        self._suspended = starts
        return True

    def _resume(self) -> None:
        """Map the segments of a suspended queue again, as they were: every one full but
        the last, which ends at ``max_offset`` (all synced before ``suspend``)."""
        starts = self._suspended
        assert starts is not None and not self._closed, self
        end_pos = self._max_offset * UNIT_SIZE
        files = self._files.files
        try:
            for start in starts:
                f = _open_segment(
                    self.path / segment_name(start), start, self._segment_bytes, False
                )
                f.wrote = f.flushed = min(self._segment_bytes, max(0, end_pos - start))
                files.append(f)
        except BaseException:
            self._files.close()
            raise
        self._suspended = None
        self._set_tail()
        if self.on_resume is not None:
            self.on_resume(self)

    def close(self) -> None:
        self._closed = True
        self._suspended = None
        self._files.close()
        self._tail = self._tail_mm = None

    def destroy(self) -> None:
        """Close and delete the queue's directory."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    # ---- loading and recovery --------------------------------------------------------------

    def _end_of_last_unit(self) -> int:
        if self._max_offset <= self._min_offset:
            return -1
        c, s, _ = self._unit(self._max_offset - 1)
        return c + s

    def _read_reset_offset(self) -> int:
        path = self.path / RESET_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        try:
            value = int(raw.decode("ascii").strip())
        except ValueError:  # UnicodeDecodeError included
            raise ConsumeQueueError(f"{path}: not a queue offset: {raw[:40]!r}") from None
        if value < 0:
            raise ConsumeQueueError(f"{path}: negative queue offset {value}")
        return value

    def _segment_starts(self) -> list[int]:
        starts: list[int] = []
        for p in self.path.iterdir():
            name = p.name
            if name == RESET_FILE:
                continue
            if name.endswith(".tmp"):  # an interrupted reset
                p.unlink()
                continue
            if len(name) != NAME_DIGITS or not name.isdigit() or not p.is_file():
                raise ConsumeQueueError(f"{p}: unexpected file in a consume queue directory")
            starts.append(int(name))
        starts.sort()
        for k, start in enumerate(starts):
            if start % self._segment_bytes or (k and start != starts[k - 1] + self._segment_bytes):
                raise ConsumeQueueError(
                    f"{self.path / segment_name(start)}: segments are not contiguous multiples"
                    f" of the segment size {self._segment_bytes} (was segment_units changed?)"
                )
        return starts

    def _load(self) -> None:
        reset_offset = self._read_reset_offset()
        starts = self._segment_starts()
        files = self._files.files
        for start in starts:
            path = self.path / segment_name(start)
            actual = path.stat().st_size
            if actual < self._segment_bytes:
                _extend_short_segment(path, actual, self._segment_bytes)
            try:
                f = _open_segment(path, start, self._segment_bytes, False)
            except StoreFileError as e:
                raise ConsumeQueueError(str(e)) from e
            f.wrote = f.flushed = self._segment_bytes
            files.append(f)
        # Units before a reset point in its segment were never written (zero). Segments
        # wholly below it can only be left over from a reset a crash interrupted.
        min_pos = reset_offset * UNIT_SIZE
        while files and files[0].limit <= min_pos:
            files.pop(0).destroy()
        if not files:
            self._files.reset(min_pos)
            self._min_offset = self._max_offset = reset_offset
            return
        self._min_offset = max(reset_offset, files[0].start // UNIT_SIZE)
        end_pos = self._recover_end()
        self._set_end(end_pos)
        self._max_offset = end_pos // UNIT_SIZE
        self._set_tail()
        self._last_end = self._end_of_last_unit()

    def _recover_end(self) -> int:
        """Byte position just past the last valid unit (see the module docstring)."""
        files = self._files.files
        min_pos = self._min_offset * UNIT_SIZE
        end_pos = files[-1].limit
        for f in files[max(0, len(files) - self.settings.recovery_tail_segments) :]:
            lo = max(0, min_pos - f.start)
            if lo >= f.size:
                continue
            rel = first_zero_record(f.mm, lo, f.size, UNIT_SIZE)
            if rel is not None:
                end_pos = f.start + rel
                break
        end_pos = max(end_pos, min_pos)
        # Drop torn units from the end: each step looks at one unit and the one before it.
        while end_pos > min_pos:
            c, s, _ = self._unit_at(end_pos - UNIT_SIZE)
            prev_end = 0
            if end_pos - UNIT_SIZE > min_pos:
                pc, ps, _ = self._unit_at(end_pos - 2 * UNIT_SIZE)
                prev_end = pc + ps
            if s > 0 and (c >= prev_end or (end_pos - UNIT_SIZE > min_pos and c + s == prev_end)):
                break
            end_pos -= UNIT_SIZE
        return end_pos

    def _unit_at(self, pos: int) -> Unit:
        f = self._files.segment_for(pos)
        assert f is not None, (self, pos)
        c, s, t = UNIT.unpack_from(f.mm, pos - f.start)
        return c, s, t

    def _set_end(self, end_pos: int) -> None:
        """Recovery: the queue ends at ``end_pos``; later segments go, and every non-zero
        byte after it in its segment is zeroed. The whole rest of the segment is checked,
        not just up to the first zero chunk: a power loss can drop a page in the middle
        of the unsynced tail and keep the ones after it."""
        files = self._files.files
        while len(files) > 1 and files[-1].start >= end_pos:
            files.pop().destroy()
        last = files[-1]
        rel = end_pos - last.start
        last.wrote = last.flushed = rel
        mm = last.mm
        while rel < last.size:
            n = min(_ZERO_CHUNK, last.size - rel)
            if mm[rel : rel + n] != _ZEROS[:n]:
                last.zero(rel, rel + n)
            rel += n


def _open_segment(path: Path, start: int, size: int, create: bool) -> MmapFile:
    """A segment mapped for random access: a fault reads in the faulting page only, not
    the kernel's read-around window (``read_ahead_kb``, up to the whole segment), which
    for a new segment meant zero-filling all of it on the first store."""
    f = MmapFile(path, start, size, create=create)
    try:
        f.mm.madvise(mmap.MADV_RANDOM)
    except BaseException:
        f.close()
        raise
    return f


def _extend_short_segment(path: Path, actual: int, segment_bytes: int) -> None:
    """A segment cut short (a copy, an operator, a crash before its allocation): drop a
    trailing partial unit, which zero-extension would make look written, then extend it
    (sparse) to the full size; ``_reserve`` allocates blocks before a store."""
    fd = os.open(path, os.O_RDWR)
    try:
        if actual % UNIT_SIZE:
            os.ftruncate(fd, actual - actual % UNIT_SIZE)
        os.ftruncate(fd, segment_bytes)
    finally:
        os.close(fd)
