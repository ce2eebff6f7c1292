"""The Raft core's events (``event_log(name, fields)``) in the node's log: the ones an
operator follows (roles, elections, snapshots) at INFO, faults at WARNING, a divergence
(this node holds committed entries its leader contradicts) at ERROR, the rest (commits,
snapshots taken, ...) at DEBUG.

A fault that lasts (a full disk, a peer that keeps refusing) must not flood the log: a
WARNING event is logged at most once per ``interval_s`` per name, with the count of the
ones left out since."""

from __future__ import annotations

import logging
import time
from typing import Any

EVENT_LOG_INTERVAL_S = 10.0  # a repeated warning event is logged at most this often

ERROR_EVENTS = frozenset({"diverged"})  # acknowledged data is at stake: the operator acts
WARNING_EVENTS = frozenset(
    {
        "snapshot_unavailable",
        "install_snapshot_refused",
        "install_refused",
        "dispatcher_error",
        "persist_no_space",
        "append_storage_error",
        "append_refused_damaged",
        "append_refused_again",
        "peer_storage_refused",
        "term_space_exhausted",
        "client_request_refused",
        "loop_stall",
        # a member's id answers from another data directory than the member's (issue 33)
        "stranger_incarnation",
        "stale_identity",
        "foreign_cluster",  # a frame of another cluster that shares the group's name
    }
)
INFO_EVENTS = frozenset(
    {
        "role",
        "leader_connection_lost",
        "early_pre_vote",
        "vote_round",
        "check_quorum_step_down",
        "transfer",
        "two_leaders",
        "needs_snapshot",
        "inconsistent_leader",
        "install_snapshot",
        "install_snapshot_sent",
        "install_snapshot_done",
        "peer_storage_recovered",
        "peer_append_recovered",
        "config",
        "config_change",
        "config_seal",
        "config_from_log",
    }
)


class EventLog:
    """``event_log`` for a ``DLedgerCore``: call it with (name, fields)."""

    def __init__(self, log: logging.Logger, interval_s: float = EVENT_LOG_INTERVAL_S) -> None:
        self.log = log
        self.interval_s = interval_s
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def __call__(self, name: str, fields: dict[str, Any]) -> None:
        if name in INFO_EVENTS:
            self.log.info("%s %s", name, fields)
        elif name in WARNING_EVENTS or name in ERROR_EVENTS:
            now = time.monotonic()
            if now - self._logged_at.get(name, -1e18) < self.interval_s:
                self._unlogged[name] = self._unlogged.get(name, 0) + 1
                return
            self._logged_at[name] = now
            more = self._unlogged.pop(name, 0)
            level = logging.ERROR if name in ERROR_EVENTS else logging.WARNING
            self.log.log(
                level, "%s %s%s", name, fields, f" (and {more} more like it)" if more else ""
            )
        else:
            self.log.debug("%s %s", name, fields)
