"""Replay simulator seeds: ``python -m tests.sim --seed 17 --verbose``."""

from __future__ import annotations

import argparse
import sys
import time

from .sim import run_seed


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim")
    ap.add_argument("--seed", type=int, help="run one seed")
    ap.add_argument("--seeds", default="0:20", help="a range start:stop (default 0:20)")
    ap.add_argument("--fault-ms", type=int, default=8_000)
    ap.add_argument("--verbose", action="store_true", help="print the trace")
    a = ap.parse_args()
    seeds = [a.seed] if a.seed is not None else range(*map(int, a.seeds.split(":")))
    failed = 0
    for s in seeds:
        t0 = time.monotonic()
        try:
            sim = run_seed(s, fault_ms=a.fault_ms, verbose=a.verbose)
        except AssertionError as e:
            failed += 1
            print(f"seed {s}: FAIL {e}", flush=True)
            continue
        took = time.monotonic() - t0
        print(
            f"seed {s}: ok {took:.2f}s n={sim.knobs.n_nodes} events={sim.trace_lines} "
            f"digest={sim.trace_digest[:16]}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
