"""Transactional produce (issue 29): a transaction's produce and commit next to a plain
produce of the same messages, in the same run.

A 3-node ``LocalBrokerCluster`` (three ``python -m ledgermq`` processes on 127.0.0.1,
node defaults: ``flush=sync``), driven over HTTP by ``bench/http_bench.py``'s load
generator in its own process (its raw keep-alive client, its measured window and CPU
sampling), with the cluster helpers of ``bench/delay_bench.py``.

For each of ``--batches`` (1, 10 and 100 messages per request), ``--clients`` (16)
connections, each sending its next request when the last one is answered, for
``--seconds`` (8) after ``--warmup`` (1) s:

- ``plain``: ``POST /v1/topics/bench/messages`` with the batch (to the master);
- ``tx``: the same request with ``"transaction": {"producer_group": "bench-pg"}``
  (stored as half messages, one record), then ``POST /v1/transactions/{id}
  {"action": "commit"}`` (answered once the copies into the topic ``benchtx`` are
  committed). A transaction counts when its commit is answered.

Reported per run: msg/s (committed), transactions/s, p50/p99 of the produce request and
(tx) of the commit request, and the master's CPU per message (utime + stime from /proc
over the window). After the tx runs, the topic must hold exactly the messages of every
commit answered (warm-up included): ``once``.

    .venv/bin/python bench/tx_bench.py             # ~1 min
    .venv/bin/python bench/tx_bench.py --quick     # smoke run, ~25 s
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delay_bench import TOPIC, DelayBench
from http_bench import (
    HttpxConnection,
    LoadGen,
    RawConnection,
    Request,
    WrongAnswerError,
    _ms,
    _pct,
    _post_head,
    add_node_args,
    loadgen_main,
    run_and_report,
)

TX_TOPIC = "benchtx"
GROUP = "bench-pg"
TX_ID = re.compile(rb'"transaction_id":"([^"]+)"')


class TxLoadGen(LoadGen):
    """``LoadGen`` with one more kind, ``tx``: each client begins a transaction with its
    request, then commits it; ``tally`` keeps the produce latencies, the transactions
    (as requests) and the messages committed in the window."""

    def __init__(self, spec: dict[str, Any], progress: Any, conn: Connection) -> None:
        super().__init__(spec, progress, conn)
        self.commit_latencies: list[float] = []
        self.tx_latencies: list[float] = []
        self.committed_total = 0  # messages of every commit answered, warm-up included

    async def post_client(
        self, k: int, conn: RawConnection | HttpxConnection, reqs: list[Request]
    ) -> None:
        if self.spec["kind"] != "tx":
            return await super().post_client(k, conn, reqs)
        s = self.spec
        tx_field = b',"transaction":{"producer_group":"' + GROUP.encode() + b'"}}'
        begins = []
        for path, _head, body in reqs:
            b = body[:-1] + tx_field
            begins.append((path, _post_head(s["host"], s["port"], path, len(b)), b))
        commit = b'{"action":"commit"}'
        i = k
        try:
            while time.monotonic() < self.stop_at:
                t0 = time.monotonic()
                got = await self._one(conn, begins[i % len(begins)])
                i += 1
                if got is None:
                    continue
                t1 = time.monotonic()
                m = TX_ID.search(got[1])
                if m is None or got[1].count(b'"msg_id"') != s["batch"]:
                    raise WrongAnswerError(f"a transactional produce answered {got[1][:200]!r}")
                path = f"/v1/transactions/{m.group(1).decode()}"
                req = (path, _post_head(s["host"], s["port"], path, len(commit)), commit)
                for _ in range(3):  # (an error is counted; the commit is repeated)
                    answer = await self._one(conn, req)
                    if answer is not None:
                        break
                else:
                    continue  # left pending (the broker's checks find nobody to ask)
                t2 = time.monotonic()
                if b'"state":"committed"' not in answer[1]:
                    raise WrongAnswerError(f"a commit answered {answer[1][:200]!r}")
                self.committed_total += s["batch"]
                self.progress.value += 2
                if self._in_window(t2):
                    self.tally.latencies.append(t1 - t0)
                    self.commit_latencies.append(t2 - t1)
                    self.tx_latencies.append(t2 - t0)
                    self.tally.requests += 1
                    self.tally.messages += s["batch"]
        finally:
            await conn.aclose()

    async def run(self) -> dict[str, Any]:
        result = await super().run()
        if self.spec["kind"] == "tx":
            result.update(
                {
                    "tx_per_s": result["req_per_s"],  # (one begin and one commit each)
                    "commit_p50_ms": _ms(_pct(self.commit_latencies, 0.50)),
                    "commit_p99_ms": _ms(_pct(self.commit_latencies, 0.99)),
                    "tx_p50_ms": _ms(_pct(self.tx_latencies, 0.50)),
                    "tx_p99_ms": _ms(_pct(self.tx_latencies, 0.99)),
                    "committed_total": self.committed_total,
                }
            )
        return result


def tx_loadgen_main(conn: Connection, progress: Any) -> None:
    """The load generator process, with ``TxLoadGen``."""
    loadgen_main(conn, progress, TxLoadGen)


class TxBench(DelayBench):
    """``DelayBench`` whose load generator knows transactions."""

    def __init__(self, a: argparse.Namespace, root: Path) -> None:
        super().__init__(a, root)
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.worker = ctx.Process(
            target=tx_loadgen_main, args=(child, self.counter), name="loadgen", daemon=True
        )

    def wait_count(self, node: str, topic: str, expect: int) -> int:
        """The topic's messages on ``node`` once it holds ``expect`` (or after the timeout)."""
        deadline = time.monotonic() + self.a.timeout
        while (n := self.count(node, topic)) < expect and time.monotonic() < deadline:
            time.sleep(0.1)
        return n


def _row(b: TxBench, kind: str, batch: int, rnd: int) -> dict[str, Any]:
    a = b.a
    master = b.master()
    topic = TX_TOPIC if kind == "tx" else TOPIC
    r = b.scenario(
        f"{kind} b={batch} c={a.clients} #{rnd + 1}",
        "tx" if kind == "tx" else "produce",
        master,
        path=f"/v1/topics/{topic}/messages",
        batch=batch,
        clients=a.clients,
    )
    pct = r["cpu_pct"].get(master)
    r.update(kind_of_produce=kind, round=rnd + 1, master=master)
    r["master_us_per_msg"] = (
        round(pct * 1e4 / r["msgs_per_s"], 1) if pct is not None and r["msgs_per_s"] else None
    )
    if kind == "tx":
        print(
            f"  tx b={batch}: {r['tx_per_s']:,} tx/s, produce p50 {r['p50_ms']} ms, "
            f"commit p50 {r['commit_p50_ms']} ms p99 {r['commit_p99_ms']} ms",
            file=sys.stderr,
        )
    return r


def run(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    b = TxBench(a, root)
    results: dict[str, Any] = {
        "settings": {k: str(v) for k, v in vars(a).items()},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "rows": [],
    }
    try:
        master = b.start()
        print(f"cluster ready, master {master}", file=sys.stderr)
        b.create_topic(master)
        b.make_topic(master, TX_TOPIC)
        committed = 0
        for rnd in range(a.rounds):
            for batch in a.batches:
                for kind in ("plain", "tx"):
                    r = _row(b, kind, batch, rnd)
                    results["rows"].append(r)
                    committed += r.get("committed_total", 0)
        master = b.master()
        held = b.wait_count(master, TX_TOPIC, committed)
        results["once"] = {"committed": committed, "in_topic": held, "ok": held == committed}
        results["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        b.close()
    return results


def print_table(a: argparse.Namespace, results: dict[str, Any]) -> None:
    la0, la1 = results["machine"]["loadavg_start"][0], results["machine"]["loadavg_end"][0]
    print(
        f"\nTransactional produce: 3 nodes on 127.0.0.1 (flush={a.flush}), {a.body_size} B "
        f"bodies, c={a.clients}, {a.seconds:g} s per run; {os.cpu_count()} CPUs shared by all "
        f"processes (load average {la0:.1f} at the start, {la1:.1f} at the end)"
    )
    print(
        f"\n  {'run':<20}{'msg/s':>9}{'tx/s':>8}{'produce p50/p99 ms':>20}"
        f"{'commit p50/p99 ms':>19}{'errors':>7}{'master us/msg':>15}"
    )
    for r in results["rows"]:
        tx = r["kind_of_produce"] == "tx"
        tps = f"{r['tx_per_s']:,.0f}" if tx else "-"
        commit = f"{r['commit_p50_ms']}/{r['commit_p99_ms']}" if tx else "-"
        print(
            f"  {r['scenario']:<20}{r['msgs_per_s']:>9,}{tps:>8}"
            f"{str(r['p50_ms']) + '/' + str(r['p99_ms']):>20}{commit:>19}{r['errors']:>7}"
            f"{r['master_us_per_msg']!s:>15}"
        )
    print("\n  tx vs plain, same batch (msg/s ratio; master CPU per message ratio):")
    for batch in a.batches:
        rs = [r for r in results["rows"] if r["batch"] == batch]
        plain = [r for r in rs if r["kind_of_produce"] == "plain"]
        tx = [r for r in rs if r["kind_of_produce"] == "tx"]
        p_rate = sum(r["msgs_per_s"] for r in plain) / max(1, len(plain))
        t_rate = sum(r["msgs_per_s"] for r in tx) / max(1, len(tx))
        p_us = [r["master_us_per_msg"] for r in plain if r["master_us_per_msg"]]
        t_us = [r["master_us_per_msg"] for r in tx if r["master_us_per_msg"]]
        cpu = f"{(sum(t_us) / len(t_us)) / (sum(p_us) / len(p_us)):.2f}x" if p_us and t_us else "-"
        rate = f"{t_rate / p_rate:.2f}x" if p_rate else "-"
        print(f"    b={batch:<4} {rate:>6} msg/s, {cpu:>6} CPU per message")
    once = results["once"]
    print(
        f"\n  once: {once['in_topic']:,} messages in {TX_TOPIC} for {once['committed']:,} "
        f"committed (warm-up included): {'yes' if once['ok'] else 'NO'}"
    )
    print(
        "  msg/s: messages committed (tx) or produced (plain) per s; tx/s: commits answered"
        " per s;\n  produce: the request storing the batch (half messages for tx); commit:"
        " POST /v1/transactions/{id},\n  answered once the copies are committed."
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="measured time per run")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured s before each")
    ap.add_argument("--rounds", type=int, default=1, help="plain + tx runs per batch size")
    ap.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 10, 100],
        help="messages per request (per transaction)",
    )
    ap.add_argument("--clients", type=int, default=16, help="connections")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s runs")
    add_node_args(ap)
    a = ap.parse_args()
    a.client, a.batch_records = "raw", True  # what http_bench.Bench reads
    if a.quick:
        a.seconds, a.warmup, a.data_file_mb = 3.0, 0.5, 256
    return run_and_report(a, "tx-bench", run, print_table)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
