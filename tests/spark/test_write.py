"""Writes through Spark (``df.write.format("ledgermq")``) against a 3-node cluster: what
is written reads back field for field, chunked within the request limits; a write whose
task fails halfway and is retried stores every row exactly once (the retried attempt's
chunks that the first attempt stored are answered from its producer session); bad input
is refused before anything is written."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T  # noqa: N812

from ledgermq.client import Admin
from ledgermq.local_cluster import LocalBrokerCluster
from tests.spark import flaky
from tests.spark.conftest import expected_rows

pytestmark = pytest.mark.spark


def write(df: Any, cluster: LocalBrokerCluster, topic: str, **options: str) -> None:
    w = df.write.format("ledgermq").mode("append").option("brokers", cluster.brokers)
    for k, v in {"topic": topic, **options}.items():
        w = w.option(k, v)
    w.save()


def test_a_write_reads_back_field_for_field(spark: Any, cluster: LocalBrokerCluster) -> None:
    with Admin(cluster.brokers) as admin:
        admin.create_topic("written", 4)
    schema = T.StructType(
        [
            T.StructField("value", T.BinaryType()),
            T.StructField("key", T.StringType()),
            T.StructField("keys", T.ArrayType(T.StringType())),
            T.StructField("tags", T.StringType()),
            T.StructField("properties", T.MapType(T.StringType(), T.StringType())),
            T.StructField("queue_id", T.IntegerType()),
        ]
    )
    rows = [
        (
            bytes([i % 256]) * (i % 40),
            f"k{i}" if i % 2 else None,
            [f"k{i}", f"x{i}"] if i % 2 else [],
            ["A", "B", None][i % 3],
            {"i": str(i)} if i % 4 else {},
            i % 4,
        )
        for i in range(500)
    ]
    df = spark.createDataFrame(rows, schema).repartition(3)
    # 37 messages per request at most: many requests per task.
    write(df, cluster, "written", maxMessagesPerRequest="37")
    got = expected_rows(cluster, "written")
    assert len(got) == 500

    def as_written(r: dict[str, Any]) -> tuple[Any, ...]:
        keys = tuple(r["keys"])
        return (r["value"], r["key"], keys, r["tags"], tuple(sorted(r["properties"].items())))

    for q in range(4):
        want = Counter(
            (v, k, tuple(ks), t, tuple(sorted(p.items())))
            for v, k, ks, t, p, qid in rows
            if qid == q
        )
        have = Counter(as_written(r) for key, r in got.items() if key[0] == q)
        assert have == want, f"queue {q}"
    # String values travel as UTF-8; a DataFrame read from a topic can be written back.
    write(spark.createDataFrame([("héllo",)], "value string"), cluster, "text")
    assert [r["value"] for r in expected_rows(cluster, "text").values()] == ["héllo".encode()]
    copy = (
        spark.read.format("ledgermq")
        .option("brokers", cluster.brokers)
        .option("topic", "text")
        .load()
    )
    write(copy, cluster, "text")
    assert (
        sorted(r["value"] for r in expected_rows(cluster, "text").values())
        == ["héllo".encode()] * 2
    )


def test_a_retried_write_task_stores_no_duplicates(
    spark: Any, cluster: LocalBrokerCluster, tmp_path: Path
) -> None:
    from pyspark import cloudpickle  # noqa: PLC0415

    # The workers get the test source by value: they need not import the tests package.
    cloudpickle.register_pickle_by_value(sys.modules[flaky.__name__])
    spark.dataSource.register(flaky.FlakyRows)
    with Admin(cluster.brokers) as admin:
        admin.create_topic("retried", 2)
    marker = tmp_path / "first-attempt"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        df = (
            spark.read.format("flaky_rows")
            .option("rows", "300")
            .option("fail_after", "120")
            .option("wait_for", "40")
            .option("brokers", cluster.brokers)
            .option("topic", "retried")
            .option("marker", str(marker))
            .load()
        )
        write(df, cluster, "retried", maxMessagesPerRequest="20")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    stored_by_first_attempt = int(marker.read_text())
    assert stored_by_first_attempt >= 40, "the first attempt failed before storing anything"
    stored = expected_rows(cluster, "retried")
    values = Counter(r["value"] for r in stored.values())
    assert max(values.values()) == 1, "a row was stored twice"
    assert set(values) == {flaky.row_value(p, i) for p in (0, 1) for i in range(300)}
    assert {q for (q, _), r in stored.items() if r["value"].startswith(b"p0-")} == {0}


def test_bad_writes_are_refused_before_anything_is_written(
    spark: Any, cluster: LocalBrokerCluster
) -> None:
    df = spark.createDataFrame([(b"x", "a")], "value binary, tag string")
    with pytest.raises(Exception, match="'tag' is not written"):
        write(df, cluster, "refused")
    with pytest.raises(Exception, match="needs a value column"):
        write(spark.createDataFrame([("a",)], "key string"), cluster, "refused")
    with pytest.raises(Exception, match="only be appended"):
        spark.createDataFrame([(b"x",)], "value binary").write.format("ledgermq").mode(
            "overwrite"
        ).option("brokers", cluster.brokers).option("topic", "refused").save()
    with Admin(cluster.brokers) as admin:
        assert "refused" not in {t.name for t in admin.list_topics()}
