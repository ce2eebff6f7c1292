"""Heartbeats: the follower's answer codes and the leader's reading of a
round."""

from __future__ import annotations

from dledger.codes import DLedgerCode
from dledger.core.elector_rounds import HeartbeatRound
from dledger.core.messages import HeartBeatRequest, HeartBeatResponse, Role, VoteRequest

from .harness import GROUP, Cluster, heartbeat, make_store

# ---- the follower side ------------------------------------------------------------


def beat(c: Cluster, term: int, *, frm: str = "n1", leader: str | None = None) -> HeartBeatResponse:
    """Step a heartbeat from ``frm`` into n0; return n0's answer."""
    out = c.inject(heartbeat(frm, "n0", term, leader=leader))
    (resp,) = [m for m in out if isinstance(m, HeartBeatResponse)]
    assert (resp.local_id, resp.remote_id) == ("n0", frm)
    return resp


def at_term(term: int) -> Cluster:
    return Cluster(3, stores={"n0": make_store(term=term)})


def test_le_40_unknown_leader_is_unknown_member() -> None:
    c = at_term(4)
    resp = beat(c, 4, leader="n9")
    assert (resp.code, resp.term) == (DLedgerCode.UNKNOWN_MEMBER, 4)
    assert c.role("n0") is Role.CANDIDATE


def test_le_40_a_leader_with_our_own_id_is_unexpected_member() -> None:
    c = at_term(4)
    assert beat(c, 4, leader="n0").code is DLedgerCode.UNEXPECTED_MEMBER
    assert c.role("n0") is Role.CANDIDATE


def test_le_40_lower_term_is_expired_term_with_our_term() -> None:
    c = at_term(4)
    resp = beat(c, 3)
    assert (resp.code, resp.term) == (DLedgerCode.EXPIRED_TERM, 4)
    assert c.role("n0") is Role.CANDIDATE


def test_le_40_same_term_without_a_leader_makes_the_candidate_a_follower() -> None:
    c = at_term(4)
    c.now_ms = 500
    resp = beat(c, 4)
    assert (resp.code, resp.term) == (DLedgerCode.SUCCESS, 4)
    state = c.cores["n0"].member_state
    assert (state.role, state.leader_id, state.curr_term) == (Role.FOLLOWER, "n1", 4)
    assert c.cores["n0"].elector.last_leader_heartbeat_ms == 500


def test_le_40_same_leader_refreshes_the_heartbeat_time() -> None:
    c = at_term(4)
    beat(c, 4)
    c.now_ms = 900
    assert beat(c, 4).code is DLedgerCode.SUCCESS
    assert c.cores["n0"].elector.last_leader_heartbeat_ms == 900


def test_cv_43_le_40_a_second_leader_in_the_term_gets_inconsistent_leader_with_the_term() -> None:
    c = at_term(4)
    beat(c, 4, frm="n1")
    resp = beat(c, 4, frm="n2")
    assert resp.code is DLedgerCode.INCONSISTENT_LEADER
    assert resp.term == 4  # DLedger's reply carries no term
    assert (c.role("n0"), c.cores["n0"].member_state.leader_id) == (Role.FOLLOWER, "n1")


def test_le_40_higher_term_is_term_not_ready_and_makes_a_candidate() -> None:
    c = at_term(4)
    beat(c, 4)
    resp = beat(c, 6, frm="n2")
    assert (resp.code, resp.term) == (DLedgerCode.TERM_NOT_READY, 4)
    core = c.cores["n0"]
    assert (
        core.member_state.role,
        core.member_state.curr_term,
        core.member_state.known_max_term,
    ) == (Role.CANDIDATE, 4, 6)
    assert core.elector.need_increase_term_immediately


# ---- the leader side ----------------------------------------------------------------


def open_heartbeat_round(c: Cluster) -> tuple[str, HeartbeatRound]:
    """A settled leader whose next heartbeat round gets no answer but ours."""
    lead = c.wait_leader()
    c.drop(lambda m: isinstance(m, HeartBeatRequest))
    el = c.cores[lead].elector
    assert c.tick_until(lambda: el.heartbeat_round is not None, 1000) is not None
    assert el.heartbeat_round is not None
    return lead, el.heartbeat_round


def reply(c: Cluster, lead: str, r: HeartbeatRound, frm: str, code: DLedgerCode, term: int) -> None:
    c.inject(
        HeartBeatResponse(
            group=GROUP, local_id=frm, remote_id=lead, term=term, req_id=r.req_id, code=code
        )
    )


def followers(c: Cluster, lead: str) -> list[str]:
    return [i for i in c.ids if i != lead]


def test_cv_42_le_39_a_higher_term_answer_deposes_the_leader_despite_a_success_quorum() -> None:
    c = Cluster(5, seed=1)
    lead, r = open_heartbeat_round(c)
    term = c.term(lead)
    p1, p2, p3, _ = followers(c, lead)
    reply(c, lead, r, p1, DLedgerCode.EXPIRED_TERM, term + 5)
    reply(c, lead, r, p2, DLedgerCode.SUCCESS, term)
    reply(c, lead, r, p3, DLedgerCode.SUCCESS, term)  # 3 of 5 successful: the round closes
    core = c.cores[lead]
    assert core.elector.heartbeat_round is None
    assert core.member_state.role is Role.CANDIDATE
    assert core.member_state.known_max_term == term + 5


def test_cv_31_the_heartbeat_round_keeps_the_highest_term_not_the_last() -> None:
    c = Cluster(5, seed=2)
    lead, r = open_heartbeat_round(c)
    term = c.term(lead)
    p1, p2, p3, p4 = followers(c, lead)
    reply(c, lead, r, p1, DLedgerCode.EXPIRED_TERM, term + 9)
    reply(c, lead, r, p2, DLedgerCode.EXPIRED_TERM, term + 2)  # arrives last of the two
    reply(c, lead, r, p3, DLedgerCode.SUCCESS, term)
    reply(c, lead, r, p4, DLedgerCode.SUCCESS, term)
    assert c.role(lead) is Role.CANDIDATE
    assert c.cores[lead].member_state.known_max_term == term + 9


def test_le_39_success_plus_not_ready_quorum_sends_the_next_heartbeat_at_once() -> None:
    c = Cluster(5, seed=3)
    lead, r = open_heartbeat_round(c)
    term = c.term(lead)
    p1, p2, _, _ = followers(c, lead)
    reply(c, lead, r, p1, DLedgerCode.TERM_NOT_READY, term - 1)
    reply(c, lead, r, p2, DLedgerCode.TERM_NOT_READY, term - 1)
    el = c.cores[lead].elector
    assert c.role(lead) is Role.LEADER
    assert el.heartbeat_round is None and el.last_send_heartbeat_ms == -1
    sent = len(c.sent_of(HeartBeatRequest, local_id=lead))
    c.tick()  # 10 ms, not a heartbeat interval
    assert len(c.sent_of(HeartBeatRequest, local_id=lead)) == sent + 4


def test_le_39_success_quorum_records_the_success_time() -> None:
    c = Cluster(3, seed=4)
    lead, r = open_heartbeat_round(c)
    c.now_ms += 5
    reply(c, lead, r, followers(c, lead)[0], DLedgerCode.SUCCESS, c.term(lead))
    el = c.cores[lead].elector
    assert el.heartbeat_round is None
    assert el.last_succ_heartbeat_ms == c.now_ms


def test_le_39_inconsistent_leader_without_a_quorum_steps_down_in_the_same_term() -> None:
    c = Cluster(5, seed=5)
    lead, r = open_heartbeat_round(c)
    term = c.term(lead)
    reply(c, lead, r, followers(c, lead)[0], DLedgerCode.INCONSISTENT_LEADER, term)
    assert c.role(lead) is Role.LEADER  # the round is still open
    # (a candidate whose last round PASSED asks again in the same term at once, and its
    # old voters would accept: keep it a candidate so the step-down stays visible)
    c.drop(lambda m: isinstance(m, VoteRequest))
    assert c.tick_until(lambda: c.cores[lead].elector.heartbeat_round is None, 500) is not None
    assert c.role(lead) is Role.CANDIDATE
    assert c.cores[lead].member_state.known_max_term == term


def test_le_39_a_round_without_answers_keeps_a_recently_successful_leader() -> None:
    """The control for the test above: no answer at all is not yet a reason to go."""
    c = Cluster(5, seed=5)
    lead, _ = open_heartbeat_round(c)
    assert c.tick_until(lambda: c.cores[lead].elector.heartbeat_round is None, 500) is not None
    assert c.role(lead) is Role.LEADER
