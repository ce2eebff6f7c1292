"""The PySpark data source ``ledgermq`` (docs/spark.md) on pyspark 4's Python Data Source API.

- ``spark.read.format("ledgermq")``: ``LedgerMQBatchReader``. The driver plans one
  partition per queue and offset range (``minPartitions`` splits large ranges); each task
  pulls its range as Arrow record batches and hands them to Spark as they came.
- ``spark.readStream.format("ledgermq")``: ``LedgerMQStreamReader``. Offsets are
  ``{"<queue_id>": next_offset}`` in the checkpoint; ``maxOffsetsPerTrigger`` is the
  read limit; ``Trigger.AvailableNow`` reads what was there when the query started;
  ``groupId`` commits progress to a consumer group (informational: the checkpoint is the
  truth).
- ``df.write.format("ledgermq")`` and ``writeStream``: ``LedgerMQWriter`` and
  ``LedgerMQStreamWriter`` take Arrow batches and produce them in chunks within the API's
  limits, each task under a producer session keyed by the write and the partition (and
  for streams the query and micro-batch), so a retried task's chunks that an earlier
  attempt stored are answered from the session instead of being stored twice.

pyspark 4 traps, and where each is handled:

1. Option keys arrive lower-cased: ``options`` matches every key lower-cased.
2. The stream reader is built in two processes (the streaming-source runner that asks
   for offsets, and the planner that pickles it for the executors) and ``__init__`` runs
   in both: it does no I/O and holds nothing only one of them would know.
3. ``initialOffset()`` is called twice: it is memoised, or a ``latest`` start resolved a
   second time, after new messages came, would skip them.
4. ``commit(end)`` arrives one trigger late, and never for the last batch of
   ``Trigger.AvailableNow``: group commits are also made from ``latestOffset(start)``,
   whose ``start`` is the end of a batch Spark has finished.
5. ``stop()`` is usually not called: nothing depends on it (no connection outlives a
   call).
6. Arrow batches must match the derived schema exactly (``binary``,
   ``timestamp("us", "UTC")``): the broker's pages are built in ``ledgermq.client.arrow_schema``'s
   schema, and ``pages.from_stream`` casts anything else.
7. Workers need ``PYSPARK_PYTHON`` set to the project's interpreter and the package
   installed (not added to ``sys.path``): the test fixtures and the example set it; the
   package is installed editable by ``make setup``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .offsets import (
    QueueRange,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
    resolve,
    split_ranges,
)
from .options import (
    OptionError,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
    redact,
)
from .produce import check_columns
from .transfer import (
    ReadSettings,
    commit_group,
    offsets_for_times,
    plan_batch,
    queue_bounds,
    read_range,
    write_batches,
)

log = logging.getLogger(__name__)

SPARK_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("queue_offset", LongType()),
        StructField("msg_id", StringType()),
        StructField("tags", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("born_timestamp", TimestampType()),
        StructField("store_timestamp", TimestampType()),
    ]
)


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """One task's work: messages ``[start, end)`` of one queue."""

    queue_id: int
    start: int
    end: int


class LedgerMQDataSource(DataSource):
    """``format("ledgermq")``: see the module docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "ledgermq"

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def __repr__(self) -> str:
        return f"LedgerMQDataSource({redact(dict(self.options))})"

    def _read_options(self, schema: StructType, *, streaming: bool) -> ReadOptions:
        if schema != SPARK_SCHEMA:
            raise OptionError(
                f"the ledgermq source has a fixed schema ({SPARK_SCHEMA.simpleString()}); "
                f"do not set another ({schema.simpleString()})"
            )
        return parse_read_options(dict(self.options), streaming=streaming)

    def reader(self, schema: StructType) -> LedgerMQBatchReader:
        return LedgerMQBatchReader(self._read_options(schema, streaming=False))

    def streamReader(self, schema: StructType) -> LedgerMQStreamReader:  # noqa: N802
        return LedgerMQStreamReader(self._read_options(schema, streaming=True))

    def _write_options(self, schema: StructType, overwrite: bool) -> WriteOptions:
        if overwrite:
            raise OptionError("a topic is a log: it can only be appended to (use mode append)")
        check_columns({f.name: f.dataType.simpleString() for f in schema.fields})
        return parse_write_options(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> LedgerMQWriter:
        return LedgerMQWriter(self._write_options(schema, overwrite), uuid.uuid4().hex)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LedgerMQStreamWriter:  # noqa: N802
        return LedgerMQStreamWriter(self._write_options(schema, overwrite))


# ---- reading ----------------------------------------------------------------------------------


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, QueuePartition):  # Spark's stand-in for "no partitions"
        return
    settings = ReadSettings(
        pull_batch_size=opts.pull_batch_size,
        pull_format=opts.pull_format,
        fail_on_data_loss=opts.fail_on_data_loss,
        read_timeout_ms=opts.read_timeout_ms,
    )
    r = QueueRange(partition.queue_id, partition.start, partition.end)
    yield from read_range(opts.connection, opts.topic, r, settings)


def _partitions(ranges: Sequence[QueueRange], min_partitions: int | None) -> list[QueuePartition]:
    parts = split_ranges(ranges, min_partitions)
    return [QueuePartition(r.queue_id, r.start, r.end) for r in parts]


class LedgerMQBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[QueuePartition]:
        ranges = plan_batch(self.opts)
        log.info("ledgermq: reading %s as %s", self.opts.topic, ranges)
        return _partitions(ranges, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class LedgerMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._initial: dict[str, int] | None = None  # trap 3: memoised
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow's end
        self._committed: dict[int, int] | None = None  # the group's last commit from here

    def _latest(self) -> dict[int, int]:
        bounds = queue_bounds(self.opts.connection, self.opts.topic, self.opts.queue_ids)
        return {q: hi for q, (_lo, hi) in bounds.items()}

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        if self._initial is None:
            o = self.opts
            bounds = queue_bounds(o.connection, o.topic, o.queue_ids)
            stamps = o.starting.timestamps_for(bounds)
            by_time = offsets_for_times(o.connection, o.topic, stamps)
            self._initial = offsets_to_json(resolve(o.starting, list(bounds), bounds, by_time))
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        limit = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._latest()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        begin = offsets_from_json(start)
        self._commit_group(begin)  # trap 4: `start` is the end of a finished batch
        latest = self._latest()
        if self._target is not None:
            latest = {q: min(hi, self._target.get(q, hi)) for q, hi in latest.items()}
        # Never behind the start (a node's view may trail the offsets already read).
        latest = {q: max(hi, begin.get(q, hi)) for q, hi in latest.items()}
        if isinstance(limit, ReadMaxRows):
            first = {q: begin.get(q, hi) for q, hi in latest.items()}
            latest = rate_limit(first, latest, limit.max_rows)
        return offsets_to_json(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueuePartition]:
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        ranges = [QueueRange(q, begin.get(q, e), e) for q, e in sorted(stop.items())]
        return _partitions(ranges, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_group(offsets_from_json(end))

    def _commit_group(self, offsets: dict[int, int]) -> None:
        group = self.opts.group_id
        if group is None or offsets == self._committed:
            return
        if commit_group(self.opts.connection, group, self.opts.topic, offsets):
            self._committed = offsets


# ---- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerMQCommitMessage(WriterCommitMessage):
    partition_id: int
    attempt: int
    producer_id: str
    acknowledged: int
    skipped: int


def _write(
    opts: WriteOptions, producer_id: str, batches: Iterator[pa.RecordBatch]
) -> LedgerMQCommitMessage:
    ctx = TaskContext.get()
    report = write_batches(
        opts.connection,
        opts.topic,
        producer_id,
        batches,
        max_messages=opts.max_messages_per_request,
        max_bytes=opts.max_request_bytes,
    )
    return LedgerMQCommitMessage(
        ctx.partitionId() if ctx else 0,
        ctx.attemptNumber() if ctx else 0,
        producer_id,
        report.acknowledged,
        report.skipped,
    )


def _log_commit(what: str, messages: Sequence[WriterCommitMessage | None]) -> None:
    done = [m for m in messages if isinstance(m, LedgerMQCommitMessage)]
    log.info(
        "ledgermq: %s: %d tasks wrote %d messages (%d skipped as stored by an earlier attempt)",
        what,
        len(done),
        sum(m.acknowledged for m in done),
        sum(m.skipped for m in done),
    )


class LedgerMQWriter(DataSourceArrowWriter):
    """Batch writes. ``write_id`` (made on the driver) names the job's sessions."""

    def __init__(self, opts: WriteOptions, write_id: str) -> None:
        self.opts = opts
        self.write_id = write_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerMQCommitMessage:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        return _write(self.opts, f"spark-{self.write_id}-p{partition}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(f"write {self.write_id} to {self.opts.topic}", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # A log has no rollback: what tasks stored stays (at most once per message).
        _log_commit(f"write {self.write_id} to {self.opts.topic} FAILED", messages)


class LedgerMQStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: sessions keyed by query id, micro-batch id and partition, so a
    micro-batch Spark runs again (a restart from the checkpoint) is not stored twice."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.fallback_id = uuid.uuid4().hex  # only if Spark gives no query or batch id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerMQCommitMessage:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        partition = ctx.partitionId() if ctx else 0
        key = f"{query}-b{batch}" if query and batch else self.fallback_id
        return _write(self.opts, f"spark-{key}-p{partition}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_commit(f"micro-batch {batchId} to {self.opts.topic}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_commit(f"micro-batch {batchId} to {self.opts.topic} FAILED", messages)
