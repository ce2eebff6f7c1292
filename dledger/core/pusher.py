"""Replication: ``EntryDispatcher`` (leader, one per peer), ``EntryHandler`` (follower)
and ``QuorumAckChecker`` (leader) — DLedger's ``DLedgerEntryPusher`` (CHECKLIST §4).

Dispatcher states COMPARE → TRUNCATE → APPEND (+ COMMIT when idle, + INSTALL_SNAPSHOT),
the newer protocol variant (RP-23 a): COMPARE carries (pre_log_index, pre_log_term) and
backs up by the follower's (x_term, x_index); TRUNCATE carries only the index; follower
acks are filed under the acked entry's term, and only the current term's watermarks can
commit (CV-20).

Invariants and the seed bugs not copied:
- A follower truncates only entries that conflict with the leader: after an
  (x_term, x_index) answer the leader compares next at its *last* entry of x_term when it
  has that term (textbook fast backup), so a TRUNCATE never drops an entry both logs hold
  — DLedger jumps to x_index and may drop committed entries from a replica.
- Every change to COMPARE resets ``write_index`` and the in-flight map, whatever state it
  comes from (the CV-36 bug resets only from APPEND).
- ``doCompare`` runs on an empty leader log too, so stale follower entries are truncated
  before the leader's first write (the CV-41 bug skips it).
- Batches are bounded by ``max_push_bytes`` and ``max_push_entries`` and really batch
  (the CV-35 bug sends every entry alone); at most ``max_inflight_pushes`` per peer.
- COMPARE/TRUNCATE on a follower answers every APPEND it drops (the CV-37 bug lets them
  time out); a fast-forward answer removes the request it answers (CV-40).
- Commit: only an index whose entry has the current term (Raft §5.4.2), checked
  explicitly as well as by the per-term watermarks.

INSTALL_SNAPSHOT (RP-42, Raft §7; the seeds show only the triggers):

| From | To | Condition |
|---|---|---|
| COMPARE | INSTALL_SNAPSHOT | ``compare_index < ledger_begin_index - 1`` (the before-begin) |
| APPEND | INSTALL_SNAPSHOT | ``write_index <= ledger_begin_index - 1``, or the entry went missing |
| INSTALL_SNAPSHOT | APPEND | SUCCESS: match = ``last_included_index``, push from the next one |
| any | COMPARE | a store error in the middle of a step (RP-10: the head moved under us) |

One InstallSnapshotRequest in flight per peer, resent after ``snapshot_timeout_ms``. The
snapshot sent is the node's newest registered one, and only if the leader's log continues
right after it (``last_index >= ledger_begin_index - 1``) and it fits
``max_snapshot_bytes``; otherwise the peer waits (logged once) for a newer snapshot.
The follower installs unless it already holds ``last_included_index`` with that term (then
it keeps its log, Raft §7); the reset of its log waits until the application has the
snapshot (``Ready.install_snapshot``), and nothing is answered before both.
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
from .snapshot import Snapshot

if TYPE_CHECKING:
    from .node import DLedgerCore


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

    def __init__(self, node: DLedgerCore, peer_id: str) -> None:
        self.node = node
        self.peer_id = peer_id
        self.state = DispatcherState.COMPARE
        self.term = -1
        self.write_index = node.store.ledger_end_index + 1
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
        self.peer_storage_refused = False  # its last append failed for its disk

    def change_state(self, target: DispatcherState) -> None:
        if target is DispatcherState.COMPARE:  # from any state: the CV-36 fix
            self.write_index = self.node.store.ledger_end_index + 1
            self.pending.clear()
        elif target is DispatcherState.INSTALL_SNAPSHOT:
            self.pending.clear()  # their answers no longer matter
        self.control = None
        self.snapshot_wait = None
        self.state = target

    def _fresh(self) -> bool:
        """``checkNotLeaderAndFreshState`` (RP-11): a new term starts with COMPARE."""
        ms = self.node.ms
        if ms.role is not Role.LEADER:
            return False
        if self.term != ms.curr_term:
            self.term = ms.curr_term
            self.match_index = -1
            self.backoff_until_ms = -1
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
        """RP-10: an error in the middle of a step (retention deleted the head between a
        check and a read, on the store's own thread) → COMPARE after a back-off; COMPARE
        goes on to INSTALL_SNAPSHOT if the peer now needs one."""
        self.node.log_event("dispatcher_error", peer=self.peer_id, code=e.code.name)
        self.change_state(DispatcherState.COMPARE)
        self.backoff_until_ms = now_ms + self.node.settings.error_backoff_ms

    def _enter_install(self, now_ms: int, needed: int) -> None:
        """The peer needs entry ``needed + 1`` or earlier, which we no longer hold."""
        was = self.state
        self.change_state(DispatcherState.INSTALL_SNAPSHOT)
        self.node.log_event(
            "needs_snapshot",
            peer=self.peer_id,
            index=needed,
            state=was.value,
            ledger_begin_index=self.node.store.ledger_begin_index,
        )
        self._do_install(now_ms)

    def _request(self, type_: PushType, **kw: object) -> PushEntryRequest:
        ms = self.node.ms
        return PushEntryRequest(
            group=ms.group,
            local_id=ms.self_id,
            remote_id=self.peer_id,
            term=ms.curr_term,
            req_id=self.node.next_req_id(),
            leader_id=ms.self_id,
            type=type_,
            commit_index=ms.committed_index,
            **kw,  # type: ignore[arg-type]
        )

    def _control_busy(self, now_ms: int) -> bool:
        c = self.control
        if c is None:
            return False
        if now_ms - c.send_ms > self.node.settings.control_timeout_ms:
            self.control = None  # no answer: ask again
            return False
        return True

    # ---- COMPARE (RP-14) ---------------------------------------------------------------

    def _do_compare(self, now_ms: int) -> None:
        if self._control_busy(now_ms):
            return
        store = self.node.store
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
        self.node.send(req)

    def _on_compare(self, c: PendingControl, resp: PushEntryResponse, now_ms: int) -> None:
        node = self.node
        if resp.code is DLedgerCode.SUCCESS:
            self.match_index = c.index
            node.checker.update_peer_watermark(c.term, self.peer_id, c.index)
            self.change_state(DispatcherState.TRUNCATE)
            self._do_truncate(now_ms)
            return
        if resp.code is not DLedgerCode.INCONSISTENT_STATE:
            self._back_off(now_ms, resp)
            return
        if resp.x_term != -1:
            # textbook fast backup: compare next at our last entry of x_term, if any
            store = node.store
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

    # ---- TRUNCATE (RP-17) ----------------------------------------------------------------

    def _do_truncate(self, now_ms: int) -> None:
        if self._control_busy(now_ms):
            return
        req = self._request(PushType.TRUNCATE, pre_log_index=self.match_index + 1)
        self.control = PendingControl(
            req.req_id, PushType.TRUNCATE, now_ms, self.match_index + 1, -1
        )
        self.node.send(req)

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
        self.backoff_until_ms = now_ms + self.node.settings.error_backoff_ms
        self.node.log_event(
            "push_refused", peer=self.peer_id, code=resp.code.name, type=resp.type.name
        )

    # ---- APPEND (RP-20 .. RP-28) -----------------------------------------------------------

    def _quota_allows(self, now_ms: int, size: int) -> bool:
        """Flow control for a lagging peer (RP-24; bytes per second, CV-34)."""
        s = self.node.settings
        lag = self.node.store.ledger_end_index - self.write_index
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
        node, s = self.node, self.node.settings
        store = node.store
        first_unacked = self.pending.get(self.match_index + 1)
        if first_unacked is not None and now_ms - first_unacked.send_ms > s.push_timeout_ms:
            self.pending.clear()  # go-back-N from the first unacknowledged index (RP-26)
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
            node.send(req)
            self.write_index += count
            self.last_push_commit_ms = now_ms
            self.last_sent_commit_index = req.commit_index
        if idle_commit and self.write_index > end and not self.pending:
            committed = node.ms.committed_index
            if committed > self.last_sent_commit_index or (
                now_ms - self.last_push_commit_ms >= s.commit_push_interval_ms
            ):
                node.send(self._request(PushType.COMMIT))  # answer ignored (RP-28)
                self.last_push_commit_ms = now_ms
                self.last_sent_commit_index = committed

    def _on_append(self, resp: PushEntryResponse, now_ms: int) -> None:
        p = self.pending.get(resp.index)
        if p is None or p.req_id != resp.req_id:
            return  # answer to a batch we already gave up on
        if resp.code is DLedgerCode.SUCCESS:
            if self.peer_storage_refused:
                self.peer_storage_refused = False
                self.node.log_event("peer_storage_recovered", peer=self.peer_id)
            del self.pending[resp.index]
            last = p.first_index + p.count - 1
            if last > self.match_index:
                self.match_index = last
                self.node.checker.update_peer_watermark(p.last_term, self.peer_id, last)
            # everything at or below the watermark is acknowledged (CV-39, newer rule)
            for first in [f for f, q in self.pending.items() if f + q.count - 1 <= last]:
                del self.pending[first]
        elif resp.code is DLedgerCode.INCONSISTENT_STATE:
            self.change_state(DispatcherState.COMPARE)
        elif resp.code in (DLedgerCode.DISK_FULL, DLedgerCode.DISK_ERROR):
            # The follower wrote nothing (its store is all-or-nothing): pause, then
            # COMPARE finds where it stands. Logged once per streak, not once a second.
            if not self.peer_storage_refused:
                self.node.log_event("peer_storage_refused", peer=self.peer_id, code=resp.code.name)
            self.peer_storage_refused = True
            self.change_state(DispatcherState.COMPARE)
            self.backoff_until_ms = now_ms + self.node.settings.storage_error_backoff_ms
        # any other code: wait for the push timeout and resend (RP-22)

    # ---- INSTALL_SNAPSHOT (RP-42, Raft §7) -------------------------------------------------

    def _snapshot_problem(self) -> tuple[str, int] | None:
        """Why the newest snapshot cannot be sent now, or None if it can."""
        node = self.node
        snap = node.snapshot
        if snap is None:
            return ("no snapshot registered", -1)
        if snap.last_index < node.store.ledger_begin_index - 1:
            return ("snapshot older than the log head", snap.last_index)
        if len(snap.data) > node.settings.max_snapshot_bytes:
            return ("snapshot over max_snapshot_bytes", snap.last_index)
        return None

    def _do_install(self, now_ms: int) -> None:
        node, s = self.node, self.node.settings
        c = self.control
        if c is not None:
            if now_ms - c.send_ms <= s.snapshot_timeout_ms:
                return  # one in flight
            self.control = None  # no answer: send again
        problem = self._snapshot_problem()
        if problem is not None:
            if self.snapshot_wait != problem:
                self.snapshot_wait = problem
                snap = node.snapshot
                node.log_event(
                    "snapshot_unavailable",
                    peer=self.peer_id,
                    reason=problem[0],
                    snapshot_index=problem[1],
                    snapshot_bytes=len(snap.data) if snap is not None else 0,
                    ledger_begin_index=node.store.ledger_begin_index,
                )
            return
        snap = node.snapshot
        assert snap is not None
        ms = node.ms
        req = InstallSnapshotRequest(
            group=ms.group,
            local_id=ms.self_id,
            remote_id=self.peer_id,
            term=ms.curr_term,
            req_id=node.next_req_id(),
            leader_id=ms.self_id,
            last_included_index=snap.last_index,
            last_included_term=snap.last_term,
            before_begin_chain=snap.last_chain,
            next_pos=snap.next_pos,
            commit_index=ms.committed_index,
            data=snap.data,
        )
        self.control = PendingControl(
            req.req_id, PushType.INSTALL_SNAPSHOT, now_ms, snap.last_index, snap.last_term
        )
        self.snapshot_wait = None
        self.snapshots_sent += 1
        node.snapshot_stats["sent"] += 1
        node.log_event(
            "install_snapshot_sent", peer=self.peer_id, index=snap.last_index, bytes=len(snap.data)
        )
        node.send(req)

    def on_install_response(self, resp: InstallSnapshotResponse, now_ms: int) -> None:
        if not self._fresh() or resp.term != self.term:
            return
        c = self.control
        if (
            self.state is not DispatcherState.INSTALL_SNAPSHOT
            or c is None
            or c.req_id != resp.req_id
            or c.type is not PushType.INSTALL_SNAPSHOT
        ):
            return  # an answer we gave up on
        self.control = None
        if resp.code is not DLedgerCode.SUCCESS:
            self.backoff_until_ms = now_ms + self.node.settings.error_backoff_ms
            self.node.log_event("install_snapshot_refused", peer=self.peer_id, code=resp.code.name)
            return
        if c.index > self.match_index:
            self.match_index = c.index
            self.node.checker.update_peer_watermark(c.term, self.peer_id, c.index)
        self.change_state(DispatcherState.APPEND)
        self.write_index = c.index + 1
        self.last_push_commit_ms = now_ms
        self.node.log_event("install_snapshot_done", peer=self.peer_id, index=c.index)
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


class QuorumAckChecker:
    """Leader: the highest index a majority holds, per term; commits it (RP-37, CV-20)."""

    def __init__(self, node: DLedgerCore) -> None:
        self.node = node
        self.peer_watermarks_by_term: dict[int, dict[str, int]] = {}

    def update_peer_watermark(self, term: int, peer: str, index: int) -> None:
        marks = self.peer_watermarks_by_term.get(term)
        if marks is None:
            marks = self.peer_watermarks_by_term[term] = dict.fromkeys(self.node.ms.peer_ids, -1)
        marks[peer] = max(marks[peer], index)

    def watermark(self, peer: str) -> int:
        marks = self.peer_watermarks_by_term.get(self.node.ms.curr_term, {})
        return marks.get(peer, -1)

    def check(self) -> None:
        node = self.node
        ms, store = node.ms, node.store
        if ms.role is not Role.LEADER:
            return
        term = ms.curr_term
        for old in [t for t in self.peer_watermarks_by_term if t != term]:
            del self.peer_watermarks_by_term[old]
        own = store.ledger_end_index
        if node.settings.flush == "sync":
            own = min(own, node.synced_index)  # count ourselves only for synced entries
        self.update_peer_watermark(term, ms.self_id, own)
        marks = sorted(self.peer_watermarks_by_term[term].values(), reverse=True)
        quorum_index = marks[len(marks) // 2]
        if quorum_index <= store.committed_index:
            return
        if store.term_at(quorum_index) != term:  # Raft §5.4.2, explicitly
            return
        node.commit_to(quorum_index)


class EntryHandler:
    """Follower: apply pushes strictly in index order; answer COMPARE/TRUNCATE/COMMIT."""

    def __init__(self, node: DLedgerCore) -> None:
        self.node = node
        # first_index -> (APPEND, when it arrived)
        self.write_requests: dict[int, tuple[PushEntryRequest, int]] = {}
        self.last_check_fast_forward_ms = -1
        self.newest: tuple[int, str, int] = (-1, "", -1)  # (term, leader, max req_id seen)

    def respond(self, req: PushEntryRequest, code: DLedgerCode, **kw: int) -> None:
        node = self.node
        ms, store = node.ms, node.store
        node.send(
            PushEntryResponse(
                group=ms.group,
                local_id=ms.self_id,
                remote_id=req.local_id,
                term=ms.curr_term,
                req_id=req.req_id,
                code=code,
                type=req.type,
                index=req.first_index if req.type is PushType.APPEND else -1,
                count=req.count if req.type is PushType.APPEND else 0,
                begin_index=store.ledger_begin_index,
                end_index=store.ledger_end_index,
                **kw,
            )
        )

    def clear(self, code: DLedgerCode = DLedgerCode.INCONSISTENT_STATE) -> None:
        """Drop every held APPEND, answering each (the CV-37 fix)."""
        held = sorted(self.write_requests.items())
        self.write_requests.clear()
        for _, (req, _arrived) in held:
            self.respond(req, code)

    def handle_push(self, req: PushEntryRequest, now_ms: int) -> None:
        """``handlePush`` (RP-30); the node has checked term, leader and role.

        A TRUNCATE older than a push already taken from this leader is stale (it crossed
        a reconnect or a slow link): its compare is long answered and acting on it could
        drop entries committed since, so it is ignored."""
        term, leader, newest = self.newest
        if (term, leader) != (req.term, req.leader_id):
            newest = -1
        if req.type is PushType.TRUNCATE and req.req_id < newest:
            self.node.log_event("stale_truncate", req_id=req.req_id, newest=newest)
            return
        self.newest = (req.term, req.leader_id, max(newest, req.req_id))
        if req.type is PushType.APPEND:
            self._hold_append(req, now_ms)
        elif req.type is PushType.COMMIT:
            self._update_commit(req.commit_index)
            self.respond(req, DLedgerCode.SUCCESS)
        elif req.type is PushType.COMPARE:
            self.clear()
            self._handle_compare(req)
        elif req.type is PushType.TRUNCATE:
            self.clear()
            self._handle_truncate(req)
        else:
            self.respond(req, DLedgerCode.UNEXPECTED_ARGUMENT)

    def handle_install(self, req: InstallSnapshotRequest) -> None:
        """The follower's half of INSTALL_SNAPSHOT (Raft §7); the node has checked term,
        leader and role. Answers SUCCESS when, once this node's Ready is handled, it holds
        everything up to ``last_included_index``:

        - it holds a newer state already (its log begins after the snapshot): no change;
        - it holds the snapshot's last entry with the same term: it keeps its log, whose
          entries up to there are committed (§7: "retain log entries following it");
        - otherwise the application gets the snapshot (``Ready.install_snapshot``) and the
          log restarts right after it, at the leader's position; the answer leaves after
          both are durable (the Ready order)."""
        node = self.node
        store = node.store
        term, leader, newest = self.newest
        if (term, leader) != (req.term, req.leader_id):
            newest = -1
        self.newest = (req.term, req.leader_id, max(newest, req.req_id))
        self.clear()
        last = req.last_included_index
        if last < 0 or req.next_pos < 0 or req.last_included_term < 0:
            self.respond_install(req, DLedgerCode.UNEXPECTED_ARGUMENT)
            return
        inst = node.installing
        if inst is not None:
            if last <= inst.last_index:  # true once the install in progress is durable
                self.respond_install(req, DLedgerCode.SUCCESS, inst)
                return
        elif last < store.ledger_begin_index - 1:
            self.respond_install(req, DLedgerCode.SUCCESS)
            return
        elif last <= store.ledger_end_index and store.term_at(last) == req.last_included_term:
            if last > store.committed_index:
                node.commit_to(last)
            self.respond_install(req, DLedgerCode.SUCCESS)
            return
        elif last <= store.committed_index:
            # Our committed entry there has another term: a correct leader never sends
            # this (§5.4); refuse (and log) rather than drop committed entries.
            node.log_event("install_refused", index=last, committed=store.committed_index)
            self.respond_install(req, DLedgerCode.INCONSISTENT_STATE)
            return
        snap = Snapshot(
            last, req.last_included_term, req.before_begin_chain, req.next_pos, req.data
        )
        node.begin_install(snap)
        self.respond_install(req, DLedgerCode.SUCCESS, snap)

    def respond_install(
        self, req: InstallSnapshotRequest, code: DLedgerCode, after: Snapshot | None = None
    ) -> None:
        """Answer ``req``; ``after``: the snapshot being installed, whose log range is
        what the answer reports (it is true when the answer leaves)."""
        node = self.node
        ms, store = node.ms, node.store
        if after is not None:
            begin, end = after.last_index + 1, after.last_index
        else:
            begin, end = store.ledger_begin_index, store.ledger_end_index
        node.send(
            InstallSnapshotResponse(
                group=ms.group,
                local_id=ms.self_id,
                remote_id=req.local_id,
                term=ms.curr_term,
                req_id=req.req_id,
                code=code,
                last_included_index=req.last_included_index,
                begin_index=begin,
                end_index=end,
            )
        )

    def _hold_append(self, req: PushEntryRequest, now_ms: int) -> None:
        if req.count <= 0 or not req.entries:
            self.respond(req, DLedgerCode.UNEXPECTED_ARGUMENT)
            return
        if req.first_index in self.write_requests:
            self.respond(req, DLedgerCode.REPEATED_PUSH)
            return
        if len(self.write_requests) >= self.node.settings.max_follower_pending_pushes:
            self.respond(req, DLedgerCode.PUSH_REQUEST_IS_FULL)
            return
        self.write_requests[req.first_index] = (req, now_ms)
        self.drain(now_ms)

    def drain(self, now_ms: int) -> None:
        """Append every held request that is next in line; answer duplicates at once."""
        store = self.node.store
        while True:
            end = store.ledger_end_index
            held = self.write_requests.pop(end + 1, None)
            if held is not None:
                self._handle_append(held[0])
                continue
            behind = [f for f in self.write_requests if f <= end]
            if not behind:
                break
            for first in sorted(behind):
                self._handle_fall_behind(self.write_requests.pop(first)[0])
        self._check_abnormal_future(now_ms)

    def _handle_append(self, req: PushEntryRequest) -> None:
        """``handleDoAppend`` (RP-32): one write of the leader's bytes, then commit."""
        try:
            metas = self.node.store.append_as_follower(req.entries)
        except DLedgerError as e:
            storage = e.code in (DLedgerCode.DISK_FULL, DLedgerCode.DISK_ERROR)
            self.node.log_event(
                "append_storage_error" if storage else "append_refused",
                first=req.first_index,
                code=e.code.name,
                reason=e.message,
            )
            # A disk problem is said as such (the leader backs off); anything else means
            # the leader's view of this log is wrong, so it compares again.
            self.respond(req, e.code if storage else DLedgerCode.INCONSISTENT_STATE)
            return
        self.node.wrote_entries()
        if len(metas) != req.count:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        self.respond(req, DLedgerCode.SUCCESS)
        self._update_commit(req.commit_index)

    def _handle_fall_behind(self, req: PushEntryRequest) -> None:
        """A resend of entries we hold (the ack was lost, RP-35): SUCCESS if identical."""
        store = self.node.store
        last = req.first_index + req.count - 1
        if last > store.ledger_end_index or req.first_index < store.ledger_begin_index:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        raw, count, _ = store.read_batch(req.first_index, len(req.entries), req.count)
        same = count == req.count and raw == req.entries
        self.respond(req, DLedgerCode.SUCCESS if same else DLedgerCode.INCONSISTENT_STATE)

    def _check_abnormal_future(self, now_ms: int) -> None:
        """``checkAbnormalFuture`` (RP-34): a request far ahead of our log that has waited
        too long means the leader's view of us is wrong: answer the lowest one with
        INCONSISTENT_STATE so the leader compares again (CV-05)."""
        if not self.write_requests:
            return
        period = self.node.settings.fast_forward_check_ms
        if now_ms - self.last_check_fast_forward_ms < period:
            return
        self.last_check_fast_forward_ms = now_ms
        first = min(self.write_requests)
        req, arrived_ms = self.write_requests[first]
        if now_ms - arrived_ms >= period:
            del self.write_requests[first]
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)

    def _handle_compare(self, req: PushEntryRequest) -> None:
        """``handleDoCompare``, newer (RP-15), with binary-searched ``x_index``."""
        node = self.node
        store = node.store
        pre_index, pre_term = req.pre_log_index, req.pre_log_term
        if pre_index == -1 and pre_term == -1:
            self.respond(req, DLedgerCode.SUCCESS)
            return
        if store.ledger_end_index < pre_index:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        if pre_index < store.ledger_begin_index - 1:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        local_term = store.term_at(pre_index)
        if local_term == pre_term:
            self.respond(req, DLedgerCode.SUCCESS)
            return
        first = store.first_index_of_term(local_term, pre_index)
        if first < 0:  # the before-begin term: nothing of it left to point at
            first = store.ledger_begin_index
        self.respond(req, DLedgerCode.INCONSISTENT_STATE, x_term=local_term, x_index=first)

    def _handle_truncate(self, req: PushEntryRequest) -> None:
        """``handleDoTruncate`` (RP-18). Never at or below the committed index: a leader
        truncates only past a proven match and a committed entry always matches (§5.4),
        so such a request is refused (and logged), never obeyed."""
        store = self.node.store
        from_index = req.pre_log_index
        if from_index <= store.committed_index:  # a correct leader never sends this
            self.node.log_event(
                "truncate_refused", from_index=from_index, committed=store.committed_index
            )
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        if from_index <= store.ledger_end_index:
            store.truncate(from_index)
            self.node.wrote_entries()
        if store.ledger_end_index != from_index - 1:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        self.respond(req, DLedgerCode.SUCCESS)
        self._update_commit(req.commit_index)

    def _update_commit(self, leader_commit: int) -> None:
        """Follower commit = min(leader's, our end) (CV-18: safe because COMPARE and
        TRUNCATE aligned our whole log with this leader's in this term)."""
        node = self.node
        if node.ms.role is not Role.FOLLOWER:
            return
        committed = min(leader_commit, node.store.ledger_end_index)
        if committed > node.store.committed_index:
            node.commit_to(committed)
