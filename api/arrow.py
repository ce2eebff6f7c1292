"""The Arrow pull: a pull page as an Arrow IPC stream (docs/spark.md), built a page at a time.

``encode_page`` turns a ``broker.pages.RawPage`` (consume-queue units, and zero-copy
views of the commitlog stretches holding the records) into record batches of ``SCHEMA``
without a Python object per message and with one copy of each byte it keeps: numpy
gathers the big-endian header fields of every record at once, the variable-length
fields (body, properties) are cut out of the view by one Arrow ``take`` over a binary
array whose offsets alternate record field / gap, and the properties are split,
filtered and regrouped with Arrow compute kernels. The per-page cost is a few dozen
vectorised calls, whatever the page holds; nothing made here refers to a view after
its chunk is encoded (the view's release checks it).

The IPC stream is written once into a buffer of its exact size and handed to the
response as a view, with no copy into ``bytes``.

Invariants:
- the batches' schema is ``SCHEMA`` exactly, which is what Spark's Python data source
  demands of Arrow batches (``binary`` values, ``timestamp[us, tz=UTC]``, a
  ``list<element: string>``, a map with non-null keys);
- every row equals what the JSON pull answers for the same message: ``key`` is the first
  of ``keys`` (KEYS split on spaces, empty pieces dropped), ``tags`` is TAGS, and
  ``properties`` holds only the producer's own properties;
- every record is checked against its unit before a byte of it is used (TOTALSIZE equals
  the unit's size, MAGICCODE, PHYSICALOFFSET equals the unit's commitlog offset, the
  fields fit the record): a mismatch is ``PageFormatError``, never a wrong row.

This module needs the optional ``arrow`` extra (pyarrow, numpy); ``api.app`` answers 406
when it cannot be imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from starlette.responses import Response

from broker import errors
from broker.batch import InnerRecord, batch_inners
from broker.broker import Broker
from broker.message import (
    BODY_LENGTH_POS,
    BODY_POS,
    BORN_TIMESTAMP_POS,
    INNER_BATCH_FLAG,
    MAGIC_CODE,
    MAGIC_CODE_POS,
    PHYSICAL_OFFSET_POS,
    PROP_KEYS,
    PROP_TAGS,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    STORE_TIMESTAMP_POS,
    SYS_FLAG_POS,
    SYSTEM_PROPERTIES,
    TOTAL_SIZE_POS,
    MessageFormatError,
)
from broker.pages import RawPage, RecordChunk
from dledger.codes import DLedgerError
from ledgermq.client.arrow_schema import SCHEMA, TIMESTAMP

from . import media
from .metrics import NodeMetrics

__all__ = [
    "SCHEMA",
    "ArrowPull",
    "PageFormatError",
    "encode_page",
    "ipc_stream",
    "pull_arrow",
    "pull_response",
]

Int64Array = npt.NDArray[np.int64]

_UNIT = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_hash", ">i8")])
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)  # 16 hex digits, most significant first
_SYSTEM_NAMES = pa.array(sorted(SYSTEM_PROPERTIES), pa.string())
# Compute kernels get Arrow scalars, not Python strings: converting a Python argument
# makes pyarrow look for pandas on every call, an import attempt that costs more than
# the kernel when pandas is not installed.
_EMPTY = pa.scalar("", pa.string())
_TAGS = pa.scalar(PROP_TAGS, pa.string())
_KEYS = pa.scalar(PROP_KEYS, pa.string())
_NAME, _VALUE = pa.scalar(0, pa.int64()), pa.scalar(1, pa.int64())
_SYSTEM_BYTES = tuple(sorted(name.encode() for name in SYSTEM_PROPERTIES))
_NONE: Int64Array = np.zeros(0, dtype=np.int64)
_KEYS_TYPE = SCHEMA.field("keys").type
_MAX_CHUNK_BYTES = 2**31 - 1  # binary offsets are int32


class PageFormatError(ValueError):
    """A record that disagrees with its consume-queue unit or with the record format."""


# ---- vectorised pieces ------------------------------------------------------------------------


def _gather(buf: npt.NDArray[np.uint8], at: Int64Array, dtype: str) -> Int64Array:
    """The big-endian integers of type ``dtype`` at byte positions ``at`` of ``buf``."""
    width = np.dtype(dtype).itemsize
    raw = buf[at[:, None] + np.arange(width)]  # (n, width) bytes, C-contiguous
    out: Int64Array = raw.view(dtype).ravel().astype(np.int64)
    return out


def _cut(data: pa.Buffer, size: int, starts: Int64Array, ends: Int64Array) -> pa.Array:
    """``data[starts[i]:ends[i]]`` for every i as one binary array, in one C++ call: the
    offsets alternate gap and field over the whole chunk, and ``take`` keeps the fields.
    Needs ``0 <= starts[0] <= ends[0] <= starts[1] <= ... <= size``."""
    n = len(starts)
    bounds = np.empty(2 * n + 2, dtype=np.int32)
    bounds[0] = 0
    bounds[1:-1:2] = starts
    bounds[2:-1:2] = ends
    bounds[-1] = size
    if n and (bounds[0] > bounds[1] or np.any(np.diff(bounds) < 0)):
        raise PageFormatError("record fields overlap or leave the chunk")
    pieces = pa.Array.from_buffers(pa.binary(), 2 * n + 1, [None, pa.py_buffer(bounds), data])
    return pieces.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int64)))


def _fixed_width_strings(rows: npt.NDArray[np.uint8]) -> pa.Array:
    """A string array from an (n, width) matrix of ASCII bytes."""
    n, width = rows.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    data = pa.py_buffer(np.ascontiguousarray(rows).tobytes())
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), data])


def _msg_ids(group_hex: bytes, commitlog_offsets: Int64Array) -> pa.Array:
    """``make_msg_id`` for every offset: the group's hex, then the offset as %016X."""
    n = len(commitlog_offsets)
    nibbles = (commitlog_offsets.astype(np.uint64)[:, None] >> _NIBBLE_SHIFTS) & np.uint64(0xF)
    rows = np.empty((n, len(group_hex) + 16), dtype=np.uint8)
    rows[:, : len(group_hex)] = np.frombuffer(group_hex, dtype=np.uint8)
    rows[:, len(group_hex) :] = _HEX_DIGITS[nibbles]
    return _fixed_width_strings(rows)


def _constant_strings(text: str, n: int) -> pa.Array:
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    return _fixed_width_strings(np.broadcast_to(raw, (n, len(raw))))


def _offsets(parents: Int64Array, n: int) -> pa.Array:
    """List offsets for values whose (sorted) parent rows are ``parents``."""
    out = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parents, minlength=n), out=out[1:])
    return pa.array(out)


def _one_per_row(values: pa.Array, parents: Int64Array, n: int) -> pa.Array:
    """Row i gets the value whose parent is i, or null (each row has at most one)."""
    at = np.full(n, -1, dtype=np.int64)
    at[parents] = np.arange(len(parents), dtype=np.int64)
    return values.take(pa.array(at, mask=at < 0))


@dataclass(frozen=True, slots=True)
class _Pairs:
    """The property pairs of a chunk's records that the schema shows: the producer's
    own (as name and value strings with their row numbers), and the TAGS and KEYS
    values (a row has at most one of each)."""

    user_names: pa.Array
    user_values: pa.Array
    user_rows: Int64Array
    tags: pa.Array
    tags_rows: Int64Array
    keys: pa.Array
    keys_rows: Int64Array


def _strings(pieces: pa.Array, at: Int64Array) -> pa.Array:
    try:
        return pieces.take(pa.array(at)).cast(pa.string())  # the cast checks UTF-8
    except pa.ArrowInvalid as e:
        raise PageFormatError(f"PROPERTIES: {e}") from None


def _pairs_scan(raw: pa.Array, n: int) -> _Pairs | None:
    """The pairs found by scanning the blobs' bytes with numpy: every ``\x02`` ends a
    pair, and each pair holds exactly one ``\x01``. None when a blob is not in the
    form ``encode_properties`` writes (each pair ended by ``\x02``, names not empty);
    ``_pairs_kernels`` then decides, as ``decode_properties`` would."""
    _, offsets_buf, data_buf = raw.buffers()
    bounds = np.frombuffer(offsets_buf, np.int32)[raw.offset : raw.offset + n + 1]
    bounds = bounds.astype(np.int64)
    if data_buf is None or bounds[-1] == bounds[0]:
        return _empty_pairs() if bounds[-1] == bounds[0] else None
    data = np.frombuffer(data_buf, np.uint8)
    lo = int(bounds[0])
    blobs = data[lo : int(bounds[-1])]
    ends = np.flatnonzero(blobs == 2) + lo  # each pair's \x02
    seps = np.flatnonzero(blobs == 1) + lo  # each pair's \x01
    filled = bounds[1:] > bounds[:-1]
    if len(seps) != len(ends) or not (data[bounds[1:][filled] - 1] == 2).all():
        return None
    starts = np.empty_like(ends)
    starts[0], starts[1:] = lo, ends[:-1] + 1
    if not ((starts < seps) & (seps < ends)).all():
        return None  # an empty name, or a pair with no or two separators
    rows = np.searchsorted(bounds[1:], ends, side="right").astype(np.int64)
    name_lens = seps - starts
    system = np.zeros(len(ends), dtype=bool)
    found: dict[str, Int64Array] = {}
    for name in _SYSTEM_BYTES:
        maybe = np.flatnonzero(name_lens == len(name))
        if maybe.size:
            window = data[starts[maybe][:, None] + np.arange(len(name))]
            hit = maybe[(window == np.frombuffer(name, np.uint8)).all(axis=1)]
            system[hit] = True
            found[name.decode()] = hit
    # One binary array over the blobs, cut as name | \x01 | value | \x02 per pair.
    cuts = np.empty(4 * len(ends) + 1, dtype=np.int32)
    cuts[0:-1:4], cuts[1::4], cuts[2::4], cuts[3::4] = starts, seps, seps + 1, ends
    cuts[-1] = ends[-1] + 1
    pieces = pa.Array.from_buffers(pa.binary(), 4 * len(ends), [None, pa.py_buffer(cuts), data_buf])
    user = np.flatnonzero(~system)
    tags = found.get(PROP_TAGS, _NONE)
    keys = found.get(PROP_KEYS, _NONE)
    return _Pairs(
        _strings(pieces, 4 * user),
        _strings(pieces, 4 * user + 2),
        rows[user],
        _strings(pieces, 4 * tags + 2),
        rows[tags],
        _strings(pieces, 4 * keys + 2),
        rows[keys],
    )


def _empty_pairs() -> _Pairs:
    none = pa.array([], pa.string())
    return _Pairs(none, none, _NONE, none, _NONE, none, _NONE)


def _pairs_kernels(raw: pa.Array, n: int) -> _Pairs:
    """The pairs found with Arrow's string kernels: split on ``\x02`` (the last one
    optional, as in ``decode_properties``), then once on ``\x01``."""
    try:
        text = raw.cast(pa.string())  # checks UTF-8
        items = pc.split_pattern(text, pattern="\x02")
        flat = pc.list_flatten(items)
        rows = pc.list_parent_indices(items).to_numpy().astype(np.int64)
        present = pc.not_equal(flat, _EMPTY)  # the piece after the final separator
        flat, rows = flat.filter(present), rows[present.to_numpy(zero_copy_only=False)]
        pairs = pc.split_pattern(flat, pattern="\x01", max_splits=1)
        names = pc.list_element(pairs, _NAME)
        values = pc.list_element(pairs, _VALUE)
    except (pa.ArrowInvalid, pa.ArrowIndexError) as e:
        raise PageFormatError(f"PROPERTIES: {e}") from None
    if pc.any(pc.equal(names, _EMPTY)).as_py():
        raise PageFormatError("PROPERTIES: empty property name")
    if pc.any(pc.match_substring(values, "\x01")).as_py():
        raise PageFormatError("PROPERTIES: a pair with more than one \\x01")
    user = ~pc.is_in(names, value_set=_SYSTEM_NAMES).to_numpy(zero_copy_only=False)
    is_tags = pc.equal(names, _TAGS).to_numpy(zero_copy_only=False)
    is_keys = pc.equal(names, _KEYS).to_numpy(zero_copy_only=False)
    return _Pairs(
        names.filter(pa.array(user)),
        values.filter(pa.array(user)),
        rows[user],
        values.filter(pa.array(is_tags)),
        rows[is_tags],
        values.filter(pa.array(is_keys)),
        rows[is_keys],
    )


def _properties(raw: pa.Array, n: int) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """(key, keys, tags, properties) from the PROPERTIES blobs ``name\x01value\x02...``."""
    p = _pairs_scan(raw, n) or _pairs_kernels(raw, n)
    properties = pa.MapArray.from_arrays(
        _offsets(p.user_rows, n), p.user_names, p.user_values, type=SCHEMA.field("properties").type
    )
    tags = _one_per_row(p.tags, p.tags_rows, n)
    if len(p.keys) == 0:
        no_keys = pa.ListArray.from_arrays(
            pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()), type=_KEYS_TYPE
        )
        return pa.nulls(n, pa.string()), no_keys, tags, properties
    split = pc.split_pattern(p.keys, pattern=" ")
    key_items = pc.list_flatten(split)
    key_rows = p.keys_rows[pc.list_parent_indices(split).to_numpy().astype(np.int64)]
    real = pc.not_equal(key_items, _EMPTY).to_numpy(zero_copy_only=False)  # "a  b": a gap
    key_items, key_rows = key_items.filter(pa.array(real)), key_rows[real]
    order = np.argsort(key_rows, kind="stable")  # rows of KEYS pairs may come in any order
    key_items, key_rows = key_items.take(pa.array(order)), key_rows[order]
    keys = pa.ListArray.from_arrays(_offsets(key_rows, n), key_items, type=_KEYS_TYPE)
    first_rows, first_at = np.unique(key_rows, return_index=True)
    key = _one_per_row(key_items.take(pa.array(first_at)), first_rows.astype(np.int64), n)
    return key, keys, tags, properties


# ---- pages ------------------------------------------------------------------------------------


def _chunk_batch(chunk: RecordChunk, topic: str, group_hex: bytes) -> tuple[pa.RecordBatch, int]:
    """The chunk's messages as one record batch, and the sum of their body lengths."""
    units = np.frombuffer(chunk.units, dtype=_UNIT)
    n = len(units)
    if len(chunk.data) > _MAX_CHUNK_BYTES:
        raise PageFormatError(f"a chunk of {len(chunk.data)} bytes is over the binary limit")
    buf = np.frombuffer(chunk.data, dtype=np.uint8)
    commitlog_offsets = units["commitlog_offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    starts = commitlog_offsets - chunk.base
    ends = starts + sizes
    if n and (starts.min() < 0 or ends.max() > len(buf) or sizes.min() < BODY_POS + 4):
        raise PageFormatError("a consume-queue unit points outside its chunk")
    if np.any(_gather(buf, starts + TOTAL_SIZE_POS, ">i4") != sizes):
        raise PageFormatError("TOTALSIZE disagrees with the consume-queue unit")
    if np.any(_gather(buf, starts + MAGIC_CODE_POS, ">i4") != MAGIC_CODE):
        raise PageFormatError("MAGICCODE is not a message's")
    if np.any(_gather(buf, starts + PHYSICAL_OFFSET_POS, ">i8") != commitlog_offsets):
        raise PageFormatError("PHYSICALOFFSET disagrees with the consume-queue unit")
    batched = np.flatnonzero(_gather(buf, starts + SYS_FLAG_POS, ">i4") & INNER_BATCH_FLAG)
    body_starts = starts + BODY_POS
    body_ends = body_starts + _gather(buf, starts + BODY_LENGTH_POS, ">i4")
    if np.any(body_ends < body_starts) or np.any(body_ends + 3 > ends):
        raise PageFormatError("BODY length does not fit TOTALSIZE")
    topic_lens = buf[body_ends].astype(np.int64)
    props_len_at = body_ends + 1 + topic_lens
    if np.any(props_len_at + 2 > ends):
        raise PageFormatError("TOPIC length does not fit TOTALSIZE")
    props_starts = props_len_at + 2
    if np.any(props_starts + _gather(buf, props_len_at, ">u2") != ends):
        raise PageFormatError("PROPERTIES length disagrees with TOTALSIZE")
    queue_offsets = _gather(buf, starts + QUEUE_OFFSET_POS, ">i8")
    addresses, props_ends = commitlog_offsets, ends
    if len(batched):  # their units' messages are inside the records: where, one by one
        addresses, props_ends = commitlog_offsets.copy(), ends.copy()
        _place_inner_messages(
            chunk,
            batched,
            starts,
            spans=(body_starts, body_ends, props_starts, props_ends),
            queue_offsets=queue_offsets,
            addresses=addresses,
        )

    data = pa.py_buffer(chunk.data)
    key, keys, tags, properties = _properties(_cut(data, len(buf), props_starts, props_ends), n)
    born_us = _gather(buf, starts + BORN_TIMESTAMP_POS, ">i8") * 1000
    store_us = _gather(buf, starts + STORE_TIMESTAMP_POS, ">i8") * 1000
    columns: list[Any] = [
        key,
        keys,
        _cut(data, len(buf), body_starts, body_ends),
        _constant_strings(topic, n),
        pa.array(_gather(buf, starts + QUEUE_ID_POS, ">i4").astype(np.int32)),
        pa.array(queue_offsets),
        _msg_ids(group_hex, addresses),
        tags,
        properties,
        pa.array(born_us, type=TIMESTAMP),
        pa.array(store_us, type=TIMESTAMP),
    ]
    body_bytes = int((body_ends - body_starts).sum())
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA), body_bytes


def _place_inner_messages(
    chunk: RecordChunk,
    batched: Int64Array,
    starts: Int64Array,
    *,
    spans: tuple[Int64Array, Int64Array, Int64Array, Int64Array],
    queue_offsets: Int64Array,
    addresses: Int64Array,
) -> None:
    """For the units ``batched`` (of batch records, ``broker.batch``): their message's
    body and properties spans, queue offset and address, in place. A record's inner
    records are walked once (Python, per record), the rest stays vectorised."""
    if len(chunk.queue_offsets) != len(starts):
        raise PageFormatError("a page of batch records without its units' queue offsets")
    body_starts, body_ends, props_starts, props_ends = spans
    walked: dict[int, tuple[int, list[InnerRecord]]] = {}
    try:
        for k in batched.tolist():
            start = int(starts[k])
            base, inners = walked.get(start) or walked.setdefault(
                start, batch_inners(chunk.data, start)
            )
            i = chunk.queue_offsets[k] - base
            if not 0 <= i < len(inners):
                raise PageFormatError(f"queue offset {chunk.queue_offsets[k]} is not in its record")
            r = inners[i]
            body_starts[k], body_ends[k] = r.body_at, r.body_at + r.body_len
            props_starts[k], props_ends[k] = r.props_at, r.props_at + r.props_len
            queue_offsets[k] = base + i
            addresses[k] += i
    except MessageFormatError as e:
        raise PageFormatError(str(e)) from None


def encode_page(page: RawPage, *, topic: str, group: str) -> tuple[list[pa.RecordBatch], int]:
    """The page's messages as record batches of ``SCHEMA`` (one per chunk), and the sum
    of their body lengths. ``group`` is the broker's DLedger group (the msg_id prefix)."""
    group_hex = group.encode().hex().upper().encode()
    encoded = page.encode(lambda chunk: _chunk_batch(chunk, topic, group_hex))
    return [batch for batch, _ in encoded], sum(n for _, n in encoded)


def _write_stream(sink: Any, batches: list[pa.RecordBatch]) -> None:
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch in batches:
            writer.write_batch(batch)


def encode_pulled(page: RawPage, *, topic: str, group: str) -> tuple[list[pa.RecordBatch], int]:
    """``encode_page`` of a page just pulled. If the log moved under the page between its
    units and their records (retention or a snapshot install took the head), the pull
    is answered BUSY: the client retries, from a fresh page."""
    try:
        return encode_page(page, topic=topic, group=group)
    except DLedgerError as e:
        raise errors.BusyError(
            f"the log changed under the page ({e.message}); retry", retry_after_ms=100
        ) from None


def ipc_stream(batches: list[pa.RecordBatch]) -> memoryview:
    """An Arrow IPC stream of ``SCHEMA`` holding ``batches`` (none: the schema alone),
    written once into a buffer of its exact size (measured by a first pass that copies
    nothing) and handed out as a view: no growing buffer, no copy into ``bytes``."""
    size = pa.MockOutputStream()
    _write_stream(size, batches)
    out = pa.allocate_buffer(size.size())
    _write_stream(pa.FixedSizeBufferWriter(out), batches)
    return memoryview(out)


@dataclass(frozen=True, slots=True)
class ArrowPull:
    """A pull answered as an IPC stream, with the JSON answer's other fields."""

    content: memoryview
    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    count: int
    body_bytes: int


async def pull_arrow(
    broker: Broker,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_messages: int,
    wait_ms: int,
    tags: str | None,
) -> ArrowPull:
    """``Broker.pull`` as an Arrow IPC stream (the same status, offsets and messages)."""
    r = await broker.pull_page(
        topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
    )
    batches, body_bytes = encode_pulled(r.page, topic=topic, group=broker.settings.group)
    return ArrowPull(
        ipc_stream(batches),
        r.status,
        r.next_offset,
        r.min_offset,
        r.max_offset,
        r.page.count,
        body_bytes,
    )


async def pull_response(
    broker: Broker,
    metrics: NodeMetrics,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_messages: int,
    wait_ms: int,
    tags: str | None,
) -> Response:
    """The pull route's Arrow answer: the stream, its status and offsets in headers."""
    r = await pull_arrow(
        broker, topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
    )
    if r.count:
        metrics.pulled_messages.labels(topic).inc(r.count)
        metrics.pulled_bytes.labels(topic).inc(r.body_bytes)
    headers = {
        media.PULL_STATUS: r.status,
        media.PULL_NEXT_OFFSET: str(r.next_offset),
        media.PULL_MIN_OFFSET: str(r.min_offset),
        media.PULL_MAX_OFFSET: str(r.max_offset),
        media.PULL_COUNT: str(r.count),
    }
    return Response(r.content, media_type=media.ARROW_STREAM, headers=headers)
