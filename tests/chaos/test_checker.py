"""The chaos checker on hand-made histories: a clean one passes, and each anomaly it
must catch is caught (and only it); the POP group's rules and the delay messages' rules
likewise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .checker import Verdict, check, summary
from .history import DeadLetter, Delay, History, Op, Popped, Read, Scheduled, dump, load

WALL0 = 1_700_000_000.0  # the fake wall clock at the fake monotonic clock's 0


class Script:
    """Builds a history with a fake clock, 0.1 s per op (``wait`` moves it on); the wall
    clock is ``WALL0`` plus it."""

    def __init__(self) -> None:
        self.t = 0.0
        self.h = History(clock=self._tick, wall=lambda: WALL0 + self.t)

    def _tick(self) -> float:
        self.t = round(self.t + 0.1, 6)
        return self.t

    def wait(self, seconds: float) -> None:
        self.t = round(self.t + seconds, 6)

    def now_ms(self) -> int:
        return round((WALL0 + self.t) * 1000)

    def send(self, values: list[str], outcome: str = "ok", at: list[tuple[int, int]] = ()) -> None:  # type: ignore[assignment]
        done = self.h.invoke("producer-0", "send", tuple(values))
        if outcome == "ok":
            done("ok", tuple(Read(x, q, o) for x, (q, o) in zip(values, at, strict=True)))
        else:
            done(outcome)

    def read(self, f: str, reads: list[tuple[Any, ...]], process: str = "consumer-0",
             node: str | None = "n0", asked: tuple[int, int] | None = None) -> None:  # fmt: skip
        """``reads``: (value, queue, offset) or (value, queue, offset, store ms)."""
        done = self.h.invoke(process, f, asked)
        done("ok", tuple(Read(*r) for r in reads), node)

    def ops(self) -> list[Op]:
        return list(self.h)

    # ---- delay messages ---------------------------------------------------------------

    def delay(self, asks: list[tuple[str, int | None, int | None]], outcome: str = "ok",
              answered: list[int] | None = None) -> list[str]:  # fmt: skip
        """A delay batch: (value, deliver_at_ms, delay_ms) each; ok: answered with the
        times in ``answered`` (by default the ones asked, or now + the delay); the
        recall handles."""
        done = self.h.invoke("producer-0", "delay", tuple(Delay(*a) for a in asks))
        now = self.now_ms()
        times = answered or [at if at is not None else now + (d or 0) for _, at, d in asks]
        handles = [f"t1:{a[0]}" for a in asks]
        if outcome == "ok":
            sched = (Scheduled(a[0], t, h) for a, t, h in zip(asks, times, handles, strict=True))
            done("ok", tuple(sched))
        else:
            done(outcome, error="UNKNOWN_OUTCOME: no answer")
        return handles

    def recall(self, value: str, outcome: str = "ok", code: str | None = None) -> None:
        done = self.h.invoke("producer-0", "recall", {"value": value, "handle": f"t1:{value}"})
        done(outcome, error=None if code is None else f"{code}: said the broker")

    # ---- the POP group ----------------------------------------------------------------

    def pop_config(self, *, fifo: bool = False, attempts: int = 3) -> None:
        """Invisible times of 1 s, a retry delay of 200 ms."""
        retry = {"policy": "list", "delays_ms": (200,)}
        self.h.ok("pop-config", "pop-config", {"group": "g", "topic": "chaos", "fifo": fifo,
                  "max_delivery_attempts": attempts, "retry": retry, "start": "earliest",
                  "invisible_ms": 1000})  # fmt: skip

    def receive(self, consumer: str, got: list[tuple[str, int, int, int, int]],
                at_ms: int | None = None) -> list[str]:  # fmt: skip
        """``got``: (value, queue, offset, epoch, attempt), handed out at ``at_ms`` (by
        default as the request is sent) for 1 s; their handles."""
        done = self.h.invoke(consumer, "receive", 1000)
        at = self.now_ms() if at_ms is None else at_ms
        popped = tuple(
            Popped(x, q, o, f"v1:{q}:{o}:{e}", n, at + 1000, f"id-{x}") for x, q, o, e, n in got
        )
        done("ok", popped)
        return [p.handle for p in popped]

    def settle(self, consumer: str, f: str, handles: list[str], status: str = "OK",
               delay_ms: int = 0) -> None:  # fmt: skip
        """An ack or a nack answered ``status`` for each handle ("info": no answer)."""
        value: Any = tuple(handles) if f == "ack" else {"handles": tuple(handles),
                                                         "delay_ms": delay_ms}  # fmt: skip
        done = self.h.invoke(consumer, f, value)
        if status == "info":
            done("info", error="UNKNOWN_OUTCOME")
        else:
            done("ok", dict.fromkeys(handles, status))

    def extend(self, consumer: str, handle: str, epoch: int | None, ms: int = 1000) -> str:
        """A new invisible time of ``ms``: its handle has ``epoch`` (None: no answer)."""
        done = self.h.invoke(consumer, "extend", {"handle": handle, "invisible_ms": ms})
        new = handle.rsplit(":", 1)[0] + f":{epoch}"
        if epoch is None:
            done("info", error="UNKNOWN_OUTCOME")
        else:
            done("ok", new)
        return new

    def pop_end(self, dead: tuple[DeadLetter, ...] = (), lags: dict[int, int] | None = None,
                nodes: tuple[str, ...] = ("n0", "n1", "n2")) -> None:  # fmt: skip
        for n in nodes:
            self.h.ok("pop-end", "pop-lag", {0: 0, 1: 0} if lags is None else lags, n)
        self.h.ok("pop-end", "dlq", dead, "n0")


def _clean() -> Script:
    s = Script()
    s.h.info("nemesis", "fault", {"kind": "kill", "nodes": ("n1",)})
    s.send(["a", "b"], at=[(0, 0), (0, 1)])
    s.send(["c"], at=[(1, 0)])
    s.send(["d"], outcome="info")  # in the log, once: resolved
    s.send(["e"], outcome="info")  # never made it: resolved too
    s.read("poll", [("a", 0, 0)])
    s.read("poll", [("b", 0, 1), ("c", 1, 0)])
    s.read("pull", [("a", 0, 0), ("b", 0, 1), ("d", 0, 2)], process="puller-0", asked=(0, 0))
    s.h.invoke("consumer-0", "commit", {0: 2, 1: 1})("ok")
    s.h.ok("offsets", "offsets", {0: 2, 1: 1}, node="n0")
    for n in ("n0", "n1", "n2"):
        s.read("drain", [("a", 0, 0), ("b", 0, 1), ("d", 0, 2), ("c", 1, 0)], "drain", n)
    return s


def _only(v: Verdict, anomaly: str) -> list[str]:
    found = v.anomalies()
    assert set(found) == {anomaly}, found
    return found[anomaly]


def test_a_clean_history_is_valid_and_resolves_the_indeterminate() -> None:
    v = check(_clean().ops())
    assert v.valid, v.anomalies()
    assert (v.sent, v.acknowledged, v.indeterminate) == (5, 3, 2)
    assert (v.indeterminate_found, v.indeterminate_absent) == (1, 1)
    assert v.operations["send ok"] == 2


def test_a_lost_write_is_caught() -> None:
    s = Script()
    s.send(["a", "b"], at=[(0, 0), (0, 1)])
    s.read("drain", [("a", 0, 0)], "drain")
    assert _only(check(s.ops()), "lost") == ["b"]


def test_a_phantom_read_is_caught() -> None:
    s = Script()
    s.send(["a"], at=[(0, 0)])
    s.read("drain", [("a", 0, 0), ("ghost", 0, 1)], "drain")
    assert _only(check(s.ops()), "unexpected") == ["ghost"]


def test_a_duplicate_is_caught_even_of_an_indeterminate_send() -> None:
    s = Script()
    s.send(["a"], outcome="info")
    s.read("drain", [("a", 0, 0), ("a", 0, 1)], "drain")
    v = check(s.ops())
    assert _only(v, "duplicated") == ["a at [(0, 0), (0, 1)]"]
    assert v.indeterminate_found == 1


def test_an_offset_gap_within_a_read_and_across_the_queue_is_caught() -> None:
    s = Script()
    s.send(["a", "b"], at=[(0, 0), (0, 2)])
    s.read("drain", [("a", 0, 0), ("b", 0, 2)], "drain")
    gaps = _only(check(s.ops()), "gaps")
    assert any("0 → 2" in g for g in gaps)
    assert any("offsets 1 never read" in g for g in gaps)


def test_a_poll_skip_and_a_poll_rewind_are_caught() -> None:
    s = Script()
    s.send(["a", "b", "c"], at=[(0, 0), (0, 1), (0, 2)])
    s.read("poll", [("a", 0, 0)])
    s.read("poll", [("c", 0, 2)])  # skipped 1
    s.read("poll", [("b", 0, 1)])  # back to 1
    s.read("drain", [("a", 0, 0), ("b", 0, 1), ("c", 0, 2)], "drain")
    v = check(s.ops())
    assert set(v.anomalies()) == {"gaps", "rewinds"}
    assert [g.split(": ")[1] for g in v.gaps] == ["queue 0 0 → 2"]
    assert [r.split(": ")[1] for r in v.rewinds] == ["queue 0 2 → 1"]


def test_an_offset_rewind_within_a_read_and_a_pull_starting_elsewhere_are_caught() -> None:
    s = Script()
    s.send(["a", "b"], at=[(0, 0), (0, 1)])
    s.read("pull", [("a", 0, 0), ("b", 0, 1), ("a", 0, 0)], process="puller-0", asked=(0, 0))
    s.read("pull", [("a", 0, 0)], process="puller-0", asked=(0, 1))
    rewinds = _only(check(s.ops()), "rewinds")
    assert len(rewinds) == 2
    assert "asked 1, got 0" in rewinds[1]


def test_an_inconsistent_offset_across_nodes_is_caught() -> None:
    s = Script()
    s.send(["a"], at=[(0, 0)])
    s.send(["b"], outcome="info")
    s.read("drain", [("a", 0, 0)], "drain", "n0")
    s.read("drain", [("b", 0, 0)], "drain", "n1")
    v = check(s.ops())
    assert v.inconsistent == ["queue 0 offset 0: 'a' and 'b'"]
    assert set(v.anomalies()) == {"inconsistent"}


def test_a_value_read_elsewhere_than_acknowledged_is_inconsistent() -> None:
    s = Script()
    s.send(["a"], at=[(0, 5)])
    s.read("drain", [("a", 0, 0)], "drain")
    assert _only(check(s.ops()), "inconsistent") == [
        "a: acknowledged at queue 0 offset 5, read [(0, 0)]"
    ]


def test_group_offsets_moving_backwards_are_caught_but_not_across_a_restart() -> None:
    s = Script()
    s.h.ok("offsets", "offsets", {0: 5}, node="n1")
    s.h.info("nemesis", "fault", {"kind": "kill-slave", "nodes": ("n1",)})
    s.h.ok("offsets", "offsets", {0: 3}, node="n1")  # replaying after a restart: allowed
    s.h.ok("offsets", "offsets", {0: 2}, node="n1")  # backwards on one node: not
    (found,) = _only(check(s.ops()), "offsets_backwards")
    assert found.startswith("n1 at ") and found.endswith("queue 0 committed 3 → 2")


def test_a_node_ending_below_an_acknowledged_commit_is_caught() -> None:
    s = Script()
    s.h.invoke("consumer-0", "commit", {0: 4})("ok")
    s.h.ok("offsets", "offsets", {0: 4}, node="n0")
    s.h.ok("offsets", "offsets", {0: 4}, node="n1")
    s.h.info("nemesis", "fault", {"kind": "kill", "nodes": ("n2",)})
    s.h.ok("offsets", "offsets", {0: 1}, node="n2")
    assert _only(check(s.ops()), "offsets_backwards") == [
        "n2 at the end: queue 0 committed 1 < acknowledged 4"
    ]


def _stale_commit(s: Script, answered: int) -> None:
    """The consumer commits 5 on queue 0, n0 reports it; then the stale committer commits
    2 (a position polled earlier) and the broker answers ``answered``."""
    s.h.invoke("consumer-0", "commit", {0: 5})("ok")
    s.h.ok("offsets", "offsets", {0: 5}, node="n0")
    s.h.invoke("committer-1", "stale-commit", {0: 2})("ok", {0: answered})


def test_a_stale_commit_that_leaves_the_group_where_it_stands_is_valid() -> None:
    s = Script()
    _stale_commit(s, answered=5)
    s.h.ok("offsets", "offsets", {0: 5}, node="n0")
    s.h.ok("offsets", "offsets", {0: 5}, node="n1")
    v = check(s.ops())
    assert v.valid, v.anomalies()
    assert v.operations["stale-commit ok"] == 1


def test_a_stale_commit_followed_by_a_lower_report_is_caught() -> None:
    """Answered right, but a node then reports the stale offset: backwards on that node,
    and below what was acknowledged at the end."""
    s = Script()
    _stale_commit(s, answered=5)
    s.h.ok("offsets", "offsets", {0: 2}, node="n0")
    found = _only(check(s.ops()), "offsets_backwards")
    assert [x.split(": ", 1)[1] for x in found] == [
        "queue 0 committed 5 → 2",
        "queue 0 committed 2 < acknowledged 5",
    ]


def test_a_stale_commit_applied_as_the_last_writer_is_caught_by_its_answer() -> None:
    """Last-writer-wins: the answer says the group went back to 2; the rule holds even
    before any node reports it (here n1 never had reported 5)."""
    s = Script()
    _stale_commit(s, answered=2)
    s.h.ok("offsets", "offsets", {0: 5}, node="n0")
    (found,) = _only(check(s.ops()), "commit_answers")
    assert found.startswith("committer-1 stale commit at ")
    assert found.endswith("queue 0 asked 2, answered 2 < 5 (known before)")


def test_a_stale_commit_answered_below_a_report_or_what_it_asked_is_caught() -> None:
    s = Script()
    s.h.ok("offsets", "offsets", {0: 7, 1: 3}, node="n1")  # known from a report alone
    s.h.invoke("committer-1", "stale-commit", {0: 4, 1: 2})("ok", {0: 6, 1: 1})
    s.h.ok("offsets", "offsets", {0: 7, 1: 3}, node="n1")
    found = _only(check(s.ops()), "commit_answers")
    assert [x.split(": ", 1)[1] for x in found] == [
        "queue 0 asked 4, answered 6 < 7 (known before)",
        "queue 1 asked 2, answered 1 < 3 (known before)",
    ]
    s = Script()
    s.h.invoke("committer-1", "stale-commit", {0: 4, 1: 2})("ok", {0: 3})
    found = _only(check(s.ops()), "commit_answers")
    assert [x.split(": ", 1)[1] for x in found] == [
        "queue 0 asked 4, answered 3 < 4 (asked)",
        "queue 1 asked 2, answered None < 2 (asked)",
    ]


def test_a_stale_commit_is_held_only_to_offsets_known_when_it_was_invoked() -> None:
    s = Script()
    done = s.h.invoke("committer-1", "stale-commit", {0: 2})
    s.h.invoke("consumer-0", "commit", {0: 5})("ok")  # acknowledged while it ran
    done("ok", {0: 2})  # applied before the consumer's: it stood at 2 then
    s.h.invoke("committer-1", "stale-commit", {0: 1})("info", error="UNKNOWN_OUTCOME: x")
    s.h.ok("offsets", "offsets", {0: 5}, node="n0")
    v = check(s.ops())
    assert v.valid, v.anomalies()


def test_the_unavailability_window_runs_to_the_first_ack_of_a_later_send() -> None:
    s = Script()
    done = s.h.invoke("producer-0", "send", ("a",))  # 0.1: before the fault
    s.h.info("nemesis", "fault", {"kind": "pause", "nodes": ("n0",)})  # 0.2
    done("ok", (Read("a", 0, 0),))  # 0.3: answered after, invoked before: not counted
    s.send(["b"], at=[(0, 1)])  # invoked 0.4, ok 0.5
    s.h.info("nemesis", "fault", {"kind": "kill", "nodes": ("n1",)})  # 0.6: nothing after
    w = check(s.ops()).windows
    assert [(x.kind, x.window_s) for x in w] == [("pause", pytest.approx(0.3)), ("kill", None)]
    assert [x.stall_s for x in w] == [pytest.approx(0.2), 0.0]  # 0.3 → 0.5: the longest


def test_a_history_survives_dump_and_load(tmp_path: Path) -> None:
    ops = _clean().ops()
    dump(ops, tmp_path / "h.jsonl")
    again = load(tmp_path / "h.jsonl")
    assert again == ops
    assert check(again).valid


def test_an_op_completes_once() -> None:
    h = History(clock=lambda: 0.0)
    done: Any = h.invoke("p", "send", ("a",))
    done("info")
    with pytest.raises(AssertionError, match="completed twice"):
        done("ok")


# ---- the POP group ----------------------------------------------------------------------------


def _pop_clean() -> Script:
    """Every fate a POP message has in a run, by the rules."""
    s = Script()
    s.pop_config(attempts=2)
    places = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    s.send(["a", "b", "c", "d", "e"], at=places)
    # a acked; b nacked (back at once), then acked by another consumer
    ha, hb = s.receive("pop-0", [("a", 0, 0, 10, 1), ("b", 0, 1, 10, 1)])
    s.settle("pop-0", "ack", [ha])
    s.settle("pop-0", "nack", [hb], delay_ms=0)
    (hb,) = s.receive("pop-1", [("b", 0, 1, 14, 2)])
    s.settle("pop-1", "ack", [hb])
    # c and d let go: back after their invisible time and the retry delay (1.2 s)
    s.receive("pop-0", [("c", 1, 0, 16, 1), ("d", 1, 1, 16, 1)])
    s.wait(1.2)
    hc, _ = s.receive("pop-1", [("c", 1, 0, 20, 2), ("d", 1, 1, 20, 2)])
    hc = s.extend("pop-1", hc, 22)  # c kept longer, then acked
    s.settle("pop-1", "ack", [hc])
    # e acked, the answer INVALID_RECEIPT_HANDLE: perhaps a retry after its first attempt
    (he,) = s.receive("pop-2", [("e", 1, 2, 24, 1)])
    s.settle("pop-2", "ack", [he], status="INVALID_RECEIPT_HANDLE")
    # the group drained: d spent its two attempts, a dead letter
    s.wait(1.2)
    for n in ("n0", "n1", "n2"):
        s.read("drain", [("a", 0, 0), ("b", 0, 1), ("c", 1, 0), ("d", 1, 1), ("e", 1, 2)],
               "drain", n)  # fmt: skip
    s.pop_end((DeadLetter("d", "chaos", 1, 1, "id-d", 2, 20),))
    return s


def test_a_clean_pop_history_is_valid() -> None:
    v = check(_pop_clean().ops())
    assert v.valid, v.anomalies()
    assert (v.pop_delivered, v.pop_redelivered, v.pop_acked, v.pop_nacked) == (8, 3, 3, 1)
    assert (v.pop_extended, v.pop_dead_lettered, v.pop_acks_uncertain) == (1, 1, 1)
    assert "POP delivered" in summary(v)


def test_a_pop_history_survives_dump_and_load(tmp_path: Path) -> None:
    ops = _pop_clean().ops()
    dump(ops, tmp_path / "h.jsonl")
    assert load(tmp_path / "h.jsonl") == ops


def test_a_message_delivered_after_its_ack_is_caught() -> None:
    s = Script()
    s.pop_config()
    s.send(["a"], at=[(0, 0)])
    (h,) = s.receive("pop-0", [("a", 0, 0, 10, 1)])
    s.settle("pop-0", "ack", [h])
    s.wait(2.0)  # long after its invisible time: only the ack forbids it
    s.receive("pop-1", [("a", 0, 0, 20, 2)])
    (found,) = _only(check(s.ops()), "pop_acked_again")
    assert "epoch 20" in found and "ack of epoch 10 answered OK" in found


@pytest.mark.parametrize(
    ("before", "caught"),
    [
        ("nothing", 2),  # inside the invisible time, and before it is due
        ("an ack of unknown outcome", 2),  # applied or not, the second is a violation
        ("a nack", 0),  # it let the message go: no violation
        ("a nack after", 2),  # sent after the second delivery: it excuses nothing
        ("a new invisible time of 0, no answer", 0),  # it may have let it go at once
    ],
)
def test_a_message_held_by_two_consumers_inside_its_invisible_time_is_caught(
    before: str, caught: int
) -> None:
    s = Script()
    s.pop_config()
    s.send(["a"], at=[(0, 0)])
    (h,) = s.receive("pop-0", [("a", 0, 0, 10, 1)])
    until = s.now_ms() - 100 + 1000  # handed out as the request was sent
    s.wait(0.5)  # handed out again within its 1 s: only a release would allow it
    if before == "an ack of unknown outcome":
        s.settle("pop-0", "ack", [h], status="info")
    elif before == "a nack":
        s.settle("pop-0", "nack", [h], delay_ms=0)
    elif before == "a new invisible time of 0, no answer":
        s.extend("pop-0", h, None, ms=0)
    at = s.now_ms() + 100  # as the next request is sent
    s.receive("pop-1", [("a", 0, 0, 14, 2)])
    if before == "a nack after":
        s.settle("pop-0", "nack", [h], delay_ms=0)
    v = check(s.ops())
    if not caught:
        assert v.valid, v.anomalies()
        return
    found = _only(v, "pop_held_twice")
    assert len(found) == caught
    assert found[0].startswith(f"queue 0 offset 0 handed out to pop-1 at {at} (epoch 14), while")
    if before != "a nack after":  # (which moved the floors, to after the second)
        assert found[0].endswith(f"is invisible until {until}")
        assert found[1].endswith(f"before it is due again at {until + 200} (epoch 10, attempt 1)")


def test_a_redelivery_before_the_retry_delay_is_caught() -> None:
    s = Script()
    s.pop_config()
    s.send(["a"], at=[(0, 0)])
    s.receive("pop-0", [("a", 0, 0, 10, 1)])
    s.wait(0.9)  # past the invisible time (1 s after the receive), not the delay (200 ms)
    s.receive("pop-1", [("a", 0, 0, 14, 2)])
    (found,) = _only(check(s.ops()), "pop_held_twice")
    assert "before it is due again" in found


def test_attempts_that_do_not_go_up_are_caught() -> None:
    s = Script()
    s.pop_config(attempts=3)
    s.send(["a", "b"], at=[(0, 0), (0, 1)])
    s.receive("pop-0", [("a", 0, 0, 10, 2), ("b", 0, 1, 10, 3)])  # earlier ones unseen: fine
    s.wait(1.5)
    s.receive("pop-1", [("a", 0, 0, 20, 2), ("b", 0, 1, 20, 4)])  # the same; over 3
    found = _only(check(s.ops()), "pop_attempts")
    assert len(found) == 2
    assert "offset 0 handed out to pop-1" in found[0] and "attempt 2 after attempt 2" in found[0]
    assert "attempt 4 after attempt 3 (epoch 10), of 3 at most" in found[1]


@pytest.mark.parametrize("fifo", [True, False])
@pytest.mark.parametrize("acked_first", [True, False])
def test_fifo_a_queue_handing_out_while_a_message_of_it_is_in_flight_is_caught(
    fifo: bool, acked_first: bool
) -> None:
    s = Script()
    s.pop_config(fifo=fifo)
    s.send(["a", "b", "c"], at=[(0, 0), (0, 1), (1, 0)])
    (h,) = s.receive("pop-0", [("a", 0, 0, 10, 1)])
    if acked_first:
        s.settle("pop-0", "ack", [h], status="info")  # it may have ended the flight
    s.receive("pop-1", [("b", 0, 1, 12, 1), ("c", 1, 0, 12, 1)])  # c: another queue
    v = check(s.ops())
    if acked_first or not fifo:
        assert v.valid, v.anomalies()
        return
    (found,) = _only(v, "pop_fifo")
    assert found.startswith("queue 0: offset 1 handed out to pop-1 at ")
    assert "while offset 0 is in flight (epoch 10, pop-0" in found


def test_a_hand_out_time_outside_its_request_is_caught() -> None:
    s = Script()
    s.pop_config()
    s.send(["a"], at=[(0, 0)])
    s.receive("pop-0", [("a", 0, 0, 10, 1)], at_ms=s.now_ms() - 5_000)
    (found,) = _only(check(s.ops()), "pop_invisible_until")
    assert "outside its request" in found


def _pop_end(acks: list[str], dead: tuple[DeadLetter, ...] = (),
             lags: dict[int, int] | None = None) -> Verdict:  # fmt: skip
    """One message, a, delivered and answered ``acks``; the end as given."""
    s = Script()
    s.pop_config(attempts=2)
    s.send(["a"], at=[(0, 0)])
    (h,) = s.receive("pop-0", [("a", 0, 0, 10, 1)])
    for status in acks:
        s.settle("pop-0", "ack", [h], status=status)
    s.read("drain", [("a", 0, 0)], "drain")
    s.pop_end(dead, {0: 0} if lags is None else lags)
    return check(s.ops())


def test_at_the_end_every_message_is_acked_or_dead_lettered_exactly_once() -> None:
    dl = DeadLetter("a", "chaos", 0, 0, "id-a", 2, 10)
    assert _pop_end(["OK"]).valid
    assert _pop_end([], (dl,)).valid
    assert _pop_end(["info"]).valid  # perhaps acked: uncertain, not a violation
    (never,) = _only(_pop_end([]), "pop_not_done")
    assert never.startswith("queue 0 offset 0 ('a'): neither acked nor dead-lettered (its ")
    assert "last handle: Seen(epoch=10, attempt=1, " in never
    (twice,) = _only(_pop_end(["OK", "OK"]), "pop_not_done")
    assert "acked 2 times (epochs [10, 10]), dead-lettered 0 times" in twice
    (both,) = _only(_pop_end(["OK"], (dl,)), "pop_not_done")
    assert "acked 1 times (epochs [10]), dead-lettered 1 times" in both
    (dead_twice,) = _only(_pop_end([], (dl, dl)), "pop_not_done")
    assert "dead-lettered 2 times" in dead_twice


def test_a_dead_letter_not_matching_its_message_is_caught() -> None:
    wrong = DeadLetter("a", "other", 0, 1, "id-x", 3, 9)  # delivered after epoch 9 too
    found = _only(_pop_end([], (wrong,)), "pop_dead_letters")
    assert [f.split(": ", 1)[1] for f in found] == [
        "the message is at chaos queue 0 offset 0",
        "message id id-x, not id-a",
        "after 3 attempts, not 2",
        "it ended epoch 9, handed out again at epoch 10",
    ]
    ghost = DeadLetter("ghost", "chaos", 0, 5, "id-g", 2, 10)
    found = _only(_pop_end(["OK"], (ghost,)), "pop_dead_letters")
    assert found == ["dead letter 'ghost' (of queue 0 offset 5): no such message in the topic"]


def test_a_lag_left_at_the_end_is_caught() -> None:
    assert _only(_pop_end(["OK"], lags={0: 1}), "pop_lag") == [
        f"{n}: lag {{0: 1}} at the end" for n in ("n0", "n1", "n2")
    ]
    assert _only(_pop_end(["OK"], lags={}), "pop_lag") == [
        f"{n}: lag {{0: None}} at the end" for n in ("n0", "n1", "n2")
    ]


def test_a_history_written_before_the_wall_clock_loads(tmp_path: Path) -> None:
    row = ["producer-0", "invoke", "send", ["a"], 0.1, None, None]  # 7 fields: no wall_s
    (tmp_path / "h.jsonl").write_text(json.dumps(row) + "\n")
    assert load(tmp_path / "h.jsonl") == [Op("producer-0", "invoke", "send", ("a",), 0.1)]


# ---- delay messages -----------------------------------------------------------------------


def _delay_clean() -> Script:
    """Every fate a delay message has in a run, by the rules."""
    s = Script()
    t = s.now_ms()
    s.send(["a"], at=[(0, 0)])
    # x due at t + 500 (asked so), y 300 ms after its send (t + 600), z recalled in time
    s.delay([("x", t + 500, None), ("y", None, 300), ("z", t + 2000, None)])
    s.recall("z")
    s.wait(0.5)
    # y delivered, then a recall of it answered ALREADY_DELIVERED (after its time)
    s.read("poll", [("y", 0, 1, t + 600)])
    s.recall("y", "fail", "ALREADY_DELIVERED")
    s.read("pull", [("a", 0, 0), ("y", 0, 1, t + 600), ("x", 0, 2, t + 501)], "puller-0",
           asked=(0, 0))  # fmt: skip
    # w: no answer, found once; v: no answer, never stored; u: a recall of unknown outcome
    s.delay([("w", None, 0)], outcome="info")
    s.delay([("v", t + 900, None)], outcome="info")
    s.delay([("u", t + 1000, None)])
    s.recall("u", "info", "UNKNOWN_OUTCOME")
    s.wait(1.0)
    drained = [("a", 0, 0), ("y", 0, 1, t + 600), ("x", 0, 2, t + 501), ("w", 0, 3, s.now_ms())]
    for n in ("n0", "n1", "n2"):
        s.read("drain", drained, "drain", n)
    return s


def test_a_clean_delay_history_is_valid() -> None:
    v = check(_delay_clean().ops())
    assert v.valid, v.anomalies()
    assert (v.delay_sent, v.delay_acknowledged, v.delay_indeterminate) == (6, 4, 2)
    assert (v.delay_indeterminate_found, v.delay_delivered) == (1, 3)
    assert v.delay_recalls == {"ok": 1, "fail": 1, "info": 1}
    assert sorted(v.delay_late_ms) == [0, 1]  # x 1 ms late, y on time
    assert "delay messages" in summary(v)


def test_a_delay_history_survives_dump_and_load(tmp_path: Path) -> None:
    ops = _delay_clean().ops()
    dump(ops, tmp_path / "h.jsonl")
    assert load(tmp_path / "h.jsonl") == ops


def test_a_delay_message_stored_before_its_time_is_caught() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([("x", t + 500, None)])
    s.wait(1.0)
    s.read("drain", [("x", 0, 0, t + 499)], "drain")
    assert _only(check(s.ops()), "delay_early") == [
        f"x (due {t + 500}) read by drain drain: stored at {t + 499}, 1 ms early"
    ]


def test_a_time_answered_later_than_the_stored_one_makes_the_delivery_early() -> None:
    """The bug the rule found: a retried send answered by its session said the retry's
    now + delay_ms; the message came at the first attempt's."""
    s = Script()
    t = s.now_ms()
    s.delay([("x", None, 1000)], answered=[t + 1400])  # stored at about t + 1000
    s.wait(1.5)
    s.read("drain", [("x", 0, 0, t + 1001)], "drain")
    assert "399 ms early" in _only(check(s.ops()), "delay_early")[0]


def test_a_delay_message_read_before_its_time_is_caught_whatever_its_store_time() -> None:
    """A read that ended before the time saw it early (an older history: no store time;
    a send of unknown outcome: its time is its invoke plus its delay)."""
    s = Script()
    t = s.now_ms()
    s.delay([("x", None, 5000)], outcome="info")
    s.read("pull", [("x", 0, 0)], "puller-0", asked=(0, 0))
    s.wait(5.0)
    s.read("drain", [("x", 0, 0)], "drain")
    [found] = _only(check(s.ops()), "delay_early")
    assert found.startswith(f"x (due {t + 100 + 5000}) read by puller-0 pull: the read ended")


def test_a_pop_receive_before_the_time_is_caught() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([("x", t + 5000, None)])
    s.receive("pop-0", [("x", 0, 0, 3, 1)])
    s.wait(5.0)
    s.read("drain", [("x", 0, 0, t + 5000)], "drain")
    assert "pop-0 receive: the read ended" in _only(check(s.ops()), "delay_early")[0]


def test_already_delivered_before_the_time_is_caught() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([("x", t + 5000, None)])
    s.recall("x", "fail", "ALREADY_DELIVERED")
    s.wait(5.0)
    s.read("drain", [("x", 0, 0, t + 5000)], "drain")
    assert "answered ALREADY_DELIVERED" in _only(check(s.ops()), "delay_early")[0]


def test_a_lost_delay_message_is_caught_unless_a_recall_may_have_cancelled_it() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([(x, t + 100, None) for x in ("lost", "refused", "maybe", "cancelled")])
    s.recall("refused", "fail", "ALREADY_DELIVERED")
    s.recall("maybe", "info", "UNKNOWN_OUTCOME")
    s.recall("cancelled")
    s.delay([("unknown", t + 100, None)], outcome="info")
    s.wait(1.0)
    s.read("drain", [], "drain")
    lost = _only(check(s.ops()), "delay_lost")
    assert [x.split(" ")[0] for x in lost] == ["lost", "refused"]


def test_a_recalled_delay_message_delivered_is_caught() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([("x", t + 1000, None)])
    s.recall("x")
    s.wait(1.0)
    s.read("drain", [("x", 0, 0, t + 1000)], "drain")
    assert _only(check(s.ops()), "delay_recall") == ["x: read although a recall of it answered OK"]


def test_a_recall_handle_not_found_for_an_acknowledged_message_is_caught() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([("x", t + 100, None)])
    s.recall("x", "fail", "RECALL_HANDLE_NOT_FOUND")
    s.wait(1.0)
    s.read("drain", [("x", 0, 0, t + 100)], "drain")
    assert _only(check(s.ops()), "delay_recall") == ["x: its recall handle t1:x not found"]


def test_a_delay_message_of_unknown_outcome_delivered_twice_is_caught() -> None:
    s = Script()
    t = s.now_ms()
    s.delay([("x", t + 100, None)], outcome="info")
    s.wait(1.0)
    s.read("drain", [("x", 0, 0, t + 100), ("x", 0, 1, t + 101)], "drain")
    assert _only(check(s.ops()), "duplicated") == ["x at [(0, 0), (0, 1)]"]
