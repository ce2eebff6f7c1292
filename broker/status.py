"""``BrokerStatus``: one node's state as the API, the metrics and the tools read it.

A typed snapshot taken on the event loop (``Broker.status()``): every field is a plain
value copied at that moment, so a reader holds no reference into live state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """The leader's view of one peer (empty on a follower)."""

    state: str  # the entry dispatcher's state: COMPARE, TRUNCATE, APPEND, INSTALL_SNAPSHOT
    match_index: int
    in_flight: int
    snapshots_sent: int


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    group: str
    node_id: str
    raft_role: str  # LEADER | FOLLOWER | CANDIDATE
    broker_role: str  # MASTER | SLAVE
    term: int
    leader_id: str | None
    leader_url: str | None
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    dispatched_index: int
    snapshot_index: int  # the newest metadata snapshot (what a lagging follower installs)
    snapshots_installed: int
    peers: dict[str, PeerStatus]
    stats: dict[str, int]
    dispatch_stall: str | None  # why dispatch cannot move (a disk error it retries)
    failed: str | None  # why the node stopped working (it exits)
    # This node holds a committed entry its leader contradicts (acknowledged data was
    # lost by the group): what and where, from the Raft core; None when all is well
    diverged: str | None
    refused: dict[str, int]  # inbound Raft frames and connections refused, by reason

    def to_dict(self) -> dict[str, Any]:
        """As JSON-ready values (for tools that print or send it)."""
        return dataclasses.asdict(self)
