"""The producer-session and promotion rules as plain objects (``broker/sessions.py``,
``broker/promotion.py``): every decision, driven by hand. The simulation drives the same
objects (tests/sim/test_broker_simulation.py breaks them and sees seeds fail)."""

from __future__ import annotations

from broker import errors
from broker.metadata import ProducerSession
from broker.promotion import Promotion, Step
from broker.sessions import (
    Answer,
    Append,
    AttemptState,
    Join,
    ProducerSessions,
    Refuse,
    SettleFirst,
)

R1 = [(0, 0, 48), (1, 0, 200)]


def never(_index: int) -> bool:
    return False


def always(_index: int) -> bool:
    return True


def test_a_new_batch_is_appended_and_a_retry_meanwhile_joins_it() -> None:
    ps = ProducerSessions(limit=10)
    d = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(d, Append) and d.done == [] and d.attempt.term == 3
    again = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(again, Join) and again.attempt is d.attempt


def test_an_answered_attempt_answers_retries_until_settled() -> None:
    """A success whose wait for dispatch timed out: the table may not know the batch
    yet, so a retry must get the same answer, never a second append."""
    ps = ProducerSessions(limit=10)
    d = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(d, Append)
    ps.end(d.attempt, answer=R1, appended=True, master_term=3, ledger_end=9, settled=never)
    assert d.attempt.state is AttemptState.ANSWERED and d.attempt.settle_index == 9
    assert ps.begin(("p", 1), 2, term=3, table={}, settled=never) == Answer(R1)
    ps.end(d.attempt, answer=R1, appended=True, master_term=3, ledger_end=9, settled=always)
    assert ("p", 1) in ps.attempts  # end counts once: a second call changes nothing


def test_an_unknown_outcome_settles_before_a_retry_may_append() -> None:
    ps = ProducerSessions(limit=10)
    d = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(d, Append)
    ps.end(d.attempt, answer=None, appended=True, master_term=3, ledger_end=12, settled=never)
    assert d.attempt.state is AttemptState.ORPHANED
    wait = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert wait == SettleFirst(d.attempt, 12)
    # Settled, and the log holds the whole batch: answered from the table.
    table = {"p": ProducerSession(1, 2, list(R1))}
    assert ps.begin(("p", 1), 2, term=3, table=table, settled=always) == Answer(R1)
    assert ("p", 1) not in ps.attempts


def test_a_batch_cut_short_by_a_failover_appends_its_tail() -> None:
    ps = ProducerSessions(limit=10)
    table = {"p": ProducerSession(1, 2, [R1[0]])}
    d = ps.begin(("p", 1), 2, term=4, table=table, settled=always)
    assert isinstance(d, Append) and d.done == [R1[0]]


def test_an_attempt_of_an_earlier_term_is_dropped() -> None:
    ps = ProducerSessions(limit=10)
    d = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(d, Append)
    d2 = ps.begin(("p", 1), 2, term=4, table={}, settled=never)
    assert isinstance(d2, Append) and d2.attempt is not d.attempt


def test_an_attempt_refused_before_appending_goes_at_once() -> None:
    ps = ProducerSessions(limit=10)
    d = ps.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(d, Append)
    ps.end(d.attempt, answer=None, appended=False, master_term=3, ledger_end=5, settled=never)
    assert not ps.attempts
    ps2 = ProducerSessions(limit=10)
    d = ps2.begin(("p", 1), 2, term=3, table={}, settled=never)
    assert isinstance(d, Append)
    ps2.end(d.attempt, answer=None, appended=True, master_term=None, ledger_end=5, settled=never)
    assert not ps2.attempts  # no longer master: its term's entries are not ours to settle


def test_an_old_sequence_is_refused_and_the_limit_is_kept() -> None:
    ps = ProducerSessions(limit=2)
    table = {"p": ProducerSession(5, 1, [(0, 0, 48)])}
    d = ps.begin(("p", 4), 1, term=3, table=table, settled=never)
    assert isinstance(d, Refuse) and isinstance(d.error, errors.SequenceTooOldError)
    for seq in (6, 7):
        assert isinstance(ps.begin(("p", seq), 1, term=3, table=table, settled=never), Append)
    busy = ps.begin(("q", 0), 1, term=3, table={}, settled=never)
    assert isinstance(busy, Refuse) and isinstance(busy.error, errors.BusyError)
    # Ended and settled attempts make room.
    for a in list(ps.attempts.values()):
        ps.end(a, answer=[(0, 1, 60)], appended=True, master_term=3, ledger_end=9, settled=never)
    assert isinstance(ps.begin(("q", 0), 1, term=3, table={}, settled=always), Append)


def test_promotion_waits_for_the_noop_then_dispatch_then_is_ready() -> None:
    p = Promotion(term=7)
    kw = {"leading": True, "committed_index": 10, "dispatched": 3}
    assert p.advance(own_term_committed=False, **kw) is Step.WAIT_NOOP  # type: ignore[arg-type]
    assert p.advance(own_term_committed=True, **kw) is Step.WAIT_DISPATCH  # type: ignore[arg-type]
    assert p.catch_up_target == 10
    # The target stays what was committed when the NOOP was: later commits do not move it.
    assert (
        p.advance(leading=True, own_term_committed=True, committed_index=50, dispatched=10)
        is Step.READY
    )
    assert (
        p.advance(leading=False, own_term_committed=True, committed_index=50, dispatched=50)
        is Step.GIVE_UP
    )
