"""The binary fetch (issue 31): a pull page as the stored records plus an offset table,
``Accept: application/vnd.ledgermq.records`` (docs/http.md "Pull in the record format",
the layout in docs/formats.md "Record pages").

The pull runs exactly as the JSON pull's (``Reads.pull_page`` with the JSON limits: the
same selection, tag filter, long poll, statuses and offsets); only the rendering
differs. ``encode_records`` copies each record of the page once, straight from the
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

import struct
from dataclasses import dataclass

from starlette.responses import Response

from broker import errors
from broker.message import INNER_BATCH_FLAG, MessageFormatError
from broker.msgid import msg_id_prefix
from broker.pages import RawPage, RecordChunk
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
    "encode_records",
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


@dataclass(slots=True)
class _Walk:
    """Where the walk of a batch record's inner records got to: inner ``index`` starts
    at ``at``; the BODY ends at ``end``."""

    index: int
    at: int
    end: int


def _copy_chunk(
    chunk: RecordChunk, out: bytearray, pos: int, area: int, entries: list[int]
) -> tuple[int, int]:
    """The chunk's records copied into ``out`` from ``pos`` on, each once, and its
    messages' entries appended to ``entries`` (flat: queue offset, position from
    ``area``, the records area's start in ``out``, and index).
    Returns the position after the last record and the sum of the messages' body
    lengths (the pulled-bytes metric)."""
    data, base, offsets = chunk.data, chunk.base, chunk.queue_offsets
    unpack_record, unpack_inner = _RECORD.unpack_from, _INNER.unpack_from
    body_bytes = 0
    previous = -1
    at = queue_base = 0
    walk: _Walk | None = None
    for k, (offset, size, _) in enumerate(UNIT.iter_unpack(chunk.units)):
        queue_offset = offsets[k]
        if offset != previous:
            previous = offset
            rel = offset - base
            total, queue_base, physical, sys_flag, body_len = unpack_record(data, rel)
            if total != size or physical != offset:
                raise MessageFormatError(
                    f"record at commitlog offset {offset}: TOTALSIZE {total} or PHYSICALOFFSET"
                    f" {physical} disagrees with its consume-queue unit ({size} bytes)"
                )
            at = pos
            out[pos : pos + size] = data[rel : rel + size]
            pos += size
            if sys_flag & INNER_BATCH_FLAG:
                start = rel + _BODY_AT
                walk = _Walk(0, start, start + body_len)
            else:
                walk = None
                body_bytes += body_len
        index = queue_offset - queue_base
        if walk is None:
            if index:
                raise MessageFormatError(
                    f"record at commitlog offset {offset}: QUEUEOFFSET {queue_base},"
                    f" its consume-queue unit {queue_offset}"
                )
        else:
            if index < walk.index:
                raise MessageFormatError(
                    f"batch record at {offset}: queue offset {queue_offset} out of order"
                )
            while True:
                if walk.end - walk.at < _INNER_MIN:
                    raise MessageFormatError(
                        f"batch record at {offset}: queue offset {queue_offset} is not in it"
                    )
                inner_size, inner_body = unpack_inner(data, walk.at)
                if inner_size < _INNER_MIN or inner_size > walk.end - walk.at:
                    raise MessageFormatError(
                        f"batch record at {offset}: inner record {walk.index} does not fit"
                    )
                if walk.index == index:
                    body_bytes += inner_body
                    break
                walk.at += inner_size
                walk.index += 1
        entries += (queue_offset, at - area, index)
    return pos, body_bytes


def _records_bytes(units: bytes) -> int:
    """The bytes of the records the units name, each counted once."""
    total, previous = 0, -1
    for offset, size, _ in UNIT.iter_unpack(units):
        if offset != previous:
            total += size
            previous = offset
    return total


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


def encode_records(
    page: RawPage,
    *,
    status: str,
    next_offset: int,
    min_offset: int,
    max_offset: int,
    prefix: str,
) -> tuple[memoryview, int]:
    """The record page of ``page`` (see the module docstring) and the sum of its
    messages' body lengths. ``prefix``: the node's msg id prefix (``msg_id_prefix``)."""
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
    entries: list[int] = []
    pos = head
    body_bytes = 0

    def copy(chunk: RecordChunk) -> None:
        nonlocal pos, body_bytes
        pos, b = _copy_chunk(chunk, out, pos, head, entries)
        body_bytes += b

    page.encode(copy)
    if pos != len(out):  # (the units' sizes are the records' TOTALSIZEs: checked above)
        raise MessageFormatError(f"record page: {pos - head} of {records_bytes} record bytes")
    struct.pack_into(f">{'qII' * n}", out, HEADER.size + len(name), *entries)
    return memoryview(out), body_bytes


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
        content, body_bytes = encode_records(
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


def pull_headers(r: RecordsPull) -> dict[str, str]:
    """The ``PULL_*`` response headers of a record page (what its header block says,
    for a reader with curl)."""
    return {
        media.PULL_STATUS: r.status,
        media.PULL_NEXT_OFFSET: str(r.next_offset),
        media.PULL_MIN_OFFSET: str(r.min_offset),
        media.PULL_MAX_OFFSET: str(r.max_offset),
        media.PULL_COUNT: str(r.count),
    }


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
    return Response(r.content, media_type=MEDIA_TYPE, headers=pull_headers(r))
