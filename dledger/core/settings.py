"""Every timer and limit of the protocol, with our fast-failover defaults (docs/architecture.md).

Names carry their unit last (``heartbeat_interval_ms``). ``CoreSettings.dledger()`` gives
DLedger's own defaults (2 s heartbeats, 6 s election timeout) as the
documented alternative profile; ours detect a lost leader in 3 x 200 member_state.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class CoreSettings:
    # election
    heartbeat_interval_ms: int = 200
    max_heartbeat_leak: int = 3  # leader presumed lost after this many missed heartbeats
    min_vote_interval_ms: int = 100
    max_vote_interval_ms: int = 300
    vote_response_timeout_ms: int = 300  # how long a vote round waits for answers
    taking_leadership_vote_min_ms: int = 30  # vote timer of a transfer target
    taking_leadership_vote_max_ms: int = 100
    pre_vote: bool = True  # SOFAJRaft pre-vote before raising the term (docs/architecture.md)
    check_quorum: bool = True  # leader steps down without a live majority (docs/architecture.md)
    # Issue 18: a follower whose connection from/to its leader closed (the leader's
    # process died: the kernel closed its sockets) pre-votes at once, after a jitter of
    # 0..early_pre_vote_jitter_ms plus its turn (followers by id, 2 x the jitter apart,
    # so two seeing the same close do not split the vote), instead of waiting
    # election_timeout_ms. Needs pre_vote: a voter that
    # still hears the leader refuses, so a follower's own broken link deposes nobody.
    early_pre_vote: bool = True
    early_pre_vote_jitter_ms: int = 20
    # A message whose term is more than this above ours is dropped (logged), as if lost:
    # with pre-vote a live group moves one term per election, so only a forged frame
    # jumps millions, and a group must never be walked to MAX_TERM (it could not elect).
    max_term_jump: int = 1 << 24
    # replication
    max_inflight_pushes: int = 64  # APPEND requests in flight per peer (DLedger: 1000)
    max_push_bytes: int = 1 << 20  # per APPEND frame
    max_push_entries: int = 1024  # per APPEND frame
    push_timeout_ms: int = 1000  # resend from the first unacknowledged index after this
    control_timeout_ms: int = 1000  # COMPARE / TRUNCATE answer wait (DLedger: 3 s)
    commit_push_interval_ms: int = 1000  # idle COMMIT push
    error_backoff_ms: int = 50  # dispatcher pause after a refused COMPARE/TRUNCATE
    # A follower that refuses the same entries again and again (a damaged copy here, or
    # settings that place them elsewhere): the pause doubles from error_backoff_ms to this
    max_refused_append_backoff_ms: int = 5000
    # dispatcher pause after a follower refused an append for its disk (full, failing):
    # it recovers by itself when space returns; until then one retry per pause
    storage_error_backoff_ms: int = 1000
    peer_push_quota_bytes_per_s: int = 0  # flow control for a lagging peer; 0 = off
    peer_push_throttle_entries: int = 1000  # quota applies when the peer lags this much
    # install snapshot: sent in chunks, one chunk in flight per peer
    snapshot_timeout_ms: int = 5000  # resend an unanswered InstallSnapshotRequest after this
    # the data of one InstallSnapshotRequest; keep it below the transport's max frame
    # (64 MiB by default)
    snapshot_chunk_bytes: int = 4 << 20
    # the largest snapshot a leader sends and a follower assembles (in memory, as the
    # application's state is): a larger one is not sent (logged), a claim of one refused
    max_snapshot_bytes: int = 1 << 30
    # follower
    max_follower_pending_pushes: int = 256  # out-of-order APPENDs held per follower
    # ... and the bytes of their entries: a leader at the defaults has at most
    # max_inflight_pushes x max_push_bytes (64 MiB) in flight, so this holds all of it;
    # a frame may carry up to the transport's max frame (64 MiB), so the count alone
    # would let 256 of them hold 16 GiB
    max_follower_pending_bytes: int = 64 << 20
    fast_forward_check_ms: int = 1000  # checkAbnormalFuture period
    # clients (AP-02)
    max_pending_proposals: int = 10000  # LEADER_PENDING_FULL above this (AP-02)
    max_wait_ack_ms: int = 2500  # a proposal not committed by then: unknown outcome
    # leadership transfer
    max_leadership_transfer_wait_index: int = 1000
    leadership_transfer_timeout_ms: int = 1000  # the transferee's; the leader waits 2 x
    # The leader ends a transfer (and takes appends again) when the transferee has not
    # answered for this long (paused, cut off): 2.5 heartbeats, well below the 2 s
    # deadline. A refused or lost connection ends it at once (peer_connection_lost).
    leadership_transfer_silence_ms: int = 500
    # membership: a learner is promoted to voter only this close to the leader's log end
    # (a voter far behind would hold commits back until it caught up)
    max_learner_lag: int = 1000
    # the leader records the first voters' incarnations in the log once it heard them
    # (``membership.sealed``): the broker turns it on; off, a group without membership
    # changes writes no configuration entry at all (the simulator's pinned traces)
    seal_members: bool = False
    preferred_leader_ids: tuple[str, ...] = ()
    preferred_leader_check_ms: int = 1000
    # durability: "sync" = entries and term/vote are synced before any reply leaves
    flush: Literal["async", "sync"] = "sync"

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"{f.name} must not be negative, got {v}")
        if self.heartbeat_interval_ms <= 0 or self.max_heartbeat_leak <= 0:
            raise ValueError("heartbeat_interval_ms and max_heartbeat_leak must be positive")
        if not 0 < self.min_vote_interval_ms <= self.max_vote_interval_ms:
            raise ValueError("need 0 < min_vote_interval_ms <= max_vote_interval_ms")
        if self.taking_leadership_vote_min_ms > self.taking_leadership_vote_max_ms:
            raise ValueError("taking_leadership_vote_min_ms > taking_leadership_vote_max_ms")
        for name in (
            "max_inflight_pushes",
            "max_push_bytes",
            "max_push_entries",
            "snapshot_timeout_ms",
            "snapshot_chunk_bytes",
            "max_snapshot_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.flush not in ("async", "sync"):
            raise ValueError(f"flush must be 'async' or 'sync', not {self.flush!r}")

    @property
    def election_timeout_ms(self) -> int:
        """No heartbeat for this long: the leader is presumed lost."""
        return self.heartbeat_interval_ms * self.max_heartbeat_leak

    @classmethod
    def dledger(cls, **overrides: Any) -> CoreSettings:
        """DLedger's own timing: about 10 s failover in RocketMQ."""
        base = cls(
            heartbeat_interval_ms=2000,
            max_heartbeat_leak=3,
            min_vote_interval_ms=300,
            max_vote_interval_ms=1000,
            vote_response_timeout_ms=2000,
            max_inflight_pushes=1000,
            control_timeout_ms=3000,
            error_backoff_ms=500,
            pre_vote=False,
            early_pre_vote=False,
            flush="async",
        )
        return replace(base, **overrides)
