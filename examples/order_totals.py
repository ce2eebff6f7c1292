"""A PySpark job over LedgerMQ: read a topic of orders, total them per customer, and write
the totals to another topic (one message per customer, keyed by the customer).

Orders are JSON message bodies like ``{"customer": "c7", "amount": 12.5}``. Run it
against a local cluster (``ledgermq cluster up --nodes 3`` in another terminal)::

    .venv/bin/python examples/order_totals.py --brokers http://127.0.0.1:8080 \\
        --source orders --dest order-totals

``PYSPARK_PYTHON`` must name the interpreter that has ``ledgermq`` installed (Spark starts
its Python workers with it); ``main`` sets it to the running interpreter when unset.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def run(spark: Any, brokers: str, source: str, dest: str) -> int:
    """Read ``source``, total ``amount`` per ``customer``, write to ``dest``; returns the
    number of totals written."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    orders = (
        spark.read.format("ledgermq")
        .option("brokers", brokers)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .load()
    )
    order = F.from_json(F.col("value").cast("string"), "customer string, amount double")
    totals = (
        orders.select(order.alias("o"))
        .groupBy("o.customer")
        .agg(F.round(F.sum("o.amount"), 2).alias("total"), F.count("*").alias("orders"))
        .select(
            F.col("customer").alias("key"),
            F.to_json(F.struct("customer", "total", "orders")).alias("value"),
            F.lit("total").alias("tags"),
        )
    )
    totals.cache()
    written = totals.count()
    (
        totals.write.format("ledgermq")
        .mode("append")
        .option("brokers", brokers)
        .option("topic", dest)
        .save()
    )
    totals.unpersist()
    return int(written)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default="http://127.0.0.1:8080")
    p.add_argument("--source", default="orders")
    p.add_argument("--dest", default="order-totals")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from ledgermq.spark import LedgerMQDataSource  # noqa: PLC0415

    spark = (
        SparkSession.builder.master(args.master)
        .appName("ledgermq-order-totals")
        .config("spark.ui.enabled", "false")
        # Spark's default of 200 shuffle partitions is for clusters; a few totals on a
        # laptop need a handful (the aggregation ran 200 tasks of nothing before).
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    try:
        spark.dataSource.register(LedgerMQDataSource)
        n = run(spark, args.brokers, args.source, args.dest)
        print(f"wrote {n} customer totals to {args.dest}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
