"""Failover as a client sees it: the next acknowledged produce after the master dies.

Three ``python -m ledgermq`` processes (``ledgermq.local_cluster.LocalBrokerCluster``, Raft and HTTP
on 127.0.0.1, the default timers) take a produce load from ``--producers`` threads of
this process, each a ``ledgermq.client.Producer`` (the project's client, with a producer
session, so a retried batch is stored once) sending batches of ``--batch`` messages of
``--body-size`` bytes back to back. Each round then faults the master and measures,
from the fault, the first batch that a producer has acknowledged by another node:

- ``--mode kill``: SIGKILL of the master (its sockets close: issue 18's early pre-vote);
  it is restarted and caught up before the next round;
- ``--mode stop``: SIGSTOP of the master (silent: nothing closes, the followers wait the
  heartbeat timeout); SIGCONT after the round, it rejoins as a follower;
- ``--mode none``: no fault, ``--duration`` s of the same load; counts leader changes
  (the sum of the nodes' term moves, which must be 0).

Per round: ``first_ms`` (the first producer to get an ack from the new master), ``all_ms``
(the last producer to), and from the node logs (wall clock, ms resolution) when a
survivor saw the master's connection close (``closed_ms``), the new leader was elected
(``leader_ms``) and became MASTER (``master_ms``), all from the fault, with its promotion
steps (``promotion``: NOOP, dispatch, queue table; issue 18). Client times are
``time.monotonic()`` of this process. The client waits ``--client-timeout`` s for an
answer (a stopped master never answers; the client's default is 10 s).

    .venv/bin/python bench/failover_bench.py --mode kill --kills 20    # ~3 min
    .venv/bin/python bench/failover_bench.py --mode stop --kills 20
    .venv/bin/python bench/failover_bench.py --mode none --duration 180
    make bench-failover                                                # all three
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datetime import datetime

import httpx
from peerbench.procs import wait_until

from ledgermq.client import ClientSettings, LedgerMQError, Producer
from ledgermq.local_cluster import LocalBrokerCluster

TOPIC = "fo"
_POLL_S = 0.005  # between looks at the producers' acks
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


class Load:
    """``n`` producer threads; each records (monotonic time, master URL) per ack."""

    def __init__(self, c: LocalBrokerCluster, a: argparse.Namespace) -> None:
        self.settings = ClientSettings(timeout_s=a.client_timeout, deadline_s=a.timeout)
        self.brokers = c.brokers
        self.body = os.urandom(a.body_size)
        self.batch = a.batch
        self.stop = threading.Event()
        self.acks: list[list[tuple[float, str | None]]] = [[] for _ in range(a.producers)]
        self.errors = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(a.producers)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _run(self, i: int) -> None:
        msgs = [{"body": self.body} for _ in range(self.batch)]
        with Producer(self.brokers, settings=self.settings) as p:
            while not self.stop.is_set():
                try:
                    p.send(TOPIC, msgs)
                except LedgerMQError:
                    with self.lock:
                        self.errors += 1
                    continue
                with self.lock:
                    self.acks[i].append((time.monotonic(), p.master))

    def first_acks_after(self, t0: float, not_from: str) -> list[float] | None:
        """Per producer, the first ack after ``t0`` from a master other than
        ``not_from``; None until every producer has one."""
        out = []
        with self.lock:
            for acks in self.acks:
                t = None
                for tt, m in reversed(acks):  # from the newest back to the fault
                    if tt <= t0:
                        break
                    if m != not_from:
                        t = tt
                if t is None:
                    return None
                out.append(t)
        return out

    def acked(self) -> int:
        with self.lock:
            return sum(len(a) for a in self.acks)


def _caught_up(c: LocalBrokerCluster, timeout_s: float) -> None:
    """Every node runs and dispatched what the master had committed when asked."""
    master = c.wait_ready(timeout_s=timeout_s)
    info = c.cluster_info(master) or {}
    target = info.get("committed_index", 0)
    for n in c.ids:
        wait_until(
            lambda n=n: (c.cluster_info(n) or {}).get("dispatched_index", -1) >= target,
            timeout_s,
            f"{n} catches up to {target}",
            _POLL_S,
        )


_STEPS = {
    "closed_ms": re.compile(r"leader_connection_lost"),
    "leader_ms": re.compile(r"role \{.*'role': 'LEADER'"),
    "master_ms": re.compile(r"broker role SLAVE → MASTER"),
}
_PROMOTION = re.compile(r"failover step (\d)/3: .*?(?:in |\()(\d+(?:\.\d+)?) ms")


def _timeline(c: LocalBrokerCluster, t_wall: float, new: str, old: str) -> dict[str, Any]:
    """When, in ms after the fault, the survivors' logs show each step (first line
    after ``t_wall``); the new master's promotion steps."""
    out: dict[str, Any] = {}
    promotion: dict[str, float] = {}
    for node in (n for n in c.ids if n != old):
        for line in (c.log_dir / f"{node}.log").read_text(errors="replace").splitlines():
            try:
                t = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if t < t_wall - 0.001:
                continue
            for key, pat in _STEPS.items():
                if (key == "closed_ms" or node == new) and pat.search(line):
                    ms = round((t - t_wall) * 1000, 1)
                    out[key] = min(out.get(key, ms), ms)
            m = _PROMOTION.search(line) if node == new else None
            if m:
                promotion[f"step{m[1]}"] = float(m[2])
    out["promotion"] = promotion
    return out


def _newest_master(load: Load, t0: float) -> str | None:
    with load.lock:
        return max((a[-1] for a in load.acks if a and a[-1][0] > t0), default=(0.0, None))[1]


def _round(c: LocalBrokerCluster, load: Load, a: argparse.Namespace) -> dict[str, Any]:
    _caught_up(c, a.timeout)
    old = c.wait_ready(timeout_s=a.timeout)
    old_url = c.urls[old]
    before = load.acked()
    wait_until(
        lambda: load.acked() >= before + a.producers, a.timeout, "load before the fault", _POLL_S
    )
    time.sleep(a.fault_after)
    t0, t_wall = time.monotonic(), time.time()
    os.kill(c.procs[old].pid, SIGNALS[a.mode])
    acks = wait_until(
        lambda: load.first_acks_after(t0, old_url), a.timeout, "acks from a new master", _POLL_S
    )
    new = next(n for n, u in c.urls.items() if u == _newest_master(load, t0))
    out = {
        "fault": a.mode,
        "old": old,
        "new": new,
        "first_ms": round((min(acks) - t0) * 1000, 1),
        "all_ms": round((max(acks) - t0) * 1000, 1),
        **_timeline(c, t_wall, new, old),
    }
    if a.mode == "kill":
        c.procs[old].wait(timeout=30)
        c.start(old)
    else:
        os.kill(c.procs[old].pid, signal.SIGCONT)
    return out


def _terms(c: LocalBrokerCluster) -> dict[str, int]:
    return {n: (c.cluster_info(n) or {}).get("term", -1) for n in c.ids}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _summary(vals: list[float]) -> dict[str, float]:
    return {
        "n": len(vals),
        "p50": round(statistics.median(vals), 1),
        "p99": round(_pct(vals, 0.99), 1),
        "max": round(max(vals), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mode", choices=("kill", "stop", "none"), default="kill")
    ap.add_argument("--kills", type=int, default=20, help="rounds (kill, stop)")
    ap.add_argument("--duration", type=float, default=180.0, help="s of load (none)")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--fault-after", type=float, default=1.0, help="s of load before a fault")
    ap.add_argument("--client-timeout", type=float, default=0.5, help="per request, s")
    ap.add_argument("--timeout", type=float, default=60.0, help="bound on every wait")
    ap.add_argument("--keep", action="store_true", help="keep the data and node logs")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    print(f"data and node logs: {root}", file=sys.stderr)
    c = LocalBrokerCluster(3, root, extra_args=("--data-file-mb", "64", "--log-level", "INFO"))
    load: Load | None = None
    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(a).items()}}
    ok = False
    try:
        c.start_all()
        master = c.wait_ready(timeout_s=a.timeout)
        httpx.post(c.urls[master] + "/v1/topics", json={"name": TOPIC, "queues": 8}, timeout=30)
        load = Load(c, a)
        load.start()
        if a.mode == "none":
            _caught_up(c, a.timeout)
            t_before = _terms(c)
            n0, t0 = load.acked(), time.monotonic()
            time.sleep(a.duration)
            t_after = _terms(c)
            took = time.monotonic() - t0
            results["none"] = {
                "seconds": round(took, 1),
                "batches_per_s": round((load.acked() - n0) / took, 1),
                "leader_changes": sum(t_after[n] - t_before[n] for n in c.ids),
                "terms_before": t_before,
                "terms_after": t_after,
            }
            print(json.dumps(results["none"]))
        else:
            rounds = []
            for _ in range(a.kills):
                rounds.append(_round(c, load, a))
                print("round:", json.dumps(rounds[-1]), file=sys.stderr)
            results["rounds"] = rounds
            results["first_ms"] = _summary([r["first_ms"] for r in rounds])
            results["all_ms"] = _summary([r["all_ms"] for r in rounds])
            for key in ("closed_ms", "leader_ms", "master_ms"):
                vals = [r[key] for r in rounds if key in r]
                if vals:
                    results[key] = _summary(vals)
            print(f"{a.mode}: next acknowledged produce, ms from the fault:")
            print(f"  first producer: {results['first_ms']}")
            print(f"  all producers:  {results['all_ms']}")
            for key in ("closed_ms", "leader_ms", "master_ms"):
                if key in results:
                    print(f"  {key:<15} {results[key]}")
        results["client_errors"] = load.errors
        ok = True
    finally:
        if load is not None:
            load.stop.set()
        for n in c.ids:
            with contextlib.suppress(Exception):
                if c.alive(n):
                    os.kill(c.procs[n].pid, signal.SIGCONT)
        c.stop_all()
        if load is not None:
            load.close()
        if ok and not a.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (node logs: n*.log)", file=sys.stderr)
    print("JSON:", json.dumps(results))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
