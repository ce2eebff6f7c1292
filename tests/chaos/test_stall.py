"""Stalls (``tests/chaos/stall.py``) on hand-made histories with a clock the test sets:
a stretch without an acknowledged produce longer than the bound is a stall, unless the
master's disk was full meanwhile (writes refused by design); the watcher dumps the
nodes' state, keeps their roles and flags the stall once; a run with a stall is INVALID
and its report names it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .history import History, Read, dump, load
from .run import RunResult, report
from .stall import Snapshot, Stall, StallWatcher, describe, role, stalls

BOUND_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _history() -> tuple[History, Clock]:
    clock = Clock()
    return History(clock=clock), clock


def _ack(h: History, clock: Clock, at_s: float) -> None:
    clock.now_s = at_s
    h.invoke("producer-0", "send", (f"v{at_s}",))("ok", (Read(f"v{at_s}", 0, int(at_s)),))


def _nemesis(h: History, clock: Clock, at_s: float, f: str, kind: str) -> None:
    clock.now_s = at_s
    h.info("nemesis", f, {"kind": kind, "nodes": ("n0",)})


def test_acknowledgements_closer_than_the_bound_are_no_stall() -> None:
    h, clock = _history()
    for t in range(1, 200, 30):
        _ack(h, clock, float(t))
    assert stalls(h.ops, 0.0, 200.0, BOUND_S) == []


def test_a_gap_longer_than_the_bound_is_a_stall_and_one_to_the_end_is_open() -> None:
    h, clock = _history()
    for t in (1.0, 5.0, 80.0, 90.0):
        _ack(h, clock, t)
    assert stalls(h.ops, 0.0, 200.0, BOUND_S) == [
        Stall(5.0, 75.0, 75.0, ended=True),
        Stall(90.0, 110.0, 110.0, ended=False),  # no master to the end: still a stall
    ]


def test_no_acknowledgement_at_all_is_a_stall_from_the_load_start() -> None:
    h, clock = _history()
    _nemesis(h, clock, 3.0, "fault", "kill-master")
    assert stalls(h.ops, 1.0, 100.0, BOUND_S) == [Stall(1.0, 99.0, 99.0, ended=False)]


def test_a_full_disk_on_the_master_does_not_count_but_one_on_a_slave_does() -> None:
    h, clock = _history()
    _ack(h, clock, 1.0)
    _nemesis(h, clock, 2.0, "fault", "disk-full-master")
    _nemesis(h, clock, 67.0, "heal", "disk-full-master")
    _ack(h, clock, 71.0)  # 70 s without an ack, 65 of them refused by design
    _nemesis(h, clock, 72.0, "fault", "disk-full-slave")
    _nemesis(h, clock, 137.0, "heal", "disk-full-slave")
    _ack(h, clock, 141.0)  # 70 s: a slave's full disk is no excuse
    assert stalls(h.ops, 0.0, 150.0, BOUND_S) == [Stall(71.0, 70.0, 70.0, ended=True)]


def test_a_stall_is_described_by_the_last_dump_within_it() -> None:
    stall = Stall(105.0, 75.0, 75.0, ended=True)
    early = Snapshot(99.0, {"n0": "before"}, "logs/stall-0-*.txt")  # before it: not used
    mid = Snapshot(120.0, {"n0": "LEADER/MASTER term 2 leader n0"}, "logs/stall-20-*.txt")
    last = Snapshot(170.0, {"n1": "CANDIDATE/SLAVE term 9 leader -", "n0": "x"}, "logs/s.txt")
    line = describe(stall, [early, mid, last], load_start_s=100.0, wall_start=0.0)
    assert "no produce acknowledged for 75.0 s" in line and "+5.0 s into the load" in line
    assert "the nodes at +70.0 s: n0 x, n1 CANDIDATE/SLAVE term 9 leader -" in line
    assert "2 dumps, the last logs/s.txt" in line
    assert "no dump" in describe(stall, [early], 100.0, 0.0)


def test_a_role_is_read_from_the_cluster_answer_or_says_why_there_is_none() -> None:
    body = json.dumps({"raft_role": "FOLLOWER", "broker_role": "SLAVE", "term": 4})
    assert role(200, body) == "FOLLOWER/SLAVE term 4 leader -"
    assert role(200, body, "paused") == "FOLLOWER/SLAVE term 4 leader - (paused)"
    assert role(503, "") == "HTTP 503"
    assert role(None, "ConnectTimeout()", "not running") == (
        "no answer (ConnectTimeout()) (not running)"
    )
    assert role(200, "not json") == "an unreadable /v1/cluster"


def test_the_watcher_dumps_the_nodes_and_flags_the_stall_once(tmp_path: Path) -> None:
    h, clock = _history()
    urls = {"n0": "http://n0", "n1": "http://n1"}
    flagged: list[Stall] = []

    async def fetch(url: str) -> tuple[int | None, str]:
        if url.startswith("http://n1"):
            return None, "ConnectError()"
        if url.endswith("/v1/cluster"):
            return 200, json.dumps({"raft_role": "CANDIDATE", "broker_role": "SLAVE", "term": 7})
        return 200, "ledgermq_up 1"

    w = StallWatcher(
        h, urls, tmp_path / "logs", start_s=0.0, fetch=fetch, on_stall=flagged.append,
        node_state=lambda n: "paused" if n == "n1" else None, bound_s=BOUND_S, dump_after_s=8.0,
    )  # fmt: skip

    async def looks() -> None:
        _ack(h, clock, 2.0)
        for t in (5.0, 12.0, 15.0, 62.5, 71.0):
            clock.now_s = t
            await w.look()

    asyncio.run(looks())
    assert flagged == [Stall(2.0, 60.5, 60.5, ended=False)]  # at 62.5 s, once
    assert [s.time_s for s in w.snapshots] == [12.0, 62.5, 71.0]  # every 8 s at most
    assert w.snapshots[0].roles == {
        "n0": "CANDIDATE/SLAVE term 7 leader -",
        "n1": "no answer (ConnectError()) (paused)",
    }
    dumped = (tmp_path / "logs" / "stall-12-n0.txt").read_text()
    assert "CANDIDATE/SLAVE term 7" in dumped and "ledgermq_up 1" in dumped
    assert sorted(p.name for p in (tmp_path / "logs").iterdir())[:2] == [
        "stall-12-n0.txt",
        "stall-12-n1.txt",
    ]


def test_a_run_with_a_stall_is_invalid_and_its_report_names_it() -> None:
    clean = RunResult(seed=7, duration_s=90.0, drained=True)
    assert clean.valid
    line = describe(Stall(10.0, 75.0, 75.0, ended=False), [], 0.0, 0.0)
    stalled = RunResult(seed=7, duration_s=90.0, drained=True, stalls=[line])
    assert not stalled.valid
    text = report(stalled)
    assert "INVALID" in text.splitlines()[0]
    assert f"stall: {line}" in text.splitlines()
    assert "until the load ended" in line


def test_a_stopped_or_undrained_run_is_invalid_and_says_the_checker_did_not_decide() -> None:
    r = RunResult(seed=7, duration_s=90.0, stopped="SIGTERM during the load")
    assert not r.valid
    text = report(r)
    assert "stopped early: SIGTERM during the load" in text
    assert "no verdict on lost or read values" in text
    assert "\nlost:" not in text


def test_a_stall_is_found_again_in_the_history_a_run_leaves(tmp_path: Path) -> None:
    """Offline, from ``history.jsonl``, as the checker is."""
    h, clock = _history()
    _ack(h, clock, 1.0)
    dump(h.ops, tmp_path / "history.jsonl")
    assert stalls(load(tmp_path / "history.jsonl"), 0.0, 100.0, BOUND_S) == [
        Stall(1.0, 99.0, 99.0, ended=False)
    ]
