"""Two departures from DLedger for liveness under partitions (docs/architecture.md):
SOFAJRaft's pre-vote, and check-quorum."""

from __future__ import annotations

import pytest

from dledger.core.messages import Role, VoteRequest, VoteResponse, VoteResult
from dledger.core.settings import CoreSettings

from .harness import TICK_MS, Cluster


def isolate_a_follower_for(c: Cluster, ms: int) -> tuple[str, str, int]:
    lead = c.wait_leader()
    term = c.term(lead)
    f = next(i for i in c.ids if i != lead)
    c.isolate(f)
    c.tick(ms)
    return lead, f, term


@pytest.mark.parametrize("seed", range(3))
def test_jr_05_a_node_back_from_a_long_partition_neither_raises_the_term_nor_deposes(
    seed: int,
) -> None:
    c = Cluster(3, seed=seed)
    lead, f, term = isolate_a_follower_for(c, 10_000)
    # it kept asking "would you vote for me?", never raising its own term
    asks = [m for m in c.sent_of(VoteRequest, local_id=f) if m.pre_vote]
    assert len(asks) >= 10
    assert {m.term for m in asks} == {term + 1}
    assert not [m for m in c.sent_of(VoteRequest, local_id=f) if not m.pre_vote]
    assert (c.role(f), c.term(f)) == (Role.CANDIDATE, term)
    changes = len(c.roles)
    c.heal()
    c.tick(2000)
    assert c.leader() == lead
    assert {c.term(i) for i in c.ids} == {term}
    assert (c.role(f), c.cores[f].member_state.leader_id) == (Role.FOLLOWER, lead)
    assert [(n, rc.role) for _, n, rc in c.roles[changes:]] == [(f, Role.FOLLOWER)]


def test_cv_15_without_pre_vote_the_returning_node_does_depose_the_leader() -> None:
    """The control: DLedger's election (no pre-vote). Unanswered rounds do not raise the
    term (1.8 branch 3), but the first one did, and that is enough to depose."""
    c = Cluster(3, seed=0, settings=CoreSettings(pre_vote=False))
    lead, f, term = isolate_a_follower_for(c, 10_000)
    assert c.term(f) == term + 1
    c.heal()
    c.tick(2000)
    assert c.term(c.wait_leader()) == term + 1
    assert any(n == lead and rc.role is Role.CANDIDATE for _, n, rc in c.roles)


def test_jr_07_a_pre_vote_changes_nothing_on_a_voter_that_hears_its_leader() -> None:
    c = Cluster(3, seed=1)
    lead = c.wait_leader()
    f, other = (i for i in c.ids if i != lead)
    before = (c.role(other), c.term(other), c.cores[other].member_state.curr_vote_for)
    c.cut(lead, f)
    c.cores[f].elector.last_leader_heartbeat_ms = -(10**9)  # f's leader went quiet
    asked = c.tick_until(lambda: bool(c.sent_of(VoteResponse, local_id=other, pre_vote=True)), 1000)
    assert asked is not None
    (resp,) = c.sent_of(VoteResponse, local_id=other, pre_vote=True)
    assert resp.pre_vote and resp.vote_result is VoteResult.REJECT_ALREADY_HAS_LEADER
    assert (c.role(other), c.term(other), c.cores[other].member_state.curr_vote_for) == before
    assert c.term(f) == before[1]


@pytest.mark.parametrize("n", [3, 5])
def test_jr_10_check_quorum_an_isolated_leader_steps_down_after_an_election_timeout(
    n: int,
) -> None:
    c = Cluster(n, seed=n)
    lead = c.wait_leader()
    c.tick(1000)
    core = c.cores[lead]
    timeout = core.settings.election_timeout_ms
    heard = sorted(core.elector.peer_heard_ms.values(), reverse=True)
    majority_heard_ms = heard[n // 2 - 1]  # with self, a majority had answered by then
    c.isolate(lead)
    assert c.tick_until(lambda: c.role(lead) is not Role.LEADER, 5 * timeout) is not None
    assert timeout < c.now_ms - majority_heard_ms <= timeout + TICK_MS
    # the others elected a new leader meanwhile
    assert c.tick_until(lambda: c.leader() not in (None, lead), 5 * timeout) is not None


def test_jr_10_check_quorum_a_leader_that_still_hears_a_majority_stays() -> None:
    c = Cluster(3, seed=3)
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    c.cut(lead, f)
    c.tick(5000)
    assert c.leader() == lead
    assert not [rc for _, n, rc in c.roles if n == lead and rc.role is not Role.LEADER]
