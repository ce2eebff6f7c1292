"""``RoleHistory``: the last role changes this node saw, for ``GET /v1/cluster/history``.

Each entry is one moment of the group's leadership as this node lived it: its Raft role
changed or it learned of a new leader (``role``: the term, its role, the leader it
follows), it became the MASTER once caught up (``master``), or it handed leadership over
on an operator's request (``transfer``: to whom, in which term the target leads). The
console merges every node's history into the master's history (which node led which
term, since when, elected or transferred to).

Bounded (``BrokerSettings.role_history_size``, the oldest dropped first) and in memory
only: a restarted node's history starts at its start. Times are the node's wall clock in
Unix milliseconds, so that histories of several nodes can be put side by side.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from dledger.core.node import RoleChange

Event = Literal["role", "master", "transfer"]


@dataclass(frozen=True, slots=True)
class RoleEvent:
    at_ms: int  # the node's wall clock, Unix ms
    event: Event
    term: int
    raft_role: str  # this node's Raft role then: LEADER | FOLLOWER | CANDIDATE
    leader_id: str | None  # the leader it knew then (for a transfer: the target)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RoleHistory:
    def __init__(self, size: int, clock: Callable[[], int]) -> None:
        if size < 1:
            raise ValueError(f"role_history_size: {size}, must be >= 1")
        self.size = size
        self.clock = clock
        self._events: deque[RoleEvent] = deque(maxlen=size)
        self.recorded = 0  # in all since the start (the ones dropped included)

    def _add(self, event: Event, term: int, raft_role: str, leader_id: str | None) -> None:
        self._events.append(RoleEvent(self.clock(), event, term, raft_role, leader_id))
        self.recorded += 1

    def role_changed(self, change: RoleChange) -> None:
        """A role change handler of the Raft server (on the home loop)."""
        self._add("role", change.term, change.role.value.upper(), change.leader_id)

    def became_master(self, term: int, node_id: str) -> None:
        self._add("master", term, "LEADER", node_id)

    def transferred(self, term: int, to: str, raft_role: str) -> None:
        self._add("transfer", term, raft_role, to)

    def entries(self) -> list[RoleEvent]:
        """Oldest first."""
        return list(self._events)
