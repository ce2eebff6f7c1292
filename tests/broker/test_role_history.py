"""``RoleHistory`` (GET /v1/cluster/history): the last N role changes, oldest first."""

from __future__ import annotations

import pytest

from broker.history import RoleHistory
from dledger.core.messages import Role
from dledger.core.node import RoleChange


def test_role_history_keeps_the_last_n() -> None:
    clock = iter(range(100, 200))
    h = RoleHistory(2, lambda: next(clock))
    h.role_changed(RoleChange(1, Role.CANDIDATE, None))
    h.role_changed(RoleChange(1, Role.LEADER, "n0"))
    h.became_master(1, "n0")
    h.transferred(2, "n1", "FOLLOWER")
    assert h.recorded == 4
    assert [e.to_dict() for e in h.entries()] == [
        {"at_ms": 102, "event": "master", "term": 1, "raft_role": "LEADER", "leader_id": "n0"},
        {"at_ms": 103, "event": "transfer", "term": 2, "raft_role": "FOLLOWER", "leader_id": "n1"},
    ]
    with pytest.raises(ValueError):
        RoleHistory(0, lambda: 0)
