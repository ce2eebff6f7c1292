"""The candidate: tallying answers, reading a round, the
NOT_READY → REVOTE_IMMEDIATELY handshake and campaigning after a restart."""

from __future__ import annotations

import random

import pytest

from dledger.core.elector_rounds import VoteRound
from dledger.core.messages import ParseResult, Role, VoteRequest, VoteResponse, VoteResult
from dledger.core.settings import CoreSettings

from .harness import GROUP, Cluster, make_store

NO_PRE_VOTE = CoreSettings(pre_vote=False)
SENTINEL_MS = 123_456

# ---- 1.8: every ParseResult branch, in order -------------------------------------------------

# (counters of a 3-node round at term 4, expected result, next vote time, role after).
# Each round also satisfies a *later* branch where a real round can, so the order shows.
BRANCHES = {
    # 1. a higher term was heard: beats "already has leader" (2) in the same round
    "1_known_max_term": (
        dict(known_max_term=9, all_num=3, valid_num=3, accepted_num=1, already_has_leader=True),
        ParseResult.WAIT_TO_VOTE_NEXT,
        "next",
        Role.CANDIDATE,
    ),
    # 2. someone knows a leader: wait an election timeout, even with a quorum of accepts
    "2_already_has_leader": (
        dict(all_num=3, valid_num=3, accepted_num=2, already_has_leader=True),
        ParseResult.WAIT_TO_REVOTE,
        "next+election_timeout",
        Role.CANDIDATE,
    ),
    # 3. too few valid answers (two UNKNOWN); also too few without the bigger logs (4)
    "3_no_valid_quorum": (
        dict(all_num=3, valid_num=1, accepted_num=0, bigger_ledger_num=1),
        ParseResult.WAIT_TO_REVOTE,
        "next",
        Role.CANDIDATE,
    ),
    # 4. most voters have a better log: back off longer (7 would also hold)
    "4_bigger_ledgers": (
        dict(all_num=3, valid_num=3, accepted_num=1, bigger_ledger_num=2),
        ParseResult.WAIT_TO_REVOTE,
        "next+max_vote_interval",
        Role.CANDIDATE,
    ),
    # 5. a quorum accepted: passed, although accepted + not ready (6) holds as well
    "5_passed": (
        dict(all_num=3, valid_num=3, accepted_num=2, not_ready_term_num=1),
        ParseResult.PASSED,
        "unchanged",
        Role.LEADER,
    ),
    # 6. accepted + not ready make a quorum: same term again at once, timer untouched
    "6_revote_immediately": (
        dict(all_num=2, valid_num=2, accepted_num=1, not_ready_term_num=1),
        ParseResult.REVOTE_IMMEDIATELY,
        "unchanged",
        Role.CANDIDATE,
    ),
    # 7. anything else (here: two ALREADY_VOTED)
    "7_wait_to_vote_next": (
        dict(all_num=3, valid_num=3, accepted_num=1),
        ParseResult.WAIT_TO_VOTE_NEXT,
        "next",
        Role.CANDIDATE,
    ),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_1_8_parse_vote_round_branch(branch: str) -> None:
    preset, expected, timer, role = BRANCHES[branch]
    counters = dict(preset)
    c = Cluster(3, stores={"n0": make_store(term=4)})
    core = c.cores["n0"]
    el, s = core.elector, core.settings
    now = c.now_ms = 1000
    known_max = int(counters.pop("known_max_term", 4))
    el.vote_round = VoteRound(
        term=4,
        req_id=99,
        deadline_ms=now + 300,
        known_max_term=known_max,
        **counters,  # type: ignore[arg-type]
    )
    el.next_time_to_request_vote_ms = SENTINEL_MS
    mirror = random.Random()
    mirror.setstate(core.rng.getstate())
    nxt = now + mirror.randint(s.min_vote_interval_ms, s.max_vote_interval_ms)

    el._parse_vote_round(now)

    assert el.last_parse_result is expected
    assert c.cores["n0"].elector.vote_round is None  # (not ``el``: mypy narrowed it)
    assert core.member_state.role is role
    assert core.member_state.curr_term == 4  # no branch changes the term itself
    assert core.member_state.known_max_term == max(known_max, 4)
    want = {
        "next": nxt,
        "next+election_timeout": nxt + s.election_timeout_ms,
        "next+max_vote_interval": nxt + s.max_vote_interval_ms,
        "unchanged": SENTINEL_MS,
    }[timer]
    assert el.next_time_to_request_vote_ms == want


def test_1_8_a_round_gone_stale_is_dropped_unread() -> None:
    """A heartbeat made the candidate a follower before the round closed."""
    c = Cluster(3, stores={"n0": make_store(term=4)})
    el = c.cores["n0"].elector
    el.vote_round = VoteRound(term=4, req_id=99, deadline_ms=300, known_max_term=4)
    el.vote_round.accepted_num = el.vote_round.valid_num = el.vote_round.all_num = 3
    c.cores["n0"].member_state.change_to_follower(4, "n1")
    el._parse_vote_round(c.now_ms)
    assert c.role("n0") is Role.FOLLOWER
    assert el.last_parse_result is ParseResult.WAIT_TO_REVOTE  # the initial value


# ---- 1.7: tallying real answers ------------------------------------------------------------


def open_round(c: Cluster) -> VoteRound:
    """Let n0 (alone: nothing gets through) start a real vote round; return it."""
    c.drop(lambda m: True)
    el = c.cores["n0"].elector
    assert c.tick_until(lambda: el.vote_round is not None, 1000, nodes=["n0"]) is not None
    assert el.vote_round is not None
    return el.vote_round


def answer(voter: str, r: VoteRound, result: VoteResult, term: int) -> VoteResponse:
    return VoteResponse(
        group=GROUP,
        local_id=voter,
        remote_id="n0",
        term=term,
        req_id=r.req_id,
        vote_result=result,
    )


def test_1_7_unknown_answers_are_not_valid_votes() -> None:
    c = Cluster(3, stores={"n0": make_store(term=4)})
    r = open_round(c)
    assert (r.term, r.all_num, r.accepted_num) == (4, 1, 1)  # its own vote
    c.inject(answer("n1", r, VoteResult.UNKNOWN, 4))
    c.inject(answer("n2", r, VoteResult.UNKNOWN, 4))
    assert (r.all_num, r.valid_num) == (3, 1)
    el = c.cores["n0"].elector
    assert el.vote_round is None  # every peer answered: the latch opened
    assert el.last_parse_result is ParseResult.WAIT_TO_REVOTE  # branch 3


def test_1_7_duplicate_and_foreign_answers_are_not_counted() -> None:
    c = Cluster(3, stores={"n0": make_store(term=4)})
    r = open_round(c)
    c.inject(answer("n1", r, VoteResult.REJECT_ALREADY_VOTED, 4))
    c.inject(answer("n1", r, VoteResult.ACCEPT, 4))  # a duplicate, however different
    stale = VoteResponse(
        group=GROUP,
        local_id="n2",
        remote_id="n0",
        term=4,
        req_id=r.req_id - 1,
        vote_result=VoteResult.ACCEPT,
    )
    c.inject(stale)  # an answer to an earlier round
    assert (r.all_num, r.accepted_num) == (2, 1)
    assert c.role("n0") is Role.CANDIDATE


def test_1_7_term_small_than_ledger_answer_moves_the_candidate_past_its_term() -> None:
    """The voter's ledger end term (6) beats even a quorum of accepts (branch 1); the
    next round adopts term 6, skipping pre-vote (a higher term is already known)."""
    c = Cluster(3, stores={"n0": make_store(term=4)})
    r = open_round(c)
    c.inject(answer("n1", r, VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, 6))
    c.inject(answer("n2", r, VoteResult.ACCEPT, 4))
    core = c.cores["n0"]
    assert core.elector.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
    assert (
        core.member_state.role,
        core.member_state.curr_term,
        core.member_state.known_max_term,
    ) == (Role.CANDIDATE, 4, 6)
    sent = len(c.sent)
    assert c.tick_until(lambda: len(c.sent) > sent, 1000, nodes=["n0"]) is not None
    reqs = [m for _, m in c.sent[sent:] if isinstance(m, VoteRequest)]
    assert reqs and all(m.term == 6 and not m.pre_vote for m in reqs)


# ---- the two-round handshake ---------------------------------------------------------


def test_le_30_not_ready_voters_catch_up_and_the_same_term_revote_elects() -> None:
    # n0 is at term 5, the voters at 0: the first round can only get TERM_NOT_READY
    c = Cluster(3, settings=NO_PRE_VOTE, stores={"n0": make_store(term=5)})
    el = c.cores["n0"].elector
    waited = c.tick_until(
        lambda: el.last_parse_result is ParseResult.REVOTE_IMMEDIATELY, 1000, nodes=["n0"]
    )
    assert waited is not None
    first = c.sent_of(VoteResponse, remote_id="n0")
    assert {(m.local_id, m.vote_result, m.term) for m in first} == {
        ("n1", VoteResult.REJECT_TERM_NOT_READY, 0),
        ("n2", VoteResult.REJECT_TERM_NOT_READY, 0),
    }
    assert c.role("n0") is Role.CANDIDATE and c.term("n0") == 5
    # one tick for everyone: the voters adopt term 5, n0 asks again in term 5
    c.tick()
    assert c.leader() == "n0" and c.term("n0") == 5
    second = c.sent_of(VoteResponse, remote_id="n0")[len(first) :]
    assert {(m.local_id, m.vote_result, m.term) for m in second} >= {
        ("n1", VoteResult.ACCEPT, 5),
        ("n2", VoteResult.ACCEPT, 5),
    }
    assert {m.term for m in c.sent_of(VoteRequest, local_id="n0")} == {5}  # never raised
    assert all(c.stores[v].load_term_vote().voted_for == "n0" for v in ("n1", "n2"))


# ---- restarting after voting for oneself ----------------------------------------------------


def test_raft_5_3_a_node_that_voted_for_itself_campaigns_in_a_new_term_after_restart() -> None:
    """It may have led that term and written entries in it; leading the same term twice
    could put two different entries at one (index, term)."""
    c = Cluster(1, stores={"n0": make_store((1, 3), term=3, voted_for="n0")})
    assert c.cores["n0"].elector.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT
    c.wait_leader()
    assert c.term("n0") == 4
    assert c.stores["n0"].term_at(2) == 4  # the NOOP of the new term


@pytest.mark.parametrize("pre_vote", [True, False])
def test_raft_5_3_the_whole_group_restarting_after_a_self_vote_never_relead_that_term(
    pre_vote: bool,
) -> None:
    stores = {n: make_store((1, 3), term=3, voted_for="n0") for n in ("n0", "n1", "n2")}
    c = Cluster(3, seed=7, settings=CoreSettings(pre_vote=pre_vote), stores=stores)
    lead = c.wait_leader()
    assert c.term(lead) > 3
    assert not [rc for _, _, rc in c.roles if rc.role is Role.LEADER and rc.term <= 3]
    assert all(m.term > 3 for m in c.sent_of(VoteRequest, local_id="n0"))
