"""``KeyIndex``: message keys → commitlog offsets, on disk (RocketMQ's IndexFile).

Files: ``<directory>/<20-digit commitlog offset of the file's first indexed message>``,
one per file-full of entries, so names sort in dispatch order. Each file is fixed-size
(preallocated, mapped) and holds, big-endian:

- a 64-byte header: magic u32 ``LMKI`` | slot_count u32 | max_entries u32 | reserved u32
  | base_ms i64 (store time of the first entry, the origin of the deltas) | min_ms i64 |
  max_ms i64 (store-time bounds, for skipping files in a time-range query) |
  begin_commitlog_offset i64 | end_commitlog_offset i64 (first and last indexed message)
  | used_slots u32 | entry_count u32;
- ``slot_count`` hash slots of i32: slot i holds the 1-based number of the newest entry
  whose key hash lands in slot i (``hash % slot_count``), 0 = empty;
- ``max_entries`` entries of 20 bytes: key hash u32 | commitlog_offset i64 | store time
  delta ms i32 (from ``base_ms``) | previous entry number i32 in the same slot (0 = end).

The key hash is ``zlib.crc32`` of the key's UTF-8 bytes (stable across processes and
machines, C-speed). Different keys can share a hash or a slot, so a query returns
*candidates*: the caller reads each message and checks its keys.

Invariants:
- entries are appended in dispatch order, so commitlog offsets (always > 0) never
  decrease along a file or across files, and ``put`` ignores an offset at or below the
  last one indexed (re-dispatch is idempotent);
- one message's entries are all in one file (a file rolls before a message that would
  not fit, or whose store time is more than an i32 of milliseconds from ``base_ms``);
- a chain only goes back: an entry's previous entry number is smaller than its own, so
  a query walk ends; a walk that would not is reported as corruption.

Crash safety. Per message, entries are written first, then their slots, then the
header's statistics, and the entry count last: after a *process* crash, open undoes the
entries beyond the count. A *power loss* keeps any subset of the 512-byte sectors
written since the last ``flush`` (a header newer than its entries, a slot pointing at an
entry that never reached the disk, half an entry), so the owner records ``position()``
at each flush and restores it after a restart: newer files go, and the last file is
repaired to exactly the entries it counted then (all synced by that flush): slots
pointing past them and the header's statistics are recomputed from the entries,
everything after them is zeroed. A new file is fsynced with its directory before its
first entry, so a recorded position never names a file a power loss can take away.

The index is derived state: opening never refuses a damaged file. One that fails a
header check is logged and dropped with every newer file; ``restore`` then reports the
recorded position gone and the owner re-indexes from the commitlog.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import sys
import threading
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dledger.store.meta import fsync_dir
from dledger.store.mmapfile import NAME_DIGITS, first_zero_record, segment_name

from .errors import ConsumeQueueError

log = logging.getLogger(__name__)

MAGIC = 0x4C4D4B49  # "LMKI"
HEADER = struct.Struct(">IIIIqqqqqII")
HEADER_SIZE = HEADER.size
# The statistics written before the count: min_ms, max_ms, begin, end, used_slots.
STATS = struct.Struct(">qqqqI")
STATS_POS = 24
COUNT = struct.Struct(">I")
COUNT_POS = 60
SLOT = struct.Struct(">i")
SLOT_SIZE = SLOT.size
ENTRY = struct.Struct(">Iqii")
ENTRY_SIZE = ENTRY.size
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
MAX_BASE_MS = 1 << 62  # a file's base store time is within +-this (a sanity bound)
assert HEADER_SIZE == 64 and ENTRY_SIZE == 20
assert STATS_POS + STATS.size == COUNT_POS and COUNT_POS + COUNT.size == HEADER_SIZE


@dataclass(frozen=True, slots=True)
class KeyIndexSettings:
    """Limits of the key index; file geometry defaults are RocketMQ's."""

    slots_per_file: int = 500_000
    max_entries_per_file: int = 2_000_000
    max_query_results: int = 1024
    """A query returns at most this many candidates, whatever the caller asks for."""
    max_keys_per_message: int = 64
    """Keys of one message beyond this are not indexed (a warning is logged): dispatch of
    a committed message must not fail, and the producer side should refuse such keys."""

    @property
    def file_bytes(self) -> int:
        """The size of one index file (allocated in full when it is created)."""
        return _IndexFile.size_for(self.slots_per_file, self.max_entries_per_file)

    def __post_init__(self) -> None:
        for name in ("slots_per_file", "max_query_results", "max_keys_per_message"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_keys_per_message <= self.max_entries_per_file <= I32_MAX:
            raise ValueError(
                "max_entries_per_file must be in [max_keys_per_message, 2**31),"
                f" got {self.max_entries_per_file}"
            )
        if self.slots_per_file > I32_MAX:
            raise ValueError(f"slots_per_file must be < 2**31, got {self.slots_per_file}")


def key_hash(key: str) -> int:
    """The 32-bit hash of a key stored in its entries: CRC-32 of its UTF-8 bytes."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass"))


def _corrupt(path: Path, why: str) -> ConsumeQueueError:
    return ConsumeQueueError(f"key index file {path}: {why}")


class _IndexFile:
    """One mapped index file; the fields mirror its header."""

    def __init__(self, path: Path, fd: int, mm: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self.mm = mm
        fields: tuple[int, ...] = HEADER.unpack_from(mm, 0)
        magic, self.slot_count, self.max_entries = fields[0], fields[1], fields[2]
        self.base_ms, self.min_ms, self.max_ms = fields[4], fields[5], fields[6]
        self.begin_offset, self.end_offset = fields[7], fields[8]
        self.used_slots, self.entry_count = fields[9], fields[10]
        self.entries_pos = HEADER_SIZE + self.slot_count * SLOT_SIZE
        self.dirty = False
        if magic != MAGIC:
            raise _corrupt(path, f"bad magic {magic:#x}")
        if self.slot_count < 1 or self.max_entries < 1:
            raise _corrupt(path, f"{self.slot_count} slots, {self.max_entries} entries")
        if len(mm) != self.entries_pos + self.max_entries * ENTRY_SIZE:
            raise _corrupt(path, f"size {len(mm)} does not match its header")
        if self.entry_count > self.max_entries:
            raise _corrupt(path, f"entry count {self.entry_count} > {self.max_entries}")
        if not -MAX_BASE_MS <= self.base_ms <= MAX_BASE_MS:
            # Store times are base_ms plus an i32 delta: far from the i64 ends, or the
            # statistics recomputed from them would not fit their fields.
            raise _corrupt(path, f"base time {self.base_ms} ms is not a store time")

    @staticmethod
    def size_for(slot_count: int, max_entries: int) -> int:
        return HEADER_SIZE + slot_count * SLOT_SIZE + max_entries * ENTRY_SIZE

    @classmethod
    def open(cls, path: Path) -> _IndexFile:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise _corrupt(path, f"{size} bytes, shorter than a header")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        try:
            return cls(path, fd, mm)
        except BaseException:
            mm.close()
            os.close(fd)
            raise

    @classmethod
    def create(
        cls, directory: Path, settings: KeyIndexSettings, commitlog_offset: int, base_ms: int
    ) -> _IndexFile:
        """A new file, allocated in full (a store through the mapping into a hole on a
        full disk is SIGBUS, not an exception), named only once its header is synced."""
        path = directory / segment_name(commitlog_offset)
        tmp = path.with_name(path.name + ".tmp")
        size = cls.size_for(settings.slots_per_file, settings.max_entries_per_file)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            header = HEADER.pack(
                MAGIC,
                settings.slots_per_file,
                settings.max_entries_per_file,
                0,
                base_ms,
                base_ms,
                base_ms,
                commitlog_offset,
                commitlog_offset,
                0,
                0,
            )
            os.pwrite(fd, header, 0)
            # Durable before its first entry: a flush records this file as the index's
            # last one, and a power loss must not take it (or its header) away after.
            os.fsync(fd)
            os.replace(tmp, path)
            fsync_dir(directory)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return cls.open(path)

    # ---- writing ---------------------------------------------------------------------------

    def fits(self, n_keys: int, store_timestamp_ms: int) -> bool:
        return (
            self.entry_count + n_keys <= self.max_entries
            and I32_MIN <= store_timestamp_ms - self.base_ms <= I32_MAX
        )

    def add(self, hashes: list[int], commitlog_offset: int, store_timestamp_ms: int) -> None:
        mm, slot_count, entries_pos = self.mm, self.slot_count, self.entries_pos
        delta = store_timestamp_ms - self.base_ms
        n = self.entry_count
        for h in hashes:
            n += 1
            slot_pos = HEADER_SIZE + (h % slot_count) * SLOT_SIZE
            (prev,) = SLOT.unpack_from(mm, slot_pos)
            if prev == 0:
                self.used_slots += 1
            ENTRY.pack_into(
                mm, entries_pos + (n - 1) * ENTRY_SIZE, h, commitlog_offset, delta, prev
            )
            SLOT.pack_into(mm, slot_pos, n)
        if self.entry_count == 0:
            self.begin_offset = commitlog_offset
        self.min_ms = min(self.min_ms, store_timestamp_ms)
        self.max_ms = max(self.max_ms, store_timestamp_ms)
        self.end_offset = commitlog_offset
        self._write_stats()
        self._write_count(n)  # last: it is what makes the message's entries count

    def _write_stats(self) -> None:
        STATS.pack_into(
            self.mm,
            STATS_POS,
            self.min_ms,
            self.max_ms,
            self.begin_offset,
            self.end_offset,
            self.used_slots,
        )
        self.dirty = True

    def _write_count(self, n: int) -> None:
        COUNT.pack_into(self.mm, COUNT_POS, n)
        self.entry_count = n
        self.dirty = True

    # ---- reading ---------------------------------------------------------------------------

    def entry(self, n: int) -> tuple[int, int, int, int]:
        h, commitlog_offset, delta, prev = ENTRY.unpack_from(
            self.mm, self.entries_pos + (n - 1) * ENTRY_SIZE
        )
        return h, commitlog_offset, delta, prev

    def lookup(
        self, h: int, begin_ms: int, end_ms: int, *, limit: int, seen: set[int], out: list[int]
    ) -> None:
        """Append to ``out`` the commitlog offsets of entries with hash ``h`` and store time in
        ``[begin_ms, end_ms]``, newest first, until ``out`` holds ``limit``."""
        (n,) = SLOT.unpack_from(self.mm, HEADER_SIZE + (h % self.slot_count) * SLOT_SIZE)
        count = self.entry_count
        lo, hi = begin_ms - self.base_ms, end_ms - self.base_ms
        while n and len(out) < limit:
            if not 0 < n <= count:
                raise _corrupt(self.path, f"chain reaches entry {n} outside [1, {count}]")
            eh, commitlog_offset, delta, prev = self.entry(n)
            if eh == h and lo <= delta <= hi and commitlog_offset not in seen:
                seen.add(commitlog_offset)
                out.append(commitlog_offset)
            if prev >= n:
                raise _corrupt(self.path, f"entry {n} chains forward to entry {prev}")
            n = prev

    # ---- repair ----------------------------------------------------------------------------

    @property
    def name_offset(self) -> int:
        return int(self.path.name)

    def valid_count(self) -> int:
        """The header's entry count, cut back before the first all-zero entry under it
        (a power loss can keep a header sector newer than the entries it counts)."""
        lo = self.entries_pos
        zero = first_zero_record(self.mm, lo, lo + self.entry_count * ENTRY_SIZE, ENTRY_SIZE)
        return self.entry_count if zero is None else (zero - lo) // ENTRY_SIZE

    def _slots(self) -> array[int]:
        slots = array("i", self.mm[HEADER_SIZE : self.entries_pos])
        if sys.byteorder == "little":
            slots.byteswap()
        return slots

    def repair(self, count: int) -> bool:
        """Hold exactly the first ``count`` entries, which must be intact. The count goes
        down first (a crash half-way leaves a file that repairs again); every slot that
        points past the entries and the header's statistics are recomputed from them;
        every byte after them is zeroed. The file is then byte for byte what it was with
        ``count`` entries, whatever subset of later writes reached the disk. Returns
        whether anything had to change."""
        assert 0 <= count <= self.max_entries, (self.path, count)
        changed = count != self.entry_count
        if changed:
            self._write_count(count)
        slots = self._slots()
        if slots and (max(slots) > count or min(slots) < 0):
            self._rechain(slots, count)
            changed = True
        if _zero_nonzero(self.mm, self.entries_pos + count * ENTRY_SIZE, len(self.mm)):
            self.dirty = changed = True
        deltas = self._entry_fields("i", count, 3)  # store time - base_ms
        stats = (  # as ``add`` keeps them: the bounds start at base_ms
            self.base_ms + min(min(deltas, default=0), 0),
            self.base_ms + max(max(deltas, default=0), 0),
            self.entry(count)[1] if count else self.begin_offset,
            len(slots) - slots.count(0),
        )
        if stats != (self.min_ms, self.max_ms, self.end_offset, self.used_slots):
            self.min_ms, self.max_ms, self.end_offset, self.used_slots = stats
            self._write_stats()
            changed = True
        return changed

    def _entry_fields(self, typecode: str, count: int, field: int) -> array[int]:
        """One 4-byte field (0: key hash, 3: time delta) of the first ``count`` entries."""
        raw = array(typecode, self.mm[self.entries_pos : self.entries_pos + count * ENTRY_SIZE])
        if sys.byteorder == "little":
            raw.byteswap()
        return raw[field :: ENTRY_SIZE // 4]

    def _rechain(self, slots: array[int], count: int) -> None:
        """Point every out-of-range slot at the newest of the first ``count`` entries in
        it (0 when none), by one backward scan of their hashes that ends once every such
        slot is found. Not by walking its chain back: the entries on the way are the
        ones a power loss may have dropped or torn."""
        found = {s: 0 for s, n in enumerate(slots) if n > count or n < 0}
        hashes = self._entry_fields("I", count, 0)
        slot_count, left = self.slot_count, len(found)
        for n in range(count, 0, -1):
            s = hashes[n - 1] % slot_count
            if found.get(s) == 0:
                found[s] = n
                left -= 1
                if not left:
                    break
        for s, n in found.items():
            SLOT.pack_into(self.mm, HEADER_SIZE + s * SLOT_SIZE, n)
            slots[s] = n
        self.dirty = True

    def truncate(self, commitlog_offset: int) -> bool:
        """Remove the entries at or after ``commitlog_offset``: a binary search over the
        counted entries, so they must be intact (after a power loss, ``repair`` to a
        recorded count instead)."""
        lo, hi = 0, self.entry_count
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.entry(mid)[1] >= commitlog_offset:
                hi = mid - 1
            else:
                lo = mid
        return self.repair(lo)

    # ---- lifecycle -------------------------------------------------------------------------

    def fsync(self) -> None:
        if not self.mm.closed:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if not self.mm.closed:
            self.mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class KeyIndex:
    """Message keys → candidate commitlog offsets, over the files in ``directory``."""

    def __init__(self, directory: Path, settings: KeyIndexSettings) -> None:
        self.directory = directory
        self.settings = settings
        self._files: list[_IndexFile] = []
        self._lock = threading.Lock()  # flush (any thread) against file deletion
        self._dir_dirty = False
        self.dropped: list[str] = []  # files dropped as damaged on open (and all newer)
        self.repairs = 0  # files whose crashed tail open or ``restore`` had to repair
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self._load()
        except BaseException:
            self.close()
            raise
        self._last_offset = self._files[-1].end_offset if self._files else -1

    def _load(self) -> None:
        names: list[str] = []
        for p in self.directory.iterdir():
            if p.name.endswith(".tmp"):  # a file whose creation was interrupted
                p.unlink()
            elif len(p.name) == NAME_DIGITS and p.name.isdigit() and p.is_file():
                names.append(p.name)
            else:
                raise ConsumeQueueError(f"{p}: unexpected file in a key index directory")
        names.sort()
        for k, name in enumerate(names):
            try:
                f = self._open_checked(self.directory / name)
            except ConsumeQueueError as e:
                # Derived data: never refuse to start over it. What is dropped is indexed
                # again from the commitlog (the owner sees it in ``restore``).
                log.warning("%s; dropping it and %d newer key index files", e, len(names) - k - 1)
                self.dropped = names[k:]
                for newer in self.dropped:
                    (self.directory / newer).unlink(missing_ok=True)
                fsync_dir(self.directory)
                break
            self._files.append(f)
        if self._files:
            last = self._files[-1]
            self.repairs += last.repair(last.valid_count())  # undo uncounted entries
        # A file with no committed entry (a crash right after its creation, or a full
        # truncation) holds nothing: drop it so every file on disk has an entry.
        for f in [f for f in self._files if f.entry_count == 0]:
            self._files.remove(f)
            f.destroy()

    def _open_checked(self, path: Path) -> _IndexFile:
        f = _IndexFile.open(path)
        if f.entry_count and f.begin_offset != f.name_offset:
            problem = f"first indexed offset {f.begin_offset} != its name"
        elif f.entry_count and self._files and self._files[-1].end_offset > f.begin_offset:
            problem = f"overlaps {self._files[-1].path.name}"
        else:
            return f
        f.close()
        raise _corrupt(path, problem)

    @property
    def last_commitlog_offset(self) -> int:
        """The commitlog offset of the last message indexed, -1 when none is."""
        return self._last_offset

    @property
    def file_count(self) -> int:
        return len(self._files)

    def put(self, keys: Iterable[str], commitlog_offset: int, store_timestamp_ms: int) -> None:
        """Index every key of one message. Idempotent: a message at or below the last
        indexed offset was indexed already (dispatch is in offset order)."""
        if commitlog_offset <= self._last_offset:
            return
        unique = list(dict.fromkeys(k for k in keys if k))
        if not unique:
            return
        cap = self.settings.max_keys_per_message
        if len(unique) > cap:
            log.warning(
                "message at commitlog offset %d has %d keys; indexing the first %d",
                commitlog_offset,
                len(unique),
                cap,
            )
            del unique[cap:]
        hashes = [key_hash(k) for k in unique]
        f = self._files[-1] if self._files else None
        if f is None or not f.fits(len(hashes), store_timestamp_ms):
            f = _IndexFile.create(
                self.directory, self.settings, commitlog_offset, store_timestamp_ms
            )
            self._files.append(f)
        f.add(hashes, commitlog_offset, store_timestamp_ms)
        self._last_offset = commitlog_offset

    def query(
        self, key: str, max_results: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[int]:
        """Candidate commitlog offsets of messages with ``key`` stored in
        ``[begin_ms, end_ms]``, newest first, at most ``max_results`` (clamped to the
        ``max_query_results`` setting). Candidates can be hash collisions: the caller
        reads each message and checks its keys."""
        limit = min(max_results, self.settings.max_query_results)
        out: list[int] = []
        if limit <= 0 or begin_ms > end_ms:
            return out
        h = key_hash(key)
        seen: set[int] = set()
        for f in reversed(self._files):
            if len(out) >= limit:
                break
            if f.max_ms < begin_ms or f.min_ms > end_ms:
                continue
            f.lookup(h, begin_ms, end_ms, limit=limit, seen=seen, out=out)
        return out

    def delete_files_below(self, commitlog_offset: int) -> int:
        """Delete the files whose last indexed offset is below ``commitlog_offset``, never
        the newest; returns how many went."""
        deleted = 0
        with self._lock:
            while len(self._files) > 1 and self._files[0].end_offset < commitlog_offset:
                self._files.pop(0).destroy()
                deleted += 1
        if deleted:
            self._dir_dirty = True
        return deleted

    def truncate_dirty_tail(self, commitlog_offset: int) -> None:
        """Forget every entry at or after ``commitlog_offset`` so queries no longer return
        it and a re-dispatch indexes it again: whole newer files are deleted, the
        straddling file is cut by a binary search over its entries, so they must be
        intact (a process crash; after a power loss, ``restore`` a recorded position)."""
        with self._lock:
            files = self._files
            while files and files[-1].begin_offset >= commitlog_offset:
                files.pop().destroy()
                self._dir_dirty = True
            if files:
                self.repairs += files[-1].truncate(commitlog_offset)
        self._last_offset = files[-1].end_offset if files else -1

    def position(self) -> tuple[int, int]:
        """(name of the newest file, its entry count), (-1, 0) when there is none: what
        the owner records with a flush, to ``restore`` after a power loss."""
        if not self._files:
            return -1, 0
        f = self._files[-1]
        return f.name_offset, f.entry_count

    def restore(self, position: tuple[int, int]) -> bool:
        """Cut the index back to ``position``, recorded at a flush: newer files go and the
        file it names is repaired to exactly that many entries. False when that file is
        gone (dropped as damaged on open): the index then holds everything up to
        ``last_commitlog_offset`` and the caller indexes the rest again."""
        name, count = position
        with self._lock:
            files = self._files
            while files and files[-1].name_offset > name:
                files.pop().destroy()
                self._dir_dirty = True
            restored = name < 0 or (
                bool(files) and files[-1].name_offset == name and 0 < count <= files[-1].max_entries
            )
            if restored and files:
                self.repairs += files[-1].repair(count)
        self._last_offset = self._files[-1].end_offset if self._files else -1
        return restored

    def clear(self) -> None:
        """Delete every file (the owner re-indexes the whole log)."""
        self.truncate_dirty_tail(-1)

    def flush(self) -> None:
        """fsync the files written since the last flush (and the directory)."""
        with self._lock:
            for f in self._files:
                if f.dirty:
                    f.dirty = False
                    f.fsync()
            if self._dir_dirty:
                self._dir_dirty = False
                fsync_dir(self.directory)

    def close(self) -> None:
        with self._lock:
            for f in self._files:
                f.close()
            self._files.clear()


_ZERO_CHUNK = 1 << 16
_ZEROS = bytes(_ZERO_CHUNK)


def _zero_nonzero(mm: mmap.mmap, lo: int, hi: int) -> bool:
    """Zero every non-zero byte of ``mm[lo:hi]``, checking it all (a power loss can keep
    a sector anywhere after a lost one). Returns whether anything was written."""
    wrote = False
    while lo < hi:
        n = min(_ZERO_CHUNK, hi - lo)
        if mm[lo : lo + n] != _ZEROS[:n]:
            mm[lo : lo + n] = _ZEROS[:n]
            wrote = True
        lo += n
    return wrote
