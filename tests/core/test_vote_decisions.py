"""The voter: ``handleVote``'s decision order.

Each test puts one core (n0 of n0..n2) in a precise state, steps a hand-made
``VoteRequest`` into it and reads the ``VoteResponse`` it sends. Where a later rule would
give a different answer, the state is built so that it also holds: the test then proves
the *order*, not just the code.
"""

from __future__ import annotations

from dledger.core.messages import Role, VoteResponse, VoteResult

from .harness import Cluster, heartbeat, make_store, vote_req


def answer(
    c: Cluster,
    term: int,
    *,
    frm: str = "n1",
    cand: str | None = None,
    end_index: int = -1,
    end_term: int = -1,
    req_id: int = 1,
) -> VoteResponse:
    """Step a vote request from ``frm`` into n0; return n0's answer."""
    req = vote_req(
        frm, "n0", term, cand=cand, end_index=end_index, end_term=end_term, req_id=req_id
    )
    (resp,) = [m for m in c.inject(req) if isinstance(m, VoteResponse)]
    assert (resp.local_id, resp.remote_id, resp.req_id) == ("n0", frm, req_id)
    return resp


def cluster(
    entry_terms: tuple[int, ...] = (), term: int = 0, voted_for: str | None = None
) -> Cluster:
    """n0 holds ``entry_terms`` and the term/vote given; n1 and n2 are empty."""
    return Cluster(3, stores={"n0": make_store(entry_terms, term=term, voted_for=voted_for)})


def test_le_06_a_node_starts_as_candidate_with_the_stored_term_and_vote() -> None:
    c = cluster((1, 2), term=4, voted_for="n2")
    state = c.cores["n0"].member_state
    assert (state.role, state.curr_term, state.curr_vote_for, state.leader_id) == (
        Role.CANDIDATE,
        4,
        "n2",
        None,
    )
    assert Cluster(1).role("n0") is Role.CANDIDATE


def test_le_21_unknown_candidate_is_rejected_first() -> None:
    # n0's log is longer and its term higher: the later rules would reject too, differently
    c = cluster((1, 1, 1), term=5)
    resp = answer(c, 1, cand="n9", end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_UNKNOWN_LEADER
    assert resp.term == 5


def test_le_22_a_candidate_using_the_voters_own_id_is_rejected() -> None:
    c = cluster((1, 1, 1), term=5)
    resp = answer(c, 1, cand="n0", end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_UNEXPECTED_LEADER


def test_le_23_older_last_log_term_is_rejected_before_any_term_comparison() -> None:
    c = cluster((1, 2), term=2)
    # a higher request term would give TERM_NOT_READY, were the log not checked first
    resp = answer(c, 9, end_index=5, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_EXPIRED_LEDGER_TERM
    state = c.cores["n0"].member_state
    assert (state.role, state.curr_term, state.known_max_term) == (Role.CANDIDATE, 2, 2)
    assert not c.cores["n0"].elector.need_increase_term_immediately


def test_le_23_same_last_term_but_shorter_log_is_rejected() -> None:
    c = cluster((1, 2, 2), term=2)
    resp = answer(c, 9, end_index=1, end_term=2)
    assert resp.vote_result is VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert c.term("n0") == 2


def test_le_24_lower_vote_term_is_rejected_with_the_voters_term() -> None:
    c = cluster((1,), term=5)
    resp = answer(c, 4, end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_EXPIRED_VOTE_TERM
    assert resp.term == 5


def test_le_25_voted_for_another_without_a_leader_is_already_voted() -> None:
    c = cluster((1,), term=3, voted_for="n2")
    resp = answer(c, 3, end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_VOTED
    assert c.cores["n0"].member_state.curr_vote_for == "n2"


def test_le_25_voted_for_another_with_a_known_leader_is_already_has_leader() -> None:
    c = cluster((1,), term=3, voted_for="n2")
    c.inject(heartbeat("n2", "n0", 3))  # n2 leads term 3: n0 follows it
    assert (c.role("n0"), c.cores["n0"].member_state.leader_id) == (Role.FOLLOWER, "n2")
    resp = answer(c, 3, end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_HAS_LEADER


def test_le_25_the_same_candidate_asking_again_is_accepted_again() -> None:
    c = cluster((1,), term=3, voted_for="n1")
    resp = answer(c, 3, end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.ACCEPT


def test_le_26_higher_term_vote_gets_term_not_ready_and_voter_becomes_candidate() -> None:
    c = cluster((1,), term=3, voted_for="n2")
    c.inject(heartbeat("n2", "n0", 3))
    assert c.role("n0") is Role.FOLLOWER
    resp = answer(c, 7, end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_TERM_NOT_READY
    assert resp.term == 3  # the voter's old term
    core = c.cores["n0"]
    state = core.member_state
    # a candidate, not a follower; the term is adopted by the candidate loop
    assert (state.role, state.curr_term, state.curr_vote_for, state.known_max_term) == (
        Role.CANDIDATE,
        3,
        "n2",
        7,
    )
    assert core.elector.need_increase_term_immediately
    # the next tick adopts the term, clears the vote and sends no vote request
    c.queue.clear()
    sent = len(c.sent)
    c.tick(nodes=["n0"])
    assert (state.curr_term, state.curr_vote_for) == (7, None)
    assert not c.cores["n0"].elector.need_increase_term_immediately
    assert c.sent[sent:] == []
    assert c.stores["n0"].load_term_vote().term == 7


def test_le_27_term_below_the_voters_ledger_end_term_carries_that_ledger_term() -> None:
    # n0 holds entries of term 6 but its stored term says 4 (e.g. a term file that was
    # lost); the candidate's log is as good, its term equal to n0's and below 6
    c = cluster((1, 6), term=4)
    resp = answer(c, 4, end_index=1, end_term=6)
    assert resp.vote_result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
    assert resp.term == 6  # the voter's ledger end term, not its current term
    assert c.cores["n0"].member_state.curr_vote_for is None


def test_le_28_a_transfer_target_rejects_a_rival_with_no_better_log() -> None:
    c = cluster((1, 1), term=4)
    c.cores["n0"].member_state.term_to_take_leadership = 4  # n0 is taking leadership
    resp = answer(c, 4, end_index=1, end_term=1)
    assert resp.vote_result is VoteResult.REJECT_TAKING_LEADERSHIP
    # a rival with a strictly longer log still gets the vote
    resp = answer(c, 4, frm="n2", end_index=2, end_term=1, req_id=2)
    assert resp.vote_result is VoteResult.ACCEPT


def test_le_29_accept_records_the_vote_in_the_same_ready_as_the_answer() -> None:
    c = cluster((1,), term=4)
    resp = answer(c, 4, end_index=0, end_term=1)
    assert resp.vote_result is VoteResult.ACCEPT and resp.term == 4
    assert c.cores["n0"].member_state.curr_vote_for == "n1"
    _, ready = c.readies[-1]
    assert resp in ready.messages
    assert ready.hard_state is not None
    assert (ready.hard_state.term, ready.hard_state.voted_for) == (4, "n1")
    tv = c.stores["n0"].load_term_vote()
    assert (tv.term, tv.voted_for) == (4, "n1")


def test_le_21_a_sender_outside_the_group_is_dropped_unanswered() -> None:
    """Not a configured peer at all (``step``'s guard, before ``handleVote``)."""
    c = cluster((1,), term=4)
    assert c.inject(vote_req("n9", "n0", 4, end_index=0, end_term=1)) == []
    assert c.inject(heartbeat("n9", "n0", 4)) == []
    assert c.cores["n0"].member_state.curr_vote_for is None
    assert c.role("n0") is Role.CANDIDATE
