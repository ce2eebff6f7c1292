"""The DLedger entry and index-unit codecs (docs/formats.md).

Entry, big-endian, 48-byte header then the body::

    magic 4 | size 4 | index 8 | term 8 | pos 8 | channel 4 | chain crc 4 | body crc 4 |
    body size 4 | body

Invariants:
- ``size == BODY_OFFSET + body_size`` for every NORMAL/NOOP entry;
- ``pos`` is the entry's absolute byte position in the data segments, the same on every
  replica (followers write each entry at exactly the leader's ``pos``);
- ``body_crc`` is CRC-32 of the body *as written*, i.e. after every append hook ran;
- ``chain_crc`` is CRC-32 of header bytes 0-35 (magic, size, index, term, pos, channel)
  seeded with the previous entry's ``chain_crc`` XOR this entry's ``body_crc`` (the chain
  before the first entry of a log is 0). DLedger reserves the field "like a block chain";
  we fill it, so recovery detects a header field damaged in place (a term, an index),
  and equal chains at an index mean equal histories up to it on two replicas. Body size
  is bound by ``size`` (checked equal), so it needs no CRC of its own;
- the tail of a segment too short for the next entry holds a blank record
  ``magic -1 | size`` followed by zeros, covering the rest of the segment.

The index unit (32 bytes) is ``magic 4 | pos 8 | size 4 | index 8 | term 8``; unit ``i``
lives at byte ``i * 32`` of the index segments.

``channel`` is reserved and always 0.
"""

from __future__ import annotations

import bisect
import mmap
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias, overload

from ..codes import DLedgerCode

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

MAGIC_NORMAL: Final = 1
MAGIC_NOOP: Final = 2
MAGIC_CONFIG: Final = 3  # a cluster configuration (dledger.core.membership); ours
MAGIC_BLANK: Final = -1
ENTRY_MAGICS: Final = frozenset({MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG})

HEADER = struct.Struct(">iiqqqiIIi")
"""magic, size, index, term, pos, channel, chain_crc, body_crc, body_size."""
BODY_OFFSET: Final = HEADER.size  # 48
POS_OFFSET: Final = 24
CHAIN_CRC_OFFSET: Final = 36
BODY_CRC_OFFSET: Final = 40
INDEX_TERM_OFFSET: Final = 8

BLANK = struct.Struct(">ii")
MIN_BLANK_LEN: Final = BLANK.size  # 8

INDEX_UNIT = struct.Struct(">iqiqq")
"""magic, pos, size, index, term."""
INDEX_UNIT_SIZE: Final = INDEX_UNIT.size  # 32

_MAGIC_SIZE = struct.Struct(">ii")
_U32 = struct.Struct(">I")

assert BODY_OFFSET == 48 and INDEX_UNIT_SIZE == 32 and MIN_BLANK_LEN == 8


def crc32(data: Buffer) -> int:
    """CRC-32 (Java ``CRC32``, crcmod ``crc-32``), unsigned.

    ``zlib.crc32`` is the hot-path implementation: it is ~5x faster than crcmod's C
    extension on 1 KiB inputs (see bench/crc_bench.py); a test keeps both in agreement.
    """
    return zlib.crc32(data) & 0xFFFFFFFF


def chain_crc(header: Buffer, prev_chain: int, offset: int = 0) -> int:
    """The chain CRC of the header at ``offset`` (whose body CRC must already be set)."""
    (body_crc,) = _U32.unpack_from(header, offset + BODY_CRC_OFFSET)
    return zlib.crc32(header[offset : offset + CHAIN_CRC_OFFSET], prev_chain ^ body_crc)


class CodecError(ValueError):
    """Bytes that do not form a valid entry or index unit."""


class EntryRejectedError(CodecError):
    """Bytes that are not the valid next entry of a log; ``code`` is the DLedger code a
    follower answers with; ``damaged``: the entry's body fails its own CRC (its bytes were
    damaged on their way, or on the disk they were read from)."""

    def __init__(self, code: DLedgerCode, message: str, *, damaged: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.damaged = damaged


UNKNOWN_CHAIN: Final = -1
"""A chain seed that cannot be known (a log whose checkpoint is lost and which does not
start at 0): the next entry's chain is then accepted as it is."""


def first_index_of_term(term_at: Callable[[int], int], lo: int, hi: int, term: int) -> int:
    """The first index in ``[lo, hi]`` whose entry has ``term``, or -1
    (``getFirstLogOfTargetTerm``). Terms never decrease along a log, so this is a
    binary search: a term may span millions of entries."""
    indexes = range(lo, hi + 1)
    k = bisect.bisect_left(indexes, term, key=term_at)
    return indexes[k] if k < len(indexes) and term_at(indexes[k]) == term else -1


def last_index_of_term(term_at: Callable[[int], int], lo: int, hi: int, term: int) -> int:
    """The last index in ``[lo, hi]`` whose entry has ``term``, or -1 (binary search)."""
    indexes = range(lo, hi + 1)
    k = bisect.bisect_right(indexes, term, key=term_at) - 1
    return indexes[k] if k >= 0 and term_at(indexes[k]) == term else -1


def place_entry(end_pos: int, segment_size: int, size: int) -> int:
    """Where an entry of ``size`` bytes goes when the log ends at ``end_pos``.

    The leader's rule: it fits the current segment if ``size`` plus room for a
    blank record is free; otherwise the rest is padded and it starts the next segment.
    Followers apply the same rule, which is why replicas stay byte-identical."""
    seg_start = end_pos - end_pos % segment_size
    free = seg_start + segment_size - end_pos
    if size + MIN_BLANK_LEN <= free:
        return end_pos
    return seg_start + segment_size


class EntryHeader(NamedTuple):
    """A decoded 48-byte entry header."""

    magic: int
    size: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index; the DLedger name wins)
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_size: int


class Entry(NamedTuple):
    """A whole entry: what ``get(index)`` returns."""

    index: int  # type: ignore[assignment]  # (shadows tuple.index; the DLedger name wins)
    term: int
    pos: int
    magic: int
    body: bytes
    body_crc: int
    chain_crc: int = 0

    @property
    def size(self) -> int:
        return BODY_OFFSET + len(self.body)

    @property
    def end_pos(self) -> int:
        return self.pos + self.size


class EntryMeta(NamedTuple):
    """What an append hook (and the Raft layer) learns about an appended entry."""

    index: int  # type: ignore[assignment]  # (shadows tuple.index; the DLedger name wins)
    term: int
    pos: int
    size: int
    magic: int


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """Configuration entry ``index`` of ``term`` with ``body`` (``dledger.core.membership``);
    index -1 is the bootstrap configuration (the ``--peers`` a node first started with).
    The store keeps them (``configs``); a snapshot carries the one in force."""

    index: int
    term: int
    body: bytes


class EntryMetas(Sequence[EntryMeta]):
    """The metas of a batch appended as leader: a sequence of :class:`EntryMeta` kept as
    two lists (pos, size), so the hot path makes no object per entry."""

    __slots__ = ("first_index", "magic", "positions", "sizes", "term")

    def __init__(
        self, first_index: int, term: int, magic: int, positions: list[int], sizes: list[int]
    ) -> None:
        self.first_index = first_index
        self.term = term
        self.magic = magic
        self.positions = positions
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, i: int) -> EntryMeta: ...
    @overload
    def __getitem__(self, i: slice) -> list[EntryMeta]: ...
    def __getitem__(self, i: int | slice) -> EntryMeta | list[EntryMeta]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self.positions)
        pos, size = self.positions[i], self.sizes[i]
        return EntryMeta(self.first_index + i, self.term, pos, size, self.magic)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EntryMetas(first_index={self.first_index}, term={self.term}, n={len(self)})"


class IndexUnit(NamedTuple):
    magic: int
    pos: int
    size: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index; the DLedger name wins)
    term: int


def encode_entry(  # noqa: PLR0917
    index: int,
    term: int,
    pos: int,
    body: Buffer,
    magic: int = MAGIC_NORMAL,
    prev_chain: int = 0,
) -> bytes:
    """Encode a complete entry: body CRC over ``body``, chain CRC from ``prev_chain``."""
    if magic not in ENTRY_MAGICS:
        raise CodecError(f"invalid entry magic {magic}")
    n = len(body)
    buf = bytearray(HEADER.pack(magic, BODY_OFFSET + n, index, term, pos, 0, 0, crc32(body), n))
    _U32.pack_into(buf, CHAIN_CRC_OFFSET, chain_crc(buf, prev_chain))
    return bytes(buf) + bytes(body)


def decode_header(buf: Buffer, offset: int = 0) -> EntryHeader:
    """Decode a header; raise :class:`CodecError` if it is not a well-formed entry header."""
    if len(buf) - offset < BODY_OFFSET:
        raise CodecError(f"short header: {len(buf) - offset} bytes, need {BODY_OFFSET}")
    h = EntryHeader._make(HEADER.unpack_from(buf, offset))
    check_header(h)
    return h


def check_header(h: EntryHeader) -> None:
    if h.magic not in ENTRY_MAGICS:
        raise CodecError(f"invalid magic {h.magic}")
    if h.body_size < 0 or h.size != BODY_OFFSET + h.body_size:
        raise CodecError(f"size {h.size} != {BODY_OFFSET} + body size {h.body_size}")
    if h.index < 0 or h.term < 0 or h.pos < 0:
        raise CodecError(f"negative index/term/pos ({h.index}, {h.term}, {h.pos})")
    if h.channel != 0:
        raise CodecError(f"reserved channel field is {h.channel}, not 0")


def decode_entry(buf: Buffer, offset: int = 0, verify: bool = True) -> Entry:
    """Decode one entry at ``offset``; verify its body CRC unless told not to."""
    h = decode_header(buf, offset)
    end = offset + h.size
    if len(buf) < end:
        raise CodecError(f"entry {h.index} truncated: need {h.size} bytes")
    body = bytes(buf[offset + BODY_OFFSET : end])
    if verify and crc32(body) != h.body_crc:
        raise CodecError(f"entry {h.index} at pos {h.pos}: body CRC mismatch")
    return Entry(h.index, h.term, h.pos, h.magic, body, h.body_crc, h.chain_crc)


def peek_magic_size(buf: Buffer, offset: int) -> tuple[int, int]:
    """The first two fields of an entry or blank record."""
    magic, size = _MAGIC_SIZE.unpack_from(buf, offset)
    return int(magic), int(size)


def encode_blank(size: int) -> bytes:
    """A blank record of ``size`` bytes: magic -1, size, then zeros."""
    if size < MIN_BLANK_LEN:
        raise CodecError(f"blank record needs at least {MIN_BLANK_LEN} bytes, got {size}")
    return BLANK.pack(MAGIC_BLANK, size) + bytes(size - MIN_BLANK_LEN)


def encode_index_unit(magic: int, pos: int, size: int, index: int, term: int) -> bytes:
    return INDEX_UNIT.pack(magic, pos, size, index, term)


def decode_index_unit(buf: Buffer, offset: int = 0) -> IndexUnit:
    if len(buf) - offset < INDEX_UNIT_SIZE:
        raise CodecError(f"short index unit: {len(buf) - offset} bytes")
    return IndexUnit._make(INDEX_UNIT.unpack_from(buf, offset))


def check_next_entry(
    buf: Buffer,
    offset: int,
    avail: int,
    *,
    end_pos: int,
    segment_size: int,
    index: int,
    term: int,
    chain: int,
) -> EntryHeader:
    """Check that the bytes at ``offset`` are the valid next entry of a log that ends at
    ``end_pos`` with entry ``index - 1`` of term ``term`` and chain CRC ``chain``.

    The one rule for "is this the next entry", used by follower appends (on the leader's
    frame) and by recovery (on the data files): a well-formed header, at most ``avail``
    bytes long, the next index, a term no lower, the pos the placement rule gives, and
    matching chain and body CRCs. Raises :class:`EntryRejectedError` with the DLedger code a
    follower answers with."""
    if avail < BODY_OFFSET:
        raise EntryRejectedError(DLedgerCode.INCONSISTENT_STATE, "header cut short")
    h = EntryHeader._make(HEADER.unpack_from(buf, offset))
    try:
        check_header(h)
    except CodecError as e:
        raise EntryRejectedError(DLedgerCode.INCONSISTENT_STATE, f"bad header: {e}") from e
    if h.size > avail:
        raise EntryRejectedError(DLedgerCode.INCONSISTENT_STATE, f"size {h.size} does not fit")
    if h.index != index:
        raise EntryRejectedError(
            DLedgerCode.INCONSISTENT_INDEX, f"entry index {h.index}, expected {index}"
        )
    if h.term < term:
        raise EntryRejectedError(
            DLedgerCode.INCONSISTENT_TERM, f"entry {h.index} term {h.term} < {term}"
        )
    pos = place_entry(end_pos, segment_size, h.size)
    if h.pos != pos:
        raise EntryRejectedError(
            DLedgerCode.INCONSISTENT_STATE, f"entry {h.index} has pos {h.pos}, it goes at {pos}"
        )
    end = offset + h.size
    body_crc = zlib.crc32(buf[offset + BODY_OFFSET : end])
    if body_crc != h.body_crc:
        raise EntryRejectedError(
            DLedgerCode.INCONSISTENT_STATE, f"entry {h.index}: body CRC mismatch", damaged=True
        )
    header = buf[offset : offset + CHAIN_CRC_OFFSET]
    if chain != UNKNOWN_CHAIN and zlib.crc32(header, chain ^ body_crc) != h.chain_crc:
        raise EntryRejectedError(
            DLedgerCode.INCONSISTENT_STATE,
            f"entry {h.index}: chain CRC mismatch (damaged header, or histories differ)",
        )
    return h
