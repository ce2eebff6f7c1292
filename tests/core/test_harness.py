"""The test cluster itself: deterministic per seed, and its faults really bite."""

from __future__ import annotations

from dledger.core.messages import HeartBeatRequest, Role

from .harness import Cluster


def trace(seed: int) -> list[str]:
    c = Cluster(3, seed=seed)
    c.wait_leader()
    c.propose([b"a", b"b"])
    c.isolate(c.leader() or "n0")
    c.tick(2000)
    c.heal()
    c.tick(1000)
    return [f"{t} {m!r}" for t, m in c.sent]


def test_the_same_seed_replays_the_same_run() -> None:
    assert trace(11) == trace(11)


def test_seeds_differ() -> None:
    assert trace(11) != trace(12)


def test_drop_and_cut_lose_exactly_what_they_name() -> None:
    c = Cluster(3, seed=1)
    lead = c.wait_leader()
    a, b = (i for i in c.ids if i != lead)
    c.cut(lead, a)
    c.drop(lambda m: isinstance(m, HeartBeatRequest) and m.remote_id == b)
    c.tick(1000)  # long enough for a to time out and ask everyone
    assert c.dropped
    for m in c.dropped:
        cut = {m.local_id, m.remote_id} == {lead, a}
        assert cut or (isinstance(m, HeartBeatRequest) and m.remote_id == b)
    assert any(m.remote_id == b for m in c.dropped)
    assert any(m.remote_id == a for m in c.dropped) and any(m.local_id == a for m in c.dropped)
    c.heal()
    c.tick(2000)
    assert c.leader() is not None
    assert {c.cores[i].member_state.leader_id for i in c.ids} == {c.leader()}
    assert c.role(a) is Role.FOLLOWER
