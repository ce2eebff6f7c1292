"""Batch reads through Spark (``spark.read.format("ledgermq")``) against a 3-node cluster
of processes: the DataFrame holds exactly what was produced (values, keys, tags,
properties, offsets, timestamps; compared with the JSON pull, an independent path), for
all queues, some queues, offset and timestamp ranges, split by ``minPartitions``, over
the Arrow pull and the JSON pull; bad options fail with their message; the token is not
shown; and a read while the master is killed still returns everything."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from typing import Any

import pytest

from ledgermq.client import Admin, Message, Producer, TopicNotFoundError
from ledgermq.local_cluster import LocalBrokerCluster
from ledgermq.spark.source import SPARK_SCHEMA
from tests.spark.conftest import df_rows, expected_rows, produce
from tests.waiting import wait_until

pytestmark = pytest.mark.spark


def varied_messages(n: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body: bytes | str = rng.randbytes(rng.randrange(0, 300)) if i % 3 else f"text {i} é"
        out.append(
            Message(
                body,
                key=f"k{i}" if i % 2 else None,
                keys=[f"x{i}", "shared"] if i % 5 == 0 else (),
                tags=rng.choice([None, "A", "B"]),
                properties={"i": str(i), "mod": str(i % 7)} if i % 4 else {},
            )
        )
    return out


def read(spark: Any, cluster: LocalBrokerCluster, topic: str, **options: str) -> Any:
    reader = spark.read.format("ledgermq").option("brokers", cluster.brokers)
    for k, v in {"topic": topic, **options}.items():
        reader = reader.option(k, v)
    return reader.load()


def test_a_read_equals_exactly_what_was_produced(spark: Any, cluster: LocalBrokerCluster) -> None:
    results = produce(cluster, "orders", varied_messages(600, seed=1), queues=4)
    expected = expected_rows(cluster, "orders")
    assert len(expected) == 600 and {r.msg_id for r in results} == {
        e["msg_id"] for e in expected.values()
    }
    df = read(spark, cluster, "orders")
    assert df.schema == SPARK_SCHEMA
    assert df.rdd.getNumPartitions() == 4  # one per queue
    got = df_rows(df)
    assert got == expected
    # The JSON pull gives the same DataFrame (the benchmark's baseline path).
    assert df_rows(read(spark, cluster, "orders", pullFormat="json")) == expected
    assert read(spark, cluster, "orders").selectExpr("sum(length(value))").first()[0] == sum(
        len(e["value"]) for e in expected.values()
    )


def test_some_queues_offset_ranges_and_min_partitions(
    spark: Any, cluster: LocalBrokerCluster
) -> None:
    produce(cluster, "ranges", varied_messages(400, seed=2), queues=4)
    expected = expected_rows(cluster, "ranges")
    top = {q: max(o for qq, o in expected if qq == q) + 1 for q in range(4)}

    df = read(spark, cluster, "ranges", queueIds="1,3")
    assert df_rows(df) == {k: v for k, v in expected.items() if k[0] in (1, 3)}

    df = read(
        spark,
        cluster,
        "ranges",
        queueIds="0,2",
        startingOffsets='{"0": 10, "2": -2}',
        endingOffsets='{"0": 60}',
        minPartitions="6",
        pullBatchSize="7",
    )
    want = {k: v for k, v in expected.items() if (k[0] == 0 and 10 <= k[1] < 60) or k[0] == 2}
    assert df_rows(df) == want
    # 50 and top[2] offsets, six partitions wanted: split in proportion, as Kafka does.
    assert df.rdd.getNumPartitions() >= 5

    empty = read(spark, cluster, "ranges", startingOffsets='{"1": 5}', endingOffsets='{"1": 5}')
    assert {k[0] for k in df_rows(empty)} == {0, 2, 3}
    ending = json.dumps({str(q): o for q, o in top.items()})
    assert df_rows(read(spark, cluster, "ranges", endingOffsets=ending)) == expected


def test_timestamp_ranges(spark: Any, cluster: LocalBrokerCluster) -> None:
    produce(cluster, "stamps", varied_messages(120, seed=3), queues=3)
    first = expected_rows(cluster, "stamps")
    last_ms = max(r["store_timestamp"] for r in first.values())
    wait_until(lambda: time.time() * 1000 > last_ms + 5, 5, "the clock passes the first batch")
    split_ms = int(time.time() * 1000)
    with Producer(cluster.brokers) as p:
        p.send("stamps", [f"late {i}" for i in range(90)])
    everything = expected_rows(cluster, "stamps")
    late = {k: v for k, v in everything.items() if k not in first}
    assert len(late) == 90 and min(r["store_timestamp"] for r in late.values()) >= split_ms

    assert df_rows(read(spark, cluster, "stamps", startingTimestamp=str(split_ms))) == late
    assert df_rows(read(spark, cluster, "stamps", endingTimestamp=str(split_ms))) == first
    by_queue = read(
        spark,
        cluster,
        "stamps",
        startingOffsetsByTimestamp=f'{{"1": {split_ms}}}',
        endingOffsetsByTimestamp=f'{{"2": {split_ms}}}',
    )
    want = {
        k: v
        for k, v in everything.items()
        if (k[0] != 1 or k in late) and (k[0] != 2 or k in first)
    }
    assert df_rows(by_queue) == want


def test_bad_options_fail_with_their_message_and_the_token_is_never_shown(
    spark: Any, cluster: LocalBrokerCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    produce(cluster, "opts", ["a", "b"], queues=1)
    secret = "s3cr3t-t0ken-value"
    df = read(spark, cluster, "opts", authToken=secret)
    assert sorted(bytes(r.value) for r in df.collect()) == [b"a", b"b"]
    df.explain(True)
    plan = capsys.readouterr().out
    assert "ledgermq" in plan.lower() and secret not in plan
    cases = {
        "startingOffsets": ("latest", "makes no sense"),
        "startingOffset": ("earliest", "unknown read option"),
        "queueIds": ("5", "not [5]"),
        "endingOffsets": ('{"0": 99}', "past its max offset"),
    }
    for option, (value, message) in cases.items():
        with pytest.raises(Exception, match=re.escape(message)) as e:
            read(spark, cluster, "opts", authToken=secret, **{option: value}).collect()
        assert secret not in str(e.value)
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("ledgermq").schema("value binary").option(
            "brokers", cluster.brokers
        ).option("topic", "opts").load().collect()


def test_a_read_while_the_master_is_killed_still_returns_everything(
    spark: Any, cluster: LocalBrokerCluster
) -> None:
    produce(cluster, "failover", [f"m{i}" * 20 for i in range(4000)], queues=4)
    expected = expected_rows(cluster, "failover")
    master = cluster.wait_ready(timeout_s=60)
    # Small pages: 400 pulls, so the job is still running when the master dies.
    df = read(spark, cluster, "failover", pullBatchSize="10", minPartitions="8")
    out: dict[str, Any] = {}
    job = threading.Thread(target=lambda: out.update(rows=df_rows(df)), daemon=True)
    tracker = spark.sparkContext.statusTracker()
    job.start()
    try:
        wait_until(tracker.getActiveStageIds, 60, "the read's stage starts")
        cluster.kill(master)
        assert job.is_alive(), "the read ended before the master was killed"
        job.join(timeout=150)
        assert not job.is_alive(), "the read did not finish"
        assert out["rows"] == expected
        # Planning also works without the old master (it is unreachable now).
        assert df_rows(read(spark, cluster, "failover", queueIds="2")) == {
            k: v for k, v in expected.items() if k[0] == 2
        }
    finally:
        job.join(timeout=150)
        cluster.start(master)
        cluster.wait_ready(timeout_s=90)

    def held(url: str) -> int:
        with Admin(url) as admin:
            try:
                return sum(q.max_offset for q in admin.describe_topic("failover").queues)
            except TopicNotFoundError:  # its log has the topic; dispatch is not there yet
                return -1

    # The restarted node catches up (ready means it dispatched what it knows committed,
    # not that it has all the leader has, maybe not even the topic's creation): every
    # node ends with the 4,000 messages.
    for url in cluster.urls.values():
        wait_until(lambda url=url: held(url) == 4000, 90, f"{url} holds every message")
