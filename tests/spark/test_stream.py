"""Streaming reads and writes through Spark against a 3-node cluster: a query with a file
sink and a checkpoint, stopped mid-stream and restarted with ``Trigger.AvailableNow``,
has neither a gap nor a duplicate; ``maxOffsetsPerTrigger`` bounds every micro-batch;
the checkpoint holds ``{"<queue_id>": next_offset}``; the ``groupId`` commits reach the
end (the last AvailableNow batch gets no ``commit`` call from Spark); a streaming write
stores each message once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledgermq.client import Admin
from ledgermq.local_cluster import LocalBrokerCluster
from tests.spark.conftest import expected_rows, produce, settled
from tests.waiting import wait_until

pytestmark = pytest.mark.spark

LIMIT = 100


def stream(spark: Any, cluster: LocalBrokerCluster, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("ledgermq").option("brokers", cluster.brokers)
    for k, v in {"topic": topic, **options}.items():
        reader = reader.option(k, v)
    return reader.load()


def rows_read(query: Any) -> int:
    """Rows the running query has read so far; its error at once if it died."""
    if not query.isActive:
        raise AssertionError(f"the query stopped: {query.exception()}")
    return sum(p["numInputRows"] for p in query.recentProgress)


def last_checkpoint_offsets(checkpoint: Path) -> Any:
    """The source offsets of the newest entry of the checkpoint's offset log."""
    newest = max(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    lines = newest.read_text().splitlines()
    return json.loads(lines[2])  # "v1", the batch metadata, then one line per source


def test_a_stream_stopped_and_restarted_has_no_gap_and_no_duplicate(
    spark: Any, cluster: LocalBrokerCluster, tmp_path: Path
) -> None:
    produce(cluster, "events", [f"early {i}" for i in range(600)], queues=3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**trigger: Any) -> Any:
        df = stream(
            spark,
            cluster,
            "events",
            startingOffsets="earliest",
            maxOffsetsPerTrigger=str(LIMIT),
            groupId="spark-etl",
        )
        return (
            df.select("queue_id", "queue_offset", "value", "msg_id")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    first = start(processingTime="50 milliseconds")
    try:
        wait_until(lambda: rows_read(first) >= 2 * LIMIT, 120, "two micro-batches")
    finally:
        first.stop()
    done_first = sum(p["numInputRows"] for p in first.recentProgress)
    assert done_first < 600, "the first run was to stop mid-stream"

    produce(cluster, "events", [f"late {i}" for i in range(300)], queues=3)
    second = start(availableNow=True)
    assert second.awaitTermination(180), "the AvailableNow run did not end"
    assert second.exception() is None

    progress = [p for q in (first, second) for p in q.recentProgress if p["numInputRows"]]
    assert all(p["numInputRows"] <= LIMIT + 3 for p in progress), [
        p["numInputRows"] for p in progress
    ]
    assert len([p for p in second.recentProgress if p["numInputRows"]]) >= 3

    expected = expected_rows(cluster, "events")
    assert len(expected) == 900
    rows = spark.read.parquet(str(out)).collect()
    keys = [(r.queue_id, r.queue_offset) for r in rows]
    assert len(keys) == len(set(keys)), "a message was written twice"
    assert set(keys) == set(expected), "a message is missing"
    assert all(bytes(r.value) == expected[(r.queue_id, r.queue_offset)]["value"] for r in rows)
    assert all(r.msg_id == expected[(r.queue_id, r.queue_offset)]["msg_id"] for r in rows)

    ends = {q: hi for q, (_, hi) in settled(cluster, "events").items()}
    assert last_checkpoint_offsets(checkpoint) == {str(q): o for q, o in ends.items()}

    def lag() -> dict[int, int]:
        # The group's commit went to the master; a follower answering may apply it later.
        with Admin(cluster.brokers) as admin:
            return {o.queue_id: o.lag for o in admin.group_offsets("spark-etl", "events")}

    wait_until(lambda: lag() == {0: 0, 1: 0, 2: 0}, 30, "the group's commits reach the end")


def test_a_stream_that_starts_at_latest_and_writes_to_a_topic(
    spark: Any, cluster: LocalBrokerCluster, tmp_path: Path
) -> None:
    produce(cluster, "clicks", [f"old {i}" for i in range(50)], queues=2)
    with Admin(cluster.brokers) as admin:
        admin.create_topic("clicks-copy", 2)
    df = stream(spark, cluster, "clicks")  # a stream starts at the latest offsets
    query = (
        df.select("value", "key", "tags")
        .writeStream.format("ledgermq")
        .option("brokers", cluster.brokers)
        .option("topic", "clicks-copy")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="50 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: rows_read(query) >= 0 and query.recentProgress, 120, "a micro-batch")
        produce(cluster, "clicks", [f"new {i}" for i in range(80)], queues=2)
        wait_until(lambda: rows_read(query) >= 80, 120, "the new messages are read")
    finally:
        query.stop()
    copied = expected_rows(cluster, "clicks-copy")
    assert sorted(r["value"] for r in copied.values()) == sorted(
        f"new {i}".encode() for i in range(80)
    )
