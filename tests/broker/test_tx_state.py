"""Transactions' replicated state (broker/transactions/state.py): resolved once, copied
once, checks counted, the snapshot part read back exactly and refused when malformed."""

from __future__ import annotations

import orjson
import pytest

from broker.transactions.state import COMMITTED, ROLLED_BACK, TransactionState


def test_a_transaction_is_resolved_once_and_each_message_copied_once() -> None:
    s = TransactionState(max_resolved=2)
    s.begun(0, 3, "pg", "t", ts=1_000, first_check_ms=6_000)
    s.begun(0, 3, "pg", "t", ts=1_000, first_check_ms=6_000)  # (a replay: nothing new)
    s.begun(3, 1, "pg", "t", ts=1_001, first_check_ms=6_000)
    assert s.end == 4 and [t.next_check for t in s.pending()] == [7_000, 7_001]
    assert s.checked(0, ts=7_000, interval_ms=30_000) and s.live[0].next_check == 37_000
    assert not s.copied(0, 0), "not committed yet"
    assert s.resolve(0, COMMITTED) == COMMITTED
    assert s.resolve(0, ROLLED_BACK) == COMMITTED, "resolved once"
    assert not s.checked(0, ts=8_000, interval_ms=1), "no checks once resolved"
    assert s.copied(0, 2) and not s.copied(0, 2) and not s.copied(0, 3)
    assert s.copied(0, 0) and s.copied(0, 1)
    assert 0 not in s.live and s.state_of(0) == COMMITTED
    assert s.resolve(3, ROLLED_BACK, expired=True) == ROLLED_BACK
    assert s.resolve(9, COMMITTED) is None
    assert (s.stats["copied"], s.stats["expired"], s.stats["checks"]) == (3, 1, 1)


def test_the_snapshot_part_round_trips_and_old_resolutions_are_forgotten() -> None:
    s = TransactionState(max_resolved=2)
    for base in range(4):
        s.begun(base, 1, "pg", "t", ts=base, first_check_ms=10)
    s.resolve(0, ROLLED_BACK)
    s.resolve(1, COMMITTED)
    s.resolve(2, ROLLED_BACK)
    assert s.state_of(0) is None, "the oldest resolution is forgotten (max_resolved)"
    doc = orjson.loads(orjson.dumps(s.to_json()))
    again = TransactionState.from_json(doc, max_resolved=2)
    assert again.to_json() == s.to_json()
    assert again.state_of(1) == COMMITTED and again.state_of(3) == "pending"


@pytest.mark.parametrize(
    "part",
    [
        {"end": 1, "live": [[0, 1, "g", "t", 0, 0, 0, "maybe", []]], "resolved": [], "stats": {}},
        {"end": 1, "live": [], "resolved": [[0, "perhaps"]], "stats": {}},
        {"end": 1, "live": [[0, 1]], "resolved": [], "stats": {}},
        {"end": "x", "live": [], "resolved": [], "stats": {}},
    ],
)
def test_a_malformed_part_is_refused(part: dict[str, object]) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        TransactionState.from_json(part)
