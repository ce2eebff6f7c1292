"""``FileStore``: the DLedger mmap file store (``DLedgerMmapFileStore``).

Layout under the node directory (docs/formats.md)::

    data/<20-digit start pos>     entries, 1 GiB segments by default
    index/<20-digit start>        32-byte index units, unit i at i*32
    currterm                      term and vote (atomic replace)
    checkpoint                    begin, committed index/pos (atomic replace)

Invariants (checked by tests/store):
- entries ``ledger_begin_index .. ledger_end_index`` are contiguous, each at the pos its
  index unit names, with non-decreasing terms;
- ``committed_index <= ledger_end_index``; the checkpoint's committed index is durable;
- leader and follower fed the same entries end with byte-identical data and index files;
- every read that returns an entry checked it (header against index unit, body CRC): a
  damaged copy raises ``CorruptEntryError``, it is never returned;
- ``currterm`` exists from a node's first start on: a node with a past and no file lost
  it, and is refused (``load_term_vote``).

Threads: callers serialise through ``self._lock`` (one writer, as DLedger's
``synchronized(memberState)``); a background thread (``flush_service``) syncs dirty
segments every ``flush_interval_ms`` (async mode), writes the checkpoint and applies
retention. Checkpoint writers also take ``self._checkpoint_lock`` (always before
``self._lock``): the periodic checkpoint holds only that one across its fsyncs.

The store owns the ledger state and its lock; the jobs that can be read alone live beside
it: ``runs`` lays out a batch (leader encoding, follower checking) and writes it all or
nothing, ``reads`` checks every entry a read returns, ``state_files`` says what the
checkpoint and ``currterm`` may claim and in which order they are written, ``recovery``
scans and repairs the files on open, ``retention`` decides which head segments go (and
refuses appends to a full disk), ``flush_service`` syncs in the background,
``mmapfile`` holds the segments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from ..codes import DLedgerCode
from .base import AppendHook, StoreError, StoreFailedError, StoreSettings, check_leader_bodies
from .configs import ConfigJournal, config_records, load_incarnation, new_incarnation_id
from .entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    MAGIC_CONFIG,
    MAGIC_NORMAL,
    ConfigRecord,
    Entry,
    EntryHeader,
    EntryMeta,
    IndexUnit,
    decode_header,
    first_index_of_term,
)
from .flush_service import FlushService
from .meta import Checkpoint, CheckpointFile, TermVote, TermVoteFile
from .mmapfile import MmapFileList
from .reads import (
    batch_extent,
    check_bodies,
    checked_entry,
    find_entries_at,
    index_unit,
    read_span,
    unit_bytes,
    view_segment,
)
from .recovery import log_begin_pos, open_log
from .retention import (
    DiskFullCheck,
    LogHead,
    delete_head_segments,
    disk_usage_ratio,
    retention_floor_pos,
)
from .runs import Run, UndoFailedError, encode_leader_runs, split_follower_runs, write_runs
from .state_files import checkpoint_claim, load_term_vote, lock_directory, reset_files

log = logging.getLogger(__name__)


def node_dir(data_dir: Path | str, group: str, node_id: str) -> Path:
    """``<data_dir>/dledger/<group>/<node_id>`` (docs/formats.md)."""
    return Path(data_dir) / "dledger" / group / node_id


class FileStore:
    """The mmap segmented log store. See the module docstring for layout and invariants."""

    def __init__(
        self,
        directory: Path | str,
        settings: StoreSettings | None = None,
        *,
        disk_usage: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
        background: bool = True,
        new_incarnation: Callable[[], str] = new_incarnation_id,
    ) -> None:
        self.dir = Path(directory)
        self.settings = s = settings or StoreSettings()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_directory(self.dir)
        self._data = MmapFileList(self.dir / "data", s.data_file_size)
        self._index = MmapFileList(self.dir / "index", s.index_file_size)
        self._term_vote = TermVoteFile(self.dir / "currterm")
        self._checkpoint = CheckpointFile(self.dir / "checkpoint")
        self._configs = ConfigJournal(self.dir / "members")
        # this data directory's identity (``configs.load_incarnation``)
        self.incarnation = load_incarnation(self.dir / "incarnation", new_incarnation)
        self._disk = DiskFullCheck(disk_usage or (lambda: disk_usage_ratio(self.dir)), s)
        self._clock = clock
        self._lock = threading.RLock()
        # Orders checkpoint writers (taken before ``_lock``, never after it): see
        # ``_write_checkpoint``.
        self._checkpoint_lock = threading.RLock()
        self._hooks: list[AppendHook] = []

        self._head = LogHead(0, 0, -1, 0)  # replaced whole: by reset, retention, recovery
        self._end_chain = 0  # chain CRC of the last entry (the next entry's seed)
        self._end_index = -1
        self._end_term = -1
        self._committed_index = -1
        self._committed_pos = 0
        self._durable_index = -1  # every entry up to here is synced (data and index)
        self._generation = 0  # bumped by truncate/reset: a sync snapshot taken before is stale
        self._retention_floor: int | None = None
        self._closed = False
        self._failed: StoreFailedError | None = None

        self.recovery_stats: dict[str, float] = {}
        try:
            self._recover()
        except BaseException:
            self._release()
            raise
        self._flusher: FlushService | None = None
        if background:  # off for deterministic simulations, which call sync() themselves
            self._flusher = FlushService(
                self.dir,
                s,
                sync=self.sync,
                write_checkpoint=self._write_checkpoint,
                clean=self.clean,
                failed=lambda: self._failed is not None,
            )
            self._flusher.start()

    # ---- ledger state ------------------------------------------------------------------

    @property
    def ledger_begin_index(self) -> int:
        return self._head.begin_index

    @property
    def ledger_before_begin_term(self) -> int:
        return self._head.before_begin_term

    @property
    def ledger_before_begin_chain(self) -> int:
        return self._head.before_begin_chain

    @property
    def ledger_end_index(self) -> int:
        return self._end_index

    @property
    def ledger_end_chain(self) -> int:
        return self._end_chain

    @property
    def ledger_end_term(self) -> int:
        return self._end_term

    @property
    def ledger_begin_pos(self) -> int:
        return log_begin_pos(self._data, self._head.begin_pos)

    @property
    def ledger_end_pos(self) -> int:
        return self._data.end

    @property
    def committed_index(self) -> int:
        return self._committed_index

    @property
    def committed_pos(self) -> int:
        return self._committed_pos

    @property
    def durable_index(self) -> int:
        """Every entry up to here is synced, data and index (what the checkpoint may claim)."""
        return self._durable_index

    @property
    def data_flushed_pos(self) -> int:
        """Every data byte below this position is synced."""
        with self._lock:
            return self._data.flushed_end

    def add_append_hook(self, hook: AppendHook) -> None:
        self._hooks.append(hook)

    # ---- appends -----------------------------------------------------------------------

    def append_as_leader(
        self,
        term: int,
        bodies: Sequence[bytes | bytearray | memoryview],
        magic: int = MAGIC_NORMAL,
    ) -> Sequence[EntryMeta]:
        """Assign index, term and pos to each body, run the append hooks, write.

        All-or-nothing: every check and every hook runs before the first byte is written,
        so a refused or failed batch leaves the log unchanged (AP-08, AP-10)."""
        check_leader_bodies(bodies, magic, self.settings)
        with self._lock:
            self._check_open()
            self._disk.check()
            if term < self._end_term:
                raise StoreError(
                    DLedgerCode.INCONSISTENT_TERM,
                    f"leader term {term} is below the ledger end term {self._end_term}",
                )
            runs, metas, units, chain = encode_leader_runs(
                bodies,
                term=term,
                magic=magic,
                first_index=self._end_index + 1,
                end_pos=self._data.end,
                prev_chain=self._end_chain,
                segment_size=self.settings.data_file_size,
                hooks=self._hooks,
            )
            if magic == MAGIC_CONFIG:  # noted durably before its bytes go in (``configs``)
                self._configs.add(
                    [
                        ConfigRecord(m.index, m.term, bytes(b))
                        for m, b in zip(metas, bodies, strict=True)
                    ],
                    self._config_floor(),
                )
            self._write_runs(runs, metas, units, chain)
        if self.settings.flush == "sync":
            self._sync_data()  # durable before we return; readers are not blocked meanwhile
        return metas

    def _write_runs(
        self,
        runs: Sequence[Run],
        metas: Sequence[EntryMeta],
        units: bytes | bytearray,
        end_chain: int,
    ) -> None:
        """Write pre-placed runs of entries and their index units (``runs.write_runs``:
        all or nothing); update the ledger end. A write that fails raises ``StoreError``
        with the ledger end as it was; if its undo fails too, the store fails
        (``StoreFailedError``)."""
        data_end = self._data.end
        try:
            write_runs(self._data, self._index, runs, metas[0].index * INDEX_UNIT_SIZE, units)
        except UndoFailedError as e:
            # Part of the batch may now be in the log: the outcome is unknown.
            self._fail(f"undoing a failed write at pos {data_end} ({e.error})", e.undo_error)
        except OSError as e:
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            raise StoreError(
                DLedgerCode.DISK_FULL if full else DLedgerCode.DISK_ERROR,
                f"writing entries {metas[0].index}..{metas[-1].index} at pos {data_end} failed"
                f" ({e.strerror or e}); nothing was written",
            ) from e
        self._end_index = metas[-1].index
        self._end_term = metas[-1].term
        self._end_chain = end_chain

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> list[EntryMeta]:
        """Write the leader's raw entry bytes exactly where the leader wrote them.

        ``data`` holds one or more consecutive entries. Each must carry the next index, a
        term no lower than the one before, the pos the leader's placement rule gives, and
        a valid body CRC; otherwise nothing is written (docs/formats.md)."""
        view = memoryview(data)
        with self._lock:
            self._check_open()
            self._disk.check()
            runs, metas, units, chain = split_follower_runs(
                view,
                end_pos=self._data.end,
                next_index=self._end_index + 1,
                prev_term=self._end_term,
                prev_chain=self._end_chain,
                segment_size=self.settings.data_file_size,
                max_entry_bytes=self.settings.max_entry_bytes,
            )
            if metas:
                self._configs.add(config_records(view, metas), self._config_floor())
                self._write_runs(runs, metas, units, chain)
        if metas and self.settings.flush == "sync":
            self._sync_data()
        return metas

    # ---- reads (the checks themselves are in ``reads``) ---------------------------------

    def _unit(self, index: int) -> IndexUnit:
        return index_unit(self._index, index, self._head.begin_index, self._end_index)

    def get_meta(self, index: int) -> EntryMeta:
        with self._lock:
            u = self._unit(index)
            return EntryMeta(u.index, u.term, u.pos, u.size, u.magic)

    def get(self, index: int) -> Entry:
        """The entry at ``index``, checked: its header agrees with its index unit and its
        body with its CRC, else ``CorruptEntryError`` (this copy is damaged)."""
        with self._lock:
            u = self._unit(index)
            raw = unit_bytes(self._data, u)
        return checked_entry(self._data, raw, index, u)

    def read_entry_at(
        self, pos: int, body_size: int | None = None, max_end: int | None = None
    ) -> bytes:
        """The whole entry (header and body) that starts at byte ``pos``, checked like
        ``get``: for readers that know where an entry is, not its index (a message's
        commitlog offset). The body CRC is computed outside the store lock.

        ``StoreError(INDEX_OUT_OF_RANGE)`` when ``pos`` is outside the log or the entry
        ends past ``max_end``. A caller that gives ``body_size`` says an entry of that
        size starts at ``pos`` (a consume-queue unit does): anything else there is
        damage, ``CorruptEntryError``. Without it ``pos`` is only a guess (a message id
        from a client): bytes that are not a header whose index unit names ``pos`` mean
        "no entry there" (``INDEX_OUT_OF_RANGE``), and only an entry found there whose
        bytes fail a check is ``CorruptEntryError``."""
        return self.read_entries_at([(pos, body_size)], max_end)[0]

    def read_entries_at(
        self, spans: Sequence[tuple[int, int | None]], max_end: int | None = None
    ) -> list[bytes]:
        """``read_entry_at(pos, body_size)`` for each ``(pos, body_size)`` of ``spans``,
        under one hold of the lock (a pull's page of records), every entry checked the
        same way; the first that fails raises what ``read_entry_at`` would, and nothing
        is returned."""
        with self._lock:
            limit = self._data.end if max_end is None else min(self._data.end, max_end)
            found = find_entries_at(
                self._data,
                self._index,
                spans,
                self.ledger_begin_pos,
                limit,
                self._head.begin_index,
                self._end_index,
            )
        return check_bodies(self._data, found)

    def _header(self, index: int) -> EntryHeader:
        u = self._unit(index)
        return decode_header(self._data.read(u.pos, BODY_OFFSET))

    def term_at(self, index: int) -> int:
        """Term of the entry at ``index``; the before-begin term for ``begin - 1``."""
        if index == self._head.begin_index - 1:
            return self._head.before_begin_term
        return self.get_meta(index).term

    def read(self, pos: int, size: int) -> bytes:
        """Raw bytes at ``[pos, pos + size)`` within written data of one segment."""
        with self._lock:
            return read_span(self._data, pos, size, self.ledger_begin_pos)

    @contextlib.contextmanager
    def view(self, pos: int, size: int, limit_pos: int | None = None) -> Iterator[memoryview]:
        """A zero-copy view of ``[pos, pos + size)`` within the written data of one segment
        (and below ``limit_pos``), for a reader that decodes in place and copies only what
        it keeps. The store's lock is held while the view is open, so nothing can unmap
        the segment under it (RocketMQ holds a reference on its MappedFile for the same
        reason); keep it open briefly. The view is released on exit: a reader that kept
        a buffer made from it gets the ``BufferError`` of the release."""
        with self._lock:
            end = self._data.end if limit_pos is None else min(self._data.end, limit_pos)
            f = view_segment(self._data, pos, size, self.ledger_begin_pos, end)
            with memoryview(f.mm) as whole, whole[pos - f.start : pos - f.start + size] as part:
                yield part

    def read_entries(self, from_index: int, max_bytes: int, max_entries: int) -> bytes:
        """Raw bytes of consecutive entries from ``from_index`` (at least one when it
        exists), stopping at ``max_bytes``, ``max_entries`` or a segment end."""
        return self.read_batch(from_index, max_bytes, max_entries)[0]

    def read_batch(
        self, from_index: int, max_bytes: int, max_entries: int
    ) -> tuple[bytes, int, int]:
        """``read_entries`` plus the entry count and the last entry's term (a push's
        ``count`` and the term its ack is filed under). One read of the index units."""
        with self._lock:
            first = self._unit(from_index)
            last_index = min(self._end_index, from_index + max(1, max_entries) - 1)
            end, count, last_term = batch_extent(
                self._index,
                from_index,
                first,
                last_index,
                segment_size=self.settings.data_file_size,
                max_bytes=max_bytes,
            )
            return self._data.read(first.pos, end - first.pos), count, last_term

    def first_index_of_term(self, term: int, end_index: int) -> int:
        """``getFirstLogOfTargetTerm``: the first entry of ``term`` at or before
        ``end_index``; -1 if that term has no entry there."""
        with self._lock:
            lo, hi = self._head.begin_index, min(end_index, self._end_index)
            return first_index_of_term(lambda i: self._unit(i).term, lo, hi, term)

    # ---- truncate, reset, commit -------------------------------------------------------

    def truncate(self, from_index: int) -> int:
        """Delete ``from_index`` and every later entry; returns the new ledger end index.

        Both the data list and the *index* list are cut (DLedger truncates the index by
        rebuilding the data list), and the ledger end term moves with the end
        index (DLedger leaves it stale)."""
        with self._lock:
            self._check_open()
            if from_index > self._end_index:
                return self._end_index
            if from_index <= self._committed_index:
                raise StoreError(
                    DLedgerCode.UNEXPECTED_ARGUMENT,
                    f"truncate from {from_index} would drop committed entry"
                    f" {self._committed_index}",
                )
            if from_index < self._head.begin_index:
                raise StoreError(
                    DLedgerCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                    f"truncate from {from_index} below ledger begin {self._head.begin_index}",
                )
            # The log ends where its last entry ends: cutting at the entry that opened a
            # segment also removes the blank padding before it, so the next placement is
            # the same as on a replica that never had the entry.
            if from_index == self._head.begin_index:
                pos = self.ledger_begin_pos
                self._end_term = self._head.before_begin_term
                self._end_chain = self._head.before_begin_chain
            else:
                prev = self._header(from_index - 1)
                pos = prev.pos + prev.size
                self._end_term, self._end_chain = prev.term, prev.chain_crc
            self._data.truncate(pos)
            self._index.truncate(from_index * INDEX_UNIT_SIZE)
            self._end_index = from_index - 1
            self._durable_index = min(self._durable_index, self._end_index)
            self._generation += 1
            self._configs.truncated(from_index)
            return self._end_index

    def reset(
        self,
        begin_index: int,
        begin_pos: int,
        before_begin_term: int,
        before_begin_chain: int = 0,
        config: ConfigRecord | None = None,
    ) -> None:
        """Drop the whole log; the next entry is ``begin_index`` at ``begin_pos``.

        For a follower behind the leader's head (after INSTALL_SNAPSHOT). Everything up to
        ``begin_index - 1`` counts as committed: the snapshot covers it. ``config``: the
        configuration in force at the snapshot (``config_records``)."""
        if begin_index < 0 or begin_pos < 0:
            raise StoreError(DLedgerCode.UNEXPECTED_ARGUMENT, "negative begin index or pos")
        with self._checkpoint_lock, self._lock:
            self._check_open()
            if config is not None:
                self._configs.reset(config)
            head = LogHead(begin_index, begin_pos, before_begin_term, before_begin_chain)
            reset_files(self._data, self._index, self._checkpoint, head)
            self._head = head
            self._end_index = self._durable_index = self._committed_index = begin_index - 1
            self._end_term, self._end_chain = before_begin_term, before_begin_chain
            self._committed_pos = begin_pos
            self._generation += 1

    def update_committed(self, index: int) -> None:
        """Move the committed index forward (never back) to an entry the log holds."""
        with self._lock:
            if index <= self._committed_index:
                return
            if index > self._end_index:
                raise StoreError(
                    DLedgerCode.INDEX_OUT_OF_RANGE,
                    f"committed index {index} beyond ledger end {self._end_index}",
                )
            self._committed_pos = self._entry_end(index)
            self._committed_index = index

    # ---- term and vote -----------------------------------------------------------------

    def load_term_vote(self) -> TermVote:
        """The durable term and vote (``currterm``); refused when the file is lost
        (``state_files.load_term_vote``)."""
        past = self._end_index >= 0 or self._head.begin_index > 0
        return load_term_vote(
            self._term_vote,
            has_past=past or self._checkpoint.path.exists(),
            end_index=self._end_index,
            end_term=self._end_term,
        )

    def save_term_vote(self, tv: TermVote) -> None:
        self._term_vote.save(tv)

    # ---- configuration entries (``configs``) -------------------------------------------

    @property
    def config_version(self) -> int:
        return self._configs.version

    def _config_floor(self) -> int:
        """Where the journal may forget older configurations: committed *and* on disk
        here (a committed entry not yet synced can be lost by a crash, and the
        configuration before it is then the one in force again; simulator seed 336)."""
        return min(self._committed_index, self._durable_index)

    def config_records(self) -> list[ConfigRecord]:
        """The configuration entries the log holds, oldest first, after the newest one
        before its head (the bootstrap configuration's index is -1)."""
        with self._lock:
            return self._configs.valid(
                self._end_index, self._head.begin_index, lambda i: self._unit(i).term
            )

    def bootstrap_config(self, body: bytes) -> None:
        """Keep ``body`` as the configuration before the first entry, unless there is
        one already (a node's ``--peers`` count on its first start only)."""
        with self._lock:
            self._configs.bootstrap(body)

    # ---- durability --------------------------------------------------------------------

    def _sync_data(self) -> None:
        """Sync mode: fsync the data segments (without the store lock, so readers and the
        replication path are not blocked). The index is synced by the background thread;
        recovery rebuilds any index units past the checkpoint from the data."""
        with self._lock:
            self._check_open()
            todo = self._data.unflushed()
        try:
            self._data.sync(todo)
        except OSError as e:
            self._fail("fsync of the data segments", e)

    def sync(self) -> None:
        """Sync every written byte now (data and index), without a checkpoint."""
        with self._lock:
            self._check_open()
            todo_d = self._data.unflushed()
            todo_i = self._index.unflushed()
            end_index = self._end_index
            generation = self._generation
        try:
            self._data.sync(todo_d)
            self._index.sync(todo_i)
        except OSError as e:
            self._fail("fsync of the log", e)
        with self._lock:
            if self._generation == generation:
                self._durable_index = max(self._durable_index, end_index)

    def flush(self) -> None:
        """Sync every written byte now and write the checkpoint."""
        self.sync()
        self._write_checkpoint()

    def _checkpoint_state(self, head: LogHead | None = None) -> Checkpoint:
        """The checkpoint the store may write now (the store lock held; see
        ``state_files.checkpoint_claim``). ``head``: the log's begin as it will be once
        retention has deleted the first segment, which its checkpoint must say first."""
        if head is None:
            head = dataclasses.replace(self._head, begin_pos=self.ledger_begin_pos)
        return checkpoint_claim(
            head,
            committed_index=self._committed_index,
            committed_pos=self._committed_pos,
            durable_index=self._durable_index,
            entry_end=self._entry_end,
        )

    def _entry_end(self, index: int) -> int:
        u = self._unit(index)
        return u.pos + u.size

    def _write_checkpoint(self) -> None:
        """Write the checkpoint: its state taken under the store lock, its write and two
        fsyncs done outside it, so that a checkpoint (every ``checkpoint_interval_ms``,
        on the flush thread) never stalls the appends and reads of the event loop.
        ``_checkpoint_lock`` keeps checkpoint writers in order: an older state never
        replaces a newer one (a reset's, retention's)."""
        with self._checkpoint_lock:
            with self._lock:
                if self._closed or self._failed is not None:
                    return
                cp = self._checkpoint_state()
            self._checkpoint.save(cp)

    # ---- retention ---------------------------------------------------------------------

    def set_retention_floor(self, pos: int | None) -> None:
        """Retention never deletes bytes at or above ``pos`` (the broker passes its
        dispatch position); ``None`` means the committed position."""
        self._retention_floor = pos

    def clean(self, force: bool = False) -> int:
        """Delete expired head segments; returns how many. A segment goes when it is
        older than ``file_reserved_hours``, or (oldest first) while disk usage is above
        ``disk_clean_ratio`` or ``force`` is set; never the active segment, never data at
        or above the committed position or the retention floor (``retention``)."""
        with self._checkpoint_lock, self._lock:
            if self._closed or self._failed is not None:
                return 0
            deleted = delete_head_segments(
                self._data,
                self._index,
                self._head,
                end_index=self._end_index,
                floor_pos=retention_floor_pos(self._committed_pos, self._retention_floor),
                now_s=self._clock(),
                settings=self.settings,
                disk_usage=self._disk.usage,
                force=force,
                header_at=self._header,
                before_delete=self._save_head,
                adopt=self._adopt_head,
            )
        if deleted:
            log.info("retention deleted %d head segment(s) of %s", deleted, self.dir / "data")
        return deleted

    def _save_head(self, head: LogHead) -> None:
        """Retention's intent, durable before its segment goes: a crash in between leaves
        a checkpoint whose begin recovery finds in the data (and deletes the segment
        then). Under the store lock: at most once per deleted segment (1 GiB of log)."""
        self._checkpoint.save(self._checkpoint_state(head))

    def _adopt_head(self, head: LogHead) -> None:
        self._head = head

    # ---- recovery (the scan itself is ``recovery``) ---------------------------------------

    def _recover(self) -> None:
        """Rebuild ledger state from the files on open (docs/formats.md): load and repair
        them (:func:`open_log`), adopt what it found. Damage in the committed prefix
        raises :class:`StoreCorruptionError`."""
        r = open_log(
            self._data,
            self._index,
            self._checkpoint,
            segment_size=self.settings.data_file_size,
            verify=self.settings.recovery_verify,
        )
        self._head = LogHead(r.begin_index, r.begin_pos, r.before_begin_term, r.before_begin_chain)
        self._end_index = self._durable_index = r.end_index
        self._end_term, self._end_chain = r.end_term, r.end_chain
        self._committed_index, self._committed_pos = r.committed_index, r.committed_pos
        self.recovery_stats = {
            "seconds": r.seconds,
            "scanned_entries": r.scanned_entries,
            "rebuilt_index_from": r.rebuilt_index_from,
        }

    # ---- lifecycle ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise StoreError(DLedgerCode.ILLEGAL_MEMBER_STATE, f"store {self.dir} is closed")

    @property
    def failed(self) -> StoreFailedError | None:
        """Why the store stopped vouching for its files (``StoreFailedError``), if it did."""
        return self._failed

    def disk_full(self) -> bool:
        """Whether appends are refused now for the disk's usage (above
        ``disk_full_ratio``), as leader or follower; usage is read at most every
        ``disk_check_interval_ms`` (any thread: a stale read only delays the answer)."""
        return self._disk.full()

    def _fail(self, what: str, e: OSError) -> NoReturn:
        """Crash-only: remember the failure, so every later call raises it, and raise it."""
        if self._failed is None:
            self._failed = StoreFailedError(
                f"store {self.dir}: {what} failed: {e.strerror or e}; restart the node"
                " (recovery re-verifies the log from the last durable checkpoint)"
            )
            log.critical("%s", self._failed)
        raise self._failed from e

    def close(self) -> None:
        """Stop the flusher, sync everything, write the checkpoint, unmap the files."""
        if self._closed:
            return
        if self._failed is not None:
            self.abandon()  # nothing synced now could be trusted
            return
        if self._flusher is not None:
            self._flusher.stop()
        self.sync()
        try:
            self._write_checkpoint()
        except OSError as e:  # a full disk: the older checkpoint stays valid (recovery
            # scans further from it), so the close goes on
            log.warning("closing %s without a new checkpoint: %s", self.dir, e)
        with self._lock:
            self._closed = True
            self._release()

    def abandon(self) -> None:
        """Let go of the files without syncing anything: a process that died. Tests and
        the simulator use it to model a crash (they then drop the unsynced bytes)."""
        if self._closed:
            return
        if self._flusher is not None:
            self._flusher.stop()
        with self._lock:
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Unmap the files and let go of the directory's lock."""
        self._data.close()
        self._index.close()
        os.close(self._lock_fd)

    @property
    def index_flushed_pos(self) -> int:
        with self._lock:
            return self._index.flushed_end

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- introspection for tests and tools -------------------------------------------

    def data_files(self) -> list[Path]:
        return [f.path for f in self._data.files]

    def index_files(self) -> list[Path]:
        return [f.path for f in self._index.files]
