"""``ledgermq.spark.transfer`` and ``ledgermq.spark.pull`` without Spark, against a real node: a
broker and its HTTP API served by uvicorn on 127.0.0.1 from a background thread (its own
event loop), reached over real sockets. Covers reading a range over both pull formats,
failover past a dead broker URL, the bearer token, data loss from retention (fail, or
skip and go on), planning, the session-keyed writer's deduplication, and the prefetch
helper."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ledgermq.client import Admin, Message, Producer, UnauthenticatedError
from ledgermq.processes import free_ports
from ledgermq.spark import transfer
from ledgermq.spark.offsets import DataLossError, OffsetSpec, QueueRange
from ledgermq.spark.options import Connection, parse_read_options
from tests.api.conftest import Served, node_settings, serving
from tests.spark.conftest import wait_until

TOKEN = "spark-test-token"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    settings = node_settings(tmp_path / "n0")
    settings = replace(settings, limits=replace(settings.limits, max_arrow_pull_messages=500))
    try:
        with serving(settings, auth_token=TOKEN) as node:
            yield node
    finally:
        transfer.close_pool()


def connection(*urls: str, token: str | None = TOKEN) -> Connection:
    return Connection(tuple(urls), token, request_timeout_ms=5000, retry_deadline_ms=10_000)


def produce(node: Served, topic: str, n: int, queues: int = 2, size: int = 100) -> None:
    with Admin(node.url, auth_token=TOKEN) as admin:
        admin.create_topic(topic, queues)
    with Producer(node.url, auth_token=TOKEN) as p:
        for start in range(0, n, 100):  # message i in queue i % queues
            for q in range(queues):
                mine = range(start + q, min(n, start + 100), queues)
                p.send(topic, [Message(b"%06d" % i + b"x" * size, queue_id=q) for i in mine])


def values(batches: Iterator[Any]) -> list[bytes]:
    return [v for b in batches for v in b.column("value").to_pylist()]


def test_a_range_reads_the_same_over_both_formats_and_past_a_dead_broker(
    served: Served,
) -> None:
    produce(served, "t", 1300)
    (dead,) = free_ports(1)  # nothing listens there
    conn = connection(f"http://127.0.0.1:{dead}", served.url)
    r = QueueRange(0, 3, 640)
    with Admin(served.url, auth_token=TOKEN) as admin:
        want = [m.body for m in admin.pull("t", 0, 3, max_messages=100).messages]
    for fmt in ("arrow", "json"):
        # Pages of 100 and 500 (the node's Arrow limit): the range spans several.
        for page in (100, 500) if fmt == "arrow" else (100,):
            settings = transfer.ReadSettings(pull_batch_size=page, pull_format=fmt)
            got = values(transfer.read_range(conn, "t", r, settings))
            assert len(got) == 637 and got[:100] == want, (fmt, page)
    assert transfer.queue_bounds(conn, "t", None) == {0: (0, 650), 1: (0, 650)}
    too_big = transfer.ReadSettings(pull_batch_size=501)  # the node allows 500
    with pytest.raises(transfer.SourceError, match="set pullBatchSize to its limit"):
        list(transfer.read_range(conn, "t", r, too_big))
    with pytest.raises(transfer.SourceError, match=r"not \[5\]"):
        transfer.queue_bounds(conn, "t", [0, 5])


def test_the_token_is_needed_and_sent(served: Served) -> None:
    produce(served, "auth", 10)
    no_token = connection(served.url, token=None)
    with pytest.raises(transfer.SourceError, match="UNAUTHENTICATED"):
        transfer.queue_bounds(no_token, "auth", None)
    with pytest.raises(UnauthenticatedError):
        list(transfer.read_range(no_token, "auth", QueueRange(0, 0, 5), transfer.ReadSettings()))
    with_token = transfer.read_range(
        connection(served.url), "auth", QueueRange(0, 0, 5), transfer.ReadSettings()
    )
    assert len(values(with_token)) == 5


def test_data_removed_by_retention_fails_the_read_or_is_skipped(served: Served) -> None:
    produce(served, "old", 6000, queues=2, size=1000)  # ~6 MiB over 1 MiB segments
    b = served.broker

    async def retention() -> int:
        await b.dispatcher.snapshot()
        await b.dispatcher.checkpoint()
        return await asyncio.to_thread(b.store.clean, True)

    assert served.run(retention()) >= 1
    wait_until(lambda: b.reads.queue_bounds("old", 0)[0] > 0, 30, "the min offset moves")
    lo, hi = b.reads.queue_bounds("old", 0)
    conn = connection(served.url)
    strict = transfer.ReadSettings(pull_batch_size=200)
    with pytest.raises(DataLossError, match=rf"queue 0: messages 0\.\.{lo - 1} were removed"):
        list(transfer.read_range(conn, "old", QueueRange(0, 0, hi), strict))
    lenient = replace(strict, fail_on_data_loss=False)
    got = values(transfer.read_range(conn, "old", QueueRange(0, 0, hi), lenient))
    assert len(got) == hi - lo and got[0].startswith(b"%06d" % (2 * lo))
    # Planning sees it too: a start before the minimum is data loss, earliest is not.
    base = {"brokers": served.url, "topic": "old", "authToken": TOKEN, "queueIds": "0"}
    with pytest.raises(DataLossError):
        from_zero = parse_read_options({**base, "startingOffsets": '{"0": 0}'}, streaming=False)
        transfer.plan_batch(from_zero)
    (r,) = transfer.plan_batch(parse_read_options(base, streaming=False))
    assert (r.start, r.end) == (lo, hi)
    opts = parse_read_options(
        {**base, "startingOffsets": '{"0": 0}', "failOnDataLoss": "false"}, streaming=False
    )
    assert transfer.plan_batch(opts) == [QueueRange(0, lo, hi)]


def test_planning_by_time(served: Served) -> None:
    produce(served, "times", 20, queues=1)
    split_ms = int(time.time() * 1000) + 5
    wait_until(lambda: time.time() * 1000 > split_ms, 5, "the clock passes the split")
    produce(served, "times", 30, queues=1)
    conn = connection(served.url)
    assert transfer.offsets_for_times(conn, "times", {0: split_ms}) == {0: 20}
    base = {"brokers": served.url, "topic": "times", "authToken": TOKEN}
    opts = parse_read_options({**base, "startingTimestamp": str(split_ms)}, streaming=False)
    assert opts.starting == OffsetSpec(all_timestamp=split_ms)
    assert transfer.plan_batch(opts) == [QueueRange(0, 20, 50)]


def test_a_rerun_of_the_same_session_stores_nothing_twice(served: Served) -> None:
    with Admin(served.url, auth_token=TOKEN) as admin:
        admin.create_topic("w", 1)
    chunks = [[{"body": f"c{c}m{m}", "encoding": "utf-8"} for m in range(5)] for c in range(4)]
    conn = connection(served.url)
    first = transfer.produce_chunks(conn, "w", "spark-test-p0", chunks)
    assert (first.acknowledged, first.skipped) == (20, 0)
    again = transfer.produce_chunks(conn, "w", "spark-test-p0", chunks)
    # Chunks 0-2 are older than the session's last: skipped; chunk 3 is its last batch,
    # answered with its original results.
    assert (again.acknowledged, again.skipped) == (5, 15)
    assert served.broker.reads.queue_bounds("w", 0) == (0, 20)


def test_the_prefetch_helper_keeps_order_raises_errors_and_stops_early() -> None:
    assert list(transfer._ahead(iter(range(50)), 1)) == list(range(50))
    assert list(transfer._ahead(iter(range(5)), 0)) == list(range(5))

    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("broken page")

    got = []
    with pytest.raises(ValueError, match="broken page"):
        got.extend(transfer._ahead(failing(), 2))
    assert got == [1]

    produced: list[int] = []
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            for i in range(10**9):
                produced.append(i)
                yield i
        finally:
            closed.set()

    it = transfer._ahead(endless(), 1)
    assert [next(it), next(it)] == [0, 1]
    it.close()  # the consumer stops: the helper stops too, and closes its source
    assert closed.wait(10) and len(produced) <= 4


def test_the_stream_reader_without_spark(served: Served) -> None:
    """The stream reader's offset logic against a real node, driven the way Spark's
    streaming-source runner drives it (no JVM needed): a memoised initial offset, the
    read limit, Trigger.AvailableNow's target, and group commits from ``latestOffset``."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: PLC0415

    from ledgermq.spark.source import LedgerMQStreamReader, QueuePartition  # noqa: PLC0415

    produce(served, "s", 40)  # 20 per queue
    base = {"brokers": served.url, "topic": "s", "authToken": TOKEN, "groupId": "g"}
    reader = LedgerMQStreamReader(parse_read_options(base, streaming=True))  # from latest
    start = reader.initialOffset()
    assert start == {"0": 20, "1": 20}
    produce(served, "s", 10)
    # Spark asks twice; a latest start resolved again now would skip the 10 new messages.
    assert reader.initialOffset() == start
    assert isinstance(reader.getDefaultReadLimit(), ReadAllAvailable)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"0": 25, "1": 25}
    assert [(p.queue_id, p.start, p.end) for p in reader.partitions(start, end)] == [
        (0, 20, 25),
        (1, 20, 25),
    ]
    (batch,) = list(reader.read(QueuePartition(0, 20, 25)))
    assert batch.num_rows == 5 and batch.column("queue_offset").to_pylist() == [20, 21, 22, 23, 24]
    # latestOffset(start) commits `start` for the group: the end of a finished batch.
    with Admin(served.url, auth_token=TOKEN) as admin:
        assert {o.queue_id: o.committed_offset for o in admin.group_offsets("g", "s")} == {
            0: 20,
            1: 20,
        }

    limited = LedgerMQStreamReader(
        parse_read_options(
            {**base, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "7"}, streaming=True
        )
    )
    first = limited.initialOffset()
    assert first == {"0": 0, "1": 0}
    assert limited.getDefaultReadLimit() == ReadMaxRows(7)
    assert limited.latestOffset(first, ReadMaxRows(7)) == {"0": 3, "1": 3}
    limited.prepareForTriggerAvailableNow()  # the target: what is there now
    produce(served, "s", 10)
    assert limited.latestOffset({"0": 0, "1": 0}, ReadAllAvailable()) == {"0": 25, "1": 25}
    assert limited.latestOffset({"0": 25, "1": 25}, ReadAllAvailable()) == {"0": 25, "1": 25}
