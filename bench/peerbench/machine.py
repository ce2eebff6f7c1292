"""What the machine did during a run: load average, busy CPU, per-process CPU (/proc).

``Sampler.start()`` before a measured window and ``Sampler.stop()`` after it give, for
every pid asked about, its CPU in % of one core over the window (utime + stime), and
for the machine its 1-minute load average at both ends and the busy share of all
cores (``/proc/stat``: everything but idle and iowait), so a figure can be read next to
what else was running.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from http_bench import _cpu_ticks as cpu_ticks
from http_bench import machine_ticks


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


@dataclass
class Sampler:
    """CPU of ``pids`` (name -> pid) and of the machine between ``start`` and ``stop``."""

    pids: dict[str, int]
    _t0: float = 0.0
    _cpu0: dict[str, int | None] = field(default_factory=dict)
    _machine0: tuple[int, int] | None = None
    _load0: float | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = {k: cpu_ticks(p) for k, p in self.pids.items()}
        self._machine0 = machine_ticks()
        self._load0 = loadavg()

    def stop(self) -> dict[str, Any]:
        dt = time.monotonic() - self._t0
        tck = os.sysconf("SC_CLK_TCK")
        cpu: dict[str, float] = {}
        for k, p in self.pids.items():
            c1, c0 = cpu_ticks(p), self._cpu0.get(k)
            if c1 is not None and c0 is not None and dt > 0:
                cpu[k] = round((c1 - c0) / tck / dt * 100, 1)
        m1 = machine_ticks()
        busy = None
        if m1 is not None and self._machine0 is not None and m1[1] > self._machine0[1]:
            busy = round((m1[0] - self._machine0[0]) / (m1[1] - self._machine0[1]) * 100, 1)
        return {
            "cpu_pct": cpu,
            "machine_busy_pct": busy,
            "loadavg_start": self._load0,
            "loadavg_end": loadavg(),
            "cpus": os.cpu_count(),
            "window_s": dt,
        }
