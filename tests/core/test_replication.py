"""Replication: the dispatcher's COMPARE → TRUNCATE → APPEND, the
follower's entry handler, and the DLedger bugs not copied.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dledger.codes import DLedgerCode
from dledger.core.dispatcher import DispatcherState, PendingPush
from dledger.core.messages import (
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    RaftMessage,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.core.settings import CoreSettings
from dledger.store import MAGIC_NOOP, MemoryStore

from .harness import GROUP, Cluster, append_req, heartbeat, make_store, push, vote_req

ENTRY_BYTES = 148  # 48-byte header + the 100-byte bodies used below


def pushes(c: Cluster, to: str, type_: PushType, since: int = 0) -> list[PushEntryRequest]:
    return [
        m
        for _, m in c.sent[since:]
        if isinstance(m, PushEntryRequest) and m.remote_id == to and m.type is type_
    ]


def is_push(to: str, type_: PushType) -> Callable[[RaftMessage], bool]:
    def match(m: RaftMessage) -> bool:
        return isinstance(m, PushEntryRequest) and m.remote_id == to and m.type is type_

    return match


def same_log(a: MemoryStore, b: MemoryStore) -> bool:
    if a.ledger_end_index != b.ledger_end_index:
        return False
    return all(a.get(i) == b.get(i) for i in range(a.ledger_end_index + 1))


def with_stale_follower(
    leader_terms: tuple[int, ...],
    stale_terms: tuple[int, ...],
    *,
    term: int,
    voted_for: str,
    committed: int = -1,
    settings: CoreSettings | None = None,
) -> tuple[Cluster, str]:
    """n0 and n1 hold ``leader_terms``, n2 ``stale_terms`` (the same bodies where the
    terms agree). n0 or n1 is elected while n2 is cut off, then the links heal."""
    stores = {
        n: make_store(terms, term=term, voted_for=voted_for, committed=committed)
        for n, terms in (("n0", leader_terms), ("n1", leader_terms), ("n2", stale_terms))
    }
    c = Cluster(3, seed=1, settings=settings, stores=stores)
    c.isolate("n2")
    lead = c.wait_leader()
    c.heal()
    return c, lead


def lagging_follower(settings: CoreSettings, entries: int) -> tuple[Cluster, str, str, int]:
    """A settled 3-node group whose follower f missed ``entries`` entries; the links
    have just healed. Returns (cluster, leader, f, len(cluster.sent) at the heal)."""
    c = Cluster(3, seed=2, settings=settings)
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    c.isolate(f)
    for k in range(entries // 5):
        c.propose([bytes([k]) * 100] * 5)
    c.heal()
    return c, lead, f, len(c.sent)


# ---- real batches ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_entries", "max_bytes", "batch"),
    [(8, 1 << 20, 8), (1024, 3 * ENTRY_BYTES + 10, 3)],
    ids=["max_push_entries", "max_push_bytes"],
)
def test_cv_35_a_lagging_follower_gets_multi_entry_batches_within_the_bounds(
    max_entries: int, max_bytes: int, batch: int
) -> None:
    s = CoreSettings(max_push_entries=max_entries, max_push_bytes=max_bytes)
    c, lead, f, mark = lagging_follower(s, 60)
    assert c.tick_until(lambda: same_log(c.stores[lead], c.stores[f]), 5000) is not None
    sent = pushes(c, f, PushType.APPEND, mark)
    assert max(m.count for m in sent) == batch  # full batches, not one entry each
    assert all(m.count <= max_entries and len(m.entries) <= max_bytes for m in sent)
    assert len(sent) <= 60 // batch + 2


# ---- the flow-control quota counts bytes ------------------------------------------------


def test_cv_34_the_push_quota_for_a_lagging_follower_counts_bytes_per_second() -> None:
    quota = 1000  # bytes per second: 7 entries of 148 bytes (the last one overshoots)
    s = CoreSettings(
        max_push_entries=1, peer_push_quota_bytes_per_s=quota, peer_push_throttle_entries=5
    )
    c, lead, f, mark = lagging_follower(s, 60)
    took = c.tick_until(lambda: same_log(c.stores[lead], c.stores[f]), 20_000)
    assert took is not None
    end = c.stores[lead].ledger_end_index
    per_second: dict[int, list[PushEntryRequest]] = {}
    for t, m in c.sent[mark:]:
        if not (isinstance(m, PushEntryRequest) and is_push(f, PushType.APPEND)(m)):
            continue
        if end - m.first_index > 5:  # the follower lagged: the quota applied
            per_second.setdefault(t // 1000, []).append(m)
    assert len(per_second) >= 5
    for batch in per_second.values():
        assert sum(len(m.entries) for m in batch) <= quota + ENTRY_BYTES
    assert max(len(b) for b in per_second.values()) == 7  # not 1000 entries a second
    assert took >= 6000


def test_cv_34_without_a_quota_the_same_follower_catches_up_at_once() -> None:
    """The control: the slow catch-up above is the quota's doing."""
    s = CoreSettings(max_push_entries=1, peer_push_throttle_entries=5)
    c, lead, f, _ = lagging_follower(s, 60)
    took = c.tick_until(lambda: same_log(c.stores[lead], c.stores[f]), 20_000)
    assert took is not None and took <= 1100  # one push timeout, then everything


# ---- every change to COMPARE resets the dispatcher --------------------------------------


@pytest.mark.parametrize(
    "state",
    [DispatcherState.TRUNCATE, DispatcherState.INSTALL_SNAPSHOT, DispatcherState.APPEND],
)
def test_cv_36_change_to_compare_from_any_state_resets_write_index_and_pending(
    state: DispatcherState,
) -> None:
    c = Cluster(3, seed=0)
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    d = c.cores[lead].dispatchers[f]
    d.state, d.write_index = state, 0
    d.pending[0] = PendingPush(0, 1, 0, c.now_ms, 1)
    d.change_state(DispatcherState.COMPARE)
    assert d.state is DispatcherState.COMPARE
    assert d.write_index == c.stores[lead].ledger_end_index + 1
    assert d.pending == {} and d.control is None


def test_cv_36_a_refused_truncate_compares_again_from_the_leaders_end() -> None:
    c, lead = with_stale_follower((1,) * 10, (1, 1), term=1, voted_for="n0")
    c.drop(is_push("n2", PushType.TRUNCATE))
    d = c.cores[lead].dispatchers["n2"]
    assert c.tick_until(lambda: d.state is DispatcherState.TRUNCATE, 2000) is not None
    assert d.write_index == 2 and d.control is not None  # compare matched at index 1
    c.inject(
        PushEntryResponse(
            group=GROUP,
            local_id="n2",
            remote_id=lead,
            term=c.term(lead),
            req_id=d.control.req_id,
            code=DLedgerCode.INCONSISTENT_STATE,
            type=PushType.TRUNCATE,
        )
    )
    end = c.stores[lead].ledger_end_index
    assert (d.state, d.write_index) == (DispatcherState.COMPARE, end + 1)
    mark = len(c.sent)
    c.tick(100)  # past error_backoff_ms
    assert pushes(c, "n2", PushType.COMPARE, mark)[0].pre_log_index == end


# ---- an (almost) empty leader log still cleans a stale follower -----------------------


def test_cv_41_a_leader_with_only_its_noop_compares_and_truncates_a_stale_follower() -> None:
    c, lead = with_stale_follower((), (1, 1, 1), term=1, voted_for="n2")
    leader_store = c.stores[lead]
    assert leader_store.ledger_end_index == 0  # nothing but the NOOP
    assert c.tick_until(lambda: same_log(leader_store, c.stores["n2"]), 3000) is not None
    answers = c.sent_of(PushEntryResponse, local_id="n2", type=PushType.COMPARE)
    assert [(m.code, m.x_term, m.x_index) for m in answers] == [
        (DLedgerCode.INCONSISTENT_STATE, 1, 0),  # n2's entry 0 is of term 1, not the NOOP's
        (DLedgerCode.SUCCESS, -1, -1),  # compared before the first entry: always a match
    ]
    assert {(m.pre_log_index, m.pre_log_term) for m in pushes(c, "n2", PushType.COMPARE)} == {
        (0, c.term(lead)),
        (-1, -1),
    }
    assert [m.pre_log_index for m in pushes(c, "n2", PushType.TRUNCATE)] == [0]
    e = c.stores["n2"].get(0)
    assert (e.magic, e.term) == (MAGIC_NOOP, c.term(lead))


# ---- fast backup: TRUNCATE never removes entries the leader also holds -----------------------


@pytest.mark.parametrize(
    ("leader_terms", "stale_terms", "committed", "x", "cut_from"),
    [
        # the follower has more of term 1 than the leader: DLedger would jump to x_index 0
        ((1,) * 5, (1,) * 7, 4, (1, 0), 5),
        # the leader never had the follower's term 2: compare just below x_index
        ((1, 1, 1, 3), (1, 1, 1, 2, 2), 2, (2, 3), 3),
    ],
    ids=["leader_has_x_term", "leader_lacks_x_term"],
)
def test_rp_14_fast_backup_never_truncates_an_entry_the_leader_holds(
    leader_terms: tuple[int, ...],
    stale_terms: tuple[int, ...],
    committed: int,
    x: tuple[int, int],
    cut_from: int,
) -> None:
    term = max(leader_terms)
    c, lead = with_stale_follower(
        leader_terms, stale_terms, term=term, voted_for="n0", committed=committed
    )
    assert c.tick_until(lambda: same_log(c.stores[lead], c.stores["n2"]), 3000) is not None
    conflicts = [
        m
        for m in c.sent_of(PushEntryResponse, local_id="n2", type=PushType.COMPARE)
        if m.code is DLedgerCode.INCONSISTENT_STATE
    ]
    assert [(m.x_term, m.x_index) for m in conflicts] == [x]
    # TRUNCATE right after the last shared entry; the committed prefix is untouched
    # (the follower asserts that, so the jump to x_index would fail loudly here)
    assert [m.pre_log_index for m in pushes(c, "n2", PushType.TRUNCATE)] == [cut_from]
    assert cut_from > committed


# ---- stale TRUNCATE -----------------------------------------------------------------------------


def follower_of_n1(entry_terms: tuple[int, ...], term: int) -> Cluster:
    c = Cluster(3, stores={"n0": make_store(entry_terms, term=term)})
    c.inject(heartbeat("n1", "n0", term))
    assert (c.role("n0"), c.cores["n0"].member_state.leader_id) == (Role.FOLLOWER, "n1")
    return c


def test_rp_30_a_truncate_older_than_a_push_already_taken_is_ignored() -> None:
    c = follower_of_n1((1, 1, 1), 2)
    store = c.stores["n0"]
    out = c.inject(
        push("n1", "n0", 2, PushType.COMPARE, req_id=10, pre_log_index=0, pre_log_term=1)
    )
    assert [m.code for m in out if isinstance(m, PushEntryResponse)] == [DLedgerCode.SUCCESS]
    # a TRUNCATE the leader sent before that COMPARE, delivered late
    assert c.inject(push("n1", "n0", 2, PushType.TRUNCATE, req_id=7, pre_log_index=1)) == []
    assert store.ledger_end_index == 2
    out = c.inject(push("n1", "n0", 2, PushType.TRUNCATE, req_id=11, pre_log_index=1))
    assert [m.code for m in out if isinstance(m, PushEntryResponse)] == [DLedgerCode.SUCCESS]
    assert store.ledger_end_index == 0


# ---- divergence: a leader that contradicts a committed entry is refused, loudly ----------


def _committed_follower() -> Cluster:
    """n0 holds entries 0..3 of term 1, committed up to 2, and follows n1 in term 3."""
    c = Cluster(3, stores={"n0": make_store((1, 1, 1, 1), term=3, committed=2)})
    c.inject(heartbeat("n1", "n0", 3))
    assert c.cores["n0"].member_state.leader_id == "n1"
    assert c.cores["n0"].divergence is None and c.cores["n0"].status()["diverged"] is None
    return c


def test_a_compare_that_contradicts_a_committed_entry_marks_the_node_diverged() -> None:
    """The state issue 33's reproduction ends in: a leader elected without entries this
    node committed. The answer is as before (INCONSISTENT_STATE, nothing truncated) but
    the node now says so: status, an ERROR event, once, with a count after."""
    c = _committed_follower()
    for req_id in (5, 6):
        out = c.inject(
            push("n1", "n0", 3, PushType.COMPARE, req_id=req_id, pre_log_index=2, pre_log_term=2)
        )
        assert [m.code for m in out if isinstance(m, PushEntryResponse)] == [
            DLedgerCode.INCONSISTENT_STATE
        ]
    d = c.cores["n0"].status()["diverged"]
    assert d is not None and (d["index"], d["leader_id"], d["leader_term"]) == (2, "n1", 3)
    assert d["committed_index"] == 2 and d["count"] == 2
    assert len(c.events_of("diverged", "n0")) == 1
    assert c.stores["n0"].ledger_end_index == 3  # nothing dropped


def test_a_compare_that_contradicts_an_uncommitted_entry_is_ordinary() -> None:
    c = _committed_follower()
    c.inject(push("n1", "n0", 3, PushType.COMPARE, req_id=5, pre_log_index=3, pre_log_term=2))
    assert c.cores["n0"].divergence is None and c.events_of("diverged") == []


def test_a_truncate_of_committed_entries_marks_the_node_diverged() -> None:
    c = _committed_follower()
    out = c.inject(push("n1", "n0", 3, PushType.TRUNCATE, req_id=5, pre_log_index=1))
    assert [m.code for m in out if isinstance(m, PushEntryResponse)] == [
        DLedgerCode.INCONSISTENT_STATE
    ]
    d = c.cores["n0"].divergence
    assert d is not None and d["index"] == 1 and "truncate" in d["why"]
    assert c.stores["n0"].ledger_end_index == 3


def test_rp_30_a_new_leader_starts_its_own_request_numbering() -> None:
    c = follower_of_n1((1, 1, 1), 2)
    c.inject(push("n1", "n0", 2, PushType.COMPARE, req_id=50, pre_log_index=0, pre_log_term=1))
    c.inject(heartbeat("n2", "n0", 3))  # n2 leads term 3
    c.tick(nodes=["n0"])
    c.inject(heartbeat("n2", "n0", 3))
    assert (c.role("n0"), c.cores["n0"].member_state.leader_id) == (Role.FOLLOWER, "n2")
    out = c.inject(push("n2", "n0", 3, PushType.TRUNCATE, req_id=1, pre_log_index=1))
    assert [m.code for m in out if isinstance(m, PushEntryResponse)] == [DLedgerCode.SUCCESS]
    assert c.stores["n0"].ledger_end_index == 0


# ---- the follower answers every APPEND it drops --------------------------------

SOURCE = make_store((1,) * 8)  # the leader's log the hand-made APPENDs carry


@pytest.mark.parametrize(
    ("type_", "pre_log_index", "pre_log_term"),
    [(PushType.COMPARE, -1, -1), (PushType.TRUNCATE, 0, -1)],
    ids=["compare", "truncate"],
)
def test_cv_37_compare_or_truncate_answers_the_held_appends_it_drops(
    type_: PushType, pre_log_index: int, pre_log_term: int
) -> None:
    c = follower_of_n1((), 2)
    held = [append_req("n1", "n0", 2, SOURCE, first, 1, req_id=first) for first in (3, 5)]
    for req in held:
        assert c.inject(req) == []  # out of order: held, unanswered
    assert sorted(c.cores["n0"].handler.write_requests) == [3, 5]
    out = c.inject(
        push("n1", "n0", 2, type_, req_id=9, pre_log_index=pre_log_index, pre_log_term=pre_log_term)
    )
    answers = [(m.type, m.index, m.req_id, m.code) for m in out if isinstance(m, PushEntryResponse)]
    assert answers == [
        (PushType.APPEND, 3, 3, DLedgerCode.INCONSISTENT_STATE),
        (PushType.APPEND, 5, 5, DLedgerCode.INCONSISTENT_STATE),
        (type_, -1, 9, DLedgerCode.SUCCESS),
    ]
    assert c.cores["n0"].handler.write_requests == {}


def test_cv_40_the_fast_forward_answer_removes_the_request_it_answers() -> None:
    c = follower_of_n1((), 2)
    period = c.settings.fast_forward_check_ms
    for first in (3, 5):
        c.inject(append_req("n1", "n0", 2, SOURCE, first, 1, req_id=first))
    for _ in range(3 * period // 100):
        c.tick(100, nodes=["n0"])
        c.inject(heartbeat("n1", "n0", 2, req_id=1000 + c.now_ms))  # n0 stays a follower
    answered = [
        (t, m.index, m.code)
        for t, m in c.sent
        if isinstance(m, PushEntryResponse) and m.type is PushType.APPEND
    ]
    # the lowest first, one per period, each answered once and gone from the map
    assert answered == [
        (period, 3, DLedgerCode.INCONSISTENT_STATE),
        (2 * period, 5, DLedgerCode.INCONSISTENT_STATE),
    ]
    assert c.cores["n0"].handler.write_requests == {}


# ---- held APPENDs: bounded in number and in bytes (issue 17) -----------------------------------

BIG = MemoryStore()
BIG.append_as_leader(1, [bytes([i]) * 1000 for i in range(6)])
BIG_ENTRY_BYTES = 1048


def follower_with(settings: CoreSettings) -> Cluster:
    c = Cluster(3, settings=settings, stores={"n0": make_store((), term=2)})
    c.inject(heartbeat("n1", "n0", 2))
    assert (c.role("n0"), c.cores["n0"].member_state.leader_id) == (Role.FOLLOWER, "n1")
    return c


def append_answers(c: Cluster, *firsts: int) -> list[tuple[int, DLedgerCode]]:
    out = []
    for first in firsts:
        out += c.inject(append_req("n1", "n0", 2, BIG, first, 1, req_id=10 + first))
    return [(m.index, m.code) for m in out if isinstance(m, PushEntryResponse)]


def test_out_of_order_appends_are_held_within_a_byte_budget() -> None:
    """Before: only their count was bounded (256 frames of up to 64 MiB each)."""
    c = follower_with(CoreSettings(max_follower_pending_bytes=2 * BIG_ENTRY_BYTES))
    handler = c.cores["n0"].handler
    assert append_answers(c, 2, 3) == []  # held: ahead of the log
    assert handler.held_bytes == 2 * BIG_ENTRY_BYTES
    assert append_answers(c, 4) == [(4, DLedgerCode.PUSH_REQUEST_IS_FULL)]
    assert sorted(handler.write_requests) == [2, 3]
    # the next in line is taken whatever is held, and frees what waited for it
    assert append_answers(c, 0, 1) == [(i, DLedgerCode.SUCCESS) for i in range(4)]
    assert c.stores["n0"].ledger_end_index == 3
    assert (handler.write_requests, handler.held_bytes) == ({}, 0)


def test_the_next_append_in_line_is_taken_when_the_held_count_is_full() -> None:
    c = follower_with(CoreSettings(max_follower_pending_pushes=1))
    assert append_answers(c, 2) == []
    assert append_answers(c, 3) == [(3, DLedgerCode.PUSH_REQUEST_IS_FULL)]
    assert append_answers(c, 0, 1) == [(i, DLedgerCode.SUCCESS) for i in range(3)]


def test_dropped_held_appends_give_their_bytes_back() -> None:
    c = follower_with(CoreSettings())
    handler = c.cores["n0"].handler
    append_answers(c, 2, 4)
    assert handler.held_bytes == 2 * BIG_ENTRY_BYTES
    c.inject(push("n1", "n0", 2, PushType.COMPARE, req_id=90, pre_log_index=-1, pre_log_term=-1))
    assert (handler.write_requests, handler.held_bytes) == ({}, 0)


# ---- a damaged entry on the leader: no tight loop (issue 17) ------------------------------------


def damaged_leader() -> tuple[Cluster, str, str, int, bytes]:
    """A follower cut off while the leader commits 3 entries, then the leader's copy of
    the one before last damaged (a flipped bit in its body, as a bad sector would) and
    the links healed: (cluster, leader, follower, damaged index, the intact copy)."""
    c = Cluster(3, seed=4)
    lead = c.wait_leader()
    lag = next(i for i in c.ids if i != lead)
    c.isolate(lag)
    c.propose([b"x" * 100 for _ in range(3)])
    store = c.stores[lead]
    assert c.tick_until(lambda: store.committed_index == store.ledger_end_index) is not None
    damaged = store.ledger_end_index - 1
    k = damaged - store.ledger_begin_index
    intact = store._entries[k]
    store._entries[k] = intact[:-1] + bytes([intact[-1] ^ 0xFF])
    c.heal()
    return c, lead, lag, damaged, intact


def test_a_damaged_entry_on_the_leader_is_pushed_with_a_growing_backoff_and_named() -> None:
    """Before: the follower refused the batch (body CRC), the leader compared, truncated
    and pushed it again at once, round after round, logging only DEBUG lines (here: the
    network never went quiet). Now from the second refusal in a row it backs off
    (doubling) and names its damaged entry."""
    c, lead, lag, damaged, _ = damaged_leader()
    since = len(c.sent)
    c.tick(3000)
    carrying = [
        m
        for m in pushes(c, lag, PushType.APPEND, since)
        if m.first_index <= damaged < m.first_index + m.count
    ]
    # refused, compared, truncated, refused: then 50, 100, 200, ... ms apart (cap 5 s)
    assert 2 <= len(carrying) <= 10, len(carrying)
    events = c.events_of("append_refused_again", lead)
    assert events and {e["damaged_here"] for e in events} == {damaged}
    assert [e["backoff_ms"] for e in events[:3]] == [50, 100, 200]
    assert c.events_of("append_refused_damaged", lag)
    assert c.stores[lag].ledger_end_index < damaged


def test_a_refused_append_that_is_then_taken_resets_the_backoff() -> None:
    c, lead, lag, damaged, intact = damaged_leader()
    assert c.tick_until(lambda: bool(c.events_of("append_refused_again", lead)), 3000)
    store = c.stores[lead]
    store._entries[damaged - store.ledger_begin_index] = intact  # an operator restored it
    assert c.tick_until(lambda: same_log(store, c.stores[lag]), 10_000) is not None
    assert c.events_of("peer_append_recovered", lead)
    assert c.cores[lead].dispatchers[lag].refusals == 0


# ---- an ack covers every batch up to its watermark --------------------------------------


def test_cv_39_an_ack_drops_the_pending_batches_at_or_below_its_watermark() -> None:
    c = Cluster(3, seed=4)
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    c.drop(lambda m: isinstance(m, PushEntryResponse) and m.local_id == f)
    proposals = [c.propose([bytes([k]) * 100] * 2) for k in range(3)]
    a, b, last = (p.first_index for p in proposals)
    d = c.cores[lead].dispatchers[f]
    assert sorted(d.pending) == [a, b, last]
    # a wider batch ending exactly at b's last entry (as a go-back-N resend might send)
    d.pending[a - 1] = PendingPush(a - 1, b + 3 - a, c.term(lead), c.now_ms, 999)
    (ack,) = [
        m
        for m in c.dropped
        if isinstance(m, PushEntryResponse) and m.index == b and m.local_id == f
    ]
    c.heal()
    c.inject(ack)
    assert sorted(d.pending) == [last]
    assert d.match_index == b + 1
    assert c.cores[lead].checker.watermark(f, c.term(lead)) == b + 1


# ---- votes read the ledger end after a truncate ----------------------------------------


def test_cv_32_votes_use_the_ledger_end_left_by_a_follower_truncate() -> None:
    c, lead = with_stale_follower((1,) * 5, (1,) * 7, term=1, voted_for="n0")
    c.drop(is_push("n2", PushType.APPEND))
    assert c.tick_until(lambda: bool(pushes(c, "n2", PushType.TRUNCATE)), 2000) is not None
    state = c.cores["n2"].member_state
    assert (state.ledger_end_index, state.ledger_end_term) == (4, 1)  # was (6, 1)
    # a candidate with (5, 1) is as up to date now; with the stale end it was not
    term = c.term(lead)
    out = c.inject(vote_req("n1", "n2", term + 1, end_index=5, end_term=1, req_id=77))
    (resp,) = [m for m in out if isinstance(m, VoteResponse)]
    assert resp.vote_result is VoteResult.REJECT_TERM_NOT_READY  # past the log check
    # and its own requests carry the fresh end
    c.isolate("n2")
    mark = len(c.sent)
    asked = c.tick_until(lambda: bool(c.sent_of(VoteRequest, since=mark, local_id="n2")), 3000)
    assert asked is not None
    reqs = c.sent_of(VoteRequest, since=mark, local_id="n2")
    assert {(m.ledger_end_index, m.ledger_end_term) for m in reqs} == {(4, 1)}
