"""Leadership transfer and preferred leader (AP-01)."""

from __future__ import annotations

import pytest

from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.messages import (
    HeartBeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    PushEntryResponse,
    PushType,
    Role,
)
from dledger.core.node import TransferDone
from dledger.core.settings import CoreSettings

from .harness import Cluster, heartbeat, push


def transfer(c: Cluster, lead: str, to: str, *, deliver: bool = True) -> int:
    return c.run(lead, lambda core: core.transfer_leadership(to, c.now_ms), deliver=deliver)


@pytest.mark.parametrize("seed", range(3))
def test_le_47_the_transferee_becomes_leader_in_the_next_term(seed: int) -> None:
    c = Cluster(3, seed=seed)
    lead = c.wait_leader()
    term = c.term(lead)
    to = next(i for i in c.ids if i != lead)
    tid = transfer(c, lead, to)
    (req,) = c.sent_of(LeadershipTransferRequest)
    assert (req.transfer_id, req.transferee_id, req.term) == (lead, to, term)
    assert req.take_leadership_ledger_index == c.stores[lead].ledger_end_index
    took = c.tick_until(lambda: bool(c.transfers[lead]), 1000)
    assert took is not None and took <= 200  # a 30-100 ms vote timer, not 100-300
    assert c.transfers[lead] == [TransferDone(tid, DLedgerCode.SUCCESS)]
    assert (c.leader(), c.term(to)) == (to, term + 1)
    assert c.cores[lead].member_state.transferee is None
    c.tick(1000)
    assert c.leader() == to
    assert {c.cores[i].member_state.leader_id for i in c.ids} == {to}


def test_le_47_appends_and_other_transfers_are_refused_while_a_transfer_runs() -> None:
    c = Cluster(3, seed=1)
    lead = c.wait_leader()
    to, other = (i for i in c.ids if i != lead)
    transfer(c, lead, to, deliver=False)
    assert c.cores[lead].member_state.transferee == to
    for attempt in (lambda: c.propose([b"x"], lead), lambda: transfer(c, lead, other)):
        with pytest.raises(DLedgerError) as e:
            attempt()
        assert e.value.code is DLedgerCode.LEADER_TRANSFERRING
    c.deliver_all()
    assert c.tick_until(lambda: c.leader() == to, 1000) is not None
    c.propose([b"x"], to)


def test_le_47_a_transferee_too_far_behind_is_refused() -> None:
    c = Cluster(3, seed=2, settings=CoreSettings(max_leadership_transfer_wait_index=5))
    lead = c.wait_leader()
    slow, fresh = (i for i in c.ids if i != lead)
    c.isolate(slow)
    for k in range(6):
        c.propose([bytes([k])])
    with pytest.raises(DLedgerError) as e:
        transfer(c, lead, slow)
    assert e.value.code is DLedgerCode.FALL_BEHIND_TOO_MUCH
    assert c.cores[lead].member_state.transferee is None
    c.propose([b"still leading"])
    transfer(c, lead, fresh)  # a peer that keeps up is fine


def test_le_47_only_a_leader_transfers() -> None:
    c = Cluster(3, seed=3)
    lead = c.wait_leader()
    f, other = (i for i in c.ids if i != lead)
    with pytest.raises(DLedgerError) as e:
        transfer(c, f, other)
    assert e.value.code is DLedgerCode.NOT_LEADER
    for bad, code in (("n9", DLedgerCode.UNKNOWN_MEMBER), (lead, DLedgerCode.UNEXPECTED_ARGUMENT)):
        with pytest.raises(DLedgerError) as e:
            transfer(c, lead, bad)
        assert e.value.code is code


def test_le_47_a_transfer_to_a_peer_cut_off_fails_once_it_is_silent_and_unblocks_appends() -> None:
    """Issue 26: the leader ends the transfer once the transferee has not answered for
    ``leadership_transfer_silence_ms`` (a paused or cut-off node), not at the deadline."""
    c = Cluster(3, seed=4)
    lead = c.wait_leader()
    to = next(i for i in c.ids if i != lead)
    c.cut(lead, to)
    tid = transfer(c, lead, to)
    s = c.settings
    took = c.tick_until(lambda: bool(c.transfers[lead]), 3 * s.leadership_transfer_timeout_ms)
    assert took is not None and took <= s.leadership_transfer_silence_ms + 20
    (done,) = c.transfers[lead]
    assert (done.transfer_id, done.code) == (tid, DLedgerCode.NETWORK_ERROR)
    assert "silent" in done.reason
    assert c.leader() == lead and c.cores[lead].member_state.transferee is None
    c.propose([b"appends again"])


def test_issue_26_a_lost_connection_to_the_transferee_ends_the_transfer_at_once() -> None:
    """The transport reports the transferee's connection closed (its process died): the
    transfer fails in the same step, and appends are taken again."""
    c = Cluster(3, seed=8)
    lead = c.wait_leader()
    to = next(i for i in c.ids if i != lead)
    c.stop(to)
    tid = transfer(c, lead, to, deliver=False)
    c.run(lead, lambda core: core.peer_connection_lost(to, c.now_ms))
    (done,) = c.transfers[lead]
    assert (done.transfer_id, done.code) == (tid, DLedgerCode.NETWORK_ERROR)
    assert "connection" in done.reason
    assert c.leader() == lead and c.cores[lead].member_state.transferee is None
    c.propose([b"appends again"])


def test_issue_26_a_lost_transfer_request_is_sent_again_and_the_transfer_completes() -> None:
    """The request (the transfer's TimeoutNow) is lost once: the leader sends it again
    after a heartbeat interval, and the transfer succeeds long before its deadline."""
    c = Cluster(3, seed=9)
    lead = c.wait_leader()
    to = next(i for i in c.ids if i != lead)
    lost: list[LeadershipTransferRequest] = []

    def first_request(m: object) -> bool:
        if isinstance(m, LeadershipTransferRequest) and not lost:
            lost.append(m)
            return True
        return False

    c.drop(first_request)
    tid = transfer(c, lead, to)
    assert len(lost) == 1 and c.role(to) is Role.FOLLOWER
    took = c.tick_until(lambda: bool(c.transfers[lead]), 2000)
    assert took is not None and took <= c.settings.heartbeat_interval_ms + 200
    assert c.transfers[lead] == [TransferDone(tid, DLedgerCode.SUCCESS)]
    assert c.leader() == to


def test_issue_26_the_transferee_takes_a_request_sent_again_once() -> None:
    """A copy of the request while the take runs is ignored (no FAILED answer for a
    take under way); a copy after it ended gets the same answer again."""
    c = Cluster(3, seed=10)
    lead = c.wait_leader()
    to = next(i for i in c.ids if i != lead)
    transfer(c, lead, to, deliver=False)
    (req,) = [m for m in c.queue if isinstance(m, LeadershipTransferRequest)]
    c.queue.clear()
    c.inject(req)
    assert c.role(to) is Role.CANDIDATE
    assert c.inject(req) == []  # under way: nothing to say
    c.queue.clear()
    c.tick_until(lambda: c.role(to) is Role.LEADER, 1000)
    answers = [m for m in c.inject(req) if isinstance(m, LeadershipTransferResponse)]
    assert [a.code for a in answers] == [DLedgerCode.SUCCESS]


def test_issue_26_a_transfer_to_a_peer_not_heard_from_is_refused() -> None:
    c = Cluster(3, seed=11)
    lead = c.wait_leader()
    to = next(i for i in c.ids if i != lead)
    c.isolate(to)
    c.tick(c.settings.leadership_transfer_silence_ms + 200)
    with pytest.raises(DLedgerError) as e:
        transfer(c, lead, to)
    assert e.value.code is DLedgerCode.NETWORK_ERROR and "not answered" in e.value.message
    assert c.cores[lead].member_state.transferee is None
    c.propose([b"still leading"])


def test_le_47_the_transferee_waits_for_the_entries_it_lacks_before_it_campaigns() -> None:
    c = Cluster(3, seed=5)
    lead = c.wait_leader()
    to = next(i for i in c.ids if i != lead)
    transfer(c, lead, to, deliver=False)
    (req,) = [m for m in c.queue if isinstance(m, LeadershipTransferRequest)]
    c.queue.clear()
    late = LeadershipTransferRequest(
        group=req.group,
        local_id=req.local_id,
        remote_id=req.remote_id,
        term=req.term,
        req_id=req.req_id,
        transfer_id=req.transfer_id,
        transferee_id=req.transferee_id,
        take_leadership_ledger_index=req.take_leadership_ledger_index + 1,  # not there yet
    )
    c.inject(late)
    assert (c.role(to), c.cores[to].member_state.term_to_take_leadership) == (Role.FOLLOWER, -1)
    assert c.tick_until(lambda: bool(c.transfers[lead]), 3000) is not None
    assert [t.code for t in c.transfers[lead]] == [DLedgerCode.TAKE_LEADERSHIP_FAILED]
    assert c.leader() == lead


def test_le_47_preferred_leader_takes_over_and_keeps_leadership() -> None:
    s = CoreSettings(preferred_leader_ids=("n2",))
    c = Cluster(3, seed=6, settings=s)
    c.isolate("n2")  # someone else wins the first election
    first = c.wait_leader()
    assert first != "n2"
    c.heal()
    took = c.tick_until(lambda: c.leader() == "n2", 5000)
    assert took is not None and took <= 2 * s.preferred_leader_check_ms + 500
    assert c.tick_until(lambda: bool(c.transfers[first]), 100) is not None
    assert [t.code for t in c.transfers[first]] == [DLedgerCode.SUCCESS]
    c.tick(3000)
    assert c.leader() == "n2"
    assert [n for _, n, rc in c.roles if rc.role is Role.LEADER] == [first, "n2"]


@pytest.mark.parametrize("kind", ["heartbeat", "commit_push"])
def test_le_47_the_old_leaders_traffic_right_after_the_request_does_not_undo_the_transfer(
    kind: str,
) -> None:
    """The transferee adopts term + 1 as it starts, so a heartbeat or COMMIT push of the
    old term, arriving before the transferee's next tick, can not make it a follower."""
    c = Cluster(3, seed=7)
    lead = c.wait_leader()
    term = c.term(lead)
    to = next(i for i in c.ids if i != lead)
    tid = transfer(c, lead, to)
    assert (c.role(to), c.term(to)) == (Role.CANDIDATE, term + 1)
    msg = (
        heartbeat(lead, to, term, req_id=10_000)
        if kind == "heartbeat"
        else push(lead, to, term, PushType.COMMIT, req_id=10_000)
    )
    (resp,) = c.inject(msg)
    assert isinstance(resp, HeartBeatResponse | PushEntryResponse)
    assert (resp.code, resp.term) == (DLedgerCode.EXPIRED_TERM, term + 1)
    assert c.tick_until(lambda: bool(c.transfers[lead]), 1000) is not None
    assert c.transfers[lead] == [TransferDone(tid, DLedgerCode.SUCCESS)]
    assert c.leader() == to
