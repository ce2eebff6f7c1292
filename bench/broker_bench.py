"""Produce/pull throughput through the ``Broker`` facade on a 3-process group, and failover.

Three broker nodes run as three OS processes (``bench/broker_node.py``: a ``Broker`` on
its own uvloop loop, Raft on 127.0.0.1, ``flush="sync"``: an entry is fdatasync'ed on a
node before that node acknowledges it). There is no HTTP: the load generator runs
inside the master's process and calls ``Broker.produce`` / ``Broker.pull`` directly, so
it shares the master's CPU (as an in-process client would). This process only sends
commands (JSON lines on the children's stdin/stdout) and kills nodes.

1. ``produce``: ``--producers`` tasks on the master, each producing batches of
   ``--batch`` (100) messages of ``--body-size`` (1 KiB) random bytes to one topic of
   ``--queues`` (8) queues, back to back for ``--duration`` s. messages/s, MB/s (bodies,
   10^6 B), p50/p99 latency per batch (``produce`` call → results, i.e. after quorum
   commit and local dispatch).
2. ``pull``: every queue read from offset 0 to its end with ``Reads.pull(...,
   max_messages=1000)``, on the master and then on a slave (after it dispatched
   everything). The data was just written, so these are page-cache reads.
3. ``fill``: produce on the master until its store's ``ledger_end_pos`` reaches
   ``--fill-gib`` GiB.
4. ``failover``: ``--kills`` rounds: while the master runs the produce load
   (``--kill-mode load``, the default; ``idle`` kills a quiet master) kill -9 it, then
   time, from the kill: the Raft election (the survivor's ``leader, catching up`` role
   event), the broker role MASTER (open for writes: NOOP committed, dispatch caught up,
   queue table rebuilt), and the first produce that succeeds on it (each survivor
   produces one message as soon as it is MASTER, retrying every ms while refused).
   Times are ``time.monotonic()`` in each process (CLOCK_MONOTONIC is system-wide on
   Linux). The killed node is restarted and caught up before the next round.

    .venv/bin/python bench/broker_bench.py            # ~1.5 min, ~4 GiB of scratch disk
    .venv/bin/python bench/broker_bench.py --quick    # smoke run, ~15 s
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledgermq.processes import free_ports

GiB = 1 << 30
NODE_SCRIPT = Path(__file__).resolve().parent / "broker_node.py"
TOPIC = "bench"
_ALL: list[NodeProc] = []


class NodeError(RuntimeError):
    pass


class NodeProc:
    """One ``broker_node.py`` child: JSON-line commands, replies and events."""

    def __init__(self, node_id: str, peers: str, data_dir: Path, log: Path, extra: list[str]):
        self.id = node_id
        self.argv = [
            sys.executable,
            str(NODE_SCRIPT),
            "--id",
            node_id,
            "--peers",
            peers,
            "--data-dir",
            str(data_dir / node_id),
            *extra,
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.cond = threading.Condition()
        self.replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.next_id = 0
        self.eof = False
        _ALL.append(self)

    def start(self, timeout_s: float) -> float:
        """Start the process; returns the seconds until its broker was started."""
        assert not self.alive()
        with self.cond:
            self.replies.clear()
            self.events.clear()
            self.eof = False
        t0 = time.monotonic()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        self.wait_event(lambda e: e["event"] == "ready", 0, timeout_s)
        return time.monotonic() - t0

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                if "id" in msg and "event" not in msg:
                    self.replies[msg["id"]] = msg
                else:
                    self.events.append(msg)
                self.cond.notify_all()
        with self.cond:
            if proc is self.proc:
                self.eof = True
            self.cond.notify_all()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def send(self, cmd: str, **kw: Any) -> int:
        if not self.alive():
            raise NodeError(f"{self.id} is not running")
        assert self.proc is not None and self.proc.stdin is not None
        with self.cond:
            self.next_id += 1
            rid = self.next_id
        self.proc.stdin.write(json.dumps({"id": rid, "cmd": cmd, **kw}).encode() + b"\n")
        self.proc.stdin.flush()
        return rid

    def reply(self, rid: int, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while rid not in self.replies:
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    what = "exited" if self.eof else f"no answer in {timeout_s} s"
                    raise NodeError(f"{self.id}: command {rid}: {what} (log: {self.log})")
                self.cond.wait(min(left, 0.5))
            r = self.replies.pop(rid)
        if not r["ok"]:
            raise NodeError(f"{self.id}: {r['error']}")
        return r

    def call(self, cmd: str, timeout_s: float = 30.0, **kw: Any) -> dict[str, Any]:
        return self.reply(self.send(cmd, **kw), timeout_s)

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def wait_event(self, pred: Any, since: int, timeout_s: float) -> dict[str, Any]:
        """The first event at or after position ``since`` for which ``pred`` holds."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            i = since
            while True:
                while i < len(self.events):
                    if pred(self.events[i]):
                        return self.events[i]
                    i += 1
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    what = "exited" if self.eof else f"no such event in {timeout_s} s"
                    raise NodeError(f"{self.id}: {what} (log: {self.log})")
                self.cond.wait(min(left, 0.5))

    def find_event(self, pred: Any, since: int) -> dict[str, Any] | None:
        with self.cond:
            return next((e for e in self.events[since:] if pred(e)), None)

    def kill(self) -> float:
        """SIGKILL and reap; returns ``time.monotonic()`` taken just before the kill."""
        t = time.monotonic()
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        return t

    def stop(self, timeout_s: float = 30.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(NodeError, OSError):
            self.send("exit")
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


@atexit.register
def _kill_all() -> None:
    for n in _ALL:
        with contextlib.suppress(Exception):
            n.kill()


class Group:
    def __init__(self, root: Path, a: argparse.Namespace) -> None:
        ids = ["n0", "n1", "n2"]
        ports = free_ports(len(ids))
        peers = ";".join(f"{i}-127.0.0.1:{p}" for i, p in zip(ids, ports, strict=True))
        extra = [
            "--flush",
            a.flush,
            "--data-file-mib",
            str(a.data_file_mib),
            "--queues",
            str(a.queues),
            "--log-level",
            a.log_level,
            *(
                ["--max-open-queues", str(a.max_open_queues)]
                if getattr(a, "max_open_queues", None)
                else []
            ),
            *(
                ["--checkpoint-interval-ms", str(a.checkpoint_interval_ms)]
                if getattr(a, "checkpoint_interval_ms", None)
                else []
            ),
        ]
        self.nodes = {i: NodeProc(i, peers, root, root / f"{i}.log", extra) for i in ids}
        self.timeout = a.timeout

    def start_all(self) -> None:
        for n in self.nodes.values():
            n.start(self.timeout)

    def statuses(self) -> dict[str, dict[str, Any]]:
        out = {}
        for i, n in self.nodes.items():
            if n.alive():
                with contextlib.suppress(NodeError, OSError):
                    out[i] = n.call("status", 5.0)
        return out

    def wait_for(self, pred: Any, timeout_s: float, what: str) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        st: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            st = self.statuses()
            if pred(st):
                return st
            time.sleep(0.1)
        brief = {i: s["status"] for i, s in st.items()}
        raise TimeoutError(f"{what}: not within {timeout_s} s; last statuses: {brief}")

    def master(self) -> NodeProc:
        def one(st: dict[str, dict[str, Any]]) -> bool:
            return sum(s["status"]["broker_role"] == "MASTER" for s in st.values()) == 1

        st = self.wait_for(one, self.timeout, "one MASTER")
        return self.nodes[next(i for i, s in st.items() if s["status"]["broker_role"] == "MASTER")]

    def converged(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        """Every node is running and dispatched everything the master committed."""

        def same(st: dict[str, dict[str, Any]]) -> bool:
            if len(st) != len(self.nodes):
                return False
            ss = [s["status"] for s in st.values()]
            ends = {s["ledger_end_index"] for s in ss}
            return (
                len(ends) == 1
                and {s["committed_index"] for s in ss} == ends
                and {s["dispatched_index"] for s in ss} == ends
            )

        return self.wait_for(same, timeout_s, "all nodes caught up")

    def close(self) -> None:
        for n in self.nodes.values():
            with contextlib.suppress(Exception):
                n.stop()


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _produce_kw(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "topic": TOPIC,
        "batch": a.batch,
        "producers": a.producers,
        "body_size": a.body_size,
    }


def _fill(g: Group, a: argparse.Namespace, progress: bool) -> dict[str, Any]:
    m = g.master()
    target = int(a.fill_gib * GiB)
    mark = m.mark()
    rid = m.send("produce", until_pos=target, timeout=a.fill_timeout, **_produce_kw(a))
    bar = tqdm(total=target, unit="B", unit_scale=True, desc="fill the log", disable=not progress)
    deadline = time.monotonic() + a.fill_timeout + 60
    try:
        while True:
            with contextlib.suppress(NodeError):
                r = m.reply(rid, 0.5)
                break
            if time.monotonic() > deadline:
                raise TimeoutError("fill did not finish")
            ev = None
            with m.cond:
                for e in reversed(m.events[mark:]):
                    if e["event"] == "progress":
                        ev = e
                        break
            if ev is not None:
                bar.update(min(target, ev["ledger_end_pos"]) - bar.n)
            if not m.alive():
                raise NodeError(f"{m.id} died during the fill (log: {m.log})")
        bar.update(target - bar.n)
    finally:
        bar.close()
    return {k: r[k] for k in ("messages", "seconds", "msgs_per_s", "mb_per_s", "ledger_end_pos")}


_WHY = re.compile(
    r"NOOP committed in (\d+) ms, dispatched to (-?\d+), (\d+) queues, (\d+) ms in all"
)


def _failover_round(g: Group, a: argparse.Namespace) -> dict[str, Any]:
    old = g.master()
    st = g.converged(a.catch_up_timeout)
    end_pos = st[old.id]["ledger_end_pos"]
    survivors = [n for n in g.nodes.values() if n is not old]
    marks = {n.id: n.mark() for n in survivors}
    probes = {n.id: n.call("probe", topic=TOPIC, timeout=a.timeout)["id"] for n in survivors}
    if a.kill_mode == "load":
        old.call("load_start", timeout=3600, **_produce_kw(a))
        time.sleep(a.kill_after)
        end_pos = old.call("status")["ledger_end_pos"]
    t_kill = old.kill()  # the time just before SIGKILL; then the process is reaped

    def became_master(e: dict[str, Any]) -> bool:
        return e["event"] == "role" and e["role"] == "MASTER"

    deadline = time.monotonic() + a.timeout
    new = None
    while new is None and time.monotonic() < deadline:
        for n in survivors:
            if n.find_event(became_master, marks[n.id]) is not None:
                new = n
                break
        else:
            time.sleep(0.005)
    if new is None:
        raise TimeoutError(f"no survivor became MASTER in {a.timeout} s")
    t_master = new.find_event(became_master, marks[new.id])
    assert t_master is not None
    leader_ev = new.find_event(
        lambda e: e["event"] == "role" and e["why"] == "leader, catching up", marks[new.id]
    )
    probe = new.wait_event(
        lambda e: e["event"] == "probe" and e["probe_id"] == probes[new.id],
        marks[new.id],
        a.timeout,
    )
    for n in survivors:
        if n is not new:
            n.call("probe_cancel")
    if not probe["ok"]:
        raise NodeError(f"{new.id}: no produce succeeded within {a.timeout} s")
    out: dict[str, Any] = {
        "killed": old.id,
        "new_master": new.id,
        "log_bytes": end_pos,
        "election_ms": round((leader_ev["t"] - t_kill) * 1000, 1) if leader_ev else None,
        "master_ms": round((t_master["t"] - t_kill) * 1000, 1),
        "first_produce_ms": round((probe["t"] - t_kill) * 1000, 1),
        "probe_attempts": probe["attempts"],
        "master_why": t_master["why"],
    }
    if leader_ev is not None:
        out["lag_at_election"] = {
            "undispatched": leader_ev["committed_index"] - leader_ev["dispatched_index"],
            "uncommitted": leader_ev["ledger_end_index"] - leader_ev["committed_index"],
        }
    m = _WHY.search(t_master["why"])
    if m:
        out["catch_up"] = {
            "noop_ms": int(m[1]),
            "dispatched_to": int(m[2]),
            "queues": int(m[3]),
            "all_ms": int(m[4]),
        }
    t0 = time.monotonic()
    out["restart_s"] = round(old.start(a.timeout), 2)
    g.converged(a.catch_up_timeout)
    out["rejoin_s"] = round(time.monotonic() - t0, 2)
    return out


def _table(rows: list[tuple[str, str]]) -> None:
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=30.0, help="produce phase, seconds")
    ap.add_argument("--producers", type=int, default=8, help="concurrent producer tasks")
    ap.add_argument("--batch", type=int, default=100, help="messages per produce call")
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--fill-gib", type=float, default=1.0, help="log size before the kills")
    ap.add_argument("--fill-timeout", type=float, default=1200.0)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--kill-mode", choices=("load", "idle"), default="load")
    ap.add_argument("--kill-after", type=float, default=2.0, help="s of load before a kill")
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--data-file-mib", type=int, default=1024, help="commitlog segment size")
    ap.add_argument("--timeout", type=float, default=120.0, help="bound on every wait")
    ap.add_argument("--catch-up-timeout", type=float, default=600.0)
    ap.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    ap.add_argument("--log-level", default="INFO", help="of the nodes (logs in the data dir)")
    ap.add_argument("--quick", action="store_true", help="smoke run: small fill, short phases")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.duration, a.fill_gib, a.kills, a.data_file_mib = 3.0, 0.05, 2, 64
    progress = not a.no_progress
    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(a).items()}}
    if a.data_dir is not None:
        a.data_dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="broker-bench-", dir=a.data_dir))
    else:
        root = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    print(f"data and node logs: {root}", file=sys.stderr)
    g = Group(root, a)
    ok = False
    try:
        g.start_all()
        m = g.master()
        m.call("create_topic", topic=TOPIC, queues=a.queues)
        kw = _produce_kw(a)
        m.call("produce", messages=20 * a.batch * a.producers, timeout=a.timeout, **kw)  # warm
        print(f"produce for {a.duration:.0f} s on {m.id}...", file=sys.stderr)
        r = m.call("produce", duration=a.duration, timeout_s=a.duration + a.timeout, **kw)
        results["produce"] = {
            k: r[k] for k in ("messages", "seconds", "msgs_per_s", "mb_per_s", "p50_ms", "p99_ms")
        } | {"max_ms": r["max_ms"], "errors": r["errors"], "master": m.id, "terms": r["terms"]}
        print("produce:", json.dumps(results["produce"]), file=sys.stderr)
        r = m.call("pull", topic=TOPIC, timeout_s=a.timeout)
        results["pull_master"] = {
            k: r[k] for k in ("messages", "seconds", "msgs_per_s", "mb_per_s")
        }
        g.converged(a.catch_up_timeout)
        master_now = g.master()
        slave = next(n for n in g.nodes.values() if n is not master_now)
        r = slave.call("pull", topic=TOPIC, timeout_s=a.timeout)
        results["pull_slave"] = {k: r[k] for k in ("messages", "seconds", "msgs_per_s", "mb_per_s")}
        results["pull_master"]["node"], results["pull_slave"]["node"] = m.id, slave.id
        print(
            "pull:",
            json.dumps(results["pull_master"]),
            json.dumps(results["pull_slave"]),
            file=sys.stderr,
        )
        results["fill"] = _fill(g, a, progress)
        rounds = []
        for _ in tqdm(range(a.kills), desc="kill -9 the master", disable=not progress):
            rounds.append(_failover_round(g, a))
            print("failover:", json.dumps(rounds[-1]), file=sys.stderr)
        results["failover_rounds"] = rounds
        if rounds:
            summary = {}
            for k in ("election_ms", "master_ms", "first_produce_ms"):
                vals = [x[k] for x in rounds if x[k] is not None]
                summary[k] = {
                    "median": round(statistics.median(vals), 1),
                    "max": round(max(vals), 1),
                }
            results["failover"] = summary
        ok = True
    finally:
        g.close()
        _kill_all()
        if a.data_dir is None and ok:
            shutil.rmtree(root, ignore_errors=True)
        elif not ok:
            print(f"kept {root} (node logs: n*.log)", file=sys.stderr)

    p, pm, ps = results["produce"], results["pull_master"], results["pull_slave"]
    print(
        f"\nbroker facade, 3 processes, flush={a.flush}, {a.body_size} B bodies, "
        f"batches of {a.batch}, {a.producers} producers, {a.queues} queues"
    )
    rows = [
        (
            "produce",
            f"{p['msgs_per_s']:,} msg/s  {p['mb_per_s']} MB/s  "
            f"batch p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms  ({p['messages']:,} msgs)",
        ),
        (
            "pull (master)",
            f"{pm['msgs_per_s']:,} msg/s  {pm['mb_per_s']} MB/s  ({pm['messages']:,} msgs)",
        ),
        (
            "pull (slave)",
            f"{ps['msgs_per_s']:,} msg/s  {ps['mb_per_s']} MB/s  ({ps['messages']:,} msgs)",
        ),
        (
            "fill",
            f"{results['fill']['ledger_end_pos'] / GiB:.2f} GiB of log, "
            + (
                f"{results['fill']['msgs_per_s']:,} msg/s  {results['fill']['mb_per_s']} MB/s"
                if results["fill"]["messages"]
                else "(already reached)"
            ),
        ),
    ]
    _table(rows)
    if results.get("failover_rounds"):
        print(f"\nfailover (kill -9 of the master, {a.kill_mode}), ms from the kill:")
        print(
            "  (election: kill → Raft leader; MASTER: kill → open for writes; NOOP and\n"
            "   catch-up: leader → NOOP committed / → MASTER; undisp.: committed entries\n"
            "   the new leader had not dispatched when elected; restart/rejoin: the killed\n"
            "   node's start until its broker runs / until every node caught up, in s)"
        )
        print(
            f"  {'round':<6}{'log GiB':>8}{'election':>10}{'MASTER':>9}{'1st produce':>13}"
            f"{'NOOP':>7}{'catch-up':>10}{'undisp.':>9}{'restart':>9}{'rejoin':>8}"
        )
        for i, x in enumerate(results["failover_rounds"], 1):
            cu = x.get("catch_up", {})
            lag = x.get("lag_at_election", {})
            print(
                f"  {i:<6}{x['log_bytes'] / GiB:>8.2f}{x['election_ms']!s:>10}"
                f"{x['master_ms']:>9}{x['first_produce_ms']:>13}{cu.get('noop_ms', '-')!s:>7}"
                f"{cu.get('all_ms', '-')!s:>10}{lag.get('undispatched', '-')!s:>9}"
                f"{x['restart_s']:>9}{x['rejoin_s']:>8}"
            )
        s = results["failover"]
        print("  median ms: " + ", ".join(f"{k} {v['median']}" for k, v in s.items()))
    print("JSON:", json.dumps(results))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
