"""The run: install, start everything, the phases in order, stop everything, the report.

Phases (``--phases``), each over every system that has it, alternating LedgerMQ and
the peers (``plan.alternate``):

1. ``produce``: for each ``--batches`` x ``--clients``, one run per entry of the order;
2. ``consume``: the catch-up log is written (``fill``: ``--consume-messages`` in
   requests of ``--fill-batch``), then read from its start by 8 readers;
3. ``pop``: shared consumption: per system, ``--pop-messages`` written (a fill), then
   drained by ``--pop-clients`` consumers, each receiving ``--pop-batch`` and acking
   them (LedgerMQ's POP group, a NATS durable pull consumer with explicit acks);
4. ``recovery``: restarts on that log (``recovery``);
5. ``failover``: ``--kills`` kill -9's of the leader under load (``failover``).

Data lives in a temp directory removed at the end; every process is stopped at the
end, also on an error, Ctrl-C or SIGTERM. A system that fails is reported and skipped
from then on; the others go on.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import install, plan, procs, report
from .failover import run_failover
from .machine import Sampler, loadavg
from .recovery import run_recovery
from .runner import Runner
from .systems import LedgerMQ, System, make_systems

BENCH_DIR = Path(__file__).resolve().parent.parent


class Run:
    def __init__(self, a: Any, root: Path, results: dict[str, Any]) -> None:
        self.a = a
        self.root = root
        self.results = results
        self.systems: dict[str, System] = {}
        self.broken: dict[str, str] = {}
        self.runner: Runner | None = None

    def guarded(self, key: str, what: str, fn: Any) -> Any:
        """``fn()``, or None if it fails: the system is then left out of what follows."""
        if key in self.broken:
            return None
        try:
            return fn()
        except (RuntimeError, TimeoutError, OSError, AssertionError, ValueError) as e:
            msg = f"{what}: {type(e).__name__}: {e}"
            print(f"{key}: {msg}; left out from here on", file=sys.stderr)
            self.broken[key] = msg
            self.results["errors"].append({"system": key, "error": msg})
            return None

    def start(self) -> None:
        for key, s in self.systems.items():
            self.guarded(key, "start", s.start)
        for key, s in self.systems.items():
            self.guarded(key, "start", s.wait_ready)
        for key, s in self.systems.items():
            self.results["systems"][key] = {
                "label": s.label,
                "durability": s.durability,
                "status": self.broken.get(key, "ran"),
            }

    def order(self) -> list[str]:
        lmq = [k for k, s in self.systems.items() if isinstance(s, LedgerMQ)]
        peers = [k for k, s in self.systems.items() if not isinstance(s, LedgerMQ)]
        return plan.alternate(lmq, peers)

    def one(self, phase: str, scenario: str, key: str, spec: dict[str, Any] | None) -> None:
        if spec is None or self.runner is None:
            return
        s = self.systems[key]
        row = self.guarded(key, scenario, lambda: self.runner.run(phase, scenario, s, spec))  # type: ignore[union-attr]
        if row is not None:
            self.results["runs"].append(row)

    def produce(self) -> None:
        for batch in self.a.batches:
            for clients in self.a.clients:
                scenario = f"produce b={batch} c={clients}"
                for key in self.order():
                    spec = self.guarded(
                        key,
                        scenario,
                        lambda k=key, b=batch, c=clients: self.systems[k].produce_spec(b, c),
                    )
                    self.one("produce", scenario, key, spec)
                if batch > 1:  # LedgerMQ's record format (issue 31), the same bodies
                    scenario = f"produce records b={batch} c={clients}"
                    for key in self.order():
                        s = self.systems[key]
                        if isinstance(s, LedgerMQ):
                            spec = self.guarded(
                                key,
                                scenario,
                                lambda s=s, b=batch, c=clients: s.produce_spec(b, c, records=True),
                            )
                            self.one("produce", scenario, key, spec)

    def consume(self) -> None:
        n = self.a.consume_messages
        order = plan.once_each(self.order())
        for key in order:
            spec = self.guarded(key, "fill", lambda k=key: self.systems[k].fill_spec(n))
            self.one("fill", f"fill {n:,}", key, spec)
        if "consume" not in self.a.phases:
            return
        scenario = f"consume {n:,} b={self.a.consume_batch}"
        for key in order:
            s = self.systems[key]
            if key == "floor":
                pulls = [
                    r for r in self.results["runs"] if r["scenario"] == scenario and r["requests"]
                ]
                if not pulls:
                    continue
                size = round(sum(r["avg_response_bytes"] for r in pulls) / len(pulls))
                per = round(sum(r["messages"] / r["requests"] for r in pulls) / len(pulls))
                spec = s.blob_spec(size, per)  # type: ignore[attr-defined]
            else:
                spec = self.guarded(key, "consume", s.consume_spec)
            self.one("consume", scenario, key, spec)
        # LedgerMQ's record pages (issue 31): the same catch-up read, the stored records
        scenario = f"consume records {n:,} b={self.a.consume_batch}"
        for key in order:
            s = self.systems[key]
            if isinstance(s, LedgerMQ):
                spec = self.guarded(key, scenario, lambda s=s: s.consume_spec(records=True))
                self.one("consume", scenario, key, spec)

    def pop(self) -> None:
        """Per system (once each, alternating): its backlog written, then drained. A
        system's fill comes right before its own drain, so every drain reads a backlog
        just written (in the page cache)."""
        n = self.a.pop_messages
        scenario = f"pop receive+ack c={self.a.pop_clients} b={self.a.pop_batch}"
        for key in plan.once_each(self.order()):
            s = self.systems[key]
            spec = self.guarded(key, "pop fill", lambda s=s: s.pop_fill_spec(n))
            if spec is None:
                continue
            self.one("fill", f"pop fill {n:,}", key, spec)
            spec = self.guarded(key, "pop", s.pop_spec)
            self.one("pop", scenario, key, spec)

    def sampled(self, key: str, what: str, fn: Any) -> dict[str, Any]:
        """``fn()``'s figures with the machine's load while it ran (busy %, load avg)."""
        sampler = Sampler({})
        sampler.start()
        out = self.guarded(key, what, fn)
        if out is None:
            return {"error": self.broken.get(key, "failed")}
        m = sampler.stop()
        out.update({k: m[k] for k in ("machine_busy_pct", "loadavg_start", "loadavg_end")})
        return dict(out)

    def recovery(self) -> None:
        for key in plan.once_each(self.order()):
            if key != "floor":
                s = self.systems[key]
                self.results["recovery"][key] = self.sampled(
                    key, "recovery", lambda s=s: run_recovery(s)
                )

    def failover(self) -> None:
        for key in plan.once_each(self.order()):
            if key != "floor":
                s = self.systems[key]
                self.results["failover"][key] = self.sampled(
                    key, "failover", lambda s=s: run_failover(s, self.a)
                )

    def go(self) -> None:
        self.systems = make_systems(self.root, self.a)
        self.start()
        self.runner = Runner(
            {k: s for k, s in self.systems.items() if k not in self.broken}, self.a
        )
        phases = self.a.phases
        if "produce" in phases:
            self.produce()
        if "consume" in phases or "recovery" in phases:
            self.consume()
        if "pop" in phases:
            self.pop()
        if "recovery" in phases:
            self.recovery()
        if "failover" in phases:
            self.failover()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.close()
        for s in self.systems.values():
            try:
                s.stop()
            except Exception as e:  # stop the others anyway
                print(f"{s.key}: stop: {e}", file=sys.stderr)
        procs.kill_all()


def _keep_logs(root: Path, out: Path) -> None:
    """Copy the servers' logs (up to 5 MB each) next to the results of a failed run."""
    dest = out / "logs"
    for log in root.rglob("*.log"):
        if log.stat().st_size <= 5 << 20:
            dest.mkdir(exist_ok=True)
            shutil.copy(log, dest / f"{log.parent.name}-{log.name}")


def write(results: dict[str, Any], out: Path, charts: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "peers.json", out / "peers.md"]
    files[0].write_text(json.dumps(results, indent=1) + "\n")
    files[1].write_text(report.markdown(results))
    if charts:
        files += report.charts(results, out)
    return files


def main(argv: list[str] | None = None) -> int:
    a = plan.parse_args(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(a.out) if a.out else BENCH_DIR / "results" / "local" / stamp
    print(f"results: {out}", file=sys.stderr)
    status = install.ensure(a.peers, install=not a.no_install, charts=not a.no_charts)
    skipped = {p: why for p, why in status.items() if why != "ok"}
    a.peers = [p for p in a.peers if p not in skipped]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    root = Path(tempfile.mkdtemp(prefix="peers-bench-", dir=a.data_dir))
    print(f"data and logs: {root} (removed at the end)", file=sys.stderr)
    results: dict[str, Any] = {
        "command": "bench/peers_bench.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "settings": {
            k: v for k, v in vars(a).items() if isinstance(v, str | int | float | list | type(None))
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_start": loadavg()},
        "versions": install.versions(),
        "systems": {p: {"label": p, "durability": "", "status": why} for p, why in skipped.items()},
        "runs": [],
        "failover": {},
        "recovery": {},
        "errors": [],
    }
    t0 = time.monotonic()
    run = Run(a, root, results)
    ok = False
    try:
        run.go()
        ok = True
    except BaseException as e:  # Ctrl-C included: the report says the run is partial
        why = f"{type(e).__name__}: {e}".rstrip(": ")
        results["errors"].append({"system": "the run", "error": f"stopped early: {why}"})
        raise
    finally:
        run.stop()
        results["seconds"] = round(time.monotonic() - t0, 1)
        results["machine"]["loadavg_end"] = loadavg()
        if results["runs"] or results["failover"] or results["recovery"]:
            files = write(results, out, not a.no_charts)
            if not ok or results["errors"]:
                _keep_logs(root, out)
            print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
    print(report.markdown(results))
    print(f"results: {out}")
    return 1 if results["errors"] else 0
