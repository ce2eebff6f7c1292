"""The driver: one load generator process, one spec at a time, the machine sampled.

``Runner.run(phase, scenario, system, spec)`` hands the spec to the load generator
process (``loadgen.main``, spawned once), waits for its ``window_start`` /
``window_end`` events to sample the CPU of every process of every system, of the load
generator and of the machine (``machine.Sampler``), and returns the row: the load
generator's figures, the CPU of the system's own processes (``cpu_pct``), the load
generator's share (``loadgen_cpu_pct``), the CPU of everything else of ours that ran
(``others_cpu_pct``: the idle systems), the machine's busy share and load average, and
the system's CPU time per message counted (``system_cpu_us_per_msg``; for a spec that
names its ``master``, that process's alone: ``master_cpu_us_per_msg``).
Every wait is bounded; a system process that exits stops the run.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
from typing import Any

from http_bench import await_loadgen

from . import loadgen
from .machine import Sampler
from .systems import System


class Runner:
    def __init__(self, systems: dict[str, System], a: Any) -> None:
        self.systems = systems
        self.a = a
        self.order = 0
        self._start_worker()

    def _start_worker(self) -> None:
        ctx = mp.get_context("spawn")
        self.counter = ctx.RawValue("q", 0)
        self.conn, child = ctx.Pipe()
        self.worker = ctx.Process(
            target=loadgen.main, args=(child, self.counter), name="loadgen", daemon=True
        )
        self.worker.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.worker.join(timeout=2)
        if self.worker.is_alive():
            self.worker.terminate()
            self.worker.join(timeout=5)

    def all_pids(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, s in self.systems.items():
            out.update({f"{key}/{name}": pid for name, pid in s.pids().items()})
        assert self.worker.pid is not None
        out["loadgen"] = self.worker.pid
        return out

    def run(
        self, phase: str, scenario: str, system: System, spec: dict[str, Any]
    ) -> dict[str, Any]:
        """One run; if it fails, a fresh load generator replaces the one that may still
        be busy with it."""
        try:
            return self._run(phase, scenario, system, spec)
        except Exception:
            self.close()
            self._start_worker()
            raise

    def _run(
        self, phase: str, scenario: str, system: System, spec: dict[str, Any]
    ) -> dict[str, Any]:
        system.check_alive()
        sampler = Sampler(self.all_pids())
        name = f"{scenario} | {system.key}"
        window: dict[str, Any] = {}

        def on_window(event: str) -> None:
            nonlocal window
            if event == "window_start":
                sampler.start()
            else:
                window = sampler.stop()

        result = await_loadgen(
            self.conn,
            self.worker,
            self.counter,
            spec,
            name,
            progress=not self.a.no_progress,
            timeout=self.a.timeout,
            check_alive=system.check_alive,
            on_window=on_window,
            width=40,
        )
        self.order += 1
        return self._row(phase, scenario, system, spec, result, window)

    def _row(
        self,
        phase: str,
        scenario: str,
        system: System,
        spec: dict[str, Any],
        result: dict[str, Any],
        window: dict[str, Any],
    ) -> dict[str, Any]:
        cpu = window.get("cpu_pct", {})
        own = {k.split("/", 1)[1]: v for k, v in cpu.items() if k.startswith(system.key + "/")}
        others = sum(v for k, v in cpu.items() if k != "loadgen" and k.split("/")[0] != system.key)
        row = {
            "phase": phase,
            "scenario": scenario,
            "system": system.key,
            "order": self.order,
            "batch": spec.get("batch"),
            "clients": spec.get("clients"),
            **result,
            "cpu_pct": own,
            "system_cpu_pct": round(sum(own.values()), 1),
            "loadgen_cpu_pct": cpu.get("loadgen"),
            "others_cpu_pct": round(others, 1),
            "machine_busy_pct": window.get("machine_busy_pct"),
            "loadavg_start": window.get("loadavg_start"),
            "loadavg_end": window.get("loadavg_end"),
        }
        row["system_cpu_us_per_msg"] = _us_per_msg(row["system_cpu_pct"], window, result)
        master = spec.get("master")
        if master in own:
            row["master_cpu_us_per_msg"] = _us_per_msg(own[master], window, result)
        print(
            f"{scenario} | {system.key}: {row['msgs_per_s']:,} msg/s, {row['mb_per_s']} MB/s, "
            f"p50 {row['p50_ms']} p99 {row['p99_ms']} p999 {row['p999_ms']} ms, "
            f"errors {row['errors']}, CPU {system.key} {row['system_cpu_pct']}% "
            f"loadgen {row['loadgen_cpu_pct']}% others {row['others_cpu_pct']}%, "
            f"machine {row['machine_busy_pct']}% busy, load {row['loadavg_end']}, "
            f"CPU µs/msg {row['system_cpu_us_per_msg']}",
            file=sys.stderr,
        )
        return row


def _us_per_msg(cpu_pct: float, window: dict[str, Any], result: dict[str, Any]) -> float | None:
    """CPU µs per message counted: ``cpu_pct`` (of one core) over the sampled window."""
    seconds, messages = window.get("window_s"), result.get("messages")
    if not seconds or not messages:
        return None
    return round(cpu_pct / 100 * seconds / messages * 1e6, 1)
