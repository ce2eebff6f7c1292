"""Rows to write → produce requests (pure: pyarrow, orjson; no Spark, no network).

The writer takes the DataFrame's Arrow batches and turns each row into a message object
of the produce API (docs/http.md), then cuts the stream of messages into requests within
the API's limits (``max_messages`` per request, ``max_bytes`` of JSON per request).
Chunk boundaries depend only on the messages and the limits, never on how Spark split
the input into Arrow batches: a retried task cuts the same chunks, so its producer
session's sequence numbers name the same messages as the first attempt's did.

Columns (Kafka's writer is the model): ``value`` (binary or string) is required; ``key``
and ``tags`` (string), ``keys`` (array<string>), ``properties`` (map<string,string>),
``queue_id`` (an integer: pins the queue) and ``sharding_key`` (string) are optional; the
source's read-only columns (``topic``, ``queue_offset``, ``msg_id``, ``born_timestamp``,
``store_timestamp``) are ignored, so a DataFrame read from a topic can be written as it
is. Any other column is an error: a misspelt ``tag`` would otherwise be dropped silently.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa

INTEGRAL = frozenset({"tinyint", "smallint", "int", "bigint"})
WRITABLE: Mapping[str, frozenset[str]] = {
    "value": frozenset({"binary", "string"}),
    "key": frozenset({"string"}),
    "keys": frozenset({"array<string>"}),
    "tags": frozenset({"string"}),
    "properties": frozenset({"map<string,string>"}),
    "queue_id": INTEGRAL,
    "sharding_key": frozenset({"string"}),
}
IGNORED = frozenset({"topic", "queue_offset", "msg_id", "born_timestamp", "store_timestamp"})
# JSON around the messages of one request: {"messages":[...],"producer_id":...,"sequence":...}
REQUEST_OVERHEAD_BYTES = 256


class WriteError(ValueError):
    """Rows that cannot be written as they are (the message names the column or row)."""


def check_columns(columns: Mapping[str, str]) -> None:
    """``columns``: name → Spark type (``simpleString``). Raises ``WriteError`` unless the
    columns can be written (see the module docstring)."""
    if "value" not in columns:
        raise WriteError("the DataFrame needs a value column (binary or string)")
    for name, kind in columns.items():
        if name in IGNORED:
            continue
        allowed = WRITABLE.get(name)
        if allowed is None:
            raise WriteError(
                f"column {name!r} is not written; the writable columns are {sorted(WRITABLE)}"
                f" (and {sorted(IGNORED)} are ignored): drop or rename it"
            )
        if kind not in allowed:
            want = " or ".join(sorted(allowed))
            raise WriteError(f"column {name!r} is {kind}; it must be {want}")


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i).to_pylist()


def messages_from_batch(batch: pa.RecordBatch, first_row: int = 0) -> list[dict[str, Any]]:
    """The produce message objects of ``batch``'s rows (``first_row``: the number of the
    batch's first row in the task, for error messages)."""
    values = _column(batch, "value")
    if values is None:
        raise WriteError("the DataFrame needs a value column (binary or string)")
    binary = pa.types.is_binary(batch.schema.field("value").type) or pa.types.is_large_binary(
        batch.schema.field("value").type
    )
    optional = {name: _column(batch, name) for name in WRITABLE if name != "value"}
    out = []
    for i, value in enumerate(values):
        if value is None:
            raise WriteError(f"row {first_row + i}: value is null")
        m: dict[str, Any] = (
            {"body": base64.b64encode(value).decode("ascii"), "encoding": "base64"}
            if binary
            else {"body": value, "encoding": "utf-8"}
        )
        for name, column in optional.items():
            if column is None or column[i] is None:
                continue
            v = column[i]
            if name == "properties":
                v = dict(v)
                if not v:
                    continue
            elif name == "keys":
                if not v:
                    continue
                v = list(v)
            m[name] = v
        out.append(m)
    return out


def chunk_messages(
    messages: Iterable[dict[str, Any]], *, max_messages: int, max_bytes: int
) -> Iterator[list[dict[str, Any]]]:
    """Consecutive requests' worth of messages: at most ``max_messages`` and about
    ``max_bytes`` of request JSON each (a message's own JSON plus a comma, plus a fixed
    allowance for the request around them). A message that alone is over the limit is
    ``WriteError``."""
    if max_messages < 1 or max_bytes <= REQUEST_OVERHEAD_BYTES:
        raise WriteError(f"limits too small: {max_messages} messages, {max_bytes} bytes")
    budget = max_bytes - REQUEST_OVERHEAD_BYTES
    chunk: list[dict[str, Any]] = []
    size = 0
    for n, m in enumerate(messages):
        m_size = len(orjson.dumps(m)) + 1
        if m_size > budget:
            raise WriteError(
                f"message {n} is {m_size} bytes as JSON; a request holds at most {max_bytes}"
                " (raise maxRequestBytes, within the broker's max_request_bytes)"
            )
        if chunk and (len(chunk) >= max_messages or size + m_size > budget):
            yield chunk
            chunk, size = [], 0
        chunk.append(m)
        size += m_size
    if chunk:
        yield chunk
