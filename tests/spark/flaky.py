"""A test-only Spark data source whose first task attempt fails halfway (``flaky_rows``).

Partition p's rows go to queue p (a ``queue_id`` column). Partition 0's first attempt
yields ``fail_after`` rows, waits (bounded) until queue 0 of the topic being written holds
``wait_for`` messages, i.e. until the writer downstream in the same task has stored some
of those rows, writes what it saw to a marker file and raises. Spark
retries the task (the session's master allows several attempts), and the second attempt
yields every row: a writer that does not deduplicate stores the first rows twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ledgermq.client import Admin


def row_value(partition: int, i: int) -> bytes:
    return f"p{partition}-row{i}-".encode().ljust(2048, b".")


class FlakyReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"])
        self.fail_after = int(options["fail_after"])
        self.wait_for = int(options["wait_for"])
        self.brokers = options["brokers"]
        self.topic = options["topic"]
        self.marker = Path(options["marker"])

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def _stored(self) -> int:
        with Admin(self.brokers) as admin:
            return admin.describe_topic(self.topic).queues[0].max_offset

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx else 0
        part = partition.value
        for start in range(0, self.rows, 10):
            if part == 0 and attempt == 0 and start == self.fail_after:
                deadline = time.monotonic() + 60
                stored = self._stored()
                while stored < self.wait_for and time.monotonic() < deadline:
                    time.sleep(0.05)
                    stored = max(stored, self._stored())  # nodes may answer a step behind
                self.marker.write_text(str(stored))
                raise RuntimeError("injected failure of the first attempt")
            # 2 KiB values: the worker's 64 KiB output buffer fills and passes the rows on
            # to the writer while this attempt waits (small rows would sit in it).
            values = [row_value(part, i) for i in range(start, min(start + 10, self.rows))]
            queue = pa.array([part] * len(values), pa.int32())
            yield pa.RecordBatch.from_arrays(
                [pa.array(values, pa.binary()), queue], names=["value", "queue_id"]
            )


class FlakyRows(DataSource):
    @classmethod
    def name(cls) -> str:
        return "flaky_rows"

    def schema(self) -> str:
        return "value binary, queue_id int"

    def reader(self, schema: Any) -> FlakyReader:
        return FlakyReader(dict(self.options))
