"""Long chaos runs: ``python -m tests.chaos --seed S --duration SECONDS [--workdir DIR]``
(root: network namespaces and tmpfs mounts). Prints the seed, the run's bound and the
replay command first, the report last. The run ends within its bound whatever the
cluster does; SIGINT, SIGTERM and SIGHUP stop it at once, and every node, mount and
namespace of its is gone before it exits. Exit code: 0 for a valid run, 1 for an INVALID
one, 128 + the signal's number for one a signal stopped, 2 without root."""

from __future__ import annotations

import argparse
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .cluster import available
from .run import report, run_chaos


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos")
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--duration", type=float, default=150.0, help="the schedule, in seconds")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="kept (default: temp, removed if valid)"
    )
    a = ap.parse_args()
    if not available():
        print("needs root: network namespaces and tmpfs mounts", file=sys.stderr)
        return 2
    seed = a.seed if a.seed is not None else secrets.randbelow(2**31)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="ledgermq-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    result = run_chaos(seed, a.duration, workdir, say)
    print(report(result), flush=True)
    if result.valid and a.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"history and logs: {workdir}", flush=True)
    if result.signal is not None:
        return 128 + result.signal
    return 0 if result.valid else 1


if __name__ == "__main__":
    sys.exit(main())
