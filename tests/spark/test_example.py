"""The README's PySpark job (``examples/order_totals.py``) runs against a 3-node cluster:
it reads a topic of orders, totals them per customer and writes the totals to another
topic, where they are exactly the sums of what was produced."""

from __future__ import annotations

import importlib.util
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ledgermq.client import Message
from ledgermq.local_cluster import LocalBrokerCluster
from tests.spark.conftest import expected_rows, produce

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "order_totals.py"


def test_the_example_job_totals_orders_into_another_topic(
    spark: Any, cluster: LocalBrokerCluster
) -> None:
    spec = importlib.util.spec_from_file_location("order_totals", EXAMPLE)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)

    rng = random.Random(5)
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    orders = []
    for i in range(400):
        customer, amount = f"c{rng.randrange(12)}", rng.randrange(1, 10_000) / 100
        sums[customer] += amount
        counts[customer] += 1
        orders.append(Message(json.dumps({"customer": customer, "amount": amount}), key=str(i)))
    produce(cluster, "shop-orders", orders, queues=4)

    assert job.run(spark, cluster.brokers, "shop-orders", "shop-totals") == len(sums)
    totals = {}
    for r in expected_rows(cluster, "shop-totals").values():
        doc = json.loads(r["value"])
        assert r["key"] == doc["customer"] and r["tags"] == "total"
        totals[doc["customer"]] = (doc["total"], doc["orders"])
    assert totals == {c: (round(s, 2), counts[c]) for c, s in sums.items()}
