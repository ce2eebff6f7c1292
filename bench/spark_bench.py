"""The Spark connector's read speed, next to Spark's own Parquet reader, and the Arrow
pull next to the JSON pull, in one run.

1. A ``LocalBrokerCluster`` (``--nodes``, 3) gets a topic of ``--queues`` (8) queues and
   ``--messages`` (1,000,000) messages of ``--body-bytes`` (1 KiB) random bytes, each body
   its own, sent by ``--producers`` (4) threads in batches of 500 (not timed).
2. ``pull``: one client reads ``--pull-messages`` (200,000) of them, queue after queue
   from one node, twice: as JSON with base64 bodies (``encoding=base64``, pages of 1,000,
   the JSON limit, decoded to bytes: ``orjson.loads`` and ``b64decode`` per body) and as
   Arrow (``Accept: application/vnd.apache.arrow.stream``, pages of 1,000 and of 10,000,
   the Arrow limit, decoded with ``pyarrow.ipc.open_stream``). Messages/s, bytes on the
   wire per message, and the broker's CPU time per message (from /proc) for each; the
   second of two runs of each counts.
3. ``spark``: a ``local[2]`` session runs ``sum(length(value))`` (every value is read)
   over the whole topic three ways: the ledgermq source with the Arrow pull (default),
   the same with ``pullFormat=json``, and ``spark.read.parquet`` over a Parquet copy of
   the same rows written in this run (Spark's own read path: the ceiling). Each job runs
   once to warm up, then ``--repeats`` (3) times; rows/s of the median run, and the
   ratio to Parquet.

    .venv/bin/python bench/spark_bench.py                  # ~5-8 min on 2 cores
    .venv/bin/python bench/spark_bench.py --messages 100000 --repeats 1   # smoke run

Progress goes to stderr; the table and a last line ``JSON: {...}`` to stdout. Data goes
to a temp directory (``--data-dir`` to choose where), deleted at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledgermq.client import Admin, Producer
from ledgermq.local_cluster import LocalBrokerCluster

TOPIC = "bench-spark"
ARROW = "application/vnd.apache.arrow.stream"
BATCH = 500


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def produce(cluster: LocalBrokerCluster, args: argparse.Namespace) -> None:
    with Admin(cluster.brokers) as admin:
        admin.create_topic(TOPIC, args.queues)
    per_thread = args.messages // args.producers
    bar = tqdm(total=per_thread * args.producers, desc="produce", unit="msg", file=sys.stderr)
    errors: list[BaseException] = []

    def send(seed: int) -> None:
        r = random.Random(seed)
        try:
            with Producer(cluster.brokers, deadline_s=120) as p:
                for start in range(0, per_thread, BATCH):
                    n = min(BATCH, per_thread - start)
                    # Every body its own random bytes: Parquet would dictionary-encode a
                    # small pool of repeated bodies and read far less than a gigabyte.
                    p.send(TOPIC, [r.randbytes(args.body_bytes) for _ in range(n)])
                    bar.update(n)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(args.producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    if errors:
        raise errors[0]
    args.messages = per_thread * args.producers


def pull_all(url: str, queues: int, per_queue: int, fmt: str, page: int) -> tuple[int, int]:
    """(messages, bytes on the wire) of reading ``per_queue`` messages of every queue."""
    count = wire = 0
    headers = {"accept": ARROW} if fmt == "arrow" else {}
    with httpx.Client(base_url=url, timeout=60, headers=headers) as http:
        for q in range(queues):
            offset = 0
            while offset < per_queue:
                n = min(page, per_queue - offset)
                params: dict[str, Any] = {"offset": offset, "max_messages": n}
                if fmt == "json":
                    params["encoding"] = "base64"
                r = http.get(f"/v1/topics/{TOPIC}/queues/{q}/messages", params=params)
                r.raise_for_status()
                wire += len(r.content)
                if fmt == "json":
                    doc = orjson.loads(r.content)
                    bodies = [base64.b64decode(m["body"]) for m in doc["messages"]]
                    got, offset = len(bodies), doc["next_offset"]
                else:
                    table = pa.ipc.open_stream(r.content).read_all()
                    got, offset = table.num_rows, int(r.headers["ledgermq-next-offset"])
                if not got:
                    raise RuntimeError(f"queue {q} ended at {offset}")
                count += got
    return count, wire


def bench_pull(cluster: LocalBrokerCluster, args: argparse.Namespace) -> dict[str, Any]:
    node = cluster.ids[-1]
    url, pid = cluster.urls[node], cluster.procs[node].pid
    per_queue = args.pull_messages // args.queues
    out = {}
    runs = [("json", 1000), ("arrow", 1000), ("arrow", 10_000)]
    for fmt, page in runs + runs:  # each twice: the second run counts
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        count, wire = pull_all(url, args.queues, per_queue, fmt, page)
        seconds, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        name = f"{fmt} page {page}"
        out[name] = {
            "messages": count,
            "seconds": round(seconds, 3),
            "msgs_per_s": round(count / seconds),
            "wire_bytes_per_msg": round(wire / count, 1),
            "broker_cpu_us_per_msg": round(cpu / count * 1e6, 2),
        }
        log(f"pull {name}: {out[name]}")
    return out


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from ledgermq.spark import LedgerMQDataSource  # noqa: PLC0415

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("ledgermq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LedgerMQDataSource)
    return spark


def bench_spark(
    cluster: LocalBrokerCluster, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    spark = spark_session()
    try:

        def source(fmt: str) -> Any:
            return (
                spark.read.format("ledgermq")
                .option("brokers", cluster.brokers)
                .option("topic", TOPIC)
                .option("pullFormat", fmt)
                .load()
            )

        parquet = scratch / "copy.parquet"
        log("writing the Parquet copy")
        source("arrow").write.parquet(str(parquet))
        jobs = {
            "ledgermq arrow": lambda: source("arrow"),
            "ledgermq json": lambda: source("json"),
            "parquet": lambda: spark.read.parquet(str(parquet)),
        }
        out: dict[str, Any] = {}
        brokers = [cluster.procs[n].pid for n in cluster.ids]
        for name, df in jobs.items():
            times, busy, broker_cpu = [], [], []
            for run in range(args.repeats + 1):
                b0, c0 = machine_busy_s(), sum(cpu_seconds(p) for p in brokers)
                t0 = time.perf_counter()
                rows, total = df().selectExpr("count(*)", "sum(length(value))").first()
                seconds = time.perf_counter() - t0
                if run:
                    busy.append(round(machine_busy_s() - b0, 1))
                    broker_cpu.append(round(sum(cpu_seconds(p) for p in brokers) - c0, 1))
                if rows != args.messages or total != args.messages * args.body_bytes:
                    raise RuntimeError(f"{name}: {rows} rows, {total} bytes")
                log(f"spark {name} run {run}: {seconds:.2f} s" + (" (warm-up)" if not run else ""))
                if run:
                    times.append(seconds)
            median = statistics.median(times)
            out[name] = {
                "seconds": [round(t, 2) for t in times],
                "rows_per_s": round(args.messages / median),
                # The machine's busy CPU seconds during each run (all processes, ours and
                # anyone else's) and the brokers' share: shows what the run competed with.
                "machine_busy_cpu_s": busy,
                "broker_cpu_s": broker_cpu,
            }
        for name in ("ledgermq arrow", "ledgermq json"):
            out[name]["vs_parquet"] = round(
                out[name]["rows_per_s"] / out["parquet"]["rows_per_s"], 3
            )
        return out
    finally:
        spark.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--body-bytes", type=int, default=1024)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--pull-messages", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-pull", action="store_true")
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args()
    args.pull_messages = min(args.pull_messages, args.messages)
    scratch = Path(tempfile.mkdtemp(prefix="ledgermq-spark-bench-", dir=args.data_dir))
    results: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}}
    try:
        with LocalBrokerCluster(
            args.nodes, scratch / "cluster", extra_args=("--log-level", "WARNING")
        ) as cluster:
            cluster.start_all()
            cluster.wait_ready(timeout_s=120)
            t0 = time.perf_counter()
            produce(cluster, args)
            results["produce_seconds"] = round(time.perf_counter() - t0, 1)
            if not args.skip_pull:
                results["pull"] = bench_pull(cluster, args)
            if not args.skip_spark:
                results["spark"] = bench_spark(cluster, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n{args.messages:,} messages of {args.body_bytes} B in {args.queues} queues")
    for fmt, r in results.get("pull", {}).items():
        print(
            f"pull {fmt:17} {r['msgs_per_s']:>10,} msg/s  {r['wire_bytes_per_msg']:>8} B/msg"
            f" on the wire  {r['broker_cpu_us_per_msg']:>7} µs broker CPU/msg"
        )
    for name, r in results.get("spark", {}).items():
        ratio = f"  {r['vs_parquet']:.2f}x parquet" if "vs_parquet" in r else ""
        print(
            f"spark {name:15} {r['rows_per_s']:>10,} rows/s  runs {r['seconds']} s"
            f"  (machine busy {r['machine_busy_cpu_s']} cpu-s, brokers {r['broker_cpu_s']})" + ratio
        )
    line = json.dumps(results)
    if args.json:
        args.json.write_text(line + "\n")
    print("JSON: " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
