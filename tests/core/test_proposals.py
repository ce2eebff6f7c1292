"""Client appends on the leader (AP-01..AP-06): when a proposal is answered, with
what, and the back-pressure limit."""

from __future__ import annotations

import pytest

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import PushEntryRequest, PushType, RaftMessage, Role
from dledger.core.settings import CoreSettings

from .harness import Cluster


def is_append(m: RaftMessage) -> bool:
    return isinstance(m, PushEntryRequest) and m.type is PushType.APPEND


def test_ap_05_a_proposal_succeeds_once_committed_with_its_index_and_positions() -> None:
    c = Cluster(3, seed=0)
    lead = c.wait_leader()
    store = c.stores[lead]
    end, end_pos = store.ledger_end_index, store.ledger_end_pos
    bodies = [b"a" * 10, b"b" * 20, b"c"]
    p = c.propose(bodies, deliver=False)
    assert (p.first_index, p.last_index, p.term) == (end + 1, end + 3, c.term(lead))
    assert p.positions == (end_pos, end_pos + 58, end_pos + 58 + 68)  # 48-byte headers
    assert c.done[lead] == []  # written, not yet committed
    c.deliver_all()
    ((_, done),) = c.done[lead]
    assert done.code is DLedgerCode.SUCCESS and done.proposal == p
    assert store.committed_index >= p.last_index
    c.tick(1000)  # the commit index reaches the followers
    for s in c.stores.values():
        assert s.committed_index >= p.last_index
        got = [s.get(p.first_index + k) for k in range(3)]
        assert [(e.body, e.pos) for e in got] == list(zip(bodies, p.positions, strict=True))


def test_ap_01_a_follower_refuses_a_proposal_with_not_leader() -> None:
    c = Cluster(3, seed=0)
    lead = c.wait_leader()
    f = next(i for i in c.ids if i != lead)
    with pytest.raises(DLedgerError) as e:
        c.propose([b"x"], f)
    assert e.value.code is DLedgerCode.NOT_LEADER
    assert lead in e.value.message  # where to go instead (AP-04)


def test_ap_06_a_single_node_group_commits_at_once() -> None:
    c = Cluster(1)
    lead = c.wait_leader()
    sent, now = len(c.sent), c.now_ms
    p = c.propose([b"x", b"y"])
    assert [(t, d.code, d.proposal) for t, d in c.done[lead]] == [(now, DLedgerCode.SUCCESS, p)]
    assert c.stores[lead].committed_index == p.last_index
    assert len(c.sent) == sent  # nobody to ask


def test_rp_37_leadership_lost_fails_pending_proposals_with_term_changed() -> None:
    c = Cluster(3, seed=1)
    lead = c.wait_leader()
    c.isolate(lead)
    p = c.propose([b"lost?"])
    assert c.tick_until(lambda: bool(c.done[lead]), 2000) is not None
    ((_, done),) = c.done[lead]
    assert (done.code, done.proposal) == (DLedgerCode.TERM_CHANGED, p)
    assert c.role(lead) is not Role.LEADER


def test_rp_37_a_proposal_not_committed_in_max_wait_ack_ms_times_out() -> None:
    c = Cluster(3, seed=2, settings=CoreSettings(max_wait_ack_ms=300))
    lead = c.wait_leader()
    c.drop(is_append)  # heartbeats still flow: the leader stays
    t0 = c.now_ms
    p = c.propose([b"slow"])
    c.tick(290)
    assert c.done[lead] == []
    c.tick(10)
    assert [(t - t0, d.code, d.proposal) for t, d in c.done[lead]] == [
        (300, DLedgerCode.WAIT_QUORUM_ACK_TIMEOUT, p)
    ]
    assert c.leader() == lead
    # the outcome was unknown, not a failure: the entry commits once the link is back
    c.heal()
    c.tick(2000)
    assert c.stores[lead].committed_index >= p.last_index


def test_cv_33_leader_pending_full_counts_requests_not_entries_or_bytes() -> None:
    c = Cluster(3, seed=3, settings=CoreSettings(max_pending_proposals=3))
    lead = c.wait_leader()
    c.drop(is_append)
    for k in range(3):  # 3 requests of 50 entries and ~50 KB each: 3 pending requests
        c.propose([bytes([k]) * 1000] * 50)
    with pytest.raises(DLedgerError) as e:
        c.propose([b"one more"])
    assert e.value.code is DLedgerCode.LEADER_PENDING_FULL
    assert c.cores[lead].status()["pending_proposals"] == 3
    c.heal()
    c.tick(1500)  # the lost batches are sent again after push_timeout_ms
    assert [d.code for _, d in c.done[lead]] == [DLedgerCode.SUCCESS] * 3
    c.propose([b"one more"])  # room again


@pytest.mark.parametrize("pump", [True, False])
def test_proposals_of_one_loop_turn_share_one_push_per_follower(pump: bool) -> None:
    """Group commit: the runtime proposes with ``pump=False`` and pumps once per loop
    turn, so ten single-entry proposals leave as one APPEND of ten entries per follower;
    each pumped at once leaves as ten. Both commit all ten."""
    c = Cluster(3, seed=0)
    lead = c.wait_leader()
    c.deliver_all()
    mark = len(c.sent)
    core = c.cores[lead]
    props = [core.propose([b"m%d" % i], c.now_ms, pump=pump) for i in range(10)]
    if not pump:
        core.pump(c.now_ms)
    c.run(lead, lambda _core: None)
    appends = [m for _, m in c.sent[mark:] if is_append(m) and m.local_id == lead]
    by_follower: dict[str, list[int]] = {}
    for m in appends:
        by_follower.setdefault(m.remote_id, []).append(m.count)
    assert len(by_follower) == 2
    for counts in by_follower.values():
        assert counts == ([10] if not pump else [1] * 10)
    committed = {d.proposal.proposal_id for _, d in c.done[lead] if d.code is DLedgerCode.SUCCESS}
    assert committed >= {p.proposal_id for p in props}
