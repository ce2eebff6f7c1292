"""Runs: a batch of entries laid out for writing, one contiguous run of bytes per segment,
with the index units and chain CRC that go with them (docs/formats.md).

Both sides of replication produce the same runs for the same entries, which is what keeps
replicas byte-identical:
- ``encode_leader_runs``: the leader assigns index, term and pos to each body by the
  placement rule (``place_entry``: an entry never straddles two segments, the rest of a
  segment becomes blank padding), runs the append hooks on the encoded bytes, then
  computes the body CRC and the chain CRC;
- ``split_follower_runs``: a follower takes the leader's bytes as they are, checks each
  entry (next index, term not lower, the pos the placement rule gives, body and chain CRC)
  and splits them where the leader started a new segment.

Laying out touches no file, so a refused batch raises before anything is written;
``write_runs`` then writes the runs, all or nothing, and only after it returns does the
store move its ledger end.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from .base import AppendHook, StoreError, place_entry
from .entry import (
    BODY_OFFSET,
    CHAIN_CRC_OFFSET,
    HEADER,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MIN_BLANK_LEN,
    EntryMeta,
    EntryMetas,
    EntryRejectedError,
    check_next_entry,
)
from .mmapfile import MmapFileList

_CRCS = struct.Struct(">II")  # chain crc, body crc: adjacent header fields

Run = tuple[int, bytes | bytearray | memoryview]  # (pos of its first byte, its bytes)


class UndoFailedError(Exception):
    """A write of runs failed (``error``), and so did undoing it (the ``__cause__``): part
    of the batch may be in the log now, so the outcome is unknown."""

    def __init__(self, error: OSError, undo_error: OSError) -> None:
        super().__init__(f"{error}; undoing it failed: {undo_error}")
        self.error = error
        self.undo_error = undo_error


def encode_leader_runs(
    bodies: Sequence[bytes | bytearray | memoryview],
    *,
    term: int,
    magic: int,
    first_index: int,
    end_pos: int,
    prev_chain: int,
    segment_size: int,
    hooks: Sequence[AppendHook],
) -> tuple[list[Run], EntryMetas, bytearray, int]:
    """Encode ``bodies`` as entries ``first_index ..`` after a log ending at ``end_pos``
    with chain ``prev_chain``: (runs, metas, index units, the last chain CRC).

    One pass: this loop is the leader's hot path, so it does the per-entry minimum (pack
    header, copy body, hooks, two CRCs, pack unit)."""
    pack_header = HEADER.pack_into
    pack_crcs = _CRCS.pack_into
    pack_unit = INDEX_UNIT.pack_into
    crc32 = zlib.crc32
    n = len(bodies)
    sizes = [BODY_OFFSET + len(b) for b in bodies]
    units = bytearray(INDEX_UNIT_SIZE * n)
    positions: list[int] = []
    runs: list[Run] = []
    index = first_index
    chain = prev_chain
    i = uoff = 0
    while i < n:
        run_pos = place_entry(end_pos, segment_size, sizes[i])
        room = run_pos - run_pos % segment_size + segment_size - MIN_BLANK_LEN - run_pos
        total, k = 0, i
        while k < n and total + sizes[k] <= room:
            total += sizes[k]
            k += 1
        buf = bytearray(total)
        view = memoryview(buf)
        off = 0
        for j in range(i, k):
            body = bodies[j]
            size = sizes[j]
            pos = run_pos + off
            pack_header(buf, off, magic, size, index, term, pos, 0, 0, 0, size - BODY_OFFSET)
            buf[off + BODY_OFFSET : off + size] = body
            if hooks:
                meta = EntryMeta(index, term, pos, size, magic)
                for hook in hooks:
                    hook(meta, view[off : off + size], BODY_OFFSET)
                body_crc = crc32(view[off + BODY_OFFSET : off + size])
            else:
                body_crc = crc32(body)
            chain = crc32(view[off : off + CHAIN_CRC_OFFSET], chain ^ body_crc)
            pack_crcs(buf, off + CHAIN_CRC_OFFSET, chain, body_crc)
            pack_unit(units, uoff, magic, pos, size, index, term)
            positions.append(pos)
            index += 1
            off += size
            uoff += INDEX_UNIT_SIZE
        view.release()
        runs.append((run_pos, buf))
        end_pos = run_pos + total
        i = k
    return runs, EntryMetas(first_index, term, magic, positions, sizes), units, chain


def split_follower_runs(
    view: memoryview,
    *,
    end_pos: int,
    next_index: int,
    prev_term: int,
    prev_chain: int,
    segment_size: int,
    max_entry_bytes: int,
) -> tuple[list[Run], list[EntryMeta], bytearray, int]:
    """Check the leader's raw entries in ``view`` against a log ending at ``end_pos``
    (next entry ``next_index``, last term and chain ``prev_term``/``prev_chain``):
    (runs, metas, index units, the last chain CRC). Raises ``StoreError`` with the
    entry's refusal code at the first entry that does not fit; nothing is written then."""
    index, term, chain = next_index, prev_term, prev_chain
    metas: list[EntryMeta] = []
    units = bytearray()
    runs: list[Run] = []
    run_start, run_pos = 0, -1
    off = 0
    while off < len(view):  # each step consumes one whole entry of the view
        try:
            h = check_next_entry(
                view,
                off,
                min(len(view) - off, max_entry_bytes),
                end_pos=end_pos,
                segment_size=segment_size,
                index=index,
                term=term,
                chain=chain,
            )
        except EntryRejectedError as e:
            raise StoreError(e.code, str(e), damaged=e.damaged) from e
        pos, chain = h.pos, h.chain_crc
        if pos != end_pos or run_pos < 0:
            if run_pos >= 0:
                runs.append((run_pos, view[run_start:off]))
            run_start, run_pos = off, pos
        metas.append(EntryMeta(h.index, h.term, pos, h.size, h.magic))
        units += INDEX_UNIT.pack(h.magic, pos, h.size, h.index, h.term)
        end_pos = pos + h.size
        index += 1
        term = h.term
        off += h.size
    if run_pos >= 0:
        runs.append((run_pos, view[run_start:off]))
    return runs, metas, units, chain


def write_runs(
    data: MmapFileList,
    index: MmapFileList,
    runs: Sequence[Run],
    unit_pos: int,
    units: bytes | bytearray,
) -> None:
    """Write pre-placed ``runs`` and their index ``units`` (the first at ``unit_pos``).

    All or nothing: a write that fails part-way (``ENOSPC`` when blocks are reserved,
    ``EIO`` anywhere) is undone (segments created since deleted, bytes after the old end
    zeroed) and its ``OSError`` raised, so no orphan bytes shift the next entry's pos and
    recovery adopts nothing. If the undo fails too: :class:`UndoFailedError`."""
    data_end, data_files = data.end, len(data.files)
    index_end, index_files = index.end, len(index.files)
    try:
        for pos, run in runs:
            data.write_run(pos, run)
        assert unit_pos == index.end, (unit_pos, index.end)
        index.append_rolling(units)
    except OSError as e:
        try:
            data.undo_append(data_end, data_files)
            index.undo_append(index_end, index_files)
        except OSError as again:
            raise UndoFailedError(e, again) from again
        raise
