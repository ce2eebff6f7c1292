"""Replicated appends on a 3-process DLedger group, against pysyncobj in the same run.

What it measures (every figure is printed; nothing is asserted):

1. ``throughput``: 3 node processes on 127.0.0.1 (``python -m dledger``), one client
   process (this one) keeping ``--in-flight`` append requests of ``--batch`` 1 KiB
   bodies outstanding for ``--duration`` seconds. entries/s, MB/s (bodies), p50/p99
   commit latency per request (send → quorum-commit answer), and the number of leader
   changes seen while under full load (status sampled every second).
2. ``failover``: ``--kills`` times: kill -9 the leader while a client appends small
   batches back to back; the failover time is from the kill to the first append that
   commits afterwards (a request sent after the kill). The killed node restarts and
   catches up before the next round.
3. ``pysyncobj``: the same workload on pysyncobj with 3 processes
   (``bench/pysyncobj_baseline.py``), unless ``--skip-pysyncobj``.

    .venv/bin/python bench/raft_bench.py --duration 60 --kills 20

``--peer-secret S`` runs both DLedger groups (and the client) with a peer secret
(docs/operations.md), to see what the connection handshake costs; pysyncobj runs as always.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dledger.codes import DLedgerError
from ledgermq.processes import LocalCluster, free_ports

MB = 1_000_000


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _load(
    cl: LocalCluster, seconds: float, batch: int, in_flight: int, body_size: int, progress: bool
) -> dict[str, Any]:
    body = os.urandom(body_size)
    latencies: list[float] = []
    entries = errors = 0
    leaders: list[tuple[int, str]] = []
    async with cl.client() as c:
        await cl.wait_for_leader(c, 30)
        # warm-up: connections, page cache
        for _ in range(20):
            await c.append([body] * batch)
        start = time.monotonic()
        stop_at = start + seconds
        bar = tqdm(total=int(seconds), unit="s", desc="dledger load", disable=not progress)

        async def worker() -> None:
            nonlocal entries, errors
            while time.monotonic() < stop_at:
                t0 = time.monotonic()
                try:
                    await c.append([body] * batch, timeout_s=10)
                except DLedgerError:
                    errors += 1
                    continue
                latencies.append((time.monotonic() - t0) * 1000)
                entries += batch

        async def sampler() -> None:
            async with cl.client() as sc:
                while time.monotonic() < stop_at:
                    st = await cl.statuses(sc)
                    for s in st.values():
                        if s["role"] == "LEADER":
                            leaders.append((s["term"], s["self_id"]))
                    bar.update(1)
                    bar.set_postfix(entries=entries)
                    await asyncio.sleep(1)

        await asyncio.gather(sampler(), *(worker() for _ in range(in_flight)))
        took = time.monotonic() - start
        bar.close()
    changes = len({x for x in leaders}) - 1 if leaders else -1
    return {
        "entries": entries,
        "seconds": round(took, 2),
        "entries_per_s": round(entries / took),
        "mb_per_s": round(entries * body_size / took / MB, 1),
        "p50_ms": round(_pct(latencies, 0.5), 2),
        "p99_ms": round(_pct(latencies, 0.99), 2),
        "errors": errors,
        "leader_changes": changes,
    }


async def _failover(cl: LocalCluster, kills: int, progress: bool) -> dict[str, Any]:
    times: list[float] = []
    async with cl.client() as c:
        for _ in tqdm(range(kills), desc="kill -9 the leader", disable=not progress):
            leader = await cl.wait_for_leader(c, 30)
            await c.append([b"warm"])
            cl.kill(leader)
            t_kill = time.monotonic()
            while True:  # back-to-back appends until one sent after the kill commits
                try:
                    await c.append([b"x" * 100], timeout_s=30)
                    break
                except DLedgerError:
                    continue
            times.append((time.monotonic() - t_kill) * 1000)
            cl.start(leader)

            def caught_up(st: dict[str, dict[str, Any]]) -> bool:
                ends = {s["ledger_end_index"] for s in st.values()}
                return (
                    len(st) == 3
                    and len(ends) == 1
                    and all(s["committed_index"] == s["ledger_end_index"] for s in st.values())
                )

            await cl.wait_for(c, caught_up, 60)
    return {
        "kills": kills,
        "median_ms": round(statistics.median(times), 1),
        "p99_ms": round(_pct(times, 0.99), 1),
        "max_ms": round(max(times), 1),
        "all_ms": [round(t) for t in times],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--batch", type=int, default=128, help="bodies per append request")
    ap.add_argument("--in-flight", type=int, default=32, help="append requests outstanding")
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--skip-pysyncobj", action="store_true")
    ap.add_argument("--pysyncobj-duration", type=float, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--peer-secret", default=None, help="DLedger nodes authenticate with it")
    a = ap.parse_args()
    progress = not a.no_progress
    secret = a.peer_secret.encode() if a.peer_secret else None
    results: dict[str, Any] = {
        "settings": vars(a) | {"workdir": str(a.workdir), "peer_secret": secret is not None}
    }
    with tempfile.TemporaryDirectory(prefix="raft-bench-", dir=a.workdir) as tmp:
        root = Path(tmp)
        args = ("--data-file-mib", "256", "--flush", a.flush, "--log-level", "WARNING")
        with LocalCluster(3, root / "load", extra_args=args, peer_secret=secret) as cl:
            (root / "load").mkdir(exist_ok=True)
            cl.start_all()
            results["throughput"] = asyncio.run(
                _load(cl, a.duration, a.batch, a.in_flight, a.body_size, progress)
            )
            print("dledger throughput:", json.dumps(results["throughput"]), flush=True)
            cl.stop_all()
        if a.kills:
            (root / "failover").mkdir()
            with LocalCluster(3, root / "failover", extra_args=args, peer_secret=secret) as cl:
                cl.start_all()
                results["failover"] = asyncio.run(_failover(cl, a.kills, progress))
                print("dledger failover:", json.dumps(results["failover"]), flush=True)
                cl.stop_all()
        if not a.skip_pysyncobj:
            from pysyncobj_baseline import run_pysyncobj  # noqa: PLC0415

            (root / "pysyncobj").mkdir()
            results["pysyncobj"] = run_pysyncobj(
                a.pysyncobj_duration or a.duration,
                a.body_size,
                a.batch,
                a.in_flight,
                base_port=free_ports(1)[0] + 10,
                workdir=root / "pysyncobj",
                progress=progress,
            )
            print("pysyncobj throughput:", json.dumps(results["pysyncobj"]), flush=True)
            ratio = results["throughput"]["entries_per_s"] / max(
                1, results["pysyncobj"]["entries_per_s"]
            )
            results["throughput_ratio_vs_pysyncobj"] = round(ratio, 1)
    print("JSON:", json.dumps(results))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
