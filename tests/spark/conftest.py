"""Fixtures of the Spark tests (marker ``spark``): one ``local[2]`` SparkSession for the
whole run and one 3-node LedgerMQ cluster of processes on 127.0.0.1.

Spark runs in this process's JVM child; its Python workers are started by the JVM with
``PYSPARK_PYTHON``, which must be this interpreter (the project's ``.venv``, where the
package is installed editable): a worker with another interpreter could not import
``ledgermq.spark``. Everything binds 127.0.0.1 and the UI is off. The master URL
``local[2,4]`` is two threads with up to four attempts per task (plain ``local[2]``
allows one, so a failed task could not be retried).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgermq.client import Admin, Producer
from ledgermq.local_cluster import LocalBrokerCluster
from tests.api.conftest import CLUSTER_ARGS
from tests.waiting import wait_until

SPARK_ENV = {
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "SPARK_LOCAL_IP": "127.0.0.1",
    "SPARK_LOCAL_HOSTNAME": "localhost",
    "PYARROW_IGNORE_TIMEZONE": "1",
}


def spark_env() -> None:
    """The environment Spark's JVM and Python workers need (see the module docstring)."""
    os.environ.update(SPARK_ENV)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    spark_env()
    from pyspark.sql import SparkSession  # noqa: PLC0415 - after the environment is set

    from ledgermq.spark import LedgerMQDataSource  # noqa: PLC0415

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("ledgermq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LedgerMQDataSource)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerCluster]:
    data_dir = tmp_path_factory.mktemp("spark-cluster")
    c = LocalBrokerCluster(3, data_dir, extra_args=CLUSTER_ARGS)
    c.start_all()
    try:
        c.wait_ready(timeout_s=90)
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)


def produce(
    cluster: LocalBrokerCluster, topic: str, messages: list[Any], queues: int = 4
) -> list[Any]:
    """Send ``messages`` in batches of 50 (each a batch record in one round-robin queue,
    so that 200 messages reach four queues); returns the send results in order."""
    with Admin(cluster.brokers) as admin:
        admin.create_topic(topic, queues)
    results = []
    with Producer(cluster.brokers) as p:
        for i in range(0, len(messages), 50):
            results.extend(p.send(topic, messages[i : i + 50]))
    return results


def settled(cluster: LocalBrokerCluster, topic: str) -> dict[int, tuple[int, int]]:
    """Wait (bounded) until every running node holds the same queues of ``topic``: a
    follower may not have dispatched what the master acknowledged yet. Returns queue →
    (min offset, max offset)."""

    def views() -> list[dict[int, tuple[int, int]]]:
        out = []
        for node, url in cluster.urls.items():
            if cluster.alive(node):
                with Admin(url) as admin:
                    d = admin.describe_topic(topic)
                out.append({q.queue_id: (q.min_offset, q.max_offset) for q in d.queues})
        return out

    same = wait_until(
        lambda: (v := views()) and all(x == v[0] for x in v) and v, 60, f"{topic} settled"
    )
    return dict(same[0])


def expected_rows(cluster: LocalBrokerCluster, topic: str) -> dict[tuple[int, int], dict[str, Any]]:
    """Every message of ``topic`` as the JSON pull shows it, keyed by (queue, offset), in
    the DataFrame's terms: an independent path to compare the Arrow read against. Waits
    until every node holds the same (``settled``), so any node may answer."""
    settled(cluster, topic)
    out: dict[tuple[int, int], dict[str, Any]] = {}
    with Admin(cluster.brokers) as admin:
        for q in admin.describe_topic(topic).queues:
            offset = q.min_offset
            while offset < q.max_offset:
                r = admin.pull(topic, q.queue_id, offset, max_messages=500)
                assert r.status == "FOUND", r
                for m in r.messages:
                    out[(m.queue_id, m.queue_offset)] = row_of(m)
                offset = r.next_offset
    return out


def row_of(m: Any) -> dict[str, Any]:
    return {
        "key": m.key,
        "keys": list(m.keys),
        "value": m.body,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "msg_id": m.msg_id,
        "tags": m.tags,
        "properties": dict(m.properties),
        "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp,
    }


def df_rows(df: Any) -> dict[tuple[int, int], dict[str, Any]]:
    """A DataFrame of the source's schema, collected and keyed like ``expected_rows``
    (timestamps as epoch milliseconds); a (queue, offset) seen twice fails (a duplicate)."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for r in df.collect():
        d = r.asDict()
        d["value"] = bytes(d["value"])
        d["keys"] = list(d["keys"] or [])
        d["properties"] = dict(d["properties"] or {})
        # PySpark hands timestamps out as naive local times: back to epoch milliseconds.
        for name in ("born_timestamp", "store_timestamp"):
            d[name] = round(d[name].timestamp() * 1000)
        key = (d["queue_id"], d["queue_offset"])
        assert key not in out, f"duplicate {key}"
        out[key] = d
    return out


def data_path(tmp_path: Path, name: str) -> str:
    return str(tmp_path / name)
