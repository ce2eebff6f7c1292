"""The group pull and the POP receive in the record format (issue 31): answers of many
queues as a sequence of record pages (docs/formats.md "Record pages of many queues"),
``Accept: application/vnd.ledgermq.records``.

Each queue's part of the answer is a record page exactly as the one-queue pull makes it
(``api.fetch``), so one decoder reads all three answers. A group pull's answer is its
pages, one per queue it looked at (``ConsumerGroups.group_pull_parts``: the JSON group
pull's selection, budget, long poll and commit, only the rendering differs), each with
its queue's status and next offset: the JSON body's ``next_offsets``. A POP receive's
answer is its messages cut into pages at every change of queue (and wherever a queue's
offsets do not grow), plus one receipt per message: its delivery attempt, invisible
time and receipt handle, as the JSON answer gives them.

Invariants:
- the answer is ``GROUP_HEADER``, then (POP) ``message count`` receipts, then ``page
  count`` frames: the queue id, the page's length and the page; its length is exactly
  their sum; the messages of the answer are the pages' messages in order, and in the
  JSON answer's order;
- a page of a POP answer has status FOUND and offsets 0 (a POP group's offsets are the
  broker's); each of its records is the one its message was read from before the
  receive was appended, copied once per answer and checked as every read is.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import TypeVar

from starlette.responses import Response

from broker import errors
from broker.groups import ConsumerGroups, QueuePart
from broker.message import Buffer, RecordHead
from broker.msgid import msg_id_prefix
from broker.pop.service import PopGroups, Received
from broker.reads import MessageMaker
from dledger.codes import DLedgerError
from dledger.store import BODY_OFFSET

from . import fetch, media, models
from .metrics import NodeMetrics

__all__ = [
    "GROUP_HEADER",
    "GROUP_MAGIC",
    "PAGE_FRAME",
    "POP_MAGIC",
    "RECEIPT",
    "VERSION",
    "RecordRefs",
    "group_pull_response",
    "receive",
    "receive_response",
]

M = TypeVar("M")

GROUP_MAGIC = b"LMQG"
POP_MAGIC = b"LMQP"
VERSION = 1
GROUP_HEADER = struct.Struct(">4sB3xII")
"""magic, version, 3 bytes reserved (0), page count, message count: 16 bytes."""
PAGE_FRAME = struct.Struct(">II")
"""queue_id, the page's bytes: 8 bytes before each page."""
RECEIPT = struct.Struct(">IqH")
"""delivery_attempt, invisible_until, receipt handle length (its ASCII follows): 14 bytes."""

_SIZE_AND_OFFSET = struct.Struct(">i24xq")  # a record's TOTALSIZE and PHYSICALOFFSET (28)
# A message of a POP answer: queue id, queue offset, its record's commitlog offset, its
# index in the record.
_Ref = tuple[int, int, int, int]


def _busy(e: DLedgerError) -> errors.BusyError:
    # The log moved under a page between its units and their records (retention or a
    # snapshot install took the head): the client retries, from a fresh page.
    return errors.BusyError(
        f"the log changed under the page ({e.message}); retry", retry_after_ms=100
    )


def _framed(
    magic: bytes, pages: list[tuple[int, memoryview]], count: int, receipts: bytes
) -> bytes:
    parts: list[bytes | memoryview] = [GROUP_HEADER.pack(magic, VERSION, len(pages), count)]
    parts.append(receipts)
    for queue_id, page in pages:
        parts += (PAGE_FRAME.pack(queue_id, len(page)), page)
    return b"".join(parts)


def _headers(count: int) -> dict[str, str]:
    return {media.PULL_COUNT: str(count)}


async def group_pull_response(
    groups: ConsumerGroups, metrics: NodeMetrics, group: str, body: models.GroupPull
) -> Response:
    """The group pull's record answer: a page per queue looked at."""
    reads = groups.reads
    prefix = msg_id_prefix(reads.settings.group)
    body_bytes = 0

    async def pull_queue(
        topic: str, queue_id: int, queue_offset: int, max_messages: int, max_bytes: int
    ) -> QueuePart[memoryview]:
        nonlocal body_bytes
        r = await reads.pull_page(
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            json_limits=True,
            max_bytes=max_bytes,
        )
        try:
            content, bodies, stored = fetch.encode_page(
                r.page,
                status=r.status,
                next_offset=r.next_offset,
                min_offset=r.min_offset,
                max_offset=r.max_offset,
                prefix=prefix,
            )
        except DLedgerError as e:
            raise _busy(e) from None
        body_bytes += bodies
        return QueuePart(queue_id, content, r.page.count, stored, r.next_offset)

    parts = await groups.group_pull_parts(
        pull_queue,
        group,
        body.topic,
        max_messages=body.max_messages,
        wait_ms=body.wait_ms,
        queue_ids=body.queue_ids,
        auto_commit=body.auto_commit,
    )
    count = sum(p.count for p in parts)
    metrics.count_pulled(body.topic, count, body_bytes)
    content = _framed(GROUP_MAGIC, [(p.queue_id, p.found) for p in parts], count, b"")
    return Response(content, media_type=fetch.MEDIA_TYPE, headers=_headers(count))


class RecordRefs:
    """The ``MessageMaker`` of a POP receive in the record format: each message as
    ``(queue_id, queue_offset, commitlog_offset, index)`` of its record, whose bytes
    are kept once per answer, taken when the message is made: before the receive is
    appended, as the JSON maker renders its messages then.

    The record is the one the message's views were cut from. A read of the log hands
    each checked entry out as one ``bytes`` (``Reads.read_record``, ``_read_records``:
    header and record), which the views are of (``memoryview.obj``): it is kept when
    it is exactly that entry (its length, the record's TOTALSIZE and PHYSICALOFFSET);
    otherwise the record is read again, checked (``read``)."""

    __slots__ = ("body_bytes", "read", "records", "reread")

    def __init__(self, read: Callable[[int, int], memoryview]) -> None:
        self.read = read
        self.records: dict[int, Buffer] = {}  # by commitlog offset
        self.body_bytes = 0  # of the messages made: the pulled-bytes metric
        self.reread = 0  # records read again (their views were not of their entry)

    def __call__(
        self, h: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
    ) -> _Ref:
        offset = h.physical_offset
        if offset not in self.records:
            self.records[offset] = self._record(h, body)
        self.body_bytes += len(body)
        return h.queue_id, queue_offset, offset, address - offset

    def _record(self, h: RecordHead, body: memoryview) -> Buffer:
        entry = body.obj
        if isinstance(entry, bytes) and len(entry) == BODY_OFFSET + h.size:
            size, physical = _SIZE_AND_OFFSET.unpack_from(entry, BODY_OFFSET)
            if size == h.size and physical == h.physical_offset:
                return memoryview(entry)[BODY_OFFSET:]
        self.reread += 1
        return bytes(self.read(h.physical_offset, h.size))


def _runs(refs: list[_Ref]) -> list[list[_Ref]]:
    """The messages cut where the queue changes or its offsets stop growing."""
    runs: list[list[_Ref]] = []
    for ref in refs:
        if runs and runs[-1][-1][0] == ref[0] and runs[-1][-1][1] < ref[1]:
            runs[-1].append(ref)
        else:
            runs.append([ref])
    return runs


def _pop_page(run: list[_Ref], records: Mapping[int, Buffer], prefix: bytes) -> memoryview:
    """A record page (``api.fetch``'s layout) of one queue's messages of a POP answer."""
    at: dict[int, int] = {}  # commitlog offset → position in the records area
    area: list[Buffer] = []
    size = 0
    entries: list[int] = []
    for _, queue_offset, offset, index in run:
        if offset not in at:
            at[offset] = size
            area.append(records[offset])
            size += len(records[offset])
        entries += (queue_offset, at[offset], index)
    n = len(run)
    head = fetch.HEADER.pack(
        fetch.MAGIC, fetch.VERSION, 0, len(prefix), 0, 0, 0, n, size
    )  # FOUND, no offsets
    table = struct.pack(f">{'qII' * n}", *entries)
    return memoryview(b"".join([head, prefix, table, *area]))


def encode_received(
    received: list[Received[_Ref]], records: Mapping[int, Buffer], prefix: str
) -> bytes:
    """A POP receive's record answer (see the module docstring)."""
    name = prefix.encode("ascii")
    receipts: list[bytes] = []
    for r in received:
        handle = r.receipt_handle.encode("ascii")
        receipts += (RECEIPT.pack(r.delivery_attempt, r.invisible_until, len(handle)), handle)
    pages = [
        (run[0][0], _pop_page(run, records, name)) for run in _runs([r.message for r in received])
    ]
    return _framed(POP_MAGIC, pages, len(received), b"".join(receipts))


async def receive(
    pop: PopGroups, make: MessageMaker[M], group: str, body: models.Receive
) -> list[Received[M]]:
    """``PopGroups.receive`` as a request asks it, whatever the answer's format
    (``make`` builds each message: JSON or record references)."""
    return await pop.receive(
        make,
        group,
        body.topic,
        max_messages=body.max_messages,
        invisible_ms=body.invisible_ms,
        wait_ms=body.wait_ms,
        tags=body.tags,
        attempt_id=body.attempt_id,
    )


async def receive_response(
    pop: PopGroups, metrics: NodeMetrics, group: str, body: models.Receive
) -> Response:
    """The POP receive's record answer."""
    reads = pop.reads
    make = RecordRefs(reads.read_record)
    got = await receive(pop, make, group, body)
    metrics.count_pulled(body.topic, len(got), make.body_bytes)
    content = encode_received(got, make.records, msg_id_prefix(reads.settings.group))
    return Response(content, media_type=fetch.MEDIA_TYPE, headers=_headers(len(got)))
