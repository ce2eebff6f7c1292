"""Batch records: a producer batch for one queue stored as one CommitLog record
(docs/formats.md "Batch record"; RocketMQ 5's "inner batch" is the model, and the record
is what RocketMQ 5 writes for one).

The outer record is an ordinary message record (``broker.message``) with SYSFLAG
``BATCH_SYS_FLAG`` (``INNER_BATCH_FLAG | NEED_UNWRAP_FLAG``, 0xC0: without the unwrap bit
RocketMQ's client hands the whole record over as one message). Its QUEUEOFFSET is the
queue offset of the batch's first message (the *base*); its properties hold ``INNER_NUM``
(how many messages), for a producer session the session properties of its first
message, and last ``INNER_BASE`` (the base again, in decimal: what RocketMQ's dispatch
reads); its BODY is the messages' *inner records* back to back. An inner record is
RocketMQ's batch encoding of one message (``MessageDecoder.encodeMessage``), big-endian::

    @0  TOTALSIZE i32      @12 FLAG i32              then PROPERTIES len i16, bytes
    @4  MAGICCODE i32 (0)  @16 BODY len i32, bytes
    @8  BODYCRC i32 (0)

Invariants:
- ``TOTALSIZE == 22 + len(body) + len(properties)`` exactly, and the inner records fill
  the outer BODY exactly: a walk that does not end at the BODY's end is malformed;
- an inner record's MAGICCODE and BODYCRC are 0, as RocketMQ's client writes them;
- the outer ``INNER_BASE`` equals the outer QUEUEOFFSET: both are written when the
  master assigns the queue offset (``set_queue_base``), the property by rewriting the
  tail of the record (a decimal has no fixed width), so it is the last property;
- message ``i`` of a batch with base ``b`` has queue offset ``b + i`` and *message address*
  ``c + i``, where ``c`` is the outer record's commitlog offset. ``i < n`` and an outer
  record holds at least ``88 + 22·n`` bytes, so ``c + i`` lies inside it: every message
  address is unique, and the one at ``i = 0`` is the record's own offset. Message ids,
  key-index entries and producer-session results carry the address; consume-queue units
  carry the record (``c``, its size), one unit per message;
- inner PROPERTIES hold TAGS, KEYS and the producer's own properties, never UNIQ_KEY (the
  message id, derived from the address, names the message) nor session properties;
- the outer BODYCRC covers the inner records, and the DLedger entry CRC the whole record.

Every malformed input raises ``MessageFormatError`` naming the field.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from .message import (
    BODY_LENGTH_POS,
    BODY_POS,
    INNER_BATCH_FLAG,
    MAX_PROPERTIES_SIZE,
    NEED_UNWRAP_FLAG,
    QUEUE_OFFSET_POS,
    SYS_FLAG_POS,
    TOTAL_SIZE_POS,
    Buffer,
    Host,
    MessageFormatError,
    encode_message,
    set_queue_offset,
)
from .properties import (
    NAME_VALUE_SEPARATOR,
    PROP_INNER_BASE,
    PROP_INNER_NUM,
    PROPERTY_SEPARATOR,
    add_session,
)

__all__ = [
    "BATCH_SYS_FLAG",
    "INNER_BATCH_FLAG",
    "INNER_MIN_SIZE",
    "InnerRecord",
    "batch_inners",
    "encode_batch_body",
    "encode_batch_record",
    "encode_inner_records",
    "inner_records",
    "is_batch_record",
    "outer_body_span",
    "queue_runs",
    "set_queue_base",
]

BATCH_SYS_FLAG: Final = INNER_BATCH_FLAG | NEED_UNWRAP_FLAG
"""A batch record's SYSFLAG, RocketMQ 5's (0xC0)."""

INNER_MAGIC: Final = 0  # RocketMQ writes 0 into an inner record's MAGICCODE
INNER_BODY_CRC: Final = 0  # and 0 into its BODYCRC (``MessageDecoder.encodeMessage``)
_INNER_HEAD = struct.Struct(">iiIii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODY length
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_BASE_TAIL: Final = (PROPERTY_SEPARATOR + PROP_INNER_BASE + NAME_VALUE_SEPARATOR).encode()
"""What precedes the INNER_BASE value in an outer PROPERTIES block (its last pair)."""
INNER_MIN_SIZE: Final = _INNER_HEAD.size + 2
"""An inner record with an empty body and no properties."""


class InnerRecord(NamedTuple):
    """Where one inner record's parts lie in the buffer it was walked in."""

    size: int
    flag: int
    body_at: int
    body_len: int
    props_at: int
    props_len: int


def encode_inner_records(messages: Sequence[tuple[Buffer, bytes]]) -> bytearray:
    """The BODY of a batch record: one inner record per ``(body, properties)``, where
    ``properties`` is an encoded block (``encode_properties``) of at most 32,767 bytes."""
    total = 0
    for body, props in messages:
        if len(props) > MAX_PROPERTIES_SIZE:
            raise MessageFormatError(
                f"PROPERTIES: {len(props)} bytes, at most {MAX_PROPERTIES_SIZE} (RocketMQ"
                " reads the length as a signed short)"
            )
        total += INNER_MIN_SIZE + len(body) + len(props)
    buf = bytearray(total)
    pack_head, pack_u16 = _INNER_HEAD.pack_into, _U16.pack_into
    at = 0
    for body, props in messages:
        body_len, props_len = len(body), len(props)
        size = INNER_MIN_SIZE + body_len + props_len
        pack_head(buf, at, size, INNER_MAGIC, INNER_BODY_CRC, 0, body_len)
        at += _INNER_HEAD.size
        buf[at : at + body_len] = body
        at += body_len
        pack_u16(buf, at, props_len)
        buf[at + 2 : at + 2 + props_len] = props
        at += 2 + props_len
    return buf


def queue_runs(
    queue_ids: Sequence[int],
    alone: Sequence[bool],
    sizes: Sequence[int] | None = None,
    max_bytes: int | None = None,
) -> list[tuple[int, int]]:
    """How a request's messages become records: ``[start, end)`` runs of consecutive
    messages bound for one queue, each a batch record if it holds more than one. A
    message ``alone`` (one with its own born time, which an inner record cannot hold) is
    a run of its own; with ``sizes`` (each message's inner record), a run ends before
    its inner records would pass ``max_bytes`` (a record the log could not hold). The
    rule the broker and its simulation share."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(queue_ids)
    while i < n:
        j = i + 1
        if not alone[i]:
            total = 0 if sizes is None else sizes[i]
            while j < n and queue_ids[j] == queue_ids[i] and not alone[j]:
                if sizes is not None and max_bytes is not None:
                    if total + sizes[j] > max_bytes:
                        break
                    total += sizes[j]
                j += 1
        runs.append((i, j))
        i = j
    return runs


def encode_batch_record(
    topic: str,
    messages: Sequence[tuple[Buffer, bytes]],
    *,
    session: tuple[str, int, int, int] | None,
    timestamp: int,
    store_host: Host,
) -> bytearray:
    """A batch record of ``messages`` (``(body, encoded inner properties)``, see
    ``inner_properties``): its born and store time ``timestamp``; ``session`` is the
    (producer id, sequence, index of the first message in the batch, batch size). Its
    base is 0 until ``set_queue_base`` writes the real one."""
    return encode_batch_body(
        topic,
        encode_inner_records(messages),
        len(messages),
        session=session,
        timestamp=timestamp,
        store_host=store_host,
    )


def encode_batch_body(
    topic: str,
    inner: bytes | bytearray | memoryview,
    count: int,
    *,
    session: tuple[str, int, int, int] | None,
    timestamp: int,
    store_host: Host,
) -> bytearray:
    """``encode_batch_record`` of ``count`` inner records encoded already (``inner``,
    checked: a record-format produce's, ``broker.records``)."""
    outer: dict[str, str] = {PROP_INNER_NUM: str(count)}
    if session is not None:
        add_session(outer, session)
    outer[PROP_INNER_BASE] = "0"  # last: ``set_queue_base`` rewrites the record's tail
    return encode_message(
        topic=topic,
        body=inner,
        properties=outer,
        sys_flag=BATCH_SYS_FLAG,
        born_timestamp=timestamp,
        store_timestamp=timestamp,
        store_host=store_host,
    )


def is_batch_record(record: Buffer, offset: int = 0) -> bool:
    """Whether the (size-checked) record at ``record[offset]`` is a batch record."""
    return bool(record[offset + SYS_FLAG_POS + 3] & INNER_BATCH_FLAG)


def set_queue_base(record: bytearray, base: int) -> None:
    """Make ``base`` the queue offset of the batch record ``record`` (made by
    ``encode_batch_record``): its QUEUEOFFSET and its ``INNER_BASE`` property, whose
    decimal is the record's tail; TOTALSIZE and the PROPERTIES length follow the new
    size. ``record`` must not be viewed (a ``memoryview`` of it) while it is resized.
    Raises ``MessageFormatError``, the record unchanged, when it is not such a record or
    the base does not fit it."""
    (body_len,) = _I32.unpack_from(record, BODY_LENGTH_POS)
    props_len_at = BODY_POS + body_len + 1 + record[BODY_POS + body_len]
    props_at = props_len_at + 2
    # (INNER_NUM comes first, so the pair before INNER_BASE ends inside the block)
    value_at = record.rfind(NAME_VALUE_SEPARATOR.encode(), props_at) + 1
    name_at = value_at - len(_BASE_TAIL)
    if (
        name_at < props_at
        or record[name_at:value_at] != _BASE_TAIL
        or record[-1:] != PROPERTY_SEPARATOR.encode()
    ):
        raise MessageFormatError(f"batch record: {PROP_INNER_BASE} is not its last property")
    digits = b"%d\x02" % base
    props_len = value_at - props_at + len(digits)
    if base < 0 or props_len > MAX_PROPERTIES_SIZE or value_at + len(digits) > 0x7FFF_FFFF:
        raise MessageFormatError(f"{PROP_INNER_BASE}: {base} does not fit the record")
    set_queue_offset(record, base)
    record[value_at:] = digits
    _I32.pack_into(record, TOTAL_SIZE_POS, len(record))
    _U16.pack_into(record, props_len_at, props_len)


def inner_records(buf: Buffer, start: int, end: int) -> list[InnerRecord]:
    """Walk the inner records filling ``buf[start:end]`` (a batch record's BODY)."""
    out: list[InnerRecord] = []
    unpack_head, unpack_u16, new = _INNER_HEAD.unpack_from, _U16.unpack_from, tuple.__new__
    at = start
    while at < end:
        if end - at < INNER_MIN_SIZE:
            raise MessageFormatError(f"inner record {len(out)}: {end - at} bytes left, too short")
        size, magic, _crc, flag, body_len = unpack_head(buf, at)
        if magic != INNER_MAGIC:
            raise MessageFormatError(f"inner record {len(out)}: MAGICCODE {magic}, expected 0")
        if not INNER_MIN_SIZE <= size <= end - at or not 0 <= body_len <= size - INNER_MIN_SIZE:
            raise MessageFormatError(
                f"inner record {len(out)}: TOTALSIZE {size} or BODY length {body_len} does not"
                f" fit the {end - at} bytes left"
            )
        body_at = at + _INNER_HEAD.size
        props_len_at = body_at + body_len
        (props_len,) = unpack_u16(buf, props_len_at)
        if props_len > MAX_PROPERTIES_SIZE:
            raise MessageFormatError(
                f"inner record {len(out)}: PROPERTIES length {props_len}, at most"
                f" {MAX_PROPERTIES_SIZE} (RocketMQ reads it as a signed short)"
            )
        if INNER_MIN_SIZE + body_len + props_len != size:
            raise MessageFormatError(
                f"inner record {len(out)}: PROPERTIES length {props_len} disagrees with"
                f" TOTALSIZE {size}"
            )
        # tuple.__new__: a NamedTuple's own constructor is a Python call, 2.6x slower
        out.append(new(InnerRecord, (size, flag, body_at, body_len, props_len_at + 2, props_len)))
        at += size
    if not out:
        raise MessageFormatError("batch record: no inner record")
    return out


def outer_body_span(record: Buffer, offset: int = 0) -> tuple[int, int, int]:
    """(base queue offset, BODY start, BODY end) of the (size-checked) batch record at
    ``record[offset]``: where ``inner_records`` walks."""
    (base,) = struct.unpack_from(">q", record, offset + QUEUE_OFFSET_POS)
    (body_len,) = _I32.unpack_from(record, offset + BODY_LENGTH_POS)
    start = offset + BODY_POS
    return base, start, start + body_len


def batch_inners(record: Buffer, offset: int = 0) -> tuple[int, list[InnerRecord]]:
    """(base queue offset, inner records) of the (size-checked) batch record at
    ``record[offset]``; positions are in ``record``."""
    base, start, end = outer_body_span(record, offset)
    return base, inner_records(record, start, end)
