"""``ledgermq.spark.pages`` and ``ledgermq.spark.produce``: pulled pages to Arrow batches in the
source's schema, and rows to produce requests within the API's limits (pure: pyarrow,
no Spark, no broker)."""

from __future__ import annotations

import base64
import datetime as dt

import orjson
import pyarrow as pa
import pytest

from api.arrow import SCHEMA, ipc_stream
from ledgermq.client import ReceivedMessage
from ledgermq.spark.pages import PageError, from_received, from_stream, slice_rows
from ledgermq.spark.produce import (
    REQUEST_OVERHEAD_BYTES,
    WriteError,
    check_columns,
    chunk_messages,
    messages_from_batch,
)

MSGS = [
    ReceivedMessage(
        topic="t",
        queue_id=2,
        queue_offset=7,
        msg_id="6730000000000000000A",
        body=b"\xff\x00",
        key="k",
        keys=("k", "j"),
        tags="A",
        properties={"p": "v"},
        born_timestamp=1_700_000_000_001,
        store_timestamp=1_700_000_000_002,
    ),
    ReceivedMessage(topic="t", queue_id=2, queue_offset=8, msg_id="m2", body=b""),
]


def test_json_messages_become_one_batch_of_the_schema() -> None:
    batch = from_received(MSGS)
    assert batch.schema.equals(SCHEMA)
    first, second = batch.to_pylist()
    assert first == {
        "key": "k",
        "keys": ["k", "j"],
        "value": b"\xff\x00",
        "topic": "t",
        "queue_id": 2,
        "queue_offset": 7,
        "msg_id": "6730000000000000000A",
        "tags": "A",
        "properties": [("p", "v")],
        "born_timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, 1000, tzinfo=dt.UTC),
        "store_timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, 2000, tzinfo=dt.UTC),
    }
    assert (second["key"], second["keys"], second["properties"]) == (None, [], [])


def test_an_arrow_stream_is_taken_as_it_is_and_cast_when_it_differs() -> None:
    batch = from_received(MSGS)
    (same,) = from_stream(ipc_stream([batch]))
    assert same.equals(batch)
    # Another broker version: millisecond timestamps, columns in another order, one more.
    other = pa.RecordBatch.from_arrays(
        [batch.column(n) for n in reversed(SCHEMA.names)] + [pa.array([1, 2])],
        names=[*reversed(SCHEMA.names), "extra"],
    )
    other = other.set_column(
        other.schema.get_field_index("born_timestamp"),
        "born_timestamp",
        batch.column("born_timestamp").cast(pa.timestamp("ms", tz="UTC")),
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as w:
        w.write_batch(other)
    (cast,) = from_stream(sink.getvalue().to_pybytes())
    assert cast.schema.equals(SCHEMA) and cast.to_pylist() == batch.to_pylist()
    with pytest.raises(PageError, match="not an Arrow IPC stream"):
        from_stream(b"{}")
    lacking = pa.RecordBatch.from_arrays([pa.array([1])], names=["value"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, lacking.schema) as w:
        w.write_batch(lacking)
    with pytest.raises(PageError, match="lacks the columns"):
        from_stream(sink.getvalue().to_pybytes())


def test_slice_rows() -> None:
    b = from_received(MSGS)
    assert [x.num_rows for x in slice_rows([b, b], 3)] == [2, 1]
    assert slice_rows([b], 0) == []


# ---- produce ----------------------------------------------------------------------------------


def test_columns_a_writer_takes() -> None:
    check_columns({"value": "binary"})
    check_columns({f.name: t for f, t in zip(SCHEMA, _spark_types(), strict=True)})
    check_columns({"value": "string", "queue_id": "bigint", "sharding_key": "string"})
    with pytest.raises(WriteError, match="needs a value column"):
        check_columns({"key": "string"})
    with pytest.raises(WriteError, match="'tag' is not written"):
        check_columns({"value": "binary", "tag": "string"})
    with pytest.raises(WriteError, match="'value' is int; it must be binary or string"):
        check_columns({"value": "int"})


def _spark_types() -> list[str]:
    return [
        "string",
        "array<string>",
        "binary",
        "string",
        "int",
        "bigint",
        "string",
        "string",
        "map<string,string>",
        "timestamp",
        "timestamp",
    ]


def test_rows_become_message_objects() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"\x00\xff", b"x"], pa.binary()),
            "key": ["k", None],
            "keys": pa.array([["a", "b"], []], pa.list_(pa.string())),
            "tags": [None, "T"],
            "properties": pa.array([[("p", "1")], []], pa.map_(pa.string(), pa.string())),
            "queue_id": pa.array([3, None], pa.int64()),
            "topic": ["ignored", "ignored"],
        }
    )
    assert messages_from_batch(batch) == [
        {
            "body": base64.b64encode(b"\x00\xff").decode(),
            "encoding": "base64",
            "key": "k",
            "keys": ["a", "b"],
            "properties": {"p": "1"},
            "queue_id": 3,
        },
        {"body": base64.b64encode(b"x").decode(), "encoding": "base64", "tags": "T"},
    ]
    text = pa.RecordBatch.from_pydict({"value": ["héllo"]})
    assert messages_from_batch(text) == [{"body": "héllo", "encoding": "utf-8"}]
    with pytest.raises(WriteError, match="row 11: value is null"):
        messages_from_batch(pa.RecordBatch.from_pydict({"value": ["a", None]}), first_row=10)


def test_chunks_respect_both_limits_and_do_not_depend_on_batching() -> None:
    msgs = [{"body": "x" * (i % 50), "encoding": "utf-8"} for i in range(1000)]
    sizes = [len(orjson.dumps(m)) + 1 for m in msgs]
    chunks = list(chunk_messages(msgs, max_messages=100, max_bytes=2048))
    assert [m for c in chunks for m in c] == msgs
    assert all(len(c) <= 100 for c in chunks)
    start = 0
    for c in chunks:
        assert sum(sizes[start : start + len(c)]) <= 2048 - REQUEST_OVERHEAD_BYTES
        start += len(c)
    assert len(list(chunk_messages(msgs, max_messages=1000, max_bytes=10**9))) == 1
    assert len(list(chunk_messages(msgs, max_messages=7, max_bytes=10**9))) == 143
    with pytest.raises(WriteError, match="message 1 is"):
        list(chunk_messages([msgs[0], {"body": "y" * 5000}], max_messages=10, max_bytes=2048))
