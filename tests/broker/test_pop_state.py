"""The POP rule (broker/pop/state.py): what a receive hands out, when a message comes back,
which handles hold, FIFO blocking, and the snapshot part, on the pure state."""

from __future__ import annotations

import orjson
import pytest

from broker.pop.state import (
    ROCKETMQ_DELAYS_MS,
    Delivered,
    PopConfig,
    PopState,
    RetryPolicy,
)

G, T = "g", "t"


def _state(**config: object) -> PopState:
    s = PopState()
    s.configure(G, PopConfig.from_json(config))
    return s


Pick = tuple[int, int, int, list[int]] | tuple[int, int, int, list[int], int]


def _receive(
    s: PopState, index: int, ts: int, picks: list[Pick], inv: int = 1000
) -> list[Delivered]:
    """Picks ``(queue, start, end, offsets[, since])``: ``since`` is ``start`` unless given."""
    s.tick(ts)
    full = [p if len(p) == 5 else (*p, p[1]) for p in picks]
    return s.receive(index, G, T, invisible_ms=inv, attempt_id=None, picks=full)  # type: ignore[arg-type]


def test_a_receive_hands_out_fresh_offsets_once_and_moves_next_past_what_it_skipped() -> None:
    s = _state()
    got = _receive(s, 10, 5_000, [(0, 3, 7, [3, 5])])  # 4 and 6 did not match its tags
    assert got == [Delivered(0, 3, 1, 10, 6_000), Delivered(0, 5, 1, 10, 6_000)]
    q = s.queue(G, T, 0)
    assert q is not None and q.next == 7 and sorted(q.flights) == [3, 5]
    # A second receive that saw the same state picks the same offsets: nothing for it.
    assert _receive(s, 11, 5_001, [(0, 3, 7, [3, 5, 6])]) == []
    assert q.next == 7 and s.in_flight(G, T) == 2


def test_a_receive_that_looked_past_next_hands_out_nothing_fresh_there() -> None:
    """Two receives on one master: A looks for fresh messages from next (2), B from past
    A's picks (4), A's entry not applied yet. Applied in the other order (A waited, or
    never got into the log), B must not move next over A's messages: it hands out
    nothing fresh, and they are neither lost nor handed out twice. The same for a queue
    neither created yet (B's pick names where it starts)."""
    s = _state()
    _receive(s, 1, 0, [(0, 0, 2, [0, 1])])
    assert _receive(s, 3, 1, [(0, 2, 6, [4, 5], 4), (1, 0, 4, [2, 3], 2)]) == []  # B
    q0, q1 = s.queue(G, T, 0), s.queue(G, T, 1)
    assert q0 is not None and q1 is not None and (q0.next, q1.next) == (2, 0)
    got = _receive(s, 2, 2, [(0, 2, 4, [2, 3]), (1, 0, 2, [0, 1])])  # A
    assert [(d.queue_id, d.offset) for d in got] == [(0, 2), (0, 3), (1, 0), (1, 1)]
    got = _receive(s, 4, 3, [(0, 4, 6, [4, 5]), (1, 2, 4, [2, 3])])
    assert [(d.queue_id, d.offset) for d in got] == [(0, 4), (0, 5), (1, 2), (1, 3)]
    assert (q0.next, q1.next) == (6, 4)


def test_an_ack_needs_the_current_handle_and_ends_the_flight() -> None:
    s = _state()
    _receive(s, 10, 0, [(1, 0, 2, [0, 1])])
    assert s.ack(G, T, [(1, 0, 9), (1, 0, 10), (1, 0, 10), (2, 1, 10)]) == [
        False,
        True,
        False,
        False,
    ]
    q = s.queue(G, T, 1)
    assert q is not None and list(q.flights) == [1]


def test_a_message_comes_back_only_when_due_with_the_next_attempt_and_a_new_handle() -> None:
    s = _state(retry={"policy": "list", "delays_ms": [500, 2000]})
    _receive(s, 10, 0, [(0, 0, 1, [0])], inv=1000)
    q = s.queue(G, T, 0)
    assert q is not None and q.flights[0].due == 1_500  # invisible 1 s, then the 1st delay
    assert _receive(s, 11, 1_499, [(0, 1, 1, [0])]) == []  # not due yet
    again = _receive(s, 12, 1_500, [(0, 1, 1, [0])])
    assert again == [Delivered(0, 0, 2, 12, 2_500)]
    assert s.ack(G, T, [(0, 0, 10)]) == [False]  # the first handle died with the redelivery
    assert q.flights[0].due == 2_500 + 2_000
    assert s.ack(G, T, [(0, 0, 12)]) == [True]


def test_no_delivery_past_max_delivery_attempts() -> None:
    s = _state(max_delivery_attempts=2, retry={"policy": "list", "delays_ms": [0]})
    _receive(s, 1, 0, [(0, 0, 1, [0])], inv=10)
    assert len(_receive(s, 2, 10, [(0, 1, 1, [0])], inv=10)) == 1
    assert _receive(s, 3, 100, [(0, 1, 1, [0])], inv=10) == []  # the master dead-letters it
    q = s.queue(G, T, 0)
    assert q is not None and q.flights[0].attempt == 2


def test_fifo_holds_a_queue_while_a_flight_is_not_due_and_redelivers_in_order() -> None:
    s = _state(fifo=True, retry={"policy": "list", "delays_ms": [0]})
    _receive(s, 1, 0, [(0, 0, 2, [0, 1])], inv=100)
    assert _receive(s, 2, 50, [(0, 2, 4, [2, 3])]) == []  # blocked: nothing later
    q = s.queue(G, T, 0)
    assert q is not None and q.next == 2
    assert s.ack(G, T, [(0, 0, 1)]) == [True]
    assert _receive(s, 3, 60, [(0, 2, 4, [2, 3])]) == []  # 1 is still in flight
    got = _receive(s, 4, 100, [(0, 2, 2, [1])])
    assert [(d.offset, d.attempt) for d in got] == [(1, 2)]
    assert s.ack(G, T, [(0, 1, 4)]) == [True]
    assert [d.offset for d in _receive(s, 5, 101, [(0, 2, 4, [2, 3])])] == [2, 3]


def test_a_nack_makes_it_due_after_its_delay_or_the_policy_s_and_kills_the_handle() -> None:
    s = _state(retry={"policy": "exponential", "initial_ms": 100, "multiplier": 3, "max_ms": 250})
    _receive(s, 1, 0, [(0, 0, 2, [0, 1])], inv=10_000)
    s.tick(40)
    assert s.nack(7, G, T, [(0, 0, 1), (0, 1, 99)], None) == [True, False]
    q = s.queue(G, T, 0)
    assert q is not None and q.flights[0].due == 140 and q.flights[0].epoch == 7
    assert s.nack(8, G, T, [(0, 1, 1)], 5) == [True]
    assert q.flights[1].due == 45
    assert s.ack(G, T, [(0, 0, 1), (0, 1, 1)]) == [False, False]
    assert [d.offset for d in _receive(s, 9, 140, [(0, 2, 2, [0, 1])])] == [0, 1]


def test_a_changed_invisible_time_gives_a_new_handle() -> None:
    s = _state(retry={"policy": "list", "delays_ms": [1000]})
    _receive(s, 1, 0, [(0, 0, 1, [0])], inv=100)
    s.tick(50)
    assert s.change_invisible(2, G, T, (0, 0, 99), 500) is None
    new = s.change_invisible(2, G, T, (0, 0, 1), 500)
    assert new == Delivered(0, 0, 1, 2, 550)
    assert s.ack(G, T, [(0, 0, 1)]) == [False]
    assert s.ack(G, T, [(0, 0, 2)]) == [True]


def test_a_dead_letter_ends_a_current_flight_once() -> None:
    s = _state()
    _receive(s, 1, 0, [(0, 0, 1, [0])])
    assert s.dead_letter(G, T, (0, 0, 1)) is True
    assert s.dead_letter(G, T, (0, 0, 1)) is False
    assert s.counts(G, T)["dead_lettered"] == 1 and s.in_flight(G, T) == 0


def test_log_time_never_goes_back() -> None:
    s = PopState()
    assert (s.tick(100), s.tick(50), s.tick(120)) == (100, 100, 120)


def test_the_snapshot_part_round_trips_and_applying_is_deterministic() -> None:
    def run() -> PopState:
        s = _state(fifo=True)
        s.configure("h", PopConfig())
        _receive(s, 1, 10, [(0, 0, 3, [0, 2]), (1, 5, 6, [5])])
        s.tick(20)
        s.ack(G, T, [(0, 2, 1)])
        s.change_invisible(3, G, T, (1, 5, 1), 70)
        s.dead_letter(G, T, (0, 0, 1))
        return s

    a, b = run(), run()
    doc = orjson.loads(orjson.dumps(a.to_json()))
    assert doc == b.to_json()
    again = PopState.from_json(doc)
    assert again.to_json() == a.to_json()
    s = PopState()
    s.drop_topic(T)
    a.drop_topic(T)
    assert a.queues == {} and a.stats == {G: {}}


def test_retry_policies() -> None:
    rocketmq = RetryPolicy()
    assert [rocketmq.delay(n) for n in (1, 2, 16, 17, 40)] == [
        1000,
        5000,
        *ROCKETMQ_DELAYS_MS[15:17],
        ROCKETMQ_DELAYS_MS[-1],
    ]
    exp = RetryPolicy.from_json({"policy": "exponential", "initial_ms": 100, "max_ms": 1000})
    assert [exp.delay(n) for n in (1, 2, 3, 4, 5)] == [100, 200, 400, 800, 1000]
    assert RetryPolicy.from_json(exp.to_json()) == exp


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "offsets"},
        {"fifo": "yes"},
        {"max_delivery_attempts": 0},
        {"max_delivery_attempts": 1.5},
        {"start": -1},
        {"start": "middle"},
        {"retry": {"policy": "list", "delays_ms": []}},
        {"retry": {"policy": "list", "delays_ms": [-1]}},
        {"retry": {"policy": "exponential", "multiplier": 0.5}},
        {"retry": {"policy": "exponential", "initial_ms": 10, "max_ms": 5}},
        {"retry": {"policy": "fibonacci"}},
    ],
)
def test_a_malformed_config_is_a_value_error(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PopConfig.from_json(bad)


def test_counters_tell_expiries_from_nacks_and_survive_the_snapshot() -> None:
    s = _state(retry={"policy": "list", "delays_ms": [0]}, max_delivery_attempts=3)
    _receive(s, 1, 0, [(0, 0, 2, [0, 1])], inv=100)
    assert s.nack(2, G, T, [(0, 1, 1)], 0) == [True]
    # At 200 offset 0's invisible time has passed (an expiry), offset 1 was nacked.
    again = _receive(s, 3, 200, [(0, 2, 2, [0, 1])], inv=100)
    assert [(d.offset, d.attempt) for d in again] == [(0, 2), (1, 2)]
    assert s.ack(G, T, [(0, 0, 3), (0, 1, 1)]) == [True, False]
    s.tick(400)
    assert s.dead_letter(G, T, (0, 1, 3))  # its invisible time passed: expired too
    assert s.counts(G, T) == {
        "delivered": 4,
        "redelivered": 2,
        "acked": 1,
        "nacked": 1,
        "expired": 2,
        "dead_lettered": 1,
    }
    s.redrove(G, 5)
    s.redrove(G, 3)  # (never back)
    again_s = PopState.from_json(orjson.loads(orjson.dumps(s.to_json())))
    assert again_s.counts(G, T) == s.counts(G, T) and again_s.redriven == {G: 5}
    assert again_s.to_json() == s.to_json()


def test_a_snapshot_part_from_before_the_counters_still_loads() -> None:
    old = {
        "ts": 7,
        "groups": {G: PopConfig().to_json()},
        "queues": [[G, T, 0, 4, [[3, 1, 9, 100, 200, None]]]],
        "dead": {G: {T: 2}},
    }
    s = PopState.from_json(old)
    assert s.counts(G, T)["dead_lettered"] == 2 and s.redriven == {}
    q = s.queue(G, T, 0)
    assert q is not None and q.flights[3].attempt == 1 and not q.flights[3].nacked


def test_an_auto_renewed_flight_keeps_its_handle_and_a_change_of_it_is_a_nack() -> None:
    """A push consumer's receive (``owner``): a renewal moves the invisible time and keeps
    the epoch (the first handle still acks); ``stop`` lets it go; a change of its
    invisible time is the client's nack (due when that time ends, no retry delay on top)
    and ends the renewal; the owner survives the snapshot."""
    s = _state(retry={"policy": "list", "delays_ms": [1000]})
    s.tick(0)
    full = [(0, 0, 2, [0, 1], 0)]
    got = s.receive(
        1, G, T, invisible_ms=600, attempt_id=None, picks=full, owner="c1", renew_ms=5000
    )
    assert [d.visible_at for d in got] == [600, 600]
    q = s.queue(G, T, 0)
    assert q is not None and q.flights[0].owner == "c1" and q.flights[0].renew_until == 5000
    s.tick(500)
    assert s.renew(G, T, [(0, 0, 1), (0, 1, 9)], 600, stop=False) == [True, False]
    assert (q.flights[0].visible_at, q.flights[0].due, q.flights[0].epoch) == (1100, 2100, 1)
    again = PopState.from_json(orjson.loads(orjson.dumps(s.to_json())))
    assert again.to_json() == s.to_json() and again.queues[(G, T, 0)].flights[0].owner == "c1"
    assert s.change_invisible(2, G, T, (0, 1, 1), 200) == Delivered(0, 1, 1, 2, 700)
    assert (q.flights[1].due, q.flights[1].owner, q.flights[1].nacked) == (700, None, True)
    assert s.renew(G, T, [(0, 1, 2)], 600, stop=False) == [False]  # no longer renewed
    assert s.renew(G, T, [(0, 0, 1)], 100, stop=True) == [True]
    assert q.flights[0].owner is None and q.flights[0].visible_at == 600
    assert s.ack(G, T, [(0, 0, 1)]) == [True]  # the handle first given
    assert s.counts(G, T)["nacked"] == 1
