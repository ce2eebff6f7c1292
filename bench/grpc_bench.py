"""The gRPC front (issue 30): RocketMQ 5's official Python producer (sync and async) and
push consumer against LedgerMQ, next to our own HTTP load generator, in the same run on
the same 3-node cluster.

A 3-node ``LocalBrokerCluster`` (three ``python -m ledgermq`` processes on 127.0.0.1,
``flush=sync``), built, filled and sampled with ``bench/http_bench.py``'s and
``bench/delay_bench.py``'s helpers. The official client (``rocketmq-python-client``
5.1.2, in the venv ``tests/rocketmq/client_env.py`` makes once) runs
``bench/grpc_client.py`` in a subprocess, connected to the master's gRPC address only
(no forwarding). Each run: ``--warmup`` s unmeasured, then ``--seconds`` measured; the
master's CPU (utime + stime from /proc) over the measured window, per message.

1. produce, one message per call (the official client has no batch send):
   - ``http b=1 c=1``: our raw HTTP load generator, one connection, a request answered
     before the next (what a sync ``send`` does);
   - ``grpc sync``: ``Producer.send`` in a loop;
   - ``http b=1 c=N``: N connections (``--inflight``, 16);
   - ``grpc async``: ``Producer.send_async`` with N futures outstanding;
2. consume: a backlog of ``--consume-messages`` (20,000) made over HTTP (not timed),
   then drained by
   - ``grpc push``: a ``PushConsumer`` whose listener answers SUCCESS at once (the
     client acks), from its first message to the last;
   - ``http pop``: the same backlog again for another group, drained by our load
     generator's POP receive + ack (one connection, 32 messages a receive, what the
     push consumer asks).

``--profile`` (on by default when py-spy is found) records the master with
``py-spy --gil`` during the produce runs and the push consumer's, and prints where its
samples went.

    .venv/bin/python bench/grpc_bench.py            # make bench-grpc, ~1.5 min
    .venv/bin/python bench/grpc_bench.py --quick    # smoke run, ~40 s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from delay_bench import DelayBench, profile_top
from http_bench import (
    _CHILDREN,
    TOPIC,
    Profiler,
    add_node_args,
    print_profile_columns,
    run_and_report,
)

from tests.rocketmq.client_env import official_python

CLIENT_SCRIPT = Path(__file__).resolve().parent / "grpc_client.py"
PUSH_GROUP = "bench-grpc-push"
HTTP_POP_GROUP = "bench-http-pop"


class GrpcBench(DelayBench):
    def __init__(self, a: argparse.Namespace, root: Path) -> None:
        super().__init__(a, root)
        self.python = official_python()  # the official client's venv (made once)

    def group(self, master: str, name: str) -> None:
        """A POP group reading the topic from its first message."""
        r = httpx.put(
            self.url(master) + f"/v1/groups/{name}",
            json={"mode": "pop", "start": "earliest"},
            timeout=self.a.timeout,
        )
        r.raise_for_status()

    def fill(self, master: str, n: int) -> dict[str, Any]:
        """``n`` messages more in the topic, over HTTP (batches of 100, 16 connections)."""
        return self.scenario(
            f"fill {n:,}",
            "produce",
            master,
            path=f"/v1/topics/{TOPIC}/messages",
            batch=100,
            clients=16,
            warmup=0.0,
            seconds=self.a.timeout,
            extra={"max_messages": n},
        )

    def official(self, master: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Run ``grpc_client.py`` with the official client against the master's gRPC
        front; the master's CPU between its START and END lines."""
        a = self.a
        pid = self.cluster.procs[master].pid
        spec = {
            "endpoints": self.cluster.grpc_addrs[master],
            "topic": TOPIC,
            "seconds": a.seconds,
            "warmup": a.warmup,
            "inflight": a.inflight,
            "body_size": a.body_size,
            **spec,
        }
        print(f"{name}: starting the official client", file=sys.stderr)
        proc = subprocess.Popen(
            [str(self.python), str(CLIENT_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if self.progress else subprocess.DEVNULL,
            text=True,
        )
        _CHILDREN.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        # the client's whole life is bounded: startup, warmup, the window, shutdown
        killer = threading.Timer(a.seconds + a.warmup + a.timeout, proc.kill)
        killer.start()
        cpu0 = t0 = None
        cpu_s = window_s = None
        profiler = None
        last = ""
        try:
            for raw in proc.stdout:
                line = raw.strip()
                if line == "START":
                    cpu0, t0 = self.cpu_s(master), time.monotonic()
                    if a.profile_dir is not None:
                        out = a.profile_dir / f"{name.replace(' ', '-')}.txt"
                        profiler = Profiler(pid, out, a.rate)
                        profiler.start()
                elif line == "END":
                    cpu1 = self.cpu_s(master)
                    if profiler is not None:
                        profiler.stop()
                    if cpu0 is not None and cpu1 is not None and t0 is not None:
                        cpu_s, window_s = cpu1 - cpu0, time.monotonic() - t0
                elif line:
                    last = line
            proc.wait(timeout=a.timeout)
        finally:
            killer.cancel()
            if profiler is not None:
                profiler.stop()
        if proc.returncode != 0 or not last.startswith("{"):
            raise RuntimeError(f"{name}: the official client exited {proc.returncode}: {last}")
        r: dict[str, Any] = json.loads(last)
        seconds = r["seconds"] or window_s
        msgs_per_s = round(r["messages"] / seconds) if seconds else 0
        row = {
            "scenario": name,
            "client": "official python 5.1.2 (gRPC)",
            "master": master,
            **r,
            "msgs_per_s": msgs_per_s,
            "master_cpu_s": cpu_s,
            "master_cpu_pct": round(cpu_s / window_s * 100) if cpu_s and window_s else None,
            "master_us_per_msg": round(cpu_s / r["messages"] * 1e6, 1)
            if cpu_s is not None and r["messages"]
            else None,
        }
        if profiler is not None:
            row["profile"] = profile_top(profiler.out, a.profile_top)
        print(
            f"{name}: {msgs_per_s:,} msg/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
            f"errors {r['errors']}, master {row['master_us_per_msg']} us/msg",
            file=sys.stderr,
        )
        return row


def http_row(r: dict[str, Any], master: str, messages_key: str = "messages") -> dict[str, Any]:
    """An ``http_bench`` scenario's row with the master's CPU per message."""
    n = r.get(messages_key) or 0
    cpu = r["cpu_s"].get(master)
    return {
        **r,
        "client": "ours (HTTP, bench/http_bench.py load generator)",
        "master": master,
        "master_us_per_msg": round(cpu / n * 1e6, 1) if cpu is not None and n else None,
    }


def run(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    b = GrpcBench(a, root)
    results: dict[str, Any] = {
        "settings": {k: str(v) for k, v in vars(a).items()},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
    }
    try:
        master = b.start()
        print(f"cluster ready, master {master}", file=sys.stderr)
        b.create_topic(master)
        path = f"/v1/topics/{TOPIC}/messages"
        produce = []
        for c in (1, a.inflight):
            name = f"http b=1 c={c}"
            profiler = None
            if a.profile_dir is not None:
                out = a.profile_dir / f"{name.replace(' ', '-')}.txt"
                profiler = Profiler(b.cluster.procs[master].pid, out, a.rate)
            r = b.scenario(
                name, "produce", master, path=path, batch=1, clients=c, profiler=profiler
            )
            row = http_row(r, master)
            if profiler is not None:
                row["profile"] = profile_top(profiler.out, a.profile_top)
            produce.append(row)
            mode = "sync" if c == 1 else "async"
            name = "grpc sync" if c == 1 else f"grpc async {a.inflight} in flight"
            produce.append(b.official(master, name, {"mode": mode}))
        results["produce"] = produce
        consume = []
        n = a.consume_messages
        b.group(master, PUSH_GROUP)
        b.fill(master, n)
        b.wait_dispatched(master, master)
        consume.append(
            b.official(
                master,
                "grpc push",
                {"mode": "push", "group": PUSH_GROUP, "expect": n, "seconds": a.timeout},
            )
        )
        b.group(master, HTTP_POP_GROUP)  # the topic from its start again: n of it
        r = b.scenario(
            "http pop b=32 c=1",
            "pop",
            master,
            batch=32,
            clients=1,
            warmup=0.0,
            seconds=a.timeout,
            extra={
                "group": HTTP_POP_GROUP,
                "invisible_ms": 60_000,
                "wait_ms": 1000,
                "pop_messages": n,
            },
        )
        consume.append(http_row(r, master, "acked"))
        results["consume"] = consume
        results["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        b.close()
    return results


def print_table(a: argparse.Namespace, results: dict[str, Any]) -> None:
    la0, la1 = results["machine"]["loadavg_start"][0], results["machine"]["loadavg_end"][0]
    print(
        f"\ngRPC front vs HTTP: 3 nodes on 127.0.0.1 (flush={a.flush}), {a.body_size} B bodies,"
        f" {os.cpu_count()} CPUs shared by every process (load average {la0:.1f} at the start,"
        f" {la1:.1f} at the end); {a.seconds:g} s per produce run"
    )
    head = f"{'run':<30}{'msg/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'master us/msg':>15}"
    print(f"\n  {head}")
    for r in results["produce"] + results["consume"]:
        p50, p99 = r.get("p50_ms"), r.get("p99_ms")
        print(
            f"  {r['scenario']:<30}{r['msgs_per_s']:>9,}{p50!s:>9}{p99!s:>9}"
            f"{r.get('errors', 0)!s:>8}{r['master_us_per_msg']!s:>15}"
        )
    print(
        "  master us/msg: the master's utime + stime over the measured window, per message;"
        "\n  grpc push: from its first message to the last; http pop: receive 32 + ack, one"
        " connection"
    )
    for r in results["produce"] + results["consume"]:
        p = r.get("profile")
        if not p or not p["samples"]:
            continue
        print(f"\n  py-spy on the master, {r['scenario']}: {p['samples']} samples with the GIL")
        print_profile_columns(p)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="measured s per produce run")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured s before each")
    ap.add_argument("--inflight", type=int, default=16, help="async futures / HTTP connections")
    ap.add_argument("--consume-messages", type=int, default=20_000, help="backlog drained")
    ap.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=Profiler.find() is not None,
        help="py-spy the master during the produce and push runs (default: when py-spy is found)",
    )
    ap.add_argument("--profile-dir", type=Path, default=None, help="keep the profiles here")
    ap.add_argument("--profile-top", type=int, default=12, help="functions shown")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 5,000 consumed")
    add_node_args(ap)
    a = ap.parse_args()
    a.client, a.batch_records = "raw", True  # what http_bench.Bench reads
    if a.quick:
        a.seconds, a.warmup, a.consume_messages, a.data_file_mb = 3.0, 1.0, 5_000, 256
    if a.profile and a.profile_dir is None:
        a.profile_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "grpc-bench-profiles"
    if not a.profile:
        a.profile_dir = None
    if a.profile_dir is not None:
        a.profile_dir.mkdir(parents=True, exist_ok=True)
    return run_and_report(a, "grpc-bench", run, print_table)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
