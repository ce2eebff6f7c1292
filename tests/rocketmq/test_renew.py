"""The push consumers' liveness table (api/rocketmq/renew.py): bounded, per node."""

from __future__ import annotations

from api.rocketmq.renew import Liveness


def test_liveness_is_bounded_and_ended_clients_are_not_alive() -> None:
    now = [100.0]
    live = Liveness(limit=2, clock=lambda: now[0])
    live.seen("a")
    live.seen("b")
    live.seen("c")  # "a" forgotten: the oldest
    assert len(live) == 2
    assert live.alive("b", idle_s=10, known_since=0) and live.alive("c", 10, 0)
    # never heard of: alive only while this node has not listened for idle_s yet
    assert not live.alive("a", idle_s=10, known_since=0)
    assert live.alive("a", idle_s=10, known_since=95)
    now[0] = 111.0
    assert not live.alive("b", idle_s=10, known_since=0)  # idle
    live.seen("b")
    live.ended("b")
    assert not live.alive("b", idle_s=10, known_since=111)
    live.seen("b")  # it came back
    assert live.alive("b", idle_s=10, known_since=0)
