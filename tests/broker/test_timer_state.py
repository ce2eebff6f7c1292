"""Delay messages' replicated state (broker/timers/state.py): a timer is done once,
delivered or cancelled, and what is kept is a bitmap from the first pending timer."""

from __future__ import annotations

import orjson
import pytest

from broker.timers.state import RECALLS_KEPT, TimerState


def test_a_timer_is_done_once_and_never_past_the_end() -> None:
    s = TimerState()
    assert not s.finish(0, "delivered"), "not scheduled yet"
    for t in range(10):
        s.scheduled(t)
    s.scheduled(3)  # (a replay of an applied record changes nothing)
    assert (s.end, s.pending, s.floor) == (10, 10, 0)
    assert s.finish(1, "cancelled") and not s.finish(1, "delivered")
    assert s.was_cancelled(1) and not s.was_cancelled(2) and s.floor == 0
    assert s.finish(0, "delivered") and s.floor == 2
    for t in range(2, 9):
        assert s.finish(t, "delivered")
    assert (s.floor, s.base, s.pending) == (9, 8, 1), "whole bytes of done timers go"
    assert s.is_done(3) and s.was_cancelled(3) is False and not s.is_done(9)
    assert s.was_cancelled(1), "below base, a cancel is remembered (RECALLS_KEPT)"
    assert not s.finish(10, "delivered") and not s.finish(-1, "delivered")
    assert s.stats == {"scheduled": 10, "delivered": 8, "cancelled": 1, "dropped": 0}


@pytest.mark.parametrize(
    "part",
    [
        {"end": 8, "base": 3, "done": "", "cancelled": "", "stats": {}},  # base not a multiple of 8
        {"end": 8, "base": 0, "done": "AA==", "cancelled": "", "stats": {}},  # bitmaps differ
        {"end": 0, "base": 8, "done": "", "cancelled": "", "stats": {}},  # base past the end
        {"end": 8, "base": 0, "done": "!", "cancelled": "", "stats": {}},  # not base64
        {"end": 8, "base": 0, "done": "", "cancelled": ""},  # no stats
    ],
)
def test_a_malformed_part_is_refused(part: dict[str, object]) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        TimerState.from_json(part)


def test_a_million_pending_timers_cost_a_bitmap() -> None:
    """The replicated part of a timer is a bit: the state of a million pending timers
    with every other one done is small, and it survives the snapshot."""
    s = TimerState()
    for t in range(1_000_000):
        s.scheduled(t)
    for t in range(0, 1_000_000, 2):
        assert s.finish(t, "delivered")
    assert s.pending == 500_000 and s.floor == 1
    doc = orjson.dumps(s.to_json())
    assert len(doc) < 400_000
    again = TimerState.from_json(orjson.loads(doc))
    assert again.to_json() == s.to_json() and again.pending == 500_000
    for t in range(1, 1_000_000, 2):
        assert again.finish(t, "cancelled")
    assert again.pending == 0 and again.floor == 1_000_000 and again.base == 1_000_000
    assert not again.finish(5, "delivered") and again.was_cancelled(5) is None


def test_a_recall_asked_again_answers_the_same_after_the_bitmaps_move_on() -> None:
    """Found by the broker simulation (with the fix undone, seed 119 fails): a timer
    cancelled, then the seven others of its byte done, fell below ``base`` and was
    forgotten, so a repeated recall of it answered 409 ALREADY_DELIVERED. The last
    ``RECALLS_KEPT`` cancels are kept below ``base``, in the snapshot; older ones are
    forgotten (None), as before."""
    s = TimerState()
    for t in range(16):
        s.scheduled(t)
    assert s.finish(3, "cancelled")
    for t in range(16):
        s.finish(t, "delivered")
    assert s.base == 16 and s.was_cancelled(3) and s.was_cancelled(4) is False
    again = TimerState.from_json(orjson.loads(orjson.dumps(s.to_json())))
    assert again.was_cancelled(3) and again.was_cancelled(5) is False
    n = 16 + 8 * RECALLS_KEPT
    for t in range(16, n):
        s.scheduled(t)
        s.finish(t, "cancelled")
    assert s.base == n and len(s.recalled) == RECALLS_KEPT
    assert s.was_cancelled(3) is None and s.was_cancelled(n - 1)
    assert s.was_cancelled(n - RECALLS_KEPT) and s.was_cancelled(n - RECALLS_KEPT - 1) is None
    old = {k: v for k, v in s.to_json().items() if k not in ("recalled", "forgotten")}
    assert TimerState.from_json(old).was_cancelled(n - 1) is None, "a part written before"
    with pytest.raises(ValueError, match="out of order"):
        TimerState.from_json({**s.to_json(), "recalled": [n - 1, n - 2]})
