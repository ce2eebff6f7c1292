"""Recovery of the file store on open: one forward scan that finds where the log really
ends, and repairs what a crash can leave (docs/formats.md).

``recover_log`` takes the loaded data and index segment lists and the checkpoint, and
returns the ledger state as a :class:`RecoveredLog`. The scan starts at the checkpoint's
committed entry (``recovery_verify="checkpoint"``: the prefix below it was verified when
it was written and synced) or at the log begin (``"all"``, or no usable checkpoint), and
checks every entry's header, placement, index contiguity, term order, chain CRC and body
CRC until the first invalid record.

What it repairs, and what it refuses:
- a torn tail (a record cut by a crash, garbage after the last entry): cut there, and the
  bytes after it zeroed, so no stale byte can later pass for an entry;
- index units that disagree with the data (the index is synced after the data): rebuilt
  from the first disagreement, from the data; an index whose head segment is gone is
  rebuilt whole (the scan then starts at the begin, not at the checkpoint);
- head segments wholly below the checkpoint's begin: deleted once the data confirms that
  begin (retention writes its new begin before it deletes a segment, so a crash in
  between leaves exactly that); a begin the data contradicts is refused, and nothing is
  deleted for it;
- a reset that crashed part-way (its checkpoint says ``pendingReset``): every segment is
  from before it and goes;
- damage at or below the checkpoint's committed index, or a log that ends before it:
  :class:`StoreCorruptionError` naming the file and byte, and nothing is changed for it.
  Committed entries may be on other replicas only; a node must never start without them.

Without a checkpoint (it was lost) the first segment's first entry says where the log
begins; the chain seed before it is unknown (``UNKNOWN_CHAIN``), so the chain is checked
from that entry on, and the store then restarts the chain at 0.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

from .base import StoreCorruptionError
from .entry import (
    BODY_OFFSET,
    ENTRY_MAGICS,
    HEADER,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MAGIC_BLANK,
    MIN_BLANK_LEN,
    UNKNOWN_CHAIN,
    CodecError,
    EntryHeader,
    EntryRejectedError,
    IndexUnit,
    check_next_entry,
    decode_header,
    decode_index_unit,
)
from .meta import Checkpoint, CheckpointFile
from .mmapfile import MmapFile, MmapFileList
from .state_files import finish_reset

log = logging.getLogger(__name__)

MAGIC_BLANK_BYTES = MAGIC_BLANK.to_bytes(4, "big", signed=True)


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """The ledger state the files hold after recovery."""

    begin_index: int
    begin_pos: int
    before_begin_term: int
    before_begin_chain: int
    end_index: int  # every entry up to here was found valid (and is on disk)
    end_term: int
    end_chain: int
    committed_index: int
    committed_pos: int
    scanned_entries: int
    rebuilt_index_from: int  # -1: every index unit agreed with the data
    seconds: float = 0.0  # how long opening the log took (``open_log``)


class _Cursor(NamedTuple):
    """Where the scan stands: the next entry's pos and index, the previous entry's
    term and chain CRC (what the next entry is checked against)."""

    next_pos: int
    next_index: int
    prev_term: int
    prev_chain: int


def log_begin_pos(data: MmapFileList, begin_pos: int) -> int:
    """Where the log's bytes begin: ``begin_pos``, or the first segment's start when
    retention deleted the segment it was in."""
    return max(data.begin, begin_pos) if data.files else begin_pos


def open_log(
    data: MmapFileList,
    index: MmapFileList,
    checkpoint: CheckpointFile,
    *,
    segment_size: int,
    verify: Literal["checkpoint", "all"],
) -> RecoveredLog:
    """Load the checkpoint and both segment lists, then :func:`recover_log`. A reset that
    crashed part-way, which the scan finished, is made durable before anything is
    written, or a later recovery would take the new entries for old ones."""
    t0 = time.monotonic()
    cp = checkpoint.load()
    data.load()
    index.load()
    r = recover_log(data, index, cp, segment_size=segment_size, verify=verify)
    if cp is not None and cp.pending_reset:
        finish_reset(data, index, checkpoint, cp)
    r = dataclasses.replace(r, seconds=time.monotonic() - t0)
    log.info(
        "recovered %s: entries [%d, %d], committed %d, scanned %d in %.3f s",
        data.dir.parent,
        r.begin_index,
        r.end_index,
        r.committed_index,
        r.scanned_entries,
        r.seconds,
    )
    return r


def recover_log(
    data: MmapFileList,
    index: MmapFileList,
    cp: Checkpoint | None,
    *,
    segment_size: int,
    verify: Literal["checkpoint", "all"],
) -> RecoveredLog:
    """Scan the loaded segment lists from ``cp`` on, repair the tail, return the state.

    ``data`` and ``index`` are changed in place: the torn tail cut and zeroed, index units
    rebuilt. Raises :class:`StoreCorruptionError` when a committed entry is damaged or
    missing (see the module docstring)."""
    begin = _log_begin(data, index, cp)
    committed = cp.committed_index if cp is not None else -1
    start = begin
    # From the committed entry only when the index holds every unit from the begin on:
    # the units below the checkpoint are trusted as they are, and a lost index segment
    # (found by fuzzing: reads then failed on the missing units) is rebuilt by a scan
    # from the begin.
    head_units = bool(index.files) and index.begin <= begin.next_index * INDEX_UNIT_SIZE
    if committed >= begin.next_index and verify == "checkpoint" and head_units:
        start = _checkpoint_start(data, index, committed, begin) or begin
    end, scanned, rebuilt_from = _scan(data, index, start, committed, segment_size)
    end_index = end.next_index - 1
    if end_index < committed:
        raise StoreCorruptionError(
            f"{data.dir}: the log ends at entry {end_index} (pos {end.next_pos}) but the"
            f" checkpoint says entries up to {committed} are committed. Refusing to start."
        )
    # Cut the torn tail and everything after it, in both lists.
    data.set_end(end.next_pos)
    if rebuilt_from is None:
        _index_end_at(index, end_index + 1)
    before_chain, end_chain = begin.prev_chain, end.prev_chain
    if before_chain == UNKNOWN_CHAIN:  # no checkpoint: the chain restarts at 0
        before_chain = 0
        if end_chain == UNKNOWN_CHAIN:
            end_chain = 0
    if cp is not None and committed >= begin.next_index:
        u = _raw_unit(index, committed)
        assert u is not None, committed  # the scan rebuilt every unit it passed
        committed_pos = u.pos + u.size
    else:
        committed = begin.next_index - 1
        committed_pos = log_begin_pos(data, begin.next_pos)
    return RecoveredLog(
        begin_index=begin.next_index,
        begin_pos=begin.next_pos,
        before_begin_term=begin.prev_term,
        before_begin_chain=before_chain,
        end_index=end_index,
        end_term=end.prev_term,
        end_chain=end_chain,
        committed_index=committed,
        committed_pos=committed_pos,
        scanned_entries=scanned,
        rebuilt_index_from=-1 if rebuilt_from is None else rebuilt_from,
    )


def _log_begin(data: MmapFileList, index: MmapFileList, cp: Checkpoint | None) -> _Cursor:
    """The log's first entry (pos, index) and the term and chain before it: from the
    checkpoint (deleting head segments wholly below it, once the data confirms it), else
    from the first entry."""
    if cp is not None:
        begin = _Cursor(cp.begin_pos, cp.begin_index, cp.before_begin_term, cp.before_begin_chain)
        if cp.pending_reset:
            # A reset that crashed part-way: its checkpoint says every segment still on
            # disk is from before it.
            if data.files or index.files:
                where = data.dir.parent
                log.warning("finishing the reset of %s at entry %d", where, cp.begin_index)
            data.reset(cp.begin_pos)
            index.reset(cp.begin_index * INDEX_UNIT_SIZE)
            return begin
        below = sum(1 for f in data.files if f.limit <= begin.next_pos)
        # Segments below the begin are retention's, whose intent was written before its
        # segment went (a crash in between): deleted only when the data confirms the
        # begin, never on the checkpoint's word alone (a wrong but readable beginPos
        # would take the log's head with it). A begin with committed entries after it
        # must be confirmed anyway: the scan starts at the committed entry, and a begin
        # it never saw would stand wrong (reads refused below it, found by fuzzing).
        if below or (data.files and cp.committed_index >= cp.begin_index):
            problem = _begin_problem(data, cp)
            if problem is not None:
                kept = f", and deleting none of the {below} segment(s) below it" if below else ""
                raise StoreCorruptionError(
                    f"{data.dir.parent / 'checkpoint'} says the log begins with entry"
                    f" {cp.begin_index} at pos {cp.begin_pos}, but {problem}. Refusing to"
                    f" start{kept}. If the checkpoint is wrong, move it away: the node then"
                    " finds where its log begins from the data and checks it all (compare"
                    " the log with a peer's first: without a checkpoint, damage at the end"
                    " of the log is cut as a torn tail)."
                )
            data.delete_head(begin.next_pos, below)
    elif data.files:
        begin = _infer_begin(data, index)
    else:
        begin = _Cursor(0, 0, -1, 0)
    if data.files and data.files[0].start > begin.next_pos:
        raise StoreCorruptionError(
            f"{data.dir}: the log should begin at pos {begin.next_pos} but the first"
            f" segment starts at {data.files[0].start}"
        )
    return begin


def _begin_problem(data: MmapFileList, cp: Checkpoint) -> str | None:
    """Why the data contradicts the checkpoint's begin (entry ``begin_index`` at
    ``begin_pos``, or after blank padding at the next segment's start, or nothing yet
    when nothing after the begin is committed); None if it does not."""
    f = data.segment_for(cp.begin_pos)
    if f is None:
        return f"no segment holds that position (the data ends at {data.end})"
    rel = cp.begin_pos - f.start
    pos = cp.begin_pos
    if f.size - rel >= MIN_BLANK_LEN and f.mm[rel : rel + 4] == MAGIC_BLANK_BYTES:
        if not _is_blank_to_limit(f, rel):
            return "a damaged blank record is there"
        pos = f.limit  # padding: the first entry opens the next segment
    h = _raw_header(data, pos)
    if h is not None and (h.index, h.pos) == (cp.begin_index, pos):
        return None
    if h is not None:
        return f"entry {h.index} is there"
    g = data.segment_for(pos)
    empty = g is None or g.mm[pos - g.start : pos - g.start + BODY_OFFSET].count(0) == (
        min(BODY_OFFSET, g.size - (pos - g.start))
    )
    if empty and cp.committed_index < cp.begin_index:
        return None  # nothing written since the log was reset there
    return "no entry is there"


def _infer_begin(data: MmapFileList, index: MmapFileList) -> _Cursor:
    """The begin without a checkpoint (it was lost): the first segment's first entry
    says where the log begins. Its chain seed is unknown, so it is taken from that entry
    (the chain is then checked from there)."""
    start = data.files[0].start
    try:
        h = decode_header(data.files[0].mm, 0)
    except CodecError:
        return _Cursor(start, 0, -1, 0)
    if h.index == 0:
        return _Cursor(start, 0, -1, 0)
    before = _raw_unit(index, h.index - 1)
    log.warning(
        "no checkpoint in %s: the log is taken to begin at entry %d", data.dir.parent, h.index
    )
    return _Cursor(start, h.index, h.term if before is None else before.term, UNKNOWN_CHAIN)


def _checkpoint_start(
    data: MmapFileList, index: MmapFileList, committed: int, begin: _Cursor
) -> _Cursor | None:
    """Where to scan from: the committed entry, when its index unit and data header
    agree. ``None`` means scan from the begin."""
    u = _raw_unit(index, committed)
    h = _raw_header(data, u.pos) if u is not None else None
    if u is None or h is None or u.index != committed or u.magic not in ENTRY_MAGICS:
        return None
    if (h.index, h.term, h.pos, h.size) != (u.index, u.term, u.pos, u.size):
        return None
    if committed == begin.next_index:
        return _Cursor(u.pos, committed, begin.prev_term, begin.prev_chain)
    p = _raw_unit(index, committed - 1)
    prev = _raw_header(data, p.pos) if p is not None else None
    if prev is None:
        return None
    return _Cursor(u.pos, committed, prev.term, prev.chain_crc)


def _scan(
    data: MmapFileList, index: MmapFileList, at: _Cursor, committed: int, segment_size: int
) -> tuple[_Cursor, int, int | None]:
    """Walk valid entries from ``at``; returns (the cursor after the last valid entry,
    entries scanned, the index from which units were rewritten or None).

    Blank padding is skipped, a zero header is the clean end, anything else invalid is the
    torn tail (an error at or below ``committed``). Bounded by the data: every step moves
    ``pos`` forward, at least to the next segment."""
    pos, idx, term, chain = at
    scanned = 0
    rebuild_from: int | None = None
    entries_end = pos  # the log ends where its last valid entry ends (not after a blank)
    while (f := data.segment_for(pos)) is not None:
        rel = pos - f.start
        problem = None
        if f.size - rel < MIN_BLANK_LEN:
            problem = "no room for a record header"
        else:
            magic = int.from_bytes(f.mm[rel : rel + 4], "big", signed=True)
            if magic == MAGIC_BLANK:
                if _is_blank_to_limit(f, rel):
                    pos = f.limit
                    continue
                problem = "damaged blank record"
            elif magic == 0 and f.mm[rel : rel + BODY_OFFSET].count(0) == BODY_OFFSET:
                break  # clean end of the log
            else:
                problem = _check_entry_at(f, rel, _Cursor(pos, idx, term, chain), segment_size)
        if problem is not None:
            if idx <= committed:
                raise StoreCorruptionError(
                    f"{f.path} at byte {rel} (pos {pos}): committed entry {idx} is"
                    f" damaged ({problem}); the checkpoint says entries up to {committed}"
                    " are committed. Refusing to start: restore this replica from a peer."
                )
            log.warning(
                "recovery: torn tail in %s at byte %d (entry %d: %s); truncating",
                f.path,
                rel,
                idx,
                problem,
            )
            break
        h = EntryHeader._make(HEADER.unpack_from(f.mm, rel))
        if rebuild_from is None and not _index_unit_matches(index, h):
            rebuild_from = idx
            _index_end_at(index, idx)
        if rebuild_from is not None:
            assert idx * INDEX_UNIT_SIZE == index.end, (idx, index.end)
            index.append_rolling(INDEX_UNIT.pack(h.magic, pos, h.size, idx, h.term))
        term, chain = h.term, h.chain_crc
        idx += 1
        pos += h.size
        entries_end = pos
        scanned += 1
    return _Cursor(entries_end, idx, term, chain), scanned, rebuild_from


def _is_blank_to_limit(f: MmapFile, rel: int) -> bool:
    """A blank record at ``rel`` that pads its segment to the end, all zero after it."""
    size = int.from_bytes(f.mm[rel + 4 : rel + 8], "big", signed=True)
    rest = f.size - rel - MIN_BLANK_LEN
    return size == f.size - rel and f.mm[rel + 8 : f.size].count(0) == rest


def _check_entry_at(f: MmapFile, rel: int, at: _Cursor, segment_size: int) -> str | None:
    """Why the record at ``at.next_pos`` is not the valid entry ``at.next_index``; None if it is.
    An entry must leave room for a blank record after it in its segment."""
    try:
        check_next_entry(
            f.mm,
            rel,
            f.size - rel - MIN_BLANK_LEN,
            end_pos=at.next_pos,
            segment_size=segment_size,
            index=at.next_index,
            term=at.prev_term,
            chain=at.prev_chain,
        )
    except EntryRejectedError as e:
        return str(e)
    return None


def _raw_unit(index: MmapFileList, i: int) -> IndexUnit | None:
    """The index unit stored for entry ``i``, unchecked; None if absent."""
    try:
        return decode_index_unit(index.read(i * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE))
    except (IndexError, CodecError):
        return None


def _raw_header(data: MmapFileList, pos: int) -> EntryHeader | None:
    """The entry header stored at ``pos``; None if absent or malformed."""
    f = data.segment_for(pos)
    if f is None:
        return None
    try:
        return decode_header(f.mm, pos - f.start)
    except CodecError:
        return None


def _index_unit_matches(index: MmapFileList, h: EntryHeader) -> bool:
    ipos = h.index * INDEX_UNIT_SIZE
    f = index.segment_for(ipos)
    if f is None or ipos + INDEX_UNIT_SIZE > f.end:
        return False
    u = decode_index_unit(f.mm, ipos - f.start)
    return (u.magic, u.pos, u.size, u.index, u.term) == (h.magic, h.pos, h.size, h.index, h.term)


def _index_end_at(index: MmapFileList, i: int) -> None:
    """Make the index list end at unit ``i`` (cut within it, else restart there)."""
    ipos = i * INDEX_UNIT_SIZE
    if index.files and index.begin <= ipos <= index.files[-1].limit:
        index.set_end(ipos)
    else:
        index.reset(ipos)
