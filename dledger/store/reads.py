"""The file store's read path: an entry found through its index unit or by its position,
checked before it is returned, and the raw batches replication sends (docs/formats.md).

Every read that returns an entry checks it: its header against its index unit (the unit
was written from those very fields) and its body against its CRC. A copy that fails is
:class:`CorruptEntryError` naming the file and byte; it is never returned, and only that
read is refused (the other replicas hold good copies).

The functions take the segment lists and the ledger bounds the store passes, and change
nothing. The store calls them under its lock (nothing may unmap a segment while a read
is in it) and does the CPU-heavy part, decoding and the body CRC, after releasing it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..codes import DLedgerCode
from .base import CorruptEntryError, StoreError
from .entry import (
    BODY_OFFSET,
    HEADER,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    CodecError,
    Entry,
    IndexUnit,
    crc32,
    decode_entry,
    decode_index_unit,
)
from .mmapfile import MmapFile, MmapFileList


def index_unit(index: MmapFileList, i: int, begin_index: int, end_index: int) -> IndexUnit:
    """Index unit ``i`` as written, of a log holding entries ``begin_index..end_index``;
    ``StoreError(INDEX_OUT_OF_RANGE)`` for any other ``i``."""
    if not begin_index <= i <= end_index:
        raise StoreError(
            DLedgerCode.INDEX_OUT_OF_RANGE, f"index {i} outside [{begin_index}, {end_index}]"
        )
    return decode_index_unit(index.read(i * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE))


def damaged(data: MmapFileList, index: int, pos: int, problem: str) -> CorruptEntryError:
    """The error of a read that found this copy of entry ``index`` (at ``pos``) damaged."""
    f = data.segment_for(pos)
    where = f"{f.path} at byte {pos - f.start} (pos {pos})" if f else f"pos {pos}"
    return CorruptEntryError(
        index,
        pos,
        f"{where}: entry {index} is damaged ({problem}); this replica cannot"
        " serve it (the other replicas can; restore this one from a peer to repair it)",
    )


# ---- by index ----------------------------------------------------------------------------


def unit_bytes(data: MmapFileList, u: IndexUnit) -> bytes:
    """The bytes an index unit points at; ``CorruptEntryError`` if they are not there."""
    try:
        return data.read(u.pos, u.size)
    except IndexError:
        raise damaged(
            data, u.index, u.pos, f"its index unit points outside the data (size {u.size})"
        ) from None


def checked_entry(data: MmapFileList, raw: bytes, index: int, u: IndexUnit) -> Entry:
    """Decode entry ``index`` from the bytes its index unit ``u`` points at: the header
    must agree with the request and the unit, the body with its CRC, else
    ``CorruptEntryError`` (this copy is damaged)."""
    try:
        e = decode_entry(raw)
    except CodecError as err:
        raise damaged(data, index, u.pos, str(err)) from err
    if (e.index, e.pos, e.term, e.magic) != (index, u.pos, u.term, u.magic):
        raise damaged(data, index, u.pos, "its header disagrees with its index unit")
    return e


def iter_units(
    index: MmapFileList, first: int, last: int
) -> Iterator[tuple[int, int, int, int, int]]:
    """Decode index units ``first..last`` as tuples, one read per index segment."""
    isz = index.file_size
    i = first
    while i <= last:
        unit_pos = i * INDEX_UNIT_SIZE
        n = min(last - i + 1, (isz - unit_pos % isz) // INDEX_UNIT_SIZE)
        yield from INDEX_UNIT.iter_unpack(index.read(unit_pos, n * INDEX_UNIT_SIZE))
        i += n


def batch_extent(
    index: MmapFileList,
    from_index: int,
    first: IndexUnit,
    last_index: int,
    *,
    segment_size: int,
    max_bytes: int,
) -> tuple[int, int, int]:
    """How far a raw batch of entries ``from_index..`` goes (``first``: its first index
    unit): (its end pos, the entry count, the last entry's term). At least one entry;
    then stop at ``last_index``, ``max_bytes``, a gap or a segment end."""
    seg_limit = first.pos - first.pos % segment_size + segment_size
    start = end = first.pos
    count, last_term = 0, first.term
    for _magic, pos, size, _index, term in iter_units(index, from_index, last_index):
        too_big = count and end + size - start > max_bytes
        if pos != end or pos + size > seg_limit or too_big:
            break
        end += size
        count += 1
        last_term = term
    return end, count, last_term


# ---- by position -------------------------------------------------------------------------


def find_entry_at(  # noqa: PLR0917  # positional: keywords cost a consumer's read 2% (3.11)
    data: MmapFileList,
    index: MmapFileList,
    pos: int,
    body_size: int | None,
    begin_pos: int,
    limit: int,
    begin_index: int,
    end_index: int,
) -> tuple[bytes, int, int]:
    """``FileStore.read_entry_at`` under the lock: the entry that starts at ``pos``, with
    every check but the body CRC; returns (its bytes, its index, its body CRC), and the
    caller checks the CRC after releasing the lock. ``begin_pos``/``limit``: the
    readable bytes; ``begin_index``/``end_index``: the log's entries."""
    if pos < begin_pos or pos + BODY_OFFSET > limit:
        raise StoreError(
            DLedgerCode.INDEX_OUT_OF_RANGE,
            f"no entry at pos {pos}: outside [{begin_pos}, {limit})",
        )
    whole = None  # header and body in one read, where the caller's size allows it
    if body_size is not None and pos + BODY_OFFSET + body_size <= limit:
        try:
            whole = data.read(pos, BODY_OFFSET + body_size)
        except IndexError:  # across a segment: read the header alone
            whole = None
    try:
        head = HEADER.unpack_from(whole if whole is not None else data.read(pos, BODY_OFFSET))
    except IndexError:  # a header there would cross its segment's end
        head = None
    unit = None
    if head is not None and head[4] == pos and begin_index <= head[2] <= end_index:
        unit = INDEX_UNIT.unpack_from(index.read(head[2] * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE))
    if head is None or unit is None or unit[1] != pos:
        if body_size is None:
            raise StoreError(DLedgerCode.INDEX_OUT_OF_RANGE, f"no entry starts at {pos}")
        raise damaged(data, -1, pos, "no intact entry header there")
    magic, size, i, term, _pos, channel, _chain, body_crc, head_body_size = head
    # The index unit was written from these very fields: any difference, or a header that
    # breaks its own rules, is damage the body CRC does not cover.
    if unit != (magic, pos, size, i, term) or (channel, size) != (0, BODY_OFFSET + head_body_size):
        raise damaged(data, i, pos, "its header disagrees with its index unit")
    if body_size is not None and size != BODY_OFFSET + body_size:
        expected = f"a body of {head_body_size} bytes where {body_size} are expected"
        raise damaged(data, i, pos, expected)
    if pos + size > limit:
        raise StoreError(DLedgerCode.INDEX_OUT_OF_RANGE, f"entry {i} ends past {limit}")
    if whole is not None:  # its size is the caller's, checked above
        return whole, i, body_crc
    try:
        return data.read(pos, size), i, body_crc
    except IndexError:
        raise damaged(data, i, pos, f"its size {size} crosses its segment") from None


def find_entries_at(  # noqa: PLR0917  # positional, like find_entry_at
    data: MmapFileList,
    index: MmapFileList,
    spans: Sequence[tuple[int, int | None]],
    begin_pos: int,
    limit: int,
    begin_index: int,
    end_index: int,
) -> list[tuple[bytes, int, int, int]]:
    """``FileStore.read_entries_at`` under the lock: ``find_entry_at`` for each
    ``(pos, body_size)``, as (its bytes, its index, its body CRC, ``pos``)."""
    return [
        (*find_entry_at(data, index, pos, body_size, begin_pos, limit, begin_index, end_index), pos)
        for pos, body_size in spans
    ]


def check_bodies(data: MmapFileList, found: list[tuple[bytes, int, int, int]]) -> list[bytes]:
    """The entries ``find_entries_at`` found, each body against its CRC (after the lock
    is released: the bytes are copies); ``CorruptEntryError`` for the first that fails."""
    for raw, i, body_crc, pos in found:
        if crc32(memoryview(raw)[BODY_OFFSET:]) != body_crc:
            raise damaged(data, i, pos, "body CRC mismatch")
    return [f[0] for f in found]


def read_span(data: MmapFileList, pos: int, size: int, begin_pos: int) -> bytes:
    """A copy of ``[pos, pos + size)``, which must lie within ``[begin_pos, data.end)``
    and one segment (``FileStore.read``); else ``StoreError(INDEX_OUT_OF_RANGE)``."""
    if size < 0 or pos < begin_pos or pos + size > data.end:
        raise StoreError(
            DLedgerCode.INDEX_OUT_OF_RANGE,
            f"read [{pos}, {pos + size}) outside [{begin_pos}, {data.end})",
        )
    try:
        return data.read(pos, size)
    except IndexError as e:
        raise StoreError(DLedgerCode.INDEX_OUT_OF_RANGE, str(e)) from e


def view_segment(data: MmapFileList, pos: int, size: int, begin_pos: int, end: int) -> MmapFile:
    """The segment holding ``[pos, pos + size)``, which must lie within ``[begin_pos,
    end)`` and one segment (``FileStore.view``); else ``StoreError(INDEX_OUT_OF_RANGE)``."""
    f = data.segment_for(pos)
    if size < 0 or pos < begin_pos or pos + size > end or f is None:
        raise StoreError(
            DLedgerCode.INDEX_OUT_OF_RANGE,
            f"view [{pos}, {pos + size}) outside [{begin_pos}, {end})",
        )
    if pos + size > f.end:
        raise StoreError(
            DLedgerCode.INDEX_OUT_OF_RANGE,
            f"view [{pos}, {pos + size}) crosses the end of a segment ({f.end})",
        )
    return f
