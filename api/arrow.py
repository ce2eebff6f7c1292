"""The Arrow pull: a pull page as an Arrow IPC stream (docs/spark.md), built a page at a time.

``encode_page`` turns a ``broker.pages.RawPage`` (consume-queue units, and zero-copy
views of the commitlog stretches holding the records) into record batches of ``SCHEMA``
without a Python object per message and with one copy of each byte it keeps. The record
format is ``broker.columns``'s: it reads a chunk's records into columns (numpy arrays,
and spans of the view for the variable-length fields) and splits the property blocks;
this module makes Arrow arrays of them: one ``take`` over a binary array whose offsets
alternate field / gap cuts every span of a column out of the view at once. The per-page
cost is a few dozen vectorised calls, whatever the page holds; nothing made here refers
to a view after its chunk is encoded (the view's release checks it).

The IPC stream is written once into a buffer of its exact size and handed to the
response as a view, with no copy into ``bytes``.

Invariants:
- the batches' schema is ``SCHEMA`` exactly, which is what Spark's Python data source
  demands of Arrow batches (``binary`` values, ``timestamp[us, tz=UTC]``, a
  ``list<element: string>``, a map with non-null keys);
- every row equals what the JSON pull answers for the same message: ``key`` is the first
  of ``keys`` (KEYS split on spaces, empty pieces dropped), ``tags`` is TAGS, and
  ``properties`` holds only the producer's own;
- a record the JSON pull refuses is refused, and so is one of another topic than the
  page's (``PageFormatError``: ``broker.columns``, and here the UTF-8 of the property
  strings a row shows).

This module needs the optional ``arrow`` extra (pyarrow, numpy); ``api.app`` answers 406
when it cannot be imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from starlette.responses import Response

from broker import errors
from broker.columns import PageFormatError, Spans, read_chunk, split_properties
from broker.pages import RawPage, RecordChunk
from broker.reads import Reads
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

_KEYS_TYPE = SCHEMA.field("keys").type
_PROPERTIES_TYPE = SCHEMA.field("properties").type
_MAX_CHUNK_BYTES = 2**31 - 1  # binary offsets are int32


# ---- vectorised pieces ------------------------------------------------------------------------


def _cut(data: pa.Buffer, size: int, spans: Spans) -> pa.Array:
    """Every span of ``data`` (``size`` bytes) as one binary array, in one C++ call: the
    offsets alternate gap and field over the whole buffer, and ``take`` keeps the fields.
    Needs ``0 <= starts[0] <= ends[0] <= starts[1] <= ... <= size``."""
    n = len(spans.starts)
    bounds = np.empty(2 * n + 2, dtype=np.int32)
    bounds[0] = 0
    bounds[1:-1:2] = spans.starts
    bounds[2:-1:2] = spans.ends
    bounds[-1] = size
    if n and (bounds[0] > bounds[1] or np.any(np.diff(bounds) < 0)):
        raise PageFormatError("record fields overlap or leave the chunk")
    pieces = pa.Array.from_buffers(pa.binary(), 2 * n + 1, [None, pa.py_buffer(bounds), data])
    return pieces.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int64)))


def _strings(pieces: pa.Array, what: str) -> pa.Array:
    try:
        return pieces.cast(pa.string())  # the cast checks UTF-8
    except pa.ArrowInvalid as e:
        raise PageFormatError(f"{what}: {e}") from None


def _fixed_width_strings(rows: npt.NDArray[np.uint8]) -> pa.Array:
    """A string array from an (n, width) matrix of ASCII bytes."""
    n, width = rows.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    data = pa.py_buffer(np.ascontiguousarray(rows).tobytes())
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), data])


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


def _properties(blocks: pa.Array, n: int) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """(key, keys, tags, properties) from the PROPERTIES blocks (``split_properties``)."""
    _, offsets_buf, data_buf = blocks.buffers()
    bounds = np.frombuffer(offsets_buf, np.int32)[blocks.offset : blocks.offset + n + 1]
    size = 0 if data_buf is None else data_buf.size
    data = np.frombuffer(data_buf, np.uint8) if size else np.zeros(0, np.uint8)
    p = split_properties(data, bounds.astype(np.int64))

    def strings(spans: Spans) -> pa.Array:
        return _strings(_cut(data_buf, size, spans), "PROPERTIES")

    properties = pa.MapArray.from_arrays(
        _offsets(p.user_rows, n),
        strings(p.user_names),
        strings(p.user_values),
        type=_PROPERTIES_TYPE,
    )
    tags = _one_per_row(strings(p.tags), p.tags_rows, n)
    keys = strings(p.keys)
    first_rows, first_at = np.unique(p.keys_rows, return_index=True)
    key = _one_per_row(keys.take(pa.array(first_at)), first_rows.astype(np.int64), n)
    keys_list = pa.ListArray.from_arrays(_offsets(p.keys_rows, n), keys, type=_KEYS_TYPE)
    return key, keys_list, tags, properties


# ---- pages ------------------------------------------------------------------------------------


def _chunk_batch(chunk: RecordChunk, topic: str, group: str) -> tuple[pa.RecordBatch, int]:
    """The chunk's messages as one record batch, and the sum of their body lengths."""
    size = len(chunk.data)
    if size > _MAX_CHUNK_BYTES:
        raise PageFormatError(f"a chunk of {size} bytes is over the binary limit")
    c = read_chunk(chunk, topic=topic, group=group)
    n = c.count
    data = pa.py_buffer(chunk.data)
    key, keys, tags, properties = _properties(_cut(data, size, c.properties), n)
    columns: list[Any] = [
        key,
        keys,
        _cut(data, size, c.bodies),
        _constant_strings(topic, n),
        pa.array(c.queue_ids),
        pa.array(c.queue_offsets),
        _fixed_width_strings(c.msg_ids),
        tags,
        properties,
        pa.array(c.born_timestamps * 1000, type=TIMESTAMP),
        pa.array(c.store_timestamps * 1000, type=TIMESTAMP),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA), c.bodies.total


def encode_page(page: RawPage, *, topic: str, group: str) -> tuple[list[pa.RecordBatch], int]:
    """The page's messages (of ``topic``) as record batches of ``SCHEMA`` (one per chunk),
    and the sum of their body lengths. ``group`` is the broker's DLedger group (the
    msg_id prefix)."""
    encoded = page.encode(lambda chunk: _chunk_batch(chunk, topic, group))
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
    reads: Reads,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_messages: int,
    wait_ms: int,
    tags: str | None,
) -> ArrowPull:
    """``Reads.pull`` as an Arrow IPC stream (the same status, offsets and messages)."""
    r = await reads.pull_page(
        topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
    )
    batches, body_bytes = encode_pulled(r.page, topic=topic, group=reads.settings.group)
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
    """The pull route's Arrow answer: the stream, its status and offsets in headers."""
    r = await pull_arrow(
        reads, topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
    )
    metrics.count_pulled(topic, r.count, r.body_bytes)
    return Response(r.content, media_type=media.ARROW_STREAM, headers=media.pull_headers(r))
