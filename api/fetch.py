"""The binary fetch (issue 31): a pull page as the stored records plus an offset table,
``Accept: application/vnd.ledgermq.records`` (docs/http.md "Pull in the record format",
the layout in docs/formats.md "Record pages").

The pull runs exactly as the JSON pull's (``Reads.pull_page`` with the JSON limits: the
same selection, tag filter, long poll, statuses and offsets); only the rendering
differs. ``encode_page`` copies each record of the page once, straight from the
commitlog's view (``broker.pages``) into the answer's buffer, and writes one 16-byte
table entry per message. Nothing is decoded into a Python object per message: per record
it reads the few header integers it checks (TOTALSIZE, QUEUEOFFSET, PHYSICALOFFSET,
SYSFLAG, the BODY length), and for a batch record it hops over the inner records' heads
up to the last message the page takes.

A batch record (``broker.batch``) is always sent whole, once, whatever part of it the
page takes: the table's entries say which of its inner messages belong (a pull starting
in the middle of one names only the messages from there on). The record's bytes stay
the stored ones, so its BODYCRC still holds.

Invariants:
- the answer is ``HEADER``, the msg id prefix, ``count`` table entries, then
  ``records_bytes`` of records back to back: its length is exactly their sum;
- entry ``i`` is message ``i`` in queue order: its queue offset, the position of its
  record in the records area and its index in the record (0 for an ordinary record); a
  record appears once, at the position of its first entry, and positions only grow;
- every entry's queue offset is its record's QUEUEOFFSET plus its index, and its
  record's PHYSICALOFFSET and TOTALSIZE are its consume-queue unit's: a record that
  disagrees is refused with ``MessageFormatError``, as the JSON pull refuses it;
- the DLedger entry CRC of every record is checked before it is copied (``RawPage``'s
  check, as for the Arrow pull).
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.responses import Response

from broker import errors
from broker.message import INNER_BATCH_FLAG, MessageFormatError
from broker.msgid import msg_id_prefix
from broker.pages import RawPage, RecordChunk, distinct_records
from broker.reads import Reads
from consumequeue.queue import UNIT
from dledger.codes import DLedgerError

from . import media
from .metrics import NodeMetrics

__all__ = [
    "ENTRY",
    "HEADER",
    "MAGIC",
    "MEDIA_TYPE",
    "STATUSES",
    "VERSION",
    "RecordsPull",
    "encode_page",
    "pull_records",
    "pull_response",
]

MEDIA_TYPE = media.RECORDS
MAGIC = b"LMQR"
VERSION = 1
STATUSES = ("FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL")
"""A status's code in the header is its index here."""

HEADER = struct.Struct(">4sBBHqqqII")
"""magic, version, status, msg id prefix length, next_offset, min_offset, max_offset,
message count, records bytes: 40 bytes."""
ENTRY = struct.Struct(">qII")
"""queue_offset, record position (in the records area), inner index: 16 bytes."""

# A record's TOTALSIZE, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG and BODY length, in one read
# (docs/formats.md: bytes 0, 20, 28, 36 and 84).
_RECORD = struct.Struct(">i16xqqi44xi")
_BODY_AT = 88
# An inner record's TOTALSIZE and BODY length (bytes 0 and 16; broker.batch).
_INNER = struct.Struct(">i12xi")
_INNER_MIN = 22
_U32 = struct.Struct(">I")


class _Copier:
    """Copies a page's records into the answer, a chunk at a time (``RawPage.encode``),
    and writes its table entries. A batch record's units may fall in two chunks (a
    chunk splits where a page's span halves): it is copied once, at its first."""

    __slots__ = ("area", "body_bytes", "entries", "last", "last_at", "out", "pos", "stored")

    def __init__(self, out: bytearray, area: int) -> None:
        self.out = out
        self.area = self.pos = area  # the records area's start in ``out``; the next byte
        self.entries: list[int] = []  # flat: queue offset, record position, inner index
        self.body_bytes = 0  # the messages' bodies: the pulled-bytes metric
        self.stored = 0  # their stored bytes (``broker.reads.stored_size``): a group's budget
        self.last = -1  # the commitlog offset of the last record copied
        self.last_at = 0  # and its position in the records area

    def __call__(self, chunk: RecordChunk) -> None:
        data, base, queue_offsets = chunk.data, chunk.base, chunk.queue_offsets
        n = chunk.count
        offsets = struct.unpack_from(">" + "q12x" * n, chunk.units)  # (one C call)
        entries, unpack_record = self.entries, _RECORD.unpack_from
        k = 0
        while k < n:
            offset = offsets[k]
            end = bisect.bisect_right(offsets, offset, k)  # the units of this record
            rel = offset - base
            (size,) = _U32.unpack_from(chunk.units, k * UNIT.size + 8)
            total, queue_base, physical, sys_flag, body_len = unpack_record(data, rel)
            if total != size or physical != offset:
                raise MessageFormatError(
                    f"record at commitlog offset {offset}: TOTALSIZE {total} or PHYSICALOFFSET"
                    f" {physical} disagrees with its consume-queue unit ({size} bytes)"
                )
            if offset != self.last:
                self.last, self.last_at = offset, self.pos - self.area
                self.out[self.pos : self.pos + size] = data[rel : rel + size]
                self.pos += size
            at = self.last_at
            taken = queue_offsets[k:end]
            first, last = taken[0] - queue_base, taken[-1] - queue_base
            if not sys_flag & INNER_BATCH_FLAG:
                if end - k != 1 or first:
                    raise MessageFormatError(
                        f"record at commitlog offset {offset}: QUEUEOFFSET {queue_base}, its"
                        f" consume-queue units {list(taken)}"
                    )
                entries += (taken[0], at, 0)
                self.body_bytes += body_len
                self.stored += size
            else:
                bodies, inner_sizes = _inner_bodies(
                    data, rel, body_len, taken, queue_base=queue_base, what=f"record at {offset}"
                )
                self.body_bytes += bodies
                self.stored += inner_sizes
                entries += itertools.chain.from_iterable(
                    zip(taken, itertools.repeat(at), range(first, last + 1), strict=False)
                    if isinstance(taken, range)
                    else ((q, at, q - queue_base) for q in taken)
                )
            k = end


def _inner_bodies(
    data: memoryview, rel: int, body_len: int, taken: Sequence[int], *, queue_base: int, what: str
) -> tuple[int, int]:
    """The sums of the BODY lengths and of the TOTALSIZEs of the batch record's messages
    ``taken`` (queue offsets, ascending; the record at ``data[rel]``, its QUEUEOFFSET
    ``queue_base``): its inner records walked up to the last one taken, each checked to
    fit."""
    first, last = taken[0] - queue_base, taken[-1] - queue_base
    if first < 0:
        raise MessageFormatError(f"{what}: queue offset {taken[0]} is before it")
    wanted = None if isinstance(taken, range) else {q - queue_base for q in taken}
    unpack_inner = _INNER.unpack_from
    at = rel + _BODY_AT
    stop = at + body_len
    total = sizes = 0
    for index in range(last + 1):
        if stop - at < _INNER_MIN:
            raise MessageFormatError(f"{what}: queue offset {queue_base + index} is not in it")
        size, inner_body = unpack_inner(data, at)
        if size < _INNER_MIN or size > stop - at:
            raise MessageFormatError(f"{what}: inner record {index} does not fit")
        if index >= first and (wanted is None or index in wanted):
            total += inner_body
            sizes += size
        at += size
    return total, sizes


def _records_bytes(units: bytes) -> int:
    """The bytes of the records the units name, each counted once."""
    return sum(size for _, size in distinct_records(units))


@dataclass(frozen=True, slots=True)
class RecordsPull:
    """A pull rendered as a record page, with what the metrics and headers need."""

    content: memoryview
    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    count: int
    body_bytes: int


def encode_page(
    page: RawPage,
    *,
    status: str,
    next_offset: int,
    min_offset: int,
    max_offset: int,
    prefix: str,
) -> tuple[memoryview, int, int]:
    """The record page of ``page`` (see the module docstring), the sum of its messages'
    body lengths, and their stored bytes (``Sized``'s count: a batch record's inner
    records taken, an ordinary record whole). ``prefix``: the node's msg id prefix
    (``msg_id_prefix``)."""
    name = prefix.encode("ascii")
    n = page.count
    records_bytes = _records_bytes(page.units)
    head = HEADER.size + len(name) + n * ENTRY.size
    out = bytearray(head + records_bytes)
    HEADER.pack_into(
        out,
        0,
        MAGIC,
        VERSION,
        STATUSES.index(status),
        len(name),
        next_offset,
        min_offset,
        max_offset,
        n,
        records_bytes,
    )
    out[HEADER.size : HEADER.size + len(name)] = name
    copier = _Copier(out, head)
    page.encode(copier)
    if copier.pos != head + records_bytes:  # (the sizes are the TOTALSIZEs: checked)
        raise MessageFormatError(
            f"record page: {copier.pos - head} of {records_bytes} record bytes"
        )
    struct.pack_into(f">{'qII' * n}", out, HEADER.size + len(name), *copier.entries)
    return memoryview(out), copier.body_bytes, copier.stored


async def pull_records(
    reads: Reads,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_messages: int,
    wait_ms: int,
    tags: str | None,
) -> RecordsPull:
    """``Reads.pull`` as a record page: the same status, offsets and messages, within
    the JSON pull's limits."""
    r = await reads.pull_page(
        topic,
        queue_id,
        offset,
        max_messages=max_messages,
        wait_ms=wait_ms,
        tags=tags,
        json_limits=True,
    )
    try:
        content, body_bytes, _ = encode_page(
            r.page,
            status=r.status,
            next_offset=r.next_offset,
            min_offset=r.min_offset,
            max_offset=r.max_offset,
            prefix=msg_id_prefix(reads.settings.group),
        )
    except DLedgerError as e:
        # The log moved under the page between its units and their records (retention
        # or a snapshot install took the head): the client retries, from a fresh page.
        raise errors.BusyError(
            f"the log changed under the page ({e.message}); retry", retry_after_ms=100
        ) from None
    return RecordsPull(
        content, r.status, r.next_offset, r.min_offset, r.max_offset, r.page.count, body_bytes
    )


async def pull_response(
    reads: Reads,
    metrics: NodeMetrics,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_messages: int,
    wait_ms: int,
    tags: str | None,
) -> Response:
    """The pull route's record-page answer: the page, its status and offsets also in
    the ``PULL_*`` headers."""
    r = await pull_records(
        reads, topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
    )
    metrics.count_pulled(topic, r.count, r.body_bytes)
    return Response(r.content, media_type=MEDIA_TYPE, headers=media.pull_headers(r))
