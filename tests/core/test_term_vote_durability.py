"""``currTerm`` and ``votedFor`` are durable before any answer that depends on them
leaves (docs/architecture.md): the core puts the new hard state in the same Ready as the
answer, and the Ready contract persists before it sends."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from dledger.core.messages import RaftMessage, VoteRequest, VoteResponse, VoteResult
from dledger.runtime.ready import deliver_ready, persist_ready
from dledger.store import MemoryStore, TermVote

from .harness import Cluster, make_store, vote_req


@pytest.mark.parametrize("seed", range(5))
def test_cv_23_every_vote_leaves_in_a_ready_that_carries_it_as_hard_state(seed: int) -> None:
    c = Cluster(5, seed=seed)
    c.isolate(c.wait_leader())
    c.tick(3000)  # a second election, from a later term
    c.heal()
    c.wait_leader()
    accepts = votes = 0
    for nid, ready in c.readies:
        hs = ready.hard_state
        for m in ready.messages:
            if isinstance(m, VoteResponse) and m.vote_result is VoteResult.ACCEPT:
                if not m.pre_vote:
                    accepts += 1
                    assert hs is not None and (hs.term, hs.voted_for) == (m.term, m.remote_id)
            elif isinstance(m, VoteRequest) and not m.pre_vote:
                votes += 1  # the candidate's own vote, with its new term
                assert hs is not None and (hs.term, hs.voted_for) == (m.term, nid)
    assert accepts >= 4 and votes >= 4


def test_cv_23_a_vote_survives_a_restart() -> None:
    c = Cluster(3, stores={"n0": make_store((1,), term=4)})
    (resp,) = c.inject(vote_req("n1", "n0", 4, end_index=0, end_term=1))
    assert isinstance(resp, VoteResponse) and resp.vote_result is VoteResult.ACCEPT
    c.restart("n0")
    assert (c.term("n0"), c.cores["n0"].member_state.curr_vote_for) == (4, "n1")
    (resp,) = c.inject(vote_req("n2", "n0", 4, end_index=0, end_term=1, req_id=2))
    assert isinstance(resp, VoteResponse)
    assert resp.vote_result is VoteResult.REJECT_ALREADY_VOTED


def test_cv_23_an_adopted_term_survives_a_restart() -> None:
    c = Cluster(3, stores={"n0": make_store(term=2)})
    c.inject(vote_req("n1", "n0", 7))  # TERM_NOT_READY: adopted at the next tick
    c.tick(nodes=["n0"])
    assert c.term("n0") == 7
    c.restart("n0")
    assert (c.term("n0"), c.cores["n0"].member_state.curr_vote_for) == (7, None)


class RecordingStore(MemoryStore):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def save_term_vote(self, tv: TermVote) -> None:
        self.log.append(f"persist {tv.term}/{tv.voted_for}")
        super().save_term_vote(tv)


def test_the_ready_contract_persists_the_vote_before_sending_the_answer() -> None:
    """The order production runs (``dledger.runtime.ready``), on the core's real Ready."""
    log: list[str] = []
    store = RecordingStore(log)
    store.save_term_vote(TermVote(4, None))
    log.clear()
    c = Cluster(3, stores={"n0": store})
    core = c.cores["n0"]
    core.step(vote_req("n1", "n0", 4), c.now_ms)
    ready = core.ready()

    def send(msgs: Iterable[RaftMessage]) -> None:
        for m in msgs:
            assert isinstance(m, VoteResponse)
            log.append(f"send {type(m).__name__} {m.vote_result.name}")

    synced = persist_ready(store, ready, sync_log=True)
    deliver_ready(core, ready, synced, send=send, on_ready=lambda r: None)
    assert log == ["persist 4/n1", "send VoteResponse ACCEPT"]
