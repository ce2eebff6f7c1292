"""Issue 18: a follower whose connection from/to its leader closed pre-votes at once
(``DLedgerCore.peer_connection_lost``), instead of waiting an election timeout. A
crashed leader is replaced within a few ticks; a follower's own broken link to a healthy
leader deposes nobody and changes no term; a flapping link pre-votes once per term; a
silent (paused) leader still costs the election timeout."""

from __future__ import annotations

import pytest

from dledger.core.messages import Role, VoteRequest
from dledger.core.settings import CoreSettings

from .harness import TICK_MS, Cluster


def crash_leader(c: Cluster) -> tuple[str, int]:
    """Stop the leader; every live follower's transport reports its connection closed."""
    lead = c.wait_leader()
    term = c.term(lead)
    c.stop(lead)
    for nid in c.ids:
        if nid != lead:
            c.run(nid, lambda core: core.peer_connection_lost(lead, c.now_ms))
    return lead, term


def leader_term_follower(c: Cluster) -> tuple[str, int, str]:
    lead = c.wait_leader()
    return lead, c.term(lead), next(i for i in c.ids if i != lead)


def new_leader(c: Cluster, old: str) -> bool:
    lead = c.leader()
    return lead is not None and lead != old


@pytest.mark.parametrize("n", [3, 5])
def test_a_crashed_leader_is_replaced_well_within_an_election_timeout(n: int) -> None:
    """Usually in a few ticks: jitter (0..20 ms, on the 10 ms beat), pre-vote, vote and
    one re-vote at the same term. When two followers start in the same beat (more often
    here, where every node ticks at once, than on a real network) the vote splits and
    costs one vote interval (100..300 ms): still well within the election timeout."""
    took = []
    for seed in range(20):
        c = Cluster(n, seed=seed)
        old, term = crash_leader(c)
        t = c.tick_until(lambda: new_leader(c, old), max_ms=2000)  # noqa: B023
        assert t is not None
        took.append(t)
        assert c.term(c.leader() or "") >= term + 1
        assert c.events_of("early_pre_vote")
    assert max(took) < c.settings.election_timeout_ms, took
    assert sorted(took)[len(took) // 2] <= 60, took


def test_without_the_setting_a_crash_costs_the_election_timeout() -> None:
    c = Cluster(3, seed=0, settings=CoreSettings(early_pre_vote=False))
    old, _ = crash_leader(c)
    took = c.tick_until(lambda: new_leader(c, old), max_ms=3000)
    assert took is not None and took > c.settings.election_timeout_ms
    assert not c.events_of("leader_connection_lost")


def test_a_paused_leader_closes_nothing_and_costs_the_election_timeout() -> None:
    c = Cluster(3, seed=1)
    old = c.wait_leader()
    c.stop(old)  # silent: no connection_lost reported
    took = c.tick_until(lambda: new_leader(c, old), max_ms=3000)
    assert took is not None and took > c.settings.election_timeout_ms


@pytest.mark.parametrize("seed", range(4))
def test_a_followers_broken_link_to_a_healthy_leader_deposes_nobody(seed: int) -> None:
    c = Cluster(3, seed=seed)
    lead, term, f = leader_term_follower(c)
    roles = len(c.roles)
    c.cut(lead, f)  # the link is down for a while: f does not hear the leader
    c.run(f, lambda core: core.peer_connection_lost(lead, c.now_ms))
    c.tick(100)
    c.heal()
    c.tick(500)
    asks = [m for m in c.sent_of(VoteRequest, local_id=f) if m.pre_vote]
    assert asks and {m.term for m in asks} == {term + 1}  # it asked, and was refused
    assert c.events_of("early_pre_vote", f)[0]["granted"] == 1
    assert c.leader() == lead and {c.term(i) for i in c.ids} == {term}
    assert c.roles[roles:] == []  # not even the follower changed role
    assert not c.cores[f].elector.leader_connection_lost  # heard the leader again


def test_a_flapping_link_pre_votes_once_per_term() -> None:
    c = Cluster(3, seed=2)
    lead, term, f = leader_term_follower(c)
    for _ in range(50):
        c.run(f, lambda core: core.peer_connection_lost(lead, c.now_ms))
        c.tick(2 * TICK_MS)
    assert len(c.events_of("leader_connection_lost", f)) == 1
    assert len(c.events_of("early_pre_vote", f)) == 1
    assert c.leader() == lead and {c.term(i) for i in c.ids} == {term}


def test_a_leader_heard_again_before_the_jitter_ends_cancels_the_pre_vote() -> None:
    c = Cluster(3, seed=3, settings=CoreSettings(early_pre_vote_jitter_ms=1000))
    lead, _, f = leader_term_follower(c)
    c.run(f, lambda core: core.peer_connection_lost(lead, c.now_ms))
    assert c.cores[f].elector.early_pre_vote_ms > c.now_ms
    c.tick(1000)  # heartbeats arrive meanwhile
    assert c.cores[f].elector.early_pre_vote_ms == -1
    assert not c.events_of("early_pre_vote", f)


def test_a_close_of_another_peer_or_on_a_candidate_changes_nothing() -> None:
    c = Cluster(3, seed=4)
    lead = c.wait_leader()
    f, other = (i for i in c.ids if i != lead)
    c.run(f, lambda core: core.peer_connection_lost(other, c.now_ms))
    c.run(lead, lambda core: core.peer_connection_lost(f, c.now_ms))
    c.run(f, lambda core: core.peer_connection_lost("stranger", c.now_ms))
    c.tick(200)
    assert not c.events_of("leader_connection_lost")
    assert c.cores[f].member_state.role is Role.FOLLOWER


def test_a_voter_that_saw_the_close_grants_and_does_not_campaign_itself() -> None:
    """Both followers see the crash; whichever asks first is granted by the other, which
    then drops its own early pre-vote: no split vote."""
    c = Cluster(3, seed=5, settings=CoreSettings(early_pre_vote_jitter_ms=0))
    lead = c.wait_leader()
    a, b = (i for i in c.ids if i != lead)
    c.stop(lead)
    c.run(a, lambda core: core.peer_connection_lost(lead, c.now_ms))
    c.run(b, lambda core: core.peer_connection_lost(lead, c.now_ms))
    c.tick(TICK_MS, nodes=[a])  # a asks first; b grants and stands down
    assert c.cores[b].elector.early_pre_vote_ms == -1
    assert c.tick_until(lambda: c.leader() == a, max_ms=100) is not None
    assert not [m for m in c.sent_of(VoteRequest, local_id=b) if not m.pre_vote]
