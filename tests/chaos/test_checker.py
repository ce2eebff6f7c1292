"""The chaos checker on hand-made histories: a clean one passes, and each anomaly it
must catch is caught (and only it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .checker import Verdict, check
from .history import History, Op, Read, dump, load


def _clock() -> Iterator[float]:
    t = 0.0
    while True:
        t += 0.1
        yield t


class Script:
    """Builds a history with a fake clock, 0.1 s per op."""

    def __init__(self) -> None:
        ticks = _clock()
        self.h = History(clock=lambda: next(ticks))

    def send(self, values: list[str], outcome: str = "ok", at: list[tuple[int, int]] = ()) -> None:  # type: ignore[assignment]
        done = self.h.invoke("producer-0", "send", tuple(values))
        if outcome == "ok":
            done("ok", tuple(Read(x, q, o) for x, (q, o) in zip(values, at, strict=True)))
        else:
            done(outcome)

    def read(self, f: str, reads: list[tuple[str, int, int]], process: str = "consumer-0",
             node: str | None = "n0", asked: tuple[int, int] | None = None) -> None:  # fmt: skip
        done = self.h.invoke(process, f, asked)
        done("ok", tuple(Read(*r) for r in reads), node)

    def ops(self) -> list[Op]:
        return list(self.h)


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
