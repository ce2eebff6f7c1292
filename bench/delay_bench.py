"""Delay messages (issue 29): their produce next to a plain produce, and the release of
many timers due at the same instant.

A 3-node ``LocalBrokerCluster`` (three ``python -m ledgermq`` processes on 127.0.0.1,
node defaults: ``flush=sync``), driven over HTTP like ``bench/http_bench.py`` (whose
cluster, load generator and CPU sampling this reuses). Processes, not one process:
the release runs on the master's event loop next to its Raft leader, and every copy is
replicated to, and fsync'ed on, two followers before it counts; in one process the
three nodes would share one GIL and the figures would be theirs together.

1. ``produce``: ``POST /v1/topics/bench/messages`` to the master, batches of
   ``--batch`` (100) messages of ``--body-size`` (1 KiB) random ASCII from ``--clients``
   (16) keep-alive connections, each sending its next request when the last one is
   answered: ``plain`` (no time) and ``delayed`` (``"delay_ms": --delay-ms``, 1 h, so
   nothing is released during the run), alternating ``--rounds`` (2) times each in the
   same run. msg/s, p50/p99 of a request, and the master's CPU per message (utime +
   stime from /proc over the measured window).
2. ``release``: for each of ``--counts`` (10,000 and 100,000), a topic of its own gets
   that many delay messages, all with the same ``deliver_at_ms`` T, sent by
   ``--schedule-clients`` (16) connections in batches of ``--batch``. T is far enough
   ahead for the scheduling to end first (estimated from the delayed produce rate of
   part 1, at least ``--min-lead`` s); a run where it did not is marked ``late``. From T,
   the topic's queues are polled until every copy is there (``visible``), then every
   queue is read from offset 0 and for each copy ``store_timestamp - TIMER_DELIVER_MS``
   (its release lag; the store timestamp is taken when the master encodes the copy,
   before its commit) gives p50/p99/max. Each timer must be delivered exactly once
   (counted by ``TIMER_ORIGIN``). The master's CPU from T to ``visible`` is reported
   per message. ``--profile DIR`` also runs ``py-spy record`` on the master during each
   release and prints where its samples went.

The 1 h timers of part 1 are still pending during part 2 (``pending_long``), as long
timers would be on a real broker: the release loop's refill reads the timer queue from
the first pending timer on.

    .venv/bin/python bench/delay_bench.py                 # ~1.5 min
    .venv/bin/python bench/delay_bench.py --quick         # smoke run, ~20 s
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_bench import (
    _CHILDREN,
    Bench,
    RawConnection,
    _bodies,
    _cpu_ticks,
    _pct,
    _post_head,
    add_node_args,
    print_profile_columns,
    run_and_report,
)

HOST = "127.0.0.1"
TOPIC = "bench"  # http_bench's: Bench.create_topic makes it


class DelayBench(Bench):
    """``http_bench.Bench`` without the floor app."""

    def start(self) -> str:
        self.worker.start()
        self.cluster.start_all()
        _CHILDREN.extend(self.cluster.procs.values())
        return self.cluster.wait_ready(timeout_s=self.a.timeout)

    def url(self, node: str) -> str:
        return self.cluster.urls[node]

    def make_topic(self, master: str, name: str) -> None:
        r = httpx.post(
            self.url(master) + "/v1/topics",
            json={"name": name, "queues": self.a.queues},
            timeout=self.a.timeout,
        )
        r.raise_for_status()

    def count(self, node: str, topic: str) -> int:
        r = httpx.get(self.url(node) + f"/v1/topics/{topic}", timeout=self.a.timeout)
        r.raise_for_status()
        return sum(q["max_offset"] - q["min_offset"] for q in r.json()["queues"])

    def cpu_s(self, node: str) -> float | None:
        ticks = _cpu_ticks(self.cluster.procs[node].pid)
        return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


# ---- part 1: produce, plain and delayed -------------------------------------------------------


def produce_rounds(b: DelayBench, master: str) -> list[dict[str, Any]]:
    a = b.a
    rows = []
    for rnd in range(a.rounds):
        for kind in ("plain", "delayed"):
            master = b.master()
            r = b.scenario(
                f"{kind} b={a.batch} c={a.clients} #{rnd + 1}",
                "produce",
                master,
                path=f"/v1/topics/{TOPIC}/messages",
                batch=a.batch,
                clients=a.clients,
                fields={"delay_ms": a.delay_ms} if kind == "delayed" else None,
            )
            pct = r["cpu_pct"].get(master)
            r["kind_of_produce"] = kind
            r["round"] = rnd + 1
            r["master"] = master
            r["master_us_per_msg"] = (
                round(pct * 1e4 / r["msgs_per_s"], 1)
                if pct is not None and r["msgs_per_s"]
                else None
            )
            rows.append(r)
    return rows


def summarize_produce(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for kind in ("plain", "delayed"):
        rs = [r for r in rows if r["kind_of_produce"] == kind]
        us = [r["master_us_per_msg"] for r in rs if r["master_us_per_msg"] is not None]
        out[kind] = {
            "runs": len(rs),
            "msgs_per_s": [r["msgs_per_s"] for r in rs],
            "msgs_per_s_mean": round(statistics.mean(r["msgs_per_s"] for r in rs)) if rs else 0,
            "p50_ms": [r["p50_ms"] for r in rs],
            "p99_ms": [r["p99_ms"] for r in rs],
            "master_us_per_msg": us,
            "master_us_per_msg_mean": round(statistics.mean(us), 1) if us else None,
            "errors": sum(r["errors"] for r in rs),
        }
    return out


# ---- part 2: the release of many timers due at once -------------------------------------------


async def schedule(
    a: argparse.Namespace, port: int, topic: str, count: int, deliver_at_ms: int, deadline: float
) -> dict[str, Any]:
    """Send ``count`` delay messages, all due at ``deliver_at_ms``, in batches of
    ``a.batch`` from ``a.schedule_clients`` connections. Any failed request stops the run
    (a retry without a producer session could schedule twice)."""
    path = f"/v1/topics/{topic}/messages"
    reqs = [
        _post_head(HOST, port, path, len(body)) + body
        for body in _bodies(a.batch, a.body_size, a.pool, {"deliver_at_ms": deliver_at_ms})
    ]
    left = [count // a.batch]
    if count % a.batch:
        raise ValueError("--counts must be multiples of --batch")
    sent = [0]

    async def client(k: int) -> None:
        c = RawConnection(HOST, port)
        try:
            await c.connect()
            i = k
            while left[0] > 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"scheduling {count}: {sent[0]} sent in time")
                left[0] -= 1
                req = reqs[i % len(reqs)]
                i += 1
                status, data = await asyncio.wait_for(c.request(("", req, b"")), a.request_timeout)
                if status != 200 or data.count(b'"recall_handle"') != a.batch:
                    raise RuntimeError(f"scheduling: HTTP {status}: {data[:300]!r}")
                sent[0] += a.batch
        finally:
            c.close()

    t0 = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(a.schedule_clients)))
    seconds = time.monotonic() - t0
    return {"scheduled": sent[0], "schedule_s": round(seconds, 2)}


def read_copies(b: DelayBench, node: str, topic: str, expect: int) -> list[tuple[int, int, str]]:
    """``(store_timestamp, TIMER_DELIVER_MS, TIMER_ORIGIN)`` of every message of ``topic``
    on ``node``, each queue read from offset 0 to its end."""
    a = b.a
    out: list[tuple[int, int, str]] = []
    with httpx.Client(base_url=b.url(node), timeout=a.timeout) as http:
        for q in range(a.queues):
            offset = 0
            for _ in range(expect // 1000 + 100):  # bounded: pages of up to 1,000
                r = http.get(
                    f"/v1/topics/{topic}/queues/{q}/messages",
                    params={"offset": offset, "max_messages": 1000},
                )
                r.raise_for_status()
                doc = orjson.loads(r.content)
                for m in doc["messages"]:
                    p = m["properties"]
                    out.append(
                        (m["store_timestamp"], int(p["TIMER_DELIVER_MS"]), p["TIMER_ORIGIN"])
                    )
                if doc["status"] != "FOUND" or doc["next_offset"] <= offset:
                    break
                offset = doc["next_offset"]
            else:
                raise RuntimeError(f"{topic} queue {q}: more pages than expected")
    return out


class Profiler:
    """``py-spy record`` of one process into a raw (collapsed stacks) file, stopped with
    SIGINT (it writes the file then). ``--gil``: only the samples where a thread of it
    holds the GIL (it runs Python code), so the threads that wait (the flush thread,
    the executor) do not count."""

    def __init__(self, pid: int, out: Path, rate: int) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.out = out
        self.log = out.with_suffix(".log").open("wb")
        cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--function", "--gil"]
        cmd += ["--rate", str(rate), "--output", str(out)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        _CHILDREN.append(self.proc)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


OWN_CODE = ("(broker/", "(dledger/", "(consumequeue/", "(api/")


def profile_top(path: Path, n: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks: samples, and the functions with the most samples
    on the stack (``total``: the project's own functions) and at its top (``self``: any
    function), in % of the samples."""
    total: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    samples = 0
    if not path.exists():
        return {"samples": 0, "total": [], "self": []}
    for line in path.read_text().splitlines():
        stack, _, k = line.rpartition(" ")
        if not stack or not k.isdigit():
            continue
        frames = stack.split(";")
        samples += int(k)
        own[frames[-1]] += int(k)
        for f in {f for f in frames if any(p in f for p in OWN_CODE)}:
            total[f] += int(k)

    def top(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * v / samples, 1)) for f, v in c.most_common(n)] if samples else []

    return {"samples": samples, "total": top(total), "self": top(own)}


def release_run(b: DelayBench, count: int, rate: float, pending_long: int) -> dict[str, Any]:
    a = b.a
    master = b.master()
    topic = f"release{count}"
    b.make_topic(master, topic)
    port = b.port(master)
    lead_s = max(a.min_lead, count / max(rate, 1.0) * 2.0 + 2.0)
    deliver_at_ms = int((time.time() + lead_s) * 1000)
    print(f"release {count:,}: scheduling, due in {lead_s:.1f} s", file=sys.stderr)
    deadline = time.monotonic() + lead_s + a.timeout  # (past T: the run is marked late)
    sched = asyncio.run(schedule(a, port, topic, count, deliver_at_ms, deadline))
    ahead_ms = deliver_at_ms - int(time.time() * 1000)
    print(
        f"release {count:,}: scheduled in {sched['schedule_s']} s, {ahead_ms} ms before T",
        file=sys.stderr,
    )
    prof = None
    if a.profile is not None:
        time.sleep(max(0.0, (deliver_at_ms - 300) / 1000 - time.time()))
        prof = Profiler(b.cluster.procs[master].pid, a.profile / f"release-{count}.txt", a.rate)
    time.sleep(max(0.0, deliver_at_ms / 1000 - time.time()))
    cpu0 = {n: b.cpu_s(n) for n in b.cluster.ids}
    deadline = time.monotonic() + a.release_timeout
    seen = 0
    while True:  # bounded by --release-timeout
        b.check_alive(master)
        seen = b.count(master, topic)
        if seen >= count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    visible_ms = int(time.time() * 1000) - deliver_at_ms
    cpu1 = {n: b.cpu_s(n) for n in b.cluster.ids}
    if prof is not None:
        prof.stop()
    if seen < count:
        raise TimeoutError(f"release {count}: {seen} delivered after {a.release_timeout} s")
    copies = read_copies(b, master, topic, count)
    lags = [s - d for s, d, _ in copies]
    origins = {o for _, _, o in copies}
    stored = [s for s, _, _ in copies]
    cpu = {
        n: round(c1 - c0, 2)
        for n in b.cluster.ids
        for c0, c1 in [(cpu0[n], cpu1[n])]
        if c0 is not None and c1 is not None
    }
    out: dict[str, Any] = {
        "count": count,
        "master": master,
        **sched,
        "schedule_msgs_per_s": round(count / sched["schedule_s"]) if sched["schedule_s"] else 0,
        "lead_s": round(lead_s, 1),
        "ahead_ms": ahead_ms,
        "late": ahead_ms < 0,
        "pending_long": pending_long,
        "delivered": len(copies),
        "distinct_timers": len(origins),
        "lag_p50_ms": _pct(lags, 0.50),
        "lag_p99_ms": _pct(lags, 0.99),
        "lag_max_ms": max(lags, default=None),
        "lag_min_ms": min(lags, default=None),
        "first_stored_ms": min(stored) - deliver_at_ms if stored else None,
        "last_stored_ms": max(stored) - deliver_at_ms if stored else None,
        "visible_ms": visible_ms,
        "release_msgs_per_s": round(count / (visible_ms / 1000)) if visible_ms > 0 else None,
        "cpu_s": cpu,
        "master_us_per_msg": round(cpu[master] * 1e6 / count, 1) if master in cpu else None,
    }
    if prof is not None:
        out["profile"] = {"file": str(prof.out), **profile_top(prof.out)}
    print(
        f"release {count:,}: lag p50 {out['lag_p50_ms']} ms, p99 {out['lag_p99_ms']} ms, "
        f"max {out['lag_max_ms']} ms; all visible at T+{visible_ms} ms; "
        f"master CPU {out['master_us_per_msg']} us/msg",
        file=sys.stderr,
    )
    return out


# ---- the run and its report -------------------------------------------------------------------


def run(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    b = DelayBench(a, root)
    results: dict[str, Any] = {
        "settings": {k: str(v) for k, v in vars(a).items()},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
    }
    try:
        master = b.start()
        print(f"cluster ready, master {master}", file=sys.stderr)
        b.create_topic(master)
        rows = produce_rounds(b, master) if a.rounds else []
        results["produce"] = rows
        results["produce_summary"] = summarize_produce(rows)
        delayed = results["produce_summary"]["delayed"]["msgs_per_s_mean"]
        rate = delayed or a.assumed_rate
        pending = sum(r["messages"] for r in rows if r["kind_of_produce"] == "delayed")
        results["release"] = []
        for count in a.counts:
            results["release"].append(release_run(b, count, rate, pending))
        results["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        b.close()
    return results


def print_table(a: argparse.Namespace, results: dict[str, Any]) -> None:
    la0, la1 = results["machine"]["loadavg_start"][0], results["machine"]["loadavg_end"][0]
    print(
        f"\nDelay messages: 3 nodes on 127.0.0.1 (flush={a.flush}), {a.body_size} B bodies, "
        f"{os.cpu_count()} CPUs shared by all processes (load average {la0:.1f} at the start, "
        f"{la1:.1f} at the end)"
    )
    if results["produce"]:
        print(
            f"\n  produce: b={a.batch}, c={a.clients}, {a.seconds:g} s per run, "
            f"delayed = delay_ms {a.delay_ms}; master CPU per message over the window"
        )
        print(
            f"  {'run':<26}{'msg/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'errors':>7}{'master us/msg':>15}"
        )
        for r in results["produce"]:
            print(
                f"  {r['scenario']:<26}{r['msgs_per_s']:>9,}{r['p50_ms']:>8.1f}"
                f"{r['p99_ms']:>8.1f}{r['errors']:>7}{r['master_us_per_msg']!s:>15}"
            )
        s = results["produce_summary"]
        if s["plain"]["msgs_per_s_mean"]:
            ratio = s["delayed"]["msgs_per_s_mean"] / s["plain"]["msgs_per_s_mean"]
            print(
                f"  mean: plain {s['plain']['msgs_per_s_mean']:,} msg/s "
                f"({s['plain']['master_us_per_msg_mean']} us/msg), delayed "
                f"{s['delayed']['msgs_per_s_mean']:,} msg/s "
                f"({s['delayed']['master_us_per_msg_mean']} us/msg): {ratio:.2f}x"
            )
    print(
        "\n  release: N delay messages due at the same T; lag = store_timestamp - TIMER_DELIVER_MS"
    )
    print(
        f"  {'N':>8}{'sched s':>9}{'ahead ms':>9}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
        f"{'visible':>9}{'msg/s':>8}{'us/msg':>8}  once"
    )
    for r in results["release"]:
        once = "yes" if r["delivered"] == r["distinct_timers"] == r["count"] else "NO"
        print(
            f"  {r['count']:>8,}{r['schedule_s']:>9}{r['ahead_ms']:>9}{r['lag_p50_ms']:>8}"
            f"{r['lag_p99_ms']:>8}{r['lag_max_ms']:>8}{r['visible_ms']:>9}"
            f"{r['release_msgs_per_s']!s:>8}{r['master_us_per_msg']!s:>8}  {once}"
            + ("  late: T passed before the scheduling ended" if r["late"] else "")
        )
    print(
        "  visible: ms from T until the master answered every copy to a pull (polled every"
        " 50 ms);\n  msg/s: N / visible; us/msg: the master's CPU from T to visible, per copy;"
        "\n  once: every timer delivered exactly once (distinct TIMER_ORIGIN)."
    )
    for r in results["release"]:
        p = r.get("profile")
        if not p or not p["samples"]:
            continue
        print(
            f"\n  py-spy on the master, release of {r['count']:,}: {p['samples']} samples"
            f" with the GIL held ({a.rate}/s)"
        )
        print_profile_columns(p)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="measured time per produce run")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured s before each")
    ap.add_argument("--rounds", type=int, default=2, help="plain + delayed runs, alternating")
    ap.add_argument("--batch", type=int, default=100, help="messages per produce request")
    ap.add_argument("--clients", type=int, default=16, help="connections, produce runs")
    ap.add_argument("--delay-ms", type=int, default=3_600_000, help="the delayed runs' delay")
    ap.add_argument(
        "--counts",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10_000, 100_000],
        help="delay messages due at once, one release each",
    )
    ap.add_argument("--schedule-clients", type=int, default=16)
    ap.add_argument("--min-lead", type=float, default=5.0, help="s from the first send to T")
    ap.add_argument(
        "--assumed-rate", type=float, default=2000.0, help="delayed msg/s if --rounds 0"
    )
    ap.add_argument("--release-timeout", type=float, default=300.0, help="s from T, at most")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy the master into DIR")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 1 round, 10k")
    add_node_args(ap)
    a = ap.parse_args()
    a.client, a.batch_records = "raw", True  # what http_bench.Bench reads
    if a.quick:
        a.seconds, a.warmup, a.rounds, a.counts, a.data_file_mb = 3.0, 0.5, 1, [10_000], 256
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    return run_and_report(a, "delay-bench", run, print_table)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
