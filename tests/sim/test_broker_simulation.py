"""The broker state machine on the deterministic simulator (``tests/sim/broker_sim.py``):
queue offsets contiguous in commit order across failovers, every committed message at the
same commitlog offset on every replica, consumer offsets never lost, retried batches never
duplicated, consume-queue and key-index files byte-identical after convergence. A failing
seed's error ends with the command that replays it, e.g.
``.venv/bin/python -m tests.sim --broker --seed 17 --verbose``.

The bugs the simulation found are named in ``broker_sim.KNOWN_BUGS``; their triggers are
held off in the seeds below, and ``test_known_broker_bug_still_reproduces`` shows each one
with its trigger on (reported as xfail). When a bug is fixed that test fails with "DID
NOT RAISE": delete the bug from ``KNOWN_BUGS`` (which turns its trigger on in every seed)
and from ``REPRODUCERS``.
"""

from __future__ import annotations

import random

import pytest

from .broker_sim import KNOWN_BUGS, BrokerKnobs, run_broker_seed
from .sim import Knobs

SEEDS = range(80)

# (bug, a seed that shows it with its trigger on, its fault phase, what the failure says)
REPRODUCERS = [
    ("settle-timeout-duplicate", 15, 3000, r"duplicated: message p0\|12\|0 at entries 90 and 101"),
    (
        "recover-across-topic-delete",
        118,
        8000,
        r"poll-skip: n0 T0/0 \(created 1, dispatched 2\) holds queue offsets \[0, 0\)",
    ),
    ("recover-across-topic-delete", 25, 3000, r"n1's key index files differ from n0's"),
    ("key-index-power-loss", 22, 3000, r"key index file .*: bad magic 0x0"),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_keeps_the_broker_invariants_and_converges(seed: int) -> None:
    sim = run_broker_seed(seed)
    assert sim.acked, "no produce was ever acknowledged"


def test_same_seed_gives_the_same_trace_digest() -> None:
    a, b = run_broker_seed(7), run_broker_seed(7)
    assert a.trace_lines == b.trace_lines > 100
    assert a.trace_digest == b.trace_digest


def test_different_seeds_give_different_traces() -> None:
    assert run_broker_seed(1).trace_digest != run_broker_seed(2).trace_digest


def test_the_seeds_exercise_every_broker_knob() -> None:
    """Across the CI seeds the broker's own knobs all occur (not accidentally all off)."""
    knobs = []
    for s in SEEDS:
        rng = random.Random(s)
        base = Knobs.from_rng(rng, 3000)
        knobs.append((base, BrokerKnobs.from_rng(rng, base, frozenset())))
    brokers = [k for _, k in knobs]
    assert sum(k.churn_per_s > 0 for k in brokers) > 5
    assert sum(k.snapshot_chance > 0 for k in brokers) > 20
    assert sum(k.store_checkpoint_chance > 0 for k in brokers) > 20
    assert sum(k.dispatch_lag_ms > 0 for k in brokers) > 20
    assert sum(k.max_wait_ack_ms < 1000 for k in brokers) > 20
    assert sum(k.power_loss and b.crash_per_s > 0 for b, k in knobs) > 10
    assert {k.producers for k in brokers} == {1, 2, 3}


def test_every_known_bug_has_a_reproducer() -> None:
    assert {bug for bug, *_ in REPRODUCERS} == KNOWN_BUGS.keys()


@pytest.mark.parametrize(
    ("bug", "seed", "fault_ms", "says"), REPRODUCERS, ids=[f"{r[0]}-{r[1]}" for r in REPRODUCERS]
)
def test_known_broker_bug_still_reproduces(bug: str, seed: int, fault_ms: int, says: str) -> None:
    with pytest.raises(Exception, match=says):
        run_broker_seed(seed, fault_ms=fault_ms, explore=frozenset([bug]))
    pytest.xfail(f"{bug} (seed {seed}): {KNOWN_BUGS[bug]}")
