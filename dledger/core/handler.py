"""``EntryHandler``: the follower's half of replication (DLedger's ``EntryHandler`` inside
``DLedgerEntryPusher``). The leader's half is
``EntryDispatcher`` (``dispatcher``).

The node checks term, leader and role of every push first (``LeaderElector
.check_leader_request``); the handler then applies APPENDs strictly in index order
(holding out-of-order ones, at most ``max_follower_pending_pushes`` of them holding at
most ``max_follower_pending_bytes`` of entries) and answers COMPARE, TRUNCATE, COMMIT and
INSTALL_SNAPSHOT.

Invariants, and the DLedger bugs not copied:
- COMPARE/TRUNCATE answer every APPEND they drop (DLedger's bug lets them time out); a
  fast-forward answer removes the request it answers.
- Nothing at or below the committed index is ever truncated: a correct leader never asks,
  so such a TRUNCATE (or a snapshot that disagrees with a committed entry) is refused and
  logged, never obeyed.
- A TRUNCATE older than a push already taken from this leader is ignored: it crossed a
  reconnect, and its compare is long answered.
- An append is all or nothing (the store's rule); a disk refusal is answered as such
  (DISK_FULL, DISK_ERROR) so the leader backs off instead of comparing again.
- Held APPENDs are bounded in number and in bytes (``held_bytes`` is the sum of their
  entries, kept with every change of ``write_requests``); one over either bound is
  refused with PUSH_REQUEST_IS_FULL, except the next one in line, which is applied at
  once and never held (refusing it would leave the held ones waiting for it).
- A leader that contradicts a committed entry here (a COMPARE that finds another term at
  or below the committed index, a TRUNCATE or snapshot that would drop committed
  entries) is never obeyed, and it is never quiet: ``host.diverged`` records it (an ERROR
  line, ``status()["diverged"]``, the node's readiness and metrics).
- INSTALL_SNAPSHOT: the follower installs unless it already holds ``last_included_index``
  with that term (then it keeps its log, Raft §7); the reset of its log waits until the
  application has the snapshot (``Ready.install_snapshot``), and nothing is answered
  before both.
- A snapshot arrives in chunks: the follower assembles one snapshot at a time (of one
  leader and term, at most ``max_snapshot_bytes``), takes only the bytes that continue
  what it holds, and answers every chunk with what it holds (``received``), so a
  repeated, late or lost chunk never puts a byte in the wrong place. The assembly is
  dropped when the leader pushes anything else, or this node stops following.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..codes import DLedgerCode, DLedgerError
from ..store.entry import ConfigRecord
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
    from ..store.base import LogStore
    from .host import HandlerHost
    from .member_state import MemberState
    from .settings import CoreSettings


class EntryHandler:
    """Follower: apply pushes strictly in index order; answer COMPARE/TRUNCATE/COMMIT."""

    def __init__(
        self, member_state: MemberState, store: LogStore, settings: CoreSettings, host: HandlerHost
    ) -> None:
        self.member_state = member_state
        self.store = store
        self.settings = settings
        self.host = host
        # first_index -> (APPEND, when it arrived); ``held_bytes``: their entries' bytes
        self.write_requests: dict[int, tuple[PushEntryRequest, int]] = {}
        self.held_bytes = 0
        self.last_check_fast_forward_ms = -1
        self.newest: tuple[int, str, int] = (-1, "", -1)  # (term, leader, max req_id seen)
        self.assembly: _Assembly | None = None  # the snapshot arriving in chunks

    def respond(self, req: PushEntryRequest, code: DLedgerCode, **kw: int) -> None:
        member_state, store = self.member_state, self.store
        self.host.send(
            PushEntryResponse(
                group=member_state.group,
                local_id=member_state.self_id,
                remote_id=req.local_id,
                term=member_state.curr_term,
                req_id=req.req_id,
                code=code,
                type=req.type,
                index=req.first_index if req.type is PushType.APPEND else -1,
                count=req.count if req.type is PushType.APPEND else 0,
                begin_index=store.ledger_begin_index,
                end_index=store.ledger_end_index,
                incarnation=member_state.incarnation,
                **kw,
            )
        )

    def clear(self, code: DLedgerCode = DLedgerCode.INCONSISTENT_STATE) -> None:
        """Drop every held APPEND, answering each (the fix of DLedger's bug)."""
        held = sorted(self.write_requests.items())
        self.write_requests.clear()
        self.held_bytes = 0
        for _, (req, _arrived) in held:
            self.respond(req, code)

    def drop_assembly(self) -> None:
        """Forget a snapshot half received (the leader moved on, or we no longer follow)."""
        self.assembly = None

    def handle_push(self, req: PushEntryRequest, now_ms: int) -> None:
        """``handlePush``; the node has checked term, leader and role.

        A TRUNCATE older than a push already taken from this leader is stale (it crossed
        a reconnect or a slow link): its compare is long answered and acting on it could
        drop entries committed since, so it is ignored."""
        term, leader, newest = self.newest
        if (term, leader) != (req.term, req.leader_id):
            newest = -1
        if req.type is PushType.TRUNCATE and req.req_id < newest:
            self.host.log_event("stale_truncate", req_id=req.req_id, newest=newest)
            return
        self.newest = (req.term, req.leader_id, max(newest, req.req_id))
        self.assembly = None
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
        host, store = self.host, self.store
        term, leader, newest = self.newest
        if (term, leader) != (req.term, req.leader_id):
            newest = -1
        self.newest = (req.term, req.leader_id, max(newest, req.req_id))
        self.clear()
        last, total, offset = req.last_included_index, req.total, req.offset
        if (
            last < 0
            or req.next_pos < 0
            or req.last_included_term < 0
            or not 0 <= offset <= offset + len(req.data) <= total
        ):
            self.respond_install(req, DLedgerCode.UNEXPECTED_ARGUMENT)
            return
        if total > self.settings.max_snapshot_bytes:
            host.log_event("install_refused", index=last, bytes=total, reason="too large")
            self.respond_install(req, DLedgerCode.UNEXPECTED_ARGUMENT)
            return
        inst = host.installing
        if inst is not None:
            if last <= inst.last_index:  # true once the install in progress is durable
                self.respond_install(req, DLedgerCode.SUCCESS, inst)
                return
        elif last < store.ledger_begin_index - 1:
            self.respond_install(req, DLedgerCode.SUCCESS)
            return
        elif last <= store.ledger_end_index and store.term_at(last) == req.last_included_term:
            if last > store.committed_index:
                host.commit_to(last)
            self.respond_install(req, DLedgerCode.SUCCESS)
            return
        elif last <= store.committed_index:
            # Our committed entry there has another term: a correct leader never sends
            # this (§5.4); refuse (and log) rather than drop committed entries.
            host.log_event("install_refused", index=last, committed=store.committed_index)
            host.diverged("a snapshot contradicts a committed entry", last, req.term)
            self.respond_install(req, DLedgerCode.INCONSISTENT_STATE)
            return
        data = self._assemble(req)
        if data is None:
            return  # answered: more chunks to come
        config = (
            ConfigRecord(req.config_index, req.config_term, req.config.encode())
            if req.config
            else None
        )
        snap = Snapshot(
            last, req.last_included_term, req.before_begin_chain, req.next_pos, data, config
        )
        host.begin_install(snap)
        self.respond_install(req, DLedgerCode.SUCCESS, snap)

    def _assemble(self, req: InstallSnapshotRequest) -> bytes | None:
        """Add ``req``'s chunk to the snapshot being assembled: its whole data once
        complete, else None after answering how many bytes are held."""
        key = (
            req.term,
            req.leader_id,
            req.last_included_index,
            req.last_included_term,
            req.before_begin_chain,
            req.next_pos,
            req.total,
        )
        if req.offset == 0 and len(req.data) == req.total:
            self.assembly = None
            return req.data  # the whole snapshot in one chunk: no copy
        a = self.assembly
        if a is None or a.key != key:
            if req.offset != 0:
                self.respond_install(req, DLedgerCode.SUCCESS, received=0)  # from the start
                return None
            a = self.assembly = _Assembly(key)
        held = len(a.data)
        if req.offset <= held < req.offset + len(req.data):
            a.data += req.data[held - req.offset :]
        if len(a.data) < req.total:
            self.respond_install(req, DLedgerCode.SUCCESS, received=len(a.data))
            return None
        self.assembly = None
        return bytes(a.data)

    def respond_install(
        self,
        req: InstallSnapshotRequest,
        code: DLedgerCode,
        after: Snapshot | None = None,
        received: int | None = None,
    ) -> None:
        """Answer ``req``; ``after``: the snapshot being installed, whose log range is
        what the answer reports (it is true when the answer leaves); ``received``: the
        bytes of the snapshot held (default: all of it on SUCCESS, none otherwise)."""
        if received is None:
            received = req.total if code is DLedgerCode.SUCCESS else 0
        member_state, store = self.member_state, self.store
        if after is not None:
            begin, end = after.last_index + 1, after.last_index
        else:
            begin, end = store.ledger_begin_index, store.ledger_end_index
        self.host.send(
            InstallSnapshotResponse(
                group=member_state.group,
                local_id=member_state.self_id,
                remote_id=req.local_id,
                term=member_state.curr_term,
                req_id=req.req_id,
                code=code,
                last_included_index=req.last_included_index,
                begin_index=begin,
                end_index=end,
                received=received,
                incarnation=member_state.incarnation,
            )
        )

    def _hold_append(self, req: PushEntryRequest, now_ms: int) -> None:
        if req.count <= 0 or not req.entries:
            self.respond(req, DLedgerCode.UNEXPECTED_ARGUMENT)
            return
        if req.first_index in self.write_requests:
            self.respond(req, DLedgerCode.REPEATED_PUSH)
            return
        s = self.settings
        next_in_line = req.first_index == self.store.ledger_end_index + 1
        if not next_in_line and (
            len(self.write_requests) >= s.max_follower_pending_pushes
            or self.held_bytes + len(req.entries) > s.max_follower_pending_bytes
        ):
            self.respond(req, DLedgerCode.PUSH_REQUEST_IS_FULL)
            return
        self.write_requests[req.first_index] = (req, now_ms)
        self.held_bytes += len(req.entries)
        self.drain(now_ms)

    def _take(self, first_index: int) -> PushEntryRequest | None:
        """Remove the held APPEND at ``first_index`` (None if there is none)."""
        held = self.write_requests.pop(first_index, None)
        if held is None:
            return None
        self.held_bytes -= len(held[0].entries)
        return held[0]

    def drain(self, now_ms: int) -> None:
        """Append every held request that is next in line; answer duplicates at once."""
        store = self.store
        while True:
            end = store.ledger_end_index
            nxt = self._take(end + 1)
            if nxt is not None:
                self._handle_append(nxt)
                continue
            behind = [f for f in self.write_requests if f <= end]
            if not behind:
                break
            for first in sorted(behind):
                req = self._take(first)
                assert req is not None
                self._handle_fall_behind(req)
        self._check_abnormal_future(now_ms)

    def _handle_append(self, req: PushEntryRequest) -> None:
        """``handleDoAppend``: one write of the leader's bytes, then commit."""
        try:
            metas = self.store.append_as_follower(req.entries)
        except DLedgerError as e:
            storage = e.code in (DLedgerCode.DISK_FULL, DLedgerCode.DISK_ERROR)
            event = "append_storage_error" if storage else "append_refused"
            if getattr(e, "damaged", False):  # a store's StoreError(damaged=True)
                event = "append_refused_damaged"  # the leader's bytes fail their own CRC
            self.host.log_event(
                event,
                first=req.first_index,
                code=e.code.name,
                reason=e.message,
            )
            # A disk problem is said as such (the leader backs off); anything else means
            # the leader's view of this log is wrong, so it compares again.
            self.respond(req, e.code if storage else DLedgerCode.INCONSISTENT_STATE)
            return
        self.host.wrote_entries()
        if len(metas) != req.count:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        self.respond(req, DLedgerCode.SUCCESS)
        self._update_commit(req.commit_index)

    def _handle_fall_behind(self, req: PushEntryRequest) -> None:
        """A resend of entries we hold (the ack was lost): SUCCESS if identical."""
        store = self.store
        last = req.first_index + req.count - 1
        if last > store.ledger_end_index or req.first_index < store.ledger_begin_index:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        raw, count, _ = store.read_batch(req.first_index, len(req.entries), req.count)
        same = count == req.count and raw == req.entries
        self.respond(req, DLedgerCode.SUCCESS if same else DLedgerCode.INCONSISTENT_STATE)

    def _check_abnormal_future(self, now_ms: int) -> None:
        """``checkAbnormalFuture``: a request far ahead of our log that has waited
        too long means the leader's view of us is wrong: answer the lowest one with
        INCONSISTENT_STATE so the leader compares again."""
        if not self.write_requests:
            return
        period = self.settings.fast_forward_check_ms
        if now_ms - self.last_check_fast_forward_ms < period:
            return
        self.last_check_fast_forward_ms = now_ms
        first = min(self.write_requests)
        req, arrived_ms = self.write_requests[first]
        if now_ms - arrived_ms >= period:
            self._take(first)
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)

    def _handle_compare(self, req: PushEntryRequest) -> None:
        """``handleDoCompare``, newer, with binary-searched ``x_index``."""
        store = self.store
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
        if pre_index <= store.committed_index:
            self.host.diverged(
                f"the leader has term {pre_term} at a committed entry of term {local_term}",
                pre_index,
                req.term,
            )
        first = store.first_index_of_term(local_term, pre_index)
        if first < 0:  # the before-begin term: nothing of it left to point at
            first = store.ledger_begin_index
        self.respond(req, DLedgerCode.INCONSISTENT_STATE, x_term=local_term, x_index=first)

    def _handle_truncate(self, req: PushEntryRequest) -> None:
        """``handleDoTruncate``. Never at or below the committed index: a leader
        truncates only past a proven match and a committed entry always matches (§5.4),
        so such a request is refused (and logged), never obeyed."""
        store = self.store
        from_index = req.pre_log_index
        if from_index <= store.committed_index:  # a correct leader never sends this
            self.host.log_event(
                "truncate_refused", from_index=from_index, committed=store.committed_index
            )
            self.host.diverged(
                "the leader asks to truncate committed entries", from_index, req.term
            )
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        if from_index <= store.ledger_end_index:
            store.truncate(from_index)
            self.host.wrote_entries()
        if store.ledger_end_index != from_index - 1:
            self.respond(req, DLedgerCode.INCONSISTENT_STATE)
            return
        self.respond(req, DLedgerCode.SUCCESS)
        self._update_commit(req.commit_index)

    def _update_commit(self, leader_commit: int) -> None:
        """Follower commit = min(leader's, our end) (safe because COMPARE and
        TRUNCATE aligned our whole log with this leader's in this term)."""
        if self.member_state.role is not Role.FOLLOWER:
            return
        committed = min(leader_commit, self.store.ledger_end_index)
        if committed > self.store.committed_index:
            self.host.commit_to(committed)


class _Assembly:
    """A snapshot arriving in chunks: which one (``key``), and its first bytes."""

    __slots__ = ("data", "key")

    def __init__(self, key: tuple[int, str, int, int, int, int, int]) -> None:
        self.key = key
        self.data = bytearray()
