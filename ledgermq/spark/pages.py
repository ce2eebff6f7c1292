"""Pulled pages → Arrow record batches of the source's schema (pure: pyarrow, no Spark).

Spark's Python data source takes ``pyarrow.RecordBatch``es from ``read`` only if their
schema *equals* the one it derives from the declared schema (``binary`` values,
``timestamp[us, tz=UTC]``, ``list<element>``, a map with non-null keys); anything else
fails the task with DATA_SOURCE_RETURN_SCHEMA_MISMATCH. ``api.arrow.SCHEMA`` is that
schema, so:

- an Arrow pull's batches (``from_stream``) are handed on as they are, with no copy,
  when the stream's schema equals it, and cast column by column otherwise (a broker of
  another version);
- a JSON pull's messages (``from_received``, as ``ledgermq.client`` decoded them, base64
  bodies included) are built into one batch; this is the slow path (objects per
  message), kept for brokers without the arrow extra and as the benchmark's baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ledgermq.client import ReceivedMessage
from ledgermq.client.arrow_schema import SCHEMA, TIMESTAMP

__all__ = ["SCHEMA", "PageError", "from_received", "from_stream", "slice_rows"]


_PROPERTIES = SCHEMA.field("properties").type


class PageError(ValueError):
    """A page that does not hold what the source's schema needs."""


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    if batch.schema.equals(SCHEMA):
        return batch
    missing = [f.name for f in SCHEMA if f.name not in batch.schema.names]
    if missing:
        raise PageError(f"the broker's Arrow page lacks the columns {missing}")
    try:
        columns = [batch.column(f.name).cast(f.type) for f in SCHEMA]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise PageError(f"the broker's Arrow page does not fit the schema: {e}") from None
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def from_stream(content: bytes | memoryview) -> list[pa.RecordBatch]:
    """The record batches of an Arrow pull (an IPC stream), in the source's schema."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(content))
        return [_conform(b) for b in reader if b.num_rows]
    except pa.ArrowInvalid as e:
        raise PageError(f"the broker's answer is not an Arrow IPC stream: {e}") from None


def from_received(messages: Sequence[ReceivedMessage]) -> pa.RecordBatch:
    """One record batch from a JSON pull's messages, as ``ledgermq.client`` decoded them."""
    columns = [
        pa.array([m.key for m in messages], pa.string()),
        pa.array([list(m.keys) for m in messages], SCHEMA.field("keys").type),
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([m.topic for m in messages], pa.string()),
        pa.array([m.queue_id for m in messages], pa.int32()),
        pa.array([m.queue_offset for m in messages], pa.int64()),
        pa.array([m.msg_id for m in messages], pa.string()),
        pa.array([m.tags for m in messages], pa.string()),
        pa.array([list(m.properties.items()) for m in messages], _PROPERTIES),
        pa.array([m.born_timestamp * 1000 for m in messages], TIMESTAMP),
        pa.array([m.store_timestamp * 1000 for m in messages], TIMESTAMP),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def slice_rows(batches: Sequence[pa.RecordBatch], rows: int) -> list[pa.RecordBatch]:
    """The first ``rows`` rows of ``batches`` (zero-copy slices)."""
    out = []
    for b in batches:
        if rows <= 0:
            break
        out.append(b if b.num_rows <= rows else b.slice(0, rows))
        rows -= b.num_rows
    return out
