"""The collaborators of the core run on their narrow hosts alone (``dledger.core.host``):
the elector, an entry dispatcher and the entry handler each driven here with a small fake
host, a ``MemberState`` and a store, and no ``DLedgerCore`` at all. If one of them starts
reaching for more of the node, its fake host lacks it and these tests fail."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from dledger.codes import DLedgerCode
from dledger.core.dispatcher import DispatcherState, EntryDispatcher
from dledger.core.elector import LeaderElector
from dledger.core.handler import EntryHandler
from dledger.core.member_state import MemberState
from dledger.core.membership import Configuration
from dledger.core.messages import (
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    RaftMessage,
    Role,
    VoteRequest,
    VoteResult,
)
from dledger.core.settings import CoreSettings
from dledger.core.snapshot import Snapshot
from dledger.store import MemoryStore

from .harness import GROUP, append_req, make_store

PEERS = {"n0": "mem://n0", "n1": "mem://n1", "n2": "mem://n2"}


class FakeHost:
    """Every host of ``dledger.core.host`` at once, recording what it is asked."""

    def __init__(self) -> None:
        self.sent: list[RaftMessage] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.req_seq = 0
        self.installing: Snapshot | None = None
        self.snapshot: Snapshot | None = None
        self.role_changes: list[int] = []
        self.watermarks: list[tuple[int, str, int]] = []
        self.commits: list[int] = []
        self.writes = 0
        self.store: MemoryStore | None = None

    def send(self, msg: RaftMessage) -> None:
        self.sent.append(msg)

    def log_event(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))

    def next_req_id(self) -> int:
        self.req_seq += 1
        return self.req_seq

    def role_changed(self, now_ms: int) -> None:
        self.role_changes.append(now_ms)

    def update_peer_watermark(self, term: int, peer_id: str, index: int) -> None:
        self.watermarks.append((term, peer_id, index))

    def wrote_entries(self) -> None:
        self.writes += 1

    def commit_to(self, index: int) -> None:
        assert self.store is not None
        self.store.update_committed(index)
        self.commits.append(index)

    def begin_install(self, snap: Snapshot) -> None:
        self.installing = snap

    def diverged(self, why: str, index: int, leader_term: int) -> None:
        self.events.append(("diverged", {"why": why, "index": index}))


def _member_state(self_id: str, store: MemoryStore) -> MemberState:
    return MemberState(GROUP, self_id, Configuration.of(PEERS), store, store.load_term_vote())


def test_elector_campaigns_through_its_host() -> None:
    store = make_store([1, 1], term=1)
    state, host = _member_state("n0", store), FakeHost()
    el = LeaderElector(state, CoreSettings(pre_vote=False), random.Random(0), host)
    for now_ms in range(0, 2000, 10):
        el.maintain(now_ms)
        if host.sent:
            break
    votes = [m for m in host.sent if isinstance(m, VoteRequest)]
    assert sorted(v.remote_id for v in votes) == ["n1", "n2"]
    assert {v.req_id for v in votes} == {host.req_seq}  # numbered by the host
    assert votes[0].term == 1 and state.curr_vote_for == "n0"  # voted for itself
    # a vote request from a higher term: adopt it at the next beat, without a round
    result, _ = el.handle_vote(
        VoteRequest(
            group=GROUP,
            local_id="n1",
            remote_id="n0",
            term=5,
            req_id=1,
            leader_id="n1",
            ledger_end_index=1,
            ledger_end_term=1,
        ),
        now_ms=3000,
    )
    assert result is VoteResult.REJECT_TERM_NOT_READY and el.need_increase_term_immediately
    assert state.role is Role.CANDIDATE and state.known_max_term == 5


def test_handler_appends_answers_and_commits_through_its_host() -> None:
    leader_log = make_store([1, 1, 1])
    store = make_store(term=1)
    state, host = _member_state("n1", store), FakeHost()
    host.store = store
    state.change_to_follower(1, "n0")
    handler = EntryHandler(state, store, CoreSettings(), host)
    req = append_req("n0", "n1", 1, leader_log, 0, 3, req_id=7)
    handler.handle_push(replace(req, commit_index=1), now_ms=0)
    assert store.ledger_end_index == 2 and host.writes == 1
    (answer,) = host.sent
    assert isinstance(answer, PushEntryResponse)
    assert (answer.code, answer.req_id, answer.index) == (DLedgerCode.SUCCESS, 7, 0)
    assert host.commits == [1]  # min(leader's commit, our end)


def test_dispatcher_compares_then_reports_the_match_to_its_host() -> None:
    store = make_store([1, 1, 2], term=2)
    state, host = _member_state("n0", store), FakeHost()
    state.change_to_leader(2)
    d = EntryDispatcher("n1", state, store, CoreSettings(), host)
    d.maintain(now_ms=0, idle_commit=False)
    (compare,) = host.sent
    assert isinstance(compare, PushEntryRequest) and compare.type is PushType.COMPARE
    assert (compare.pre_log_index, compare.pre_log_term) == (2, 2)  # its last entry
    d.on_response(
        PushEntryResponse(
            group=GROUP,
            local_id="n1",
            remote_id="n0",
            term=2,
            req_id=compare.req_id,
            code=DLedgerCode.SUCCESS,
            type=PushType.COMPARE,
            index=-1,
            count=0,
            begin_index=0,
            end_index=2,
        ),
        now_ms=10,
    )
    assert host.watermarks == [(2, "n1", 2)]  # filed under the entry's term
    assert d.state is DispatcherState.TRUNCATE
    assert isinstance(host.sent[-1], PushEntryRequest) and host.sent[-1].type is PushType.TRUNCATE
