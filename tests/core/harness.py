"""A tiny in-process cluster for unit tests of the sans-I/O core (etcd-raft's ``network``).

N :class:`~dledger.core.node.DLedgerCore` over :class:`~dledger.store.MemoryStore`, each
with its own seeded ``random.Random``; a FIFO network that can ``drop`` messages by
predicate, ``cut`` links and ``isolate`` nodes (checked when a message is delivered);
simulated time in 10 ms ticks. Every ``ready()`` is handled in the documented order:
persist the hard state (and sync the log), send, then record commits, finished
proposals, transfers and role changes. Every loop has a bound, so a livelock fails the
test instead of hanging it.

Also here: builders for hand-made messages and pre-filled stores, for tests that drive
one core directly (``inject``) instead of letting the cluster run.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from dledger.core.messages import (
    HeartBeatRequest,
    PushEntryRequest,
    PushType,
    RaftMessage,
    Role,
    VoteRequest,
)
from dledger.core.node import DLedgerCore, Proposal, ProposalDone, Ready, RoleChange, TransferDone
from dledger.core.settings import CoreSettings
from dledger.core.snapshot import Snapshot
from dledger.store import MemoryStore, TermVote

T = TypeVar("T")
TICK_MS = 10
GROUP = "g0"
MAX_DELIVERIES = 100_000  # per deliver_all: far above any test's traffic
MAX_READIES = 100  # per input: a core that never runs dry is a bug


class Cluster:
    def __init__(
        self,
        n: int = 3,
        *,
        seed: int = 0,
        settings: CoreSettings | None = None,
        stores: dict[str, MemoryStore] | None = None,
    ) -> None:
        self.ids = [f"n{i}" for i in range(n)]
        self.peers = {i: f"mem://{i}" for i in self.ids}
        self.seed = seed
        self.settings = settings or CoreSettings()
        self.stores = {i: (stores or {}).get(i) or MemoryStore() for i in self.ids}
        self.now_ms = 0
        self.generation = dict.fromkeys(self.ids, 0)
        self.down: set[str] = set()
        self.queue: deque[RaftMessage] = deque()
        self.cuts: set[tuple[str, str]] = set()  # (from, to)
        self.drops: list[Callable[[RaftMessage], bool]] = []
        # what happened, for assertions
        self.sent: list[tuple[int, RaftMessage]] = []  # (time, message) put on the wire
        self.dropped: list[RaftMessage] = []
        self.readies: list[tuple[str, Ready]] = []
        self.commits: dict[str, list[int]] = {i: [] for i in self.ids}
        self.done: dict[str, list[tuple[int, ProposalDone]]] = {i: [] for i in self.ids}
        self.transfers: dict[str, list[TransferDone]] = {i: [] for i in self.ids}
        self.roles: list[tuple[int, str, RoleChange]] = []
        # what each node's application was handed, and what it saw when it was (the
        # messages already sent, to check that the answer waited for the install)
        self.installed: dict[str, list[Snapshot]] = {i: [] for i in self.ids}
        self.sent_at_install: dict[str, list[int]] = {i: [] for i in self.ids}
        self.events: list[tuple[str, str, dict[str, Any]]] = []  # (node, name, fields)
        self.cores: dict[str, DLedgerCore] = {}
        self.learners_of: dict[str, dict[str, str]] = {}  # a joining node's bootstrap
        for i in self.ids:
            self._start(i)

    # ---- nodes ---------------------------------------------------------------------------

    def _start(self, nid: str) -> None:
        rng = random.Random(f"{self.seed}/{nid}/{self.generation[nid]}")
        self.cores[nid] = DLedgerCore(
            group=GROUP,
            self_id=nid,
            peers=self.peers,
            store=self.stores[nid],
            rng=rng,
            settings=self.settings,
            now_ms=self.now_ms,
            event_log=lambda name, fields: self.events.append((nid, name, fields)),
            learners=self.learners_of.get(nid),
        )

    def add_node(self, nid: str, store: MemoryStore | None = None) -> DLedgerCore:
        """Start ``nid`` as a joining node: it knows the cluster's voters and itself as a
        learner, until the log (or a snapshot) tells it more."""
        addr = f"mem://{nid}"
        voters = {i: a for i, a in self.peers.items() if i not in self.learners_of}
        self.ids.append(nid)
        self.peers = {**voters, nid: addr}
        self.learners_of[nid] = {nid: addr}
        self.stores[nid] = store or MemoryStore()
        self.generation[nid] = 0
        for d in (self.commits, self.done, self.transfers, self.installed, self.sent_at_install):
            d[nid] = []  # type: ignore[index]
        self._start(nid)
        return self.cores[nid]

    def events_of(self, name: str, nid: str | None = None) -> list[dict[str, Any]]:
        return [f for n, e, f in self.events if e == name and (nid is None or n == nid)]

    def stop(self, nid: str) -> None:
        """Crash ``nid``: it stops ticking and messages to it are lost (its store stays)."""
        self.down.add(nid)

    def restart(self, nid: str) -> DLedgerCore:
        """A new core over the same store: term and vote come back from the store."""
        self.down.discard(nid)
        self.generation[nid] += 1
        self._start(nid)
        return self.cores[nid]

    def leader(self) -> str | None:
        """The live leader of the highest term, if any."""
        leads = [
            (c.member_state.curr_term, i)
            for i, c in self.cores.items()
            if i not in self.down and c.member_state.role is Role.LEADER
        ]
        return max(leads)[1] if leads else None

    def role(self, nid: str) -> Role:
        return self.cores[nid].member_state.role

    def term(self, nid: str) -> int:
        return self.cores[nid].member_state.curr_term

    # ---- network -------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        self.cuts |= {(a, b), (b, a)}

    def isolate(self, nid: str) -> None:
        for other in self.ids:
            if other != nid:
                self.cut(nid, other)

    def drop(self, pred: Callable[[RaftMessage], bool]) -> Callable[[RaftMessage], bool]:
        """Lose every message ``pred`` matches until ``undrop``/``heal``."""
        self.drops.append(pred)
        return pred

    def undrop(self, pred: Callable[[RaftMessage], bool]) -> None:
        self.drops.remove(pred)

    def heal(self) -> None:
        self.cuts.clear()
        self.drops.clear()

    def _lost(self, m: RaftMessage) -> bool:
        return (
            m.remote_id in self.down
            or (m.local_id, m.remote_id) in self.cuts
            or any(p(m) for p in self.drops)
        )

    def deliver_all(self) -> int:
        """Deliver queued messages (and the answers they cause) until the network is quiet."""
        n = 0
        while self.queue:
            n += 1
            assert n <= MAX_DELIVERIES, "the network never went quiet"
            m = self.queue.popleft()
            if self._lost(m):
                self.dropped.append(m)
                continue
            self.run(m.remote_id, lambda c: c.step(m, self.now_ms), deliver=False)  # noqa: B023
        return n

    def inject(self, msg: RaftMessage) -> list[RaftMessage]:
        """Step one hand-made message into its receiver; return what the receiver sent
        (also left in the queue, undelivered)."""
        before = len(self.sent)
        self.run(msg.remote_id, lambda c: c.step(msg, self.now_ms), deliver=False)
        return [m for _, m in self.sent[before:]]

    # ---- time and inputs -----------------------------------------------------------------

    def tick(self, ms: int = TICK_MS, *, nodes: Iterable[str] | None = None) -> None:
        """Advance ``ms`` of simulated time; each 10 ms tick ticks every live core (or
        only ``nodes``), then delivers until quiet."""
        assert ms > 0 and ms % TICK_MS == 0, f"{ms} ms is not a whole number of ticks"
        only = None if nodes is None else set(nodes)
        for _ in range(ms // TICK_MS):
            self.now_ms += TICK_MS
            for nid in self.ids:
                if nid in self.down or (only is not None and nid not in only):
                    continue
                self.run(nid, lambda c: c.tick(self.now_ms), deliver=False)
            self.deliver_all()

    def tick_until(self, cond: Callable[[], bool], max_ms: int = 10_000, **kw: Any) -> int | None:
        """Tick until ``cond()``; the simulated ms it took, or None if it never held."""
        start = self.now_ms
        while not cond():
            if self.now_ms - start >= max_ms:
                return None
            self.tick(**kw)
        return self.now_ms - start

    def wait_leader(self, max_ms: int = 10_000) -> str:
        """Tick until a leader has committed its NOOP; return its id."""

        def settled() -> bool:
            lead = self.leader()
            if lead is None:
                return False
            s = self.stores[lead]
            return s.committed_index == s.ledger_end_index >= 0 and s.ledger_end_term == (
                self.term(lead)
            )

        assert self.tick_until(settled, max_ms) is not None, f"no leader: {self.status()}"
        lead = self.leader()
        assert lead is not None
        return lead

    def run(self, nid: str, action: Callable[[DLedgerCore], T], *, deliver: bool = True) -> T:
        """Feed one input to ``nid`` and handle its Readies; deliver until quiet."""
        result = action(self.cores[nid])
        self._handle_ready(nid)
        if deliver:
            self.deliver_all()
        return result

    def propose(
        self, bodies: Sequence[bytes], nid: str | None = None, *, deliver: bool = True
    ) -> Proposal:
        nid = nid or self.leader()
        assert nid is not None, "no leader to propose to"
        return self.run(nid, lambda c: c.propose(bodies, self.now_ms), deliver=deliver)

    def _handle_ready(self, nid: str) -> None:
        """The Ready contract: persist (term/vote, an installed snapshot: application
        first, then the store reset), (sync), send, then the rest."""
        core, store = self.cores[nid], self.stores[nid]
        for _ in range(MAX_READIES):
            r = core.ready()
            if not r:
                return
            self.readies.append((nid, r))
            if r.hard_state is not None:
                store.save_term_vote(TermVote(r.hard_state.term, r.hard_state.voted_for))
            snap = r.install_snapshot
            if snap is not None:
                self.installed[nid].append(snap)
                self.sent_at_install[nid].append(len(self.sent))
                store.reset(
                    snap.last_index + 1, snap.next_pos, snap.last_term, snap.last_chain, snap.config
                )
                core.on_snapshot_installed(snap)
            if r.must_sync:
                store.sync()
                core.on_synced(store.ledger_end_index)  # may fill the next Ready
            for m in r.messages:
                self.sent.append((self.now_ms, m))
                self.queue.append(m)
            if r.committed_index is not None:
                self.commits[nid].append(r.committed_index)
            self.done[nid].extend((self.now_ms, d) for d in r.proposals)
            self.transfers[nid].extend(r.transfers)
            self.roles.extend((self.now_ms, nid, rc) for rc in r.role_changes)
        raise AssertionError(f"{nid}: ready() did not run dry")

    # ---- views ---------------------------------------------------------------------------

    def sent_of(self, kind: type[T], *, since: int = 0, **match: Any) -> list[T]:
        """Messages of ``kind`` sent since ``sent[since]`` whose fields equal ``match``."""
        return [
            m
            for _, m in self.sent[since:]
            if isinstance(m, kind) and all(getattr(m, k) == v for k, v in match.items())
        ]

    def status(self) -> dict[str, Any]:
        return {i: c.status() for i, c in self.cores.items()}


# ---- builders ------------------------------------------------------------------------------


def make_store(
    entry_terms: Iterable[int] = (),
    *,
    term: int = 0,
    voted_for: str | None = None,
    committed: int = -1,
    tag: str = "e",
) -> MemoryStore:
    """A store holding one entry per item of ``entry_terms`` (body ``{tag}{index}``: the
    same terms and tag give byte-identical logs), with that term/vote and commit."""
    s = MemoryStore()
    for t in entry_terms:
        s.append_as_leader(t, [f"{tag}{s.ledger_end_index + 1}".encode()])
    s.save_term_vote(TermVote(term, voted_for))
    if committed >= 0:
        s.update_committed(committed)
    return s


def vote_req(
    frm: str,
    to: str,
    term: int,
    *,
    cand: str | None = None,
    end_index: int = -1,
    end_term: int = -1,
    req_id: int = 1,
    pre_vote: bool = False,
) -> VoteRequest:
    return VoteRequest(
        group=GROUP,
        local_id=frm,
        remote_id=to,
        term=term,
        req_id=req_id,
        leader_id=frm if cand is None else cand,
        ledger_end_index=end_index,
        ledger_end_term=end_term,
        pre_vote=pre_vote,
    )


def heartbeat(
    frm: str, to: str, term: int, *, leader: str | None = None, req_id: int = 1
) -> HeartBeatRequest:
    return HeartBeatRequest(
        group=GROUP,
        local_id=frm,
        remote_id=to,
        term=term,
        req_id=req_id,
        leader_id=frm if leader is None else leader,
    )


def push(
    frm: str,
    to: str,
    term: int,
    type_: PushType,
    *,
    req_id: int,
    commit_index: int = -1,
    **kw: Any,
) -> PushEntryRequest:
    return PushEntryRequest(
        group=GROUP,
        local_id=frm,
        remote_id=to,
        term=term,
        req_id=req_id,
        leader_id=frm,
        type=type_,
        commit_index=commit_index,
        **kw,
    )


def append_req(
    frm: str, to: str, term: int, source: MemoryStore, first: int, count: int, *, req_id: int
) -> PushEntryRequest:
    """An APPEND carrying ``source``'s raw entries ``first .. first + count - 1``."""
    raw, n, _ = source.read_batch(first, 1 << 30, count)
    assert n == count
    return push(
        frm, to, term, PushType.APPEND, req_id=req_id, first_index=first, count=n, entries=raw
    )
