"""Replay simulator seeds: ``python -m tests.sim --seed 17 --verbose``; the broker
simulation (``tests/sim/broker_sim.py``) with ``--broker``."""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable

from .broker_sim import FAULT_MS, KNOWN_BUGS, BrokerSimulation, run_broker_seed
from .sim import Simulation, run_seed


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim")
    ap.add_argument("--seed", type=int, help="run one seed")
    ap.add_argument("--seeds", default="0:20", help="a range start:stop (default 0:20)")
    ap.add_argument("--broker", action="store_true", help="the broker simulation")
    ap.add_argument(
        "--explore",
        default="",
        help="with --broker: known-bug triggers to turn on, comma-separated "
        f"({', '.join(KNOWN_BUGS) or 'none known now'}; 'all' for every one)",
    )
    ap.add_argument("--fault-ms", type=int, help=f"fault phase (default 8000, broker {FAULT_MS})")
    ap.add_argument(
        "--batch-records",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --broker: store batch records or not (default: as the seed draws)",
    )
    ap.add_argument(
        "--transfers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="leadership transfers in the fault phase (default: as the seed draws)",
    )
    ap.add_argument(
        "--membership",
        action="store_true",
        help="membership changes in the fault phase, with spare nodes (issue 33)",
    )
    ap.add_argument(
        "--pop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --broker: POP groups (default: as the seed draws)",
    )
    ap.add_argument(
        "--delay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --broker: delay messages (default: as the seed draws)",
    )
    ap.add_argument(
        "--tx",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --broker: transactions (default: as the seed draws)",
    )
    ap.add_argument(
        "--send-window",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --broker: a producer under send-window ids (default: as the seed draws)",
    )
    ap.add_argument("--verbose", action="store_true", help="print the trace")
    a = ap.parse_args()
    seeds = [a.seed] if a.seed is not None else range(*map(int, a.seeds.split(":")))
    explore = frozenset(KNOWN_BUGS if a.explore == "all" else filter(None, a.explore.split(",")))
    run: Callable[..., Simulation] = (
        functools.partial(
            run_broker_seed,
            explore=explore,
            batch_records=a.batch_records,
            transfers=a.transfers,
            pop=a.pop,
            delay=a.delay,
            tx=a.tx,
            send_window=a.send_window,
        )
        if a.broker
        else functools.partial(run_seed, transfers=a.transfers, membership=a.membership)
    )
    fault_ms = a.fault_ms if a.fault_ms is not None else (FAULT_MS if a.broker else 8_000)
    failed = 0
    totals: dict[str, int] = {}  # broker runs: seeds with retention, installs, ...
    transfers: dict[str, int] = {}  # leadership transfers by kind and outcome
    members: dict[str, int] = {}  # membership changes by kind, refusals by code
    for s in seeds:
        t0 = time.monotonic()
        try:
            sim = run(s, fault_ms=fault_ms, verbose=a.verbose)
        except AssertionError as e:
            failed += 1
            print(f"seed {s}: FAIL {e}", flush=True)
            continue
        except Exception as e:  # a broker-side error (a broken invariant of derived state)
            failed += 1
            notes = " ".join(getattr(e, "__notes__", []))
            print(f"seed {s}: FAIL {type(e).__name__}: {e} ({notes})", flush=True)
            continue
        took = time.monotonic() - t0
        for k, v in sim.transfers.items():
            transfers[k] = transfers.get(k, 0) + v
        for k, v in sim.member_changes.items():
            members[k] = members.get(k, 0) + v
        more = ""
        if isinstance(sim, BrokerSimulation):
            counts = {
                "retentions": sim.stats["retentions"],
                "installs": sim.installs,
                "crashes after install": sim.crashes_after_install,
            }
            more = " " + " ".join(f"{k.replace(' ', '_')}={v}" for k, v in counts.items())
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
                totals[f"seeds with {k}"] = totals.get(f"seeds with {k}", 0) + (v > 0)
        print(
            f"seed {s}: ok {took:.2f}s n={sim.knobs.n_nodes} events={sim.trace_lines} "
            f"digest={sim.trace_digest[:16]}{more}",
            flush=True,
        )
    if totals:
        print(f"{len(seeds)} seeds, {failed} failed; {totals}", flush=True)
    if transfers:
        print(f"leadership transfers: {dict(sorted(transfers.items()))}", flush=True)
    if members:
        print(f"membership changes: {dict(sorted(members.items()))}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
