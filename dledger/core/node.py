"""``DLedgerCore``: the whole protocol of one node as a synchronous object (the shape of
etcd-io/raft's ``RawNode``; docs/architecture.md).

Inputs: ``tick(now_ms)``, ``step(message, now_ms)``, ``propose(bodies, now_ms)``,
``transfer_leadership(to, now_ms)``, ``peer_connection_lost(peer_id, now_ms)`` (the
runtime's transport saw a connection to or from a peer end; issue 18). Output:
``ready()`` drains a :class:`Ready`, which the caller handles in this order, always:

1. persist ``hard_state`` (term and vote) and, when ``must_sync``, sync the log;
2. send ``messages``;
3. apply up to ``committed_index``;
4. deliver ``proposals``, ``transfers`` and ``role_changes``.

A Ready with ``install_snapshot`` (a follower behind the leader's log head, Raft §7) adds
to step 1, in this order: the application installs the snapshot's data durably, then the
log restarts right after it (``store.reset``), then ``on_snapshot_installed``. A crash in
between leaves the application ahead of the log, never behind it: the application skips
committed entries its snapshot covers. ``persist_ready``/``deliver_ready`` in
``dledger.runtime.ready`` do exactly this.

The store is a collaborator, as in hashicorp/raft: the core writes entries into it
(leader appends run the append hooks there, followers write the leader's bytes as they
are) and the store puts them in the page cache; step 1 makes them durable before any
ack leaves. Time enters only as ``now_ms``, randomness only through ``rng``; there is no
I/O, clock, thread or socket here (a test checks the imports), so one seed replays one
run exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..codes import DLedgerCode, DLedgerError
from ..store.entry import MAGIC_CONFIG, MAGIC_NOOP
from .dispatcher import EntryDispatcher
from .elector import LeaderElector
from .handler import EntryHandler
from .member_state import HardState, MemberState
from .membership import Configuration, MembershipChange, check_change, sealed
from .messages import (
    MAX_TERM,
    HeartBeatRequest,
    HeartBeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    PushEntryRequest,
    PushEntryResponse,
    RaftMessage,
    Role,
    VoteRequest,
    VoteResponse,
)
from .quorum import QuorumAckChecker
from .settings import CoreSettings
from .snapshot import Snapshot, snapshot_of

if TYPE_CHECKING:
    import random

    from ..store.base import LogStore

EventLog = Callable[[str, dict[str, Any]], None]
_LEADER_FRAMES = (HeartBeatRequest, PushEntryRequest, InstallSnapshotRequest)
STALE_IDENTITY_TODO = (
    "its data directory is not the member's (lost or replaced), so it neither votes nor"
    " counts for commits: remove the member and add the node back as a new one"
    " (`ledgermq cluster replace`)"
)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A leader append: ``positions[i]`` is the pos of body i, at index first_index + i."""

    proposal_id: int
    term: int
    first_index: int
    positions: tuple[int, ...]

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.positions) - 1


@dataclass(frozen=True, slots=True)
class ProposalDone:
    """SUCCESS once committed; TERM_CHANGED or WAIT_QUORUM_ACK_TIMEOUT: outcome unknown."""

    proposal: Proposal
    code: DLedgerCode


@dataclass(frozen=True, slots=True)
class TransferDone:
    """A transfer's outcome: SUCCESS once the transferee leads; otherwise this node
    still leads and takes appends again, and ``reason`` says what went wrong."""

    transfer_id: int
    code: DLedgerCode
    reason: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class RoleChange:
    term: int
    role: Role
    leader_id: str | None


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None
    must_sync: bool = False
    messages: list[RaftMessage] = field(default_factory=list)
    committed_index: int | None = None
    proposals: list[ProposalDone] = field(default_factory=list)
    transfers: list[TransferDone] = field(default_factory=list)
    role_changes: list[RoleChange] = field(default_factory=list)
    # Follower: install this snapshot (the application first, then store.reset) before
    # any message of this Ready is sent; then call core.on_snapshot_installed.
    install_snapshot: Snapshot | None = None
    # The members changed (a configuration entry appended or truncated, a snapshot
    # installed, a leader learned): every member of any configuration the log holds,
    # whose frames this node takes (``MemberState.known``); the runtime connects to
    # them, no others.
    addresses: dict[str, str] | None = None

    def __bool__(self) -> bool:
        return bool(
            self.hard_state is not None
            or self.addresses is not None
            or self.install_snapshot is not None
            or self.must_sync
            or self.messages
            or self.committed_index is not None
            or self.proposals
            or self.transfers
            or self.role_changes
        )


@dataclass(slots=True)
class _Transfer:
    transfer_id: int
    to: str
    term: int
    deadline_ms: int
    index: int  # the log end the transferee must reach before it campaigns
    started_ms: int
    sent_ms: int  # when the request last left (it is sent again while unanswered)


@dataclass(slots=True)
class _TakeLeadership:
    """Transferee side: become candidate once the log reaches ``index``."""

    leader_id: str
    req_id: int
    term: int
    index: int
    deadline_ms: int
    started: bool = False


class DLedgerCore:
    def __init__(
        self,
        *,
        group: str,
        self_id: str,
        peers: dict[str, str],
        store: LogStore,
        rng: random.Random,
        settings: CoreSettings | None = None,
        now_ms: int = 0,
        event_log: EventLog | None = None,
        learners: dict[str, str] | None = None,
    ) -> None:
        """``peers`` (the voters) and ``learners`` bootstrap the configuration: they
        count on the first start only; after it the log's configuration rules
        (``membership``)."""
        self.settings = settings or CoreSettings()
        self.store = store
        self.rng = rng
        self._configs: list[tuple[int, Configuration]] = []  # the log's, by entry index
        # leaders heard of before any configuration of the log named them (id -> address)
        self._learned: dict[str, str] = {}
        bootstrap = Configuration.of(
            {i: a for i, a in peers.items() if i not in (learners or {})}, learners
        )
        if self_id not in bootstrap.members:
            raise ValueError(f"self id {self_id!r} is not among the peers {sorted(peers)}")
        store.bootstrap_config(bootstrap.encode())
        self._config_version = store.config_version
        config, config_index, known = self._log_config()
        if config.addresses != bootstrap.addresses and event_log is not None:
            event_log("config_from_log", {"index": config_index, **config.describe()})
        self.member_state = MemberState(group, self_id, config, store, store.load_term_vote())
        self.member_state.known = known
        self.member_state.config_index = config_index
        self.now_ms = now_ms
        self._event_log = event_log
        self._req_seq = 0
        self._ready = Ready()
        self.synced_index = store.ledger_end_index  # what recovery found is on disk
        self._reported_commit = store.committed_index
        self._last_role: tuple[int, Role, str | None] = (
            self.member_state.curr_term,
            self.member_state.role,
            None,
        )
        # The collaborators get the member state, the store and the settings, and reach
        # the rest of this node through the narrow hosts of ``host`` (DLedger hands its
        # elector and pusher the MemberState and the RPC service, not the server).
        self.elector = LeaderElector(self.member_state, self.settings, rng, self)
        self.checker = QuorumAckChecker(self.member_state.self_id, self.member_state.peer_ids)
        self.handler = EntryHandler(self.member_state, store, self.settings, self)
        self.dispatchers = {
            p: EntryDispatcher(p, self.member_state, store, self.settings, self)
            for p in self.member_state.replica_ids
        }
        self._proposals: deque[tuple[Proposal, int]] = deque()  # (proposal, deadline)
        self._proposal_seq = 0
        self._transfers: list[_Transfer] = []
        self.transfers_started = 0
        self._new_cluster: str | None = None  # the cluster id this node would make
        self._take: _TakeLeadership | None = None
        # Transferee: the last take answered, (leader, term, req_id) and the answer,
        # so a request the leader sent again gets the same answer.
        self._last_take: tuple[tuple[str, int, int], DLedgerCode] | None = None
        self._last_preferred_check_ms = now_ms
        self.snapshot: Snapshot | None = None  # the newest the application registered
        self.installing: Snapshot | None = None  # follower: handed out, not yet installed
        self.snapshots_installed = 0
        # A leader contradicted a committed entry here (HandlerHost.diverged): what, when
        self.divergence: dict[str, Any] | None = None

    # ---- the hosts of the collaborators (``host``) ----------------------------------------

    def next_req_id(self) -> int:
        self._req_seq += 1
        return self._req_seq

    def send(self, msg: RaftMessage) -> None:
        self._ready.messages.append(msg)

    def wrote_entries(self) -> None:
        self._ready.must_sync = True

    def log_event(self, name: str, **fields: Any) -> None:
        if self._event_log is not None:
            self._event_log(name, fields)

    def role_changed(self, now_ms: int) -> None:
        member_state = self.member_state
        cur = (member_state.curr_term, member_state.role, member_state.leader_id)
        if cur == self._last_role:
            return
        was = self._last_role[1]
        self._last_role = cur
        self._ready.role_changes.append(RoleChange(*cur))
        self.log_event(
            "role",
            term=member_state.curr_term,
            role=member_state.role.value,
            leader=member_state.leader_id,
        )
        if was is Role.LEADER and member_state.role is not Role.LEADER:
            self._fail_proposals(DLedgerCode.TERM_CHANGED)
            for d in self.dispatchers.values():
                d.leadership_lost()
        if member_state.role is not Role.FOLLOWER:
            self.handler.clear(DLedgerCode.NOT_FOLLOWER)
            self.handler.drop_assembly()
        if member_state.role is Role.LEADER:
            self._on_become_leader(now_ms)
            if self._take is not None and self._take.started:
                self._finish_take(DLedgerCode.SUCCESS)  # tell the old leader at once
        elif self._take is not None and member_state.role is Role.FOLLOWER:
            self._finish_take(DLedgerCode.TAKE_LEADERSHIP_FAILED)

    def commit_to(self, index: int) -> None:
        self.store.update_committed(index)
        self.log_event("commit", index=index)

    def update_peer_watermark(self, term: int, peer_id: str, index: int) -> None:
        if peer_id not in self.member_state.stale_peers:
            self.checker.update_peer_watermark(term, peer_id, index)

    @property
    def snapshot_stats(self) -> dict[str, int]:
        """Snapshots sent to followers (leader) and installed (follower), since start."""
        sent = sum(d.snapshots_sent for d in self.dispatchers.values())
        return {"sent": sent, "installed": self.snapshots_installed}

    # ---- inputs ----------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """The state maintainer's 10 ms beat: timers, rounds, dispatchers."""
        self.now_ms = now_ms
        self.elector.maintain(now_ms)
        self._check_take_leadership(now_ms)
        self._expire_transfers(now_ms)
        self._check_preferred_leader(now_ms)
        self.handler.drain(now_ms)
        self._pump(now_ms, idle_commit=True)
        self._expire_proposals(now_ms)
        if self.settings.seal_members:
            self._seal(now_ms)
        self._refresh_config()

    def step(self, msg: RaftMessage, now_ms: int) -> None:
        """Take one message from a peer. Requests are answered into ``ready().messages``."""
        self.now_ms = now_ms
        member_state = self.member_state
        if (
            msg.group != member_state.group
            or msg.remote_id != member_state.self_id
            or msg.local_id == member_state.self_id
            or (msg.local_id not in member_state.peers and not self._follows_stranger(msg))
        ):
            self.log_event("dropped", kind=type(msg).__name__, sender=msg.local_id)
            return
        theirs = getattr(msg, "cluster", "")
        if theirs and theirs != (ours := self._committed_cluster()) and ours:
            self.log_event(
                "foreign_cluster",
                kind=type(msg).__name__,
                sender=msg.local_id,
                cluster=theirs,
                ours=ours,
            )
            return
        if msg.term > member_state.curr_term + self.settings.max_term_jump or msg.term > MAX_TERM:
            self.log_event(
                "term_jump_refused",
                kind=type(msg).__name__,
                sender=msg.local_id,
                term=msg.term,
                ours=member_state.curr_term,
            )
            return
        if isinstance(msg, VoteRequest):
            self.send(self.elector.on_vote_request(msg, now_ms))
        elif isinstance(msg, VoteResponse):
            self._note_term(msg.term, msg.pre_vote, now_ms)
            self.elector.on_vote_response(msg, now_ms)
        elif isinstance(msg, HeartBeatRequest):
            self.send(self.elector.on_heartbeat_request(msg, now_ms))
        elif isinstance(msg, HeartBeatResponse):
            self.elector.on_heartbeat_response(msg, now_ms)
        elif isinstance(msg, PushEntryRequest):
            self._on_push(msg, now_ms)
        elif isinstance(msg, PushEntryResponse):
            self._on_push_response(msg, now_ms)
        elif isinstance(msg, InstallSnapshotRequest):
            self._on_install_snapshot(msg, now_ms)
        elif isinstance(msg, InstallSnapshotResponse):
            self._on_install_snapshot_response(msg, now_ms)
        elif isinstance(msg, LeadershipTransferRequest):
            self._on_take_leadership(msg, now_ms)
        elif isinstance(msg, LeadershipTransferResponse):
            self._on_transfer_response(msg)
        self._refresh_config()
        self._pump(now_ms, idle_commit=False)

    def _follows_stranger(self, msg: RaftMessage) -> bool:
        """A leader this node's newest configuration leaves out is followed all the same
        (Raft takes a current leader's entries whatever the configuration says): one
        that some configuration of the log names (the entry that leaves it out may be
        one it truncates), or one added while this node was behind, which says where it
        is (``leader_addr``: the runtime connects back). Only its pushes, heartbeats
        and snapshots; never its votes."""
        if not isinstance(msg, _LEADER_FRAMES):
            return False
        member_state = self.member_state
        if msg.local_id in member_state.known:
            return True
        if not msg.leader_addr:
            return False
        self._learned[msg.local_id] = msg.leader_addr
        member_state.known[msg.local_id] = msg.leader_addr
        self._ready.addresses = dict(member_state.known)
        self.log_event("leader_learned", leader=msg.local_id, addr=msg.leader_addr)
        return True

    def peer_connection_lost(self, peer_id: str, now_ms: int) -> None:
        """A connection from or to ``peer_id`` ended: EOF, reset, or refused on reconnect
        (a crash closes; a pause or a partition does not, and is no such event). If it is
        this follower's leader, the elector pre-votes early (see ``elector``); the core
        decides, the transport only reports."""
        self.now_ms = now_ms
        if peer_id in self.member_state.peers and peer_id != self.member_state.self_id:
            self.elector.on_peer_connection_lost(peer_id, now_ms)
            self.transferee_connection_lost(peer_id)

    def _note_term(self, term: int, pre_vote: bool, now_ms: int) -> None:
        if pre_vote or term <= self.member_state.curr_term:
            return
        if self.member_state.role is Role.LEADER:
            self.elector.change_role_to_candidate(term, now_ms)

    def _pump(self, now_ms: int, *, idle_commit: bool) -> None:
        if self.member_state.role is Role.LEADER:
            for d in self.dispatchers.values():
                d.maintain(now_ms, idle_commit=idle_commit)
            self._check_quorum_ack()
        self._complete_proposals()

    def _check_quorum_ack(self) -> None:
        """Leader: commit what a majority holds in this term."""
        store = self.store
        own = store.ledger_end_index
        if self.settings.flush == "sync":
            own = min(own, self.synced_index)  # count ourselves only for synced entries
        index = self.checker.check(
            self.member_state.curr_term, own, store.committed_index, store.term_at
        )
        if index is not None:
            self.commit_to(index)

    # ---- follower side of pushes ------------------------------------------------------------

    def _on_push(self, req: PushEntryRequest, now_ms: int) -> None:
        code = self.elector.check_leader_request(req.term, req.leader_id, now_ms)
        if code is None and self.installing is not None:
            # The log is being replaced (SOFAJRaft answers EBUSY): the leader retries.
            code = DLedgerCode.NEWER_INSTALL_SNAPSHOT_REQUEST_EXIST
        if code is not None:
            self.handler.respond(req, code)
            return
        self.handler.handle_push(req, now_ms)
        self._check_take_leadership(now_ms)

    # ---- INSTALL_SNAPSHOT (Raft §7) ----------------------------------------------------

    def set_snapshot(self, last_index: int, data: bytes) -> Snapshot:
        """The application wrote a snapshot of its state covering the committed entries up
        to ``last_index`` durably: keep it (the newest one) to send to followers behind
        the log head. Term, chain and next position come from the store; raises
        ``DLedgerError(UNEXPECTED_ARGUMENT)`` when ``last_index`` is not committed or is
        below ``ledger_begin_index - 1``. Returns the snapshot kept (an older one than the
        one held is not kept).

        A leader whose commit index is behind the snapshot (its checkpoint lagged when it
        restarted) commits up to it first: the application applies committed entries
        only, so they were committed, and a leader holds every committed entry (§5.4),
        so its entry there is that one. Otherwise the snapshot a follower needs could wait
        for a commit that needs that follower (simulator, membership seed 707)."""
        store = self.store
        if (
            self.member_state.role is Role.LEADER
            and store.committed_index < last_index <= store.ledger_end_index
            # only entries of earlier terms (what a restart can leave uncounted): an
            # entry of this term is committed by this leader's own count, never by a claim
            and store.term_at(last_index) < self.member_state.curr_term
        ):
            self.commit_to(last_index)
        snap = snapshot_of(store, last_index, data)
        if self.snapshot is None or snap.last_index >= self.snapshot.last_index:
            self.snapshot = snap
            self.log_event("snapshot", index=snap.last_index, bytes=len(snap.data))
        return self.snapshot

    def diverged(self, why: str, index: int, leader_term: int) -> None:
        """See ``HandlerHost.diverged``: the first one is kept (until a restart) and
        logged; the rest are counted."""
        if self.divergence is None:
            self.divergence = {
                "why": why,
                "index": index,
                "committed_index": self.store.committed_index,
                "leader_id": self.member_state.leader_id,
                "leader_term": leader_term,
                "since_ms": self.now_ms,
                "count": 0,
            }
            self.log_event("diverged", **self.divergence)
        self.divergence["count"] += 1

    def begin_install(self, snap: Snapshot) -> None:
        """Follower: hand ``snap`` to the application through the Ready (the EntryHandler
        has decided to install it)."""
        self.installing = snap
        self._ready.install_snapshot = snap
        self._ready.must_sync = True
        self.log_event("install_snapshot", index=snap.last_index, bytes=len(snap.data))

    def on_snapshot_installed(self, snap: Snapshot) -> None:
        """The caller installed ``snap`` (application, then ``store.reset``), step 1 of the
        Ready that carried it."""
        assert self.store.ledger_begin_index > snap.last_index, "store.reset did not run"
        if self.installing is snap:
            self.installing = None
        self.snapshots_installed += 1
        if self.snapshot is None or snap.last_index >= self.snapshot.last_index:
            self.snapshot = snap
        self._refresh_config()
        self._pump(self.now_ms, idle_commit=False)

    def _on_install_snapshot(self, req: InstallSnapshotRequest, now_ms: int) -> None:
        code = self.elector.check_leader_request(req.term, req.leader_id, now_ms)
        if code is not None:
            self.handler.respond_install(req, code)
            return
        self.handler.handle_install(req)

    def _answering_dispatcher(
        self, resp: PushEntryResponse | InstallSnapshotResponse, now_ms: int
    ) -> EntryDispatcher | None:
        """The dispatcher a peer's answer is for, if this node still leads; a higher
        term in the answer makes it step down instead."""
        member_state = self.member_state
        if resp.term > member_state.curr_term:
            self._note_term(resp.term, False, now_ms)
            return None
        if member_state.role is not Role.LEADER:
            return None
        if not member_state.answered_as_member(resp.local_id, resp.incarnation):
            # A lost data directory come back under a member's id: it gets the log
            # (where it reads that it is not the member), but neither its acks nor
            # its answers count as the member's (``update_peer_watermark``).
            self.log_event(
                "stranger_incarnation",
                node=resp.local_id,
                incarnation=resp.incarnation,
                what_to_do=STALE_IDENTITY_TODO,
            )
        else:
            self.elector.peer_heard_ms[resp.local_id] = now_ms
        return self.dispatchers.get(resp.local_id)

    def _on_install_snapshot_response(self, resp: InstallSnapshotResponse, now_ms: int) -> None:
        d = self._answering_dispatcher(resp, now_ms)
        if d is not None:
            d.on_install_response(resp, now_ms)

    def _on_push_response(self, resp: PushEntryResponse, now_ms: int) -> None:
        d = self._answering_dispatcher(resp, now_ms)
        if d is not None:
            d.on_response(resp, now_ms)

    # ---- leader: proposals ----------------------------------------------------------------

    def _on_become_leader(self, now_ms: int) -> None:
        """A NOOP at once, so entries of earlier terms commit without a client."""
        for d in self.dispatchers.values():
            d.term = -1  # start over with COMPARE
        self.store.append_as_leader(self.member_state.curr_term, [b""], MAGIC_NOOP)
        self.wrote_entries()
        if self.settings.seal_members:
            # The voters that elected it answered with their incarnations: record them
            # right after the NOOP, before any client's entry. No voter moves, so the
            # rule's wait for this term's first commit is not needed (``_seal`` does
            # the rest later, as more voters answer).
            new = sealed(self.member_state.config, self._heard_incarnations(), self._cluster_id())
            if new != self.member_state.config:
                self._append_config(new, now_ms)
                self.log_event("config_seal", index=self.store.ledger_end_index)

    def propose(
        self, bodies: Sequence[bytes | bytearray | memoryview], now_ms: int, *, pump: bool = True
    ) -> Proposal:
        """``handleAppend`` (AP-01..AP-05): append as leader; the :class:`ProposalDone`
        arrives in a later ``ready()``. Raises :class:`DLedgerError` when refused.

        ``pump``: push the new entries to the followers at once. The runtime passes False
        and calls :meth:`pump` once per turn of its loop, so the proposals of one turn
        (concurrent produce requests) share one push per follower (group commit)."""
        self.now_ms = now_ms
        member_state = self.member_state
        if member_state.role is not Role.LEADER:
            raise DLedgerError(DLedgerCode.NOT_LEADER, f"leader is {member_state.leader_id}")
        if member_state.transferee is not None:
            raise DLedgerError(
                DLedgerCode.LEADER_TRANSFERRING, f"handing leadership to {member_state.transferee}"
            )
        if len(self._proposals) >= self.settings.max_pending_proposals:
            raise DLedgerError(
                DLedgerCode.LEADER_PENDING_FULL,
                f"{len(self._proposals)} appends wait for a quorum",
            )
        metas = self.store.append_as_leader(member_state.curr_term, bodies)
        self.wrote_entries()
        self._proposal_seq += 1
        p = Proposal(
            self._proposal_seq, member_state.curr_term, metas[0].index, tuple(m.pos for m in metas)
        )
        self._proposals.append((p, now_ms + self.settings.max_wait_ack_ms))
        if pump:
            self._pump(now_ms, idle_commit=False)
        return p

    # ---- membership (``membership``) --------------------------------------------------

    def _log_config(self) -> tuple[Configuration, int, dict[str, str]]:
        """The newest configuration the log holds, its entry's index (-1: the one the
        node bootstrapped with), and the address of every member of any configuration
        the log holds (``MemberState.known``)."""
        records = self.store.config_records()
        if not records:  # the journal's invariant (``store.configs``) says never
            raise DLedgerError(
                DLedgerCode.ILLEGAL_MEMBER_STATE,
                "no configuration the log agrees with in the members file: the node"
                " cannot tell who its members are (docs/formats.md, `members`)",
            )
        configs = [Configuration.decode(r.body) for r in records]
        self._configs = [(r.index, c) for r, c in zip(records, configs, strict=True)]
        known: dict[str, str] = dict(self._learned)
        for c in configs:
            known.update(c.addresses)
        return configs[-1], records[-1].index, known

    @property
    def config_index(self) -> int:
        """The entry of the configuration in force (-1: the bootstrap one)."""
        return self.member_state.config_index

    def _committed_cluster(self) -> str:
        """The cluster id of the newest committed configuration that has one ("": none).
        Only a committed one is enforced: an uncommitted configuration (and the id a
        leader made in it) may be truncated by a leader that made another."""
        committed = self.store.committed_index
        for index, config in reversed(self._configs):
            if index <= committed and config.cluster:
                return config.cluster
        return ""

    def _refresh_config(self) -> None:
        """Take the log's newest configuration if it changed (an entry appended or
        truncated, a snapshot installed): members, voters, dispatchers, the runtime."""
        version = self.store.config_version
        if version == self._config_version:
            return
        self._config_version = version
        config, config_index, known = self._log_config()
        member_state = self.member_state
        member_state.config_index = config_index
        if known != member_state.known:
            member_state.known = known
            self._ready.addresses = dict(known)
        if config == member_state.config:
            return
        member_state.set_config(config)
        self.checker.peer_ids = member_state.peer_ids
        for p in [p for p in self.dispatchers if p not in member_state.replica_ids]:
            del self.dispatchers[p]
        for p in member_state.replica_ids:
            if p not in self.dispatchers:
                self.dispatchers[p] = EntryDispatcher(
                    p, member_state, self.store, self.settings, self
                )
        self._ready.addresses = dict(known)
        self.log_event("config", index=self.config_index, **config.describe())
        if member_state.stale_identity is not None:
            self.log_event(
                "stale_identity",
                node=member_state.self_id,
                ours=member_state.incarnation,
                members=member_state.stale_identity,
                index=self.config_index,
                what_to_do=STALE_IDENTITY_TODO,
            )

    def _change_allowed(self) -> None:
        """A configuration entry may be appended now (the rule of ``membership``), else
        ``DLedgerError`` saying why."""
        member_state, store = self.member_state, self.store
        if member_state.role is not Role.LEADER:
            raise DLedgerError(DLedgerCode.NOT_LEADER, f"leader is {member_state.leader_id}")
        if member_state.transferee is not None:
            raise DLedgerError(
                DLedgerCode.LEADER_TRANSFERRING, f"handing leadership to {member_state.transferee}"
            )
        committed = store.committed_index
        if committed < 0 or store.term_at(committed) != member_state.curr_term:
            raise DLedgerError(
                DLedgerCode.LEADER_NOT_READY, "no entry of this term is committed yet: retry"
            )
        if self.config_index > committed:
            raise DLedgerError(
                DLedgerCode.LEADER_PENDING_FULL,
                f"the change at index {self.config_index} is not committed yet: retry",
            )

    def _append_config(self, new: Configuration, now_ms: int) -> Proposal:
        member_state = self.member_state
        metas = self.store.append_as_leader(member_state.curr_term, [new.encode()], MAGIC_CONFIG)
        self.wrote_entries()
        self._proposal_seq += 1
        p = Proposal(self._proposal_seq, member_state.curr_term, metas[0].index, (metas[0].pos,))
        self._proposals.append((p, now_ms + self.settings.max_wait_ack_ms))
        self._refresh_config()
        self._pump(now_ms, idle_commit=False)
        return p

    def _cluster_id(self) -> str:
        """The configuration's cluster id, or a new one (drawn once, only when there is
        none: the first seal or change of a group makes it)."""
        if self.member_state.config.cluster:
            return self.member_state.config.cluster
        if self._new_cluster is None:
            self._new_cluster = f"{self.rng.getrandbits(64):016x}"
        return self._new_cluster

    def _heard_incarnations(self) -> dict[str, str]:
        member_state = self.member_state
        return {**member_state.heard_incarnations, member_state.self_id: member_state.incarnation}

    def _seal(self, now_ms: int) -> None:
        """Leader: record the incarnations of voters the configuration has none for
        (the first nodes, bootstrapped from ``--peers``) once it heard them, so a lost
        data directory come back under a member's id is told apart (``membership``)."""
        member_state = self.member_state
        if member_state.role is not Role.LEADER:
            return
        new = sealed(member_state.config, self._heard_incarnations(), self._cluster_id())
        if new == member_state.config:
            return
        try:
            self._change_allowed()
        except DLedgerError:
            return  # later: the rule's conditions come true by themselves
        p = self._append_config(new, now_ms)
        self.log_event("config_seal", index=p.first_index)

    def change_membership(self, change: MembershipChange, now_ms: int) -> Proposal:
        """Append the configuration ``change`` makes (one member at a time); a
        :class:`ProposalDone` reports its commit like any proposal's. Refused
        (``DLedgerError``) unless this node leads, no transfer runs, an entry of its
        term is committed and the previous change is, and the change is allowed
        (``membership.check_change``); a learner is promoted only within
        ``max_learner_lag`` entries of the log's end, and with the incarnation it
        answers from (a stale one, ``MemberState.stale_peers``, is refused)."""
        self.now_ms = now_ms
        member_state, store = self.member_state, self.store
        self._change_allowed()
        new = sealed(
            check_change(member_state.config, change, member_state.self_id),
            self._heard_incarnations(),
            self._cluster_id(),
        )
        promoted = new.is_voter(change.node_id) and not member_state.config.is_voter(change.node_id)
        if promoted:
            if change.node_id in member_state.stale_peers:
                raise DLedgerError(
                    DLedgerCode.UNKNOWN_MEMBER,
                    f"{change.node_id} answers from another data directory than its member's",
                )
            match = self.dispatchers[change.node_id].match_index
            lag = store.ledger_end_index - match
            if match < 0 <= store.ledger_end_index:
                raise DLedgerError(
                    DLedgerCode.FALL_BEHIND_TOO_MUCH,
                    f"{change.node_id} has acknowledged no entry yet: retry once it caught up",
                )
            if lag > self.settings.max_learner_lag:
                raise DLedgerError(
                    DLedgerCode.FALL_BEHIND_TOO_MUCH,
                    f"{change.node_id} is {lag} entries behind (at most"
                    f" {self.settings.max_learner_lag} to be promoted): retry once it caught up",
                )
        p = self._append_config(new, now_ms)
        self.log_event("config_change", change=repr(change), index=p.first_index)
        return p

    def pump(self, now_ms: int) -> None:
        """Push what the proposals since the last push appended (see ``propose``)."""
        self.now_ms = now_ms
        self._pump(now_ms, idle_commit=False)

    def _complete_proposals(self) -> None:
        committed = self.store.committed_index
        if committed != self._reported_commit:
            self._reported_commit = committed
            self._ready.committed_index = committed
        while self._proposals and self._proposals[0][0].last_index <= committed:
            p, _ = self._proposals.popleft()
            self._ready.proposals.append(ProposalDone(p, DLedgerCode.SUCCESS))

    def _expire_proposals(self, now_ms: int) -> None:
        while self._proposals and self._proposals[0][1] <= now_ms:
            p, _ = self._proposals.popleft()
            self._ready.proposals.append(ProposalDone(p, DLedgerCode.WAIT_QUORUM_ACK_TIMEOUT))

    def _fail_proposals(self, code: DLedgerCode) -> None:
        while self._proposals:
            p, _ = self._proposals.popleft()
            self._ready.proposals.append(ProposalDone(p, code))

    def on_synced(self, index: int) -> None:
        """The caller made everything up to ``index`` durable (step 1 of a Ready)."""
        self.synced_index = index  # a truncate may lower it
        self._pump(self.now_ms, idle_commit=False)

    # ---- leadership transfer ---------------------------------------------------------

    def transfer_leadership(self, to: str, now_ms: int) -> int:
        """Hand leadership to ``to``; a :class:`TransferDone` reports the outcome.

        Appends are refused (LEADER_TRANSFERRING) while it runs, so it ends as soon as
        its outcome is known: SUCCESS when ``to`` answers that it leads (or this node
        sees its higher term and steps down); a failure, after which this node leads on
        and takes appends again, when ``to`` refuses, when its connection is lost
        (``peer_connection_lost``: it died), when it has been silent for
        ``leadership_transfer_silence_ms`` (paused, cut off), or at the deadline. The
        request is the transfer's TimeoutNow; it is sent again every heartbeat interval
        while unanswered, so one lost frame costs a beat, not the deadline."""
        member_state, s = self.member_state, self.settings
        if to not in member_state.peer_ids or to in member_state.stale_peers:
            raise DLedgerError(DLedgerCode.UNKNOWN_MEMBER, f"{to!r} is not a voter")
        if member_state.role is not Role.LEADER:
            raise DLedgerError(DLedgerCode.NOT_LEADER, f"leader is {member_state.leader_id}")
        if to == member_state.self_id:
            raise DLedgerError(DLedgerCode.UNEXPECTED_ARGUMENT, "already the leader")
        if member_state.transferee is not None:
            raise DLedgerError(DLedgerCode.LEADER_TRANSFERRING, f"to {member_state.transferee}")
        lag = member_state.ledger_end_index - self.dispatchers[to].match_index
        if lag > s.max_leadership_transfer_wait_index:
            raise DLedgerError(DLedgerCode.FALL_BEHIND_TOO_MUCH, f"{to} is {lag} behind")
        silent_ms = self._silent_ms(to, now_ms)
        if silent_ms > s.leadership_transfer_silence_ms:
            raise DLedgerError(
                DLedgerCode.NETWORK_ERROR,
                f"{to} has not answered for {self._silence_text(silent_ms)}",
            )
        member_state.transferee = to
        t = _Transfer(
            self.next_req_id(),
            to,
            member_state.curr_term,
            now_ms + s.leadership_transfer_timeout_ms * 2,
            member_state.ledger_end_index,
            now_ms,
            now_ms,
        )
        self._transfers.append(t)
        self.transfers_started += 1
        self._send_transfer(t)
        self.log_event("transfer", to=to, term=member_state.curr_term)
        return t.transfer_id

    def _send_transfer(self, t: _Transfer) -> None:
        member_state = self.member_state
        self.send(
            LeadershipTransferRequest(
                group=member_state.group,
                local_id=member_state.self_id,
                remote_id=t.to,
                term=t.term,
                req_id=t.transfer_id,
                transfer_id=member_state.self_id,
                transferee_id=t.to,
                take_leadership_ledger_index=t.index,
            )
        )

    def _silent_ms(self, peer: str, now_ms: int) -> int:
        """How long since this leader last heard ``peer`` answer (its whole term when
        it never has)."""
        return now_ms - self.elector.peer_heard_ms.get(peer, -(10**15))

    @staticmethod
    def _silence_text(silent_ms: int) -> str:
        return f"{silent_ms} ms" if silent_ms < 10**12 else "this whole term"

    def _on_transfer_response(self, resp: LeadershipTransferResponse) -> None:
        for t in list(self._transfers):
            if t.transfer_id == resp.req_id and t.to == resp.local_id:
                why = (
                    "" if resp.code is DLedgerCode.SUCCESS else f"{t.to} answered {resp.code.name}"
                )
                self._end_transfer(t, resp.code, why)

    def _end_transfer(self, t: _Transfer, code: DLedgerCode, reason: str) -> None:
        """Report ``t``'s outcome; appends are taken again (if this node still leads)."""
        self._transfers.remove(t)
        self._ready.transfers.append(TransferDone(t.transfer_id, code, reason))
        member_state = self.member_state
        if member_state.curr_term == t.term and member_state.transferee == t.to:
            member_state.transferee = None
        self.log_event("transfer_done", to=t.to, term=t.term, code=code.name, reason=reason)

    def _expire_transfers(self, now_ms: int) -> None:
        """The leader's side of running transfers, every tick: end those whose outcome is
        known without an answer, resend the request of the others."""
        member_state, s = self.member_state, self.settings
        for t in list(self._transfers):
            if now_ms >= t.deadline_ms:
                self._end_transfer(
                    t, DLedgerCode.TIMEOUT, f"{t.to} did not take leadership in time"
                )
            elif member_state.role is not Role.LEADER or member_state.curr_term != t.term:
                # Deposed (the transferee's higher term, most likely): this node no
                # longer decides; the transferee's answer or the deadline ends it.
                continue
            elif (
                silent := min(self._silent_ms(t.to, now_ms), now_ms - t.started_ms)
            ) > s.leadership_transfer_silence_ms:
                # Silent since before the transfer began counts from its start: a target
                # heard 400 ms ago gets the whole bound to answer, not 100 ms.
                self._end_transfer(
                    t, DLedgerCode.NETWORK_ERROR, f"{t.to} silent for {self._silence_text(silent)}"
                )
            elif now_ms - t.sent_ms >= s.heartbeat_interval_ms:
                t.sent_ms = now_ms
                self._send_transfer(t)

    def transferee_connection_lost(self, peer_id: str) -> None:
        """``peer_connection_lost`` for the leader's side: a transfer to ``peer_id``
        fails now (its process died or its link broke) instead of at its deadline."""
        member_state = self.member_state
        if member_state.role is not Role.LEADER:
            return
        for t in list(self._transfers):
            if t.to == peer_id and t.term == member_state.curr_term:
                self._end_transfer(t, DLedgerCode.NETWORK_ERROR, f"connection to {peer_id} lost")

    def _on_take_leadership(self, req: LeadershipTransferRequest, now_ms: int) -> None:
        member_state = self.member_state
        key = (req.local_id, req.term, req.req_id)
        t = self._take
        if t is not None and (t.leader_id, t.term, t.req_id) == key:
            return  # the leader sent it again: this take is under way
        if self._last_take is not None and self._last_take[0] == key:
            self._answer_take(req.local_id, req.req_id, self._last_take[1])  # answer lost
            return
        if (
            req.transferee_id != member_state.self_id
            or req.term != member_state.curr_term
            or (member_state.role is not Role.FOLLOWER or member_state.leader_id != req.local_id)
        ):
            self._answer_take(req.local_id, req.req_id, DLedgerCode.TAKE_LEADERSHIP_FAILED)
            return
        self._take = _TakeLeadership(
            req.local_id,
            req.req_id,
            req.term,
            req.take_leadership_ledger_index,
            now_ms + self.settings.leadership_transfer_timeout_ms,
        )
        self._check_take_leadership(now_ms)

    def _check_take_leadership(self, now_ms: int) -> None:
        t, member_state = self._take, self.member_state
        if t is None:
            return
        if t.started:
            if member_state.role is Role.LEADER:
                self._finish_take(DLedgerCode.SUCCESS)
            elif member_state.curr_term > t.term + 1 or now_ms >= t.deadline_ms + 1000:
                self._finish_take(DLedgerCode.TAKE_LEADERSHIP_FAILED)
            return
        if now_ms >= t.deadline_ms or member_state.curr_term != t.term:
            self._finish_take(DLedgerCode.TAKE_LEADERSHIP_FAILED)
        elif member_state.ledger_end_index >= t.index:
            t.started = True
            member_state.term_to_take_leadership = t.term + 1
            self.elector.raise_term_now(t.term + 1, now_ms)
            # Adopt term + 1 now, not at the next tick: until then a heartbeat or push
            # of the old leader's term would find a candidate without a leader in that
            # term and make it a follower again, failing the transfer.
            self.elector.maintain(now_ms)

    def _finish_take(self, code: DLedgerCode) -> None:
        t, self._take = self._take, None
        assert t is not None
        self._last_take = ((t.leader_id, t.term, t.req_id), code)
        self.member_state.term_to_take_leadership = -1
        self._answer_take(t.leader_id, t.req_id, code)

    def _answer_take(self, to: str, req_id: int, code: DLedgerCode) -> None:
        member_state = self.member_state
        self.send(
            LeadershipTransferResponse(
                group=member_state.group,
                local_id=member_state.self_id,
                remote_id=to,
                term=member_state.curr_term,
                req_id=req_id,
                code=code,
            )
        )

    def _check_preferred_leader(self, now_ms: int) -> None:
        """Preferred leader: hand over to the live preferred peer that lags least."""
        s, member_state = self.settings, self.member_state
        if (
            not s.preferred_leader_ids
            or member_state.role is not Role.LEADER
            or member_state.transferee
        ):
            return
        if now_ms - self._last_preferred_check_ms < s.preferred_leader_check_ms:
            return
        self._last_preferred_check_ms = now_ms
        if member_state.self_id in s.preferred_leader_ids:
            return
        heard = self.elector.peer_heard_ms
        live = [
            (member_state.ledger_end_index - self.dispatchers[p].match_index, p)
            for p in sorted(s.preferred_leader_ids)
            if p in self.dispatchers and now_ms - heard.get(p, -(10**15)) <= s.election_timeout_ms
        ]
        if live:
            lag, to = min(live)
            if lag < s.max_leadership_transfer_wait_index:
                self.transfer_leadership(to, now_ms)

    # ---- output ----------------------------------------------------------------------------

    def ready(self) -> Ready:
        """Everything produced since the last call; handle it in the documented order."""
        member_state = self.member_state
        if member_state.hard_state_dirty:
            self._ready.hard_state = member_state.hard_state()
            member_state.hard_state_dirty = False
        r, self._ready = self._ready, Ready()
        return r

    def status(self) -> dict[str, Any]:
        member_state, store = self.member_state, self.store
        return {
            "group": member_state.group,
            "self_id": member_state.self_id,
            "role": member_state.role.value,
            "term": member_state.curr_term,
            "leader_id": member_state.leader_id,
            "voted_for": member_state.curr_vote_for,
            "ledger_begin_index": store.ledger_begin_index,
            "ledger_end_index": store.ledger_end_index,
            "ledger_end_term": store.ledger_end_term,
            "committed_index": store.committed_index,
            "committed_pos": store.committed_pos,
            "transferee": member_state.transferee,
            "pending_proposals": len(self._proposals),
            "snapshot_index": self.snapshot.last_index if self.snapshot else -1,
            "installing_snapshot_index": self.installing.last_index if self.installing else -1,
            "snapshots_sent": self.snapshot_stats["sent"],
            "snapshots_installed": self.snapshot_stats["installed"],
            "diverged": None if self.divergence is None else dict(self.divergence),
            "config_index": self.config_index,
            "voters": list(member_state.peer_ids),
            "learners": list(member_state.config.learners),
            "members": member_state.config.addresses,
            "peers": {
                p: {
                    "state": d.state.value,
                    "match_index": d.match_index,
                    "in_flight": len(d.pending),
                    "snapshots_sent": d.snapshots_sent,
                }
                for p, d in self.dispatchers.items()
            }
            if member_state.role is Role.LEADER
            else {},
        }
