"""``EntryDispatcher``: the leader's replication to one follower (DLedger's
``EntryDispatcher`` inside ``DLedgerEntryPusher``). One per peer.

States COMPARE → TRUNCATE → APPEND (+ COMMIT when idle, + INSTALL_SNAPSHOT), the newer
protocol variant: COMPARE carries (pre_log_index, pre_log_term) and backs up by
the follower's (x_term, x_index); TRUNCATE carries only the index; acks are reported to the
``QuorumAckChecker`` (through the host) under the acked entry's term. The follower's
half is ``EntryHandler`` (``handler``).

Invariants, and the DLedger bugs not copied:
- A follower truncates only entries that conflict with the leader: after an
  (x_term, x_index) answer the leader compares next at its *last* entry of x_term when it
  has that term (textbook fast backup), so a TRUNCATE never drops an entry both logs hold
  — DLedger jumps to x_index and may drop committed entries from a replica.
- Every change to COMPARE resets ``write_index`` and the in-flight map, whatever state it
  comes from (DLedger's bug resets only from APPEND).
- ``doCompare`` runs on an empty leader log too, so stale follower entries are truncated
  before the leader's first write (DLedger's bug skips it).
- Batches are bounded by ``max_push_bytes`` and ``max_push_entries`` and really batch
  (DLedger's bug sends every entry alone); at most ``max_inflight_pushes`` per peer.
- A follower that refuses an append for its disk (DISK_FULL, DISK_ERROR) wrote nothing:
  the dispatcher pauses ``storage_error_backoff_ms``, then compares again.
- A follower that holds everything before a batch and still refuses it (INCONSISTENT_STATE
  at ``match_index + 1``) refuses those entries themselves: their bytes (this leader's
  copy is damaged: its CRC fails there) or a setting that places them elsewhere. COMPARE
  and TRUNCATE would match again and the same batch be refused again, round trip after
  round trip: the first refusal compares at once (a push can cross a truncate), every
  further one in a row backs off, ``error_backoff_ms`` doubling up to
  ``max_refused_append_backoff_ms``, and is reported (``append_refused_again``) with the
  first entry of the batch whose copy here is damaged, if one is.

INSTALL_SNAPSHOT (Raft §7):

| From | To | Condition |
|---|---|---|
| COMPARE | INSTALL_SNAPSHOT | ``compare_index < ledger_begin_index - 1`` (the before-begin) |
| APPEND | INSTALL_SNAPSHOT | ``write_index <= ledger_begin_index - 1``, or the entry went missing |
| INSTALL_SNAPSHOT | APPEND | SUCCESS: match = ``last_included_index``, push from the next one |
| any | COMPARE | a store error in the middle of a step (the head moved under us) |

The snapshot goes in chunks of ``snapshot_chunk_bytes``, one InstallSnapshotRequest in
flight per peer, resent after ``snapshot_timeout_ms``; each SUCCESS says how many bytes
the peer holds (``received``) and the next chunk starts there, so a lost, repeated or
late chunk costs a resend, never a wrong byte. A transfer starts with the node's newest
registered snapshot, and only if the leader's log continues right after it
(``last_index >= ledger_begin_index - 1``) and it fits ``max_snapshot_bytes``; otherwise
the peer waits (logged once) for a newer snapshot. It goes on with that snapshot until
done, unless the log head moves past it (then it starts over with the newest).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ..codes import DLedgerCode, DLedgerError
from ..store.entry import last_index_of_term
from .messages import (
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    Role,
)

if TYPE_CHECKING:
    from ..store.base import LogStore
    from .host import DispatcherHost
    from .member_state import MemberState
    from .settings import CoreSettings
    from .snapshot import Snapshot


class DispatcherState(Enum):
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"
    APPEND = "APPEND"
    INSTALL_SNAPSHOT = "INSTALL_SNAPSHOT"  # the log head the peer needs was deleted


@dataclass(slots=True)
class PendingPush:
    first_index: int
    count: int
    last_term: int
    send_ms: int
    req_id: int


@dataclass(slots=True)
class PendingControl:
    req_id: int
    type: PushType
    send_ms: int
    index: int  # COMPARE: compare index; TRUNCATE: truncate-from index
    term: int


class EntryDispatcher:
    """Leader side, one per follower: find the match point, truncate, stream batches."""

    def __init__(
        self,
        peer_id: str,
        member_state: MemberState,
        store: LogStore,
        settings: CoreSettings,
        host: DispatcherHost,
    ) -> None:
        self.peer_id = peer_id
        self.member_state = member_state
        self.store = store
        self.settings = settings
        self.host = host
        self.state = DispatcherState.COMPARE
        self.term = -1
        self.write_index = store.ledger_end_index + 1
        self.match_index = -1
        self.pending: dict[int, PendingPush] = {}  # first_index -> batch in flight
        self.control: PendingControl | None = None
        self.backoff_until_ms = -1
        self.last_push_commit_ms = -1
        self.last_sent_commit_index = -1
        self.quota_second = -1
        self.quota_bytes = 0
        self.snapshot_wait: tuple[str, int] | None = None  # why we cannot send (logged once)
        self.snapshots_sent = 0
        # the snapshot being sent to this peer, and where its next chunk starts (only in
        # INSTALL_SNAPSHOT: every change of state drops it)
        self.sending: Snapshot | None = None
        self.send_offset = 0
        self.peer_storage_refused = False  # its last append failed for its disk
        # APPENDs refused in a row at the match point, and the first index they carried
        self.refused_index = -1
        self.refusals = 0

    def change_state(self, target: DispatcherState) -> None:
        if target is DispatcherState.COMPARE:  # from any state: the fix of DLedger's bug
            self.write_index = self.store.ledger_end_index + 1
            self.pending.clear()
        elif target is DispatcherState.INSTALL_SNAPSHOT:
            self.pending.clear()  # their answers no longer matter
        self.control = None
        self.snapshot_wait = None
        # a transfer is this state's alone: leaving it (an error, a new term) ends it
        self.sending, self.send_offset = None, 0
        self.state = target

    def leadership_lost(self) -> None:
        """This node no longer leads: a snapshot it was sending ends here (its answers
        no longer matter; a new term starts over with COMPARE, ``_fresh``)."""
        self.sending, self.send_offset = None, 0

    def _fresh(self) -> bool:
        """``checkNotLeaderAndFreshState``: a new term starts with COMPARE."""
        member_state = self.member_state
        if member_state.role is not Role.LEADER:
            return False
        if self.term != member_state.curr_term:
            self.term = member_state.curr_term
            self.match_index = -1
            self.backoff_until_ms = -1
            self.refused_index, self.refusals = -1, 0
            self.change_state(DispatcherState.COMPARE)
        return True

    def maintain(self, now_ms: int, *, idle_commit: bool) -> None:
        if not self._fresh() or now_ms < self.backoff_until_ms:
            return
        try:
            if self.state is DispatcherState.COMPARE:
                self._do_compare(now_ms)
            elif self.state is DispatcherState.TRUNCATE:
                self._do_truncate(now_ms)
            elif self.state is DispatcherState.APPEND:
                self._do_append(now_ms, idle_commit=idle_commit)
            else:
                self._do_install(now_ms)
        except DLedgerError as e:
            self._on_store_error(now_ms, e)

    def _on_store_error(self, now_ms: int, e: DLedgerError) -> None:
        """an error in the middle of a step (retention deleted the head between a
        check and a read, on the store's own thread) → COMPARE after a back-off; COMPARE
        goes on to INSTALL_SNAPSHOT if the peer now needs one."""
        self.host.log_event("dispatcher_error", peer=self.peer_id, code=e.code.name)
        self.change_state(DispatcherState.COMPARE)
        self.backoff_until_ms = now_ms + self.settings.error_backoff_ms

    def _enter_install(self, now_ms: int, needed: int) -> None:
        """The peer needs entry ``needed + 1`` or earlier, which we no longer hold."""
        was = self.state
        self.change_state(DispatcherState.INSTALL_SNAPSHOT)
        self.host.log_event(
            "needs_snapshot",
            peer=self.peer_id,
            index=needed,
            state=was.value,
            ledger_begin_index=self.store.ledger_begin_index,
        )
        self._do_install(now_ms)

    def _request(self, type_: PushType, **kw: object) -> PushEntryRequest:
        member_state = self.member_state
        return PushEntryRequest(
            group=member_state.group,
            local_id=member_state.self_id,
            remote_id=self.peer_id,
            term=member_state.curr_term,
            req_id=self.host.next_req_id(),
            leader_id=member_state.self_id,
            type=type_,
            commit_index=member_state.committed_index,
            cluster=member_state.config.cluster,
            leader_addr=member_state.peers.get(member_state.self_id, ""),
            **kw,  # type: ignore[arg-type]
        )

    def _control_busy(self, now_ms: int) -> bool:
        c = self.control
        if c is None:
            return False
        if now_ms - c.send_ms > self.settings.control_timeout_ms:
            self.control = None  # no answer: ask again
            return False
        return True

    # ---- COMPARE ---------------------------------------------------------------

    def _do_compare(self, now_ms: int) -> None:
        if self._control_busy(now_ms):
            return
        store = self.store
        compare_index = self.write_index - 1
        if compare_index < store.ledger_begin_index - 1:  # compareIndex < ledgerBeforeBegin
            self._enter_install(now_ms, compare_index)
            return
        compare_term = store.term_at(compare_index) if compare_index >= 0 else -1
        req = self._request(
            PushType.COMPARE, pre_log_index=compare_index, pre_log_term=compare_term
        )
        self.control = PendingControl(
            req.req_id, PushType.COMPARE, now_ms, compare_index, compare_term
        )
        self.host.send(req)

    def _on_compare(self, c: PendingControl, resp: PushEntryResponse, now_ms: int) -> None:
        if resp.code is DLedgerCode.SUCCESS:
            self.match_index = c.index
            self.host.update_peer_watermark(c.term, self.peer_id, c.index)
            self.change_state(DispatcherState.TRUNCATE)
            self._do_truncate(now_ms)
            return
        if resp.code is not DLedgerCode.INCONSISTENT_STATE:
            self._back_off(now_ms, resp)
            return
        if resp.x_term != -1:
            # textbook fast backup: compare next at our last entry of x_term, if any
            store = self.store
            begin = store.ledger_begin_index
            mine = last_index_of_term(store.term_at, begin, c.index - 1, resp.x_term)
            if mine < 0 and store.ledger_before_begin_term == resp.x_term and c.index >= begin:
                # our last entry of x_term is the one before our log head: compare there
                # rather than at the follower's x_index, below our head (a snapshot loop)
                mine = begin - 1
            nxt = mine + 1 if mine >= 0 else resp.x_index
        else:
            nxt = resp.end_index + 1  # the follower's log is shorter
        self.write_index = max(min(nxt, c.index), 0)  # strictly back, never below 0
        self.control = None
        self._do_compare(now_ms)

    # ---- TRUNCATE ----------------------------------------------------------------

    def _do_truncate(self, now_ms: int) -> None:
        if self._control_busy(now_ms):
            return
        req = self._request(PushType.TRUNCATE, pre_log_index=self.match_index + 1)
        self.control = PendingControl(
            req.req_id, PushType.TRUNCATE, now_ms, self.match_index + 1, -1
        )
        self.host.send(req)

    def _on_truncate(self, c: PendingControl, resp: PushEntryResponse, now_ms: int) -> None:
        if resp.code is not DLedgerCode.SUCCESS:
            self._back_off(now_ms, resp)
            self.change_state(DispatcherState.COMPARE)
            return
        self.change_state(DispatcherState.APPEND)
        self.write_index = self.match_index + 1
        self.last_push_commit_ms = now_ms
        self._do_append(now_ms, idle_commit=False)

    def _back_off(self, now_ms: int, resp: PushEntryResponse) -> None:
        self.control = None
        self.backoff_until_ms = now_ms + self.settings.error_backoff_ms
        self.host.log_event(
            "push_refused", peer=self.peer_id, code=resp.code.name, type=resp.type.name
        )

    # ---- APPEND -----------------------------------------------------------

    def _quota_allows(self, now_ms: int, size: int) -> bool:
        """Flow control for a lagging peer (bytes per second)."""
        s = self.settings
        lag = self.store.ledger_end_index - self.write_index
        if s.peer_push_quota_bytes_per_s <= 0 or lag <= s.peer_push_throttle_entries:
            return True
        second = now_ms // 1000
        if second != self.quota_second:
            self.quota_second, self.quota_bytes = second, 0
        if self.quota_bytes >= s.peer_push_quota_bytes_per_s:
            return False
        self.quota_bytes += size
        return True

    def _do_append(self, now_ms: int, *, idle_commit: bool) -> None:
        s, store = self.settings, self.store
        first_unacked = self.pending.get(self.match_index + 1)
        if first_unacked is not None and now_ms - first_unacked.send_ms > s.push_timeout_ms:
            self.pending.clear()  # go-back-N from the first unacknowledged index
            self.write_index = self.match_index + 1
        end = store.ledger_end_index
        while self.write_index <= end and len(self.pending) < s.max_inflight_pushes:
            if self.write_index < store.ledger_begin_index:  # writeIndex <= ledgerBeforeBegin
                self._enter_install(now_ms, self.write_index - 1)
                return
            try:
                raw, count, last_term = store.read_batch(
                    self.write_index, s.max_push_bytes, s.max_push_entries
                )
            except DLedgerError:
                if self.write_index >= store.ledger_begin_index:
                    raise
                self._enter_install(now_ms, self.write_index - 1)  # deleted under us
                return
            if not self._quota_allows(now_ms, len(raw)):
                break
            req = self._request(
                PushType.APPEND, first_index=self.write_index, count=count, entries=raw
            )
            self.pending[self.write_index] = PendingPush(
                self.write_index, count, last_term, now_ms, req.req_id
            )
            self.host.send(req)
            self.write_index += count
            self.last_push_commit_ms = now_ms
            self.last_sent_commit_index = req.commit_index
        if idle_commit and self.write_index > end and not self.pending:
            committed = self.member_state.committed_index
            if committed > self.last_sent_commit_index or (
                now_ms - self.last_push_commit_ms >= s.commit_push_interval_ms
            ):
                self.host.send(self._request(PushType.COMMIT))  # answer ignored
                self.last_push_commit_ms = now_ms
                self.last_sent_commit_index = committed

    def _on_append(self, resp: PushEntryResponse, now_ms: int) -> None:
        p = self.pending.get(resp.index)
        if p is None or p.req_id != resp.req_id:
            return  # answer to a batch we already gave up on
        if resp.code is DLedgerCode.SUCCESS:
            if self.peer_storage_refused:
                self.peer_storage_refused = False
                self.host.log_event("peer_storage_recovered", peer=self.peer_id)
            if self.refusals > 1:
                self.host.log_event("peer_append_recovered", peer=self.peer_id, index=p.first_index)
            self.refused_index, self.refusals = -1, 0
            del self.pending[resp.index]
            last = p.first_index + p.count - 1
            if last > self.match_index:
                self.match_index = last
                self.host.update_peer_watermark(p.last_term, self.peer_id, last)
            # everything at or below the watermark is acknowledged (newer rule)
            for first in [f for f, q in self.pending.items() if f + q.count - 1 <= last]:
                del self.pending[first]
        elif resp.code is DLedgerCode.INCONSISTENT_STATE:
            self.change_state(DispatcherState.COMPARE)
            if p.first_index == self.match_index + 1:
                self._refused_at_match(p, now_ms)
        elif resp.code in (DLedgerCode.DISK_FULL, DLedgerCode.DISK_ERROR):
            # The follower wrote nothing (its store is all-or-nothing): pause, then
            # COMPARE finds where it stands. Logged once per streak, not once a second.
            if not self.peer_storage_refused:
                self.host.log_event("peer_storage_refused", peer=self.peer_id, code=resp.code.name)
            self.peer_storage_refused = True
            self.change_state(DispatcherState.COMPARE)
            self.backoff_until_ms = now_ms + self.settings.storage_error_backoff_ms
        # any other code: wait for the push timeout and resend

    def _refused_at_match(self, p: PendingPush, now_ms: int) -> None:
        """The follower holds every entry before ``p`` and refused ``p``'s entries (see
        the module docstring): from the second time in a row, back off and say why."""
        if p.first_index == self.refused_index:
            self.refusals += 1
        else:
            self.refused_index, self.refusals = p.first_index, 1
        if self.refusals < 2:
            return  # once may be a push that crossed a truncate: compare at once
        s = self.settings
        backoff_ms = min(
            max(1, s.error_backoff_ms) << min(self.refusals - 2, 30),
            s.max_refused_append_backoff_ms,
        )
        self.backoff_until_ms = now_ms + backoff_ms
        self.host.log_event(
            "append_refused_again",
            peer=self.peer_id,
            index=p.first_index,
            refusals=self.refusals,
            backoff_ms=backoff_ms,
            damaged_here=self._first_damaged(p.first_index, p.count),
        )

    def _first_damaged(self, first: int, count: int) -> int:
        """The first of entries ``first .. first + count - 1`` whose copy in this log
        fails its check (so no follower can take it from here), -1 if none does."""
        for index in range(first, first + count):
            try:
                self.store.get(index)
            except DLedgerError as e:
                if getattr(e, "damaged", False):  # a store's CorruptEntryError
                    return index
                return -1  # gone (retention): nothing to say about its bytes
        return -1

    # ---- INSTALL_SNAPSHOT (Raft §7) -------------------------------------------------

    def _snapshot_problem(self) -> tuple[str, int] | None:
        """Why the newest snapshot cannot be sent now, or None if it can."""
        snap = self.host.snapshot
        if snap is None:
            return ("no snapshot registered", -1)
        if snap.last_index < self.store.ledger_begin_index - 1:
            return ("snapshot older than the log head", snap.last_index)
        if len(snap.data) > self.settings.max_snapshot_bytes:
            return ("snapshot over max_snapshot_bytes", snap.last_index)
        return None

    def _do_install(self, now_ms: int) -> None:
        host, s = self.host, self.settings
        c = self.control
        if c is not None:
            if now_ms - c.send_ms <= s.snapshot_timeout_ms:
                return  # one in flight
            self.control = None  # no answer: send again
        snap = self.sending
        if snap is None or snap.last_index < self.store.ledger_begin_index - 1:
            problem = self._snapshot_problem()
            if problem is not None:
                if self.snapshot_wait != problem:
                    self.snapshot_wait = problem
                    newest = host.snapshot
                    host.log_event(
                        "snapshot_unavailable",
                        peer=self.peer_id,
                        reason=problem[0],
                        snapshot_index=problem[1],
                        snapshot_bytes=len(newest.data) if newest is not None else 0,
                        ledger_begin_index=self.store.ledger_begin_index,
                    )
                return
            snap = host.snapshot
            assert snap is not None
            self.sending, self.send_offset = snap, 0
            self.snapshot_wait = None
            self.snapshots_sent += 1
            host.log_event(
                "install_snapshot_sent",
                peer=self.peer_id,
                index=snap.last_index,
                bytes=len(snap.data),
                chunk_bytes=s.snapshot_chunk_bytes,
            )
        offset = self.send_offset
        member_state = self.member_state
        req = InstallSnapshotRequest(
            group=member_state.group,
            local_id=member_state.self_id,
            remote_id=self.peer_id,
            term=member_state.curr_term,
            req_id=host.next_req_id(),
            leader_id=member_state.self_id,
            last_included_index=snap.last_index,
            last_included_term=snap.last_term,
            before_begin_chain=snap.last_chain,
            next_pos=snap.next_pos,
            commit_index=member_state.committed_index,
            offset=offset,
            total=len(snap.data),
            config_index=snap.config.index if snap.config else -1,
            config_term=snap.config.term if snap.config else 0,
            config=snap.config.body.decode() if snap.config else "",
            cluster=member_state.config.cluster,
            leader_addr=member_state.peers.get(member_state.self_id, ""),
            data=snap.data[offset : offset + s.snapshot_chunk_bytes],
        )
        self.control = PendingControl(
            req.req_id, PushType.INSTALL_SNAPSHOT, now_ms, snap.last_index, snap.last_term
        )
        host.send(req)

    def on_install_response(self, resp: InstallSnapshotResponse, now_ms: int) -> None:
        if not self._fresh() or resp.term != self.term:
            return
        c = self.control
        snap = self.sending
        if (
            self.state is not DispatcherState.INSTALL_SNAPSHOT
            or c is None
            or snap is None
            or c.req_id != resp.req_id
            or c.type is not PushType.INSTALL_SNAPSHOT
        ):
            return  # an answer we gave up on
        self.control = None
        if resp.code is not DLedgerCode.SUCCESS:
            self.sending, self.send_offset = None, 0
            self.backoff_until_ms = now_ms + self.settings.error_backoff_ms
            self.host.log_event("install_snapshot_refused", peer=self.peer_id, code=resp.code.name)
            return
        if resp.received < len(snap.data):
            # the peer holds the first ``received`` bytes: the next chunk starts there
            self.send_offset = max(0, resp.received)
            self._do_install(now_ms)
            return
        if c.index > self.match_index:
            self.match_index = c.index
            self.host.update_peer_watermark(c.term, self.peer_id, c.index)
        self.change_state(DispatcherState.APPEND)
        self.write_index = c.index + 1
        self.last_push_commit_ms = now_ms
        self.host.log_event("install_snapshot_done", peer=self.peer_id, index=c.index)
        try:
            self._do_append(now_ms, idle_commit=False)
        except DLedgerError as e:
            self._on_store_error(now_ms, e)

    def on_response(self, resp: PushEntryResponse, now_ms: int) -> None:
        try:
            self._on_response(resp, now_ms)
        except DLedgerError as e:
            self._on_store_error(now_ms, e)

    def _on_response(self, resp: PushEntryResponse, now_ms: int) -> None:
        if not self._fresh() or resp.term != self.term:
            return  # not leading, or an answer from an earlier term
        if resp.type is PushType.APPEND:
            if self.state is DispatcherState.APPEND:
                self._on_append(resp, now_ms)
            return
        c = self.control
        if c is None or c.req_id != resp.req_id or c.type is not resp.type:
            return
        self.control = None
        if resp.type is PushType.COMPARE and self.state is DispatcherState.COMPARE:
            self._on_compare(c, resp, now_ms)
        elif resp.type is PushType.TRUNCATE and self.state is DispatcherState.TRUNCATE:
            self._on_truncate(c, resp, now_ms)
