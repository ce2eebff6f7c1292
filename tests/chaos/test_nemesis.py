"""The nemesis against a fake cluster: its schedule ends at its deadline whatever the
cluster does (no master to fault: the issue's run waited a recovery bound per step,
for 14 minutes), a fault's hold cut by the deadline is still healed, and a step that
hangs is abandoned past the deadline and named. No root, no processes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest

from . import nemesis as nemesis_module
from .cluster import ChaosCluster
from .history import History
from .nemesis import Nemesis, Step
from .run import run_schedule

BLOCK_S = 30.0  # a hung call's own bound: the test releases it long before
SLACK_S = 5.0  # scheduling on a busy machine


class FakeCluster:
    """What the nemesis uses of a ``ChaosCluster`` for the kill faults."""

    def __init__(self, master: str | None, hang: threading.Event | None = None,
                 asked: threading.Event | None = None) -> None:  # fmt: skip
        self.ids = ["n0", "n1", "n2"]
        self._master = master
        self.hang = hang  # kill blocks until it is set
        self.asked = asked  # set when asked for the master
        self.calls: list[str] = []

    def master(self) -> str | None:
        if self.asked is not None:
            self.asked.set()
        return self._master

    def wait_ready(self, nodes: object = None, timeout_s: float = 60.0) -> str:
        if self._master is None:
            raise TimeoutError("no master")
        return self._master

    def alive(self, node: str) -> bool:
        return True

    def kill(self, node: str) -> None:
        self.calls.append(f"kill {node}")
        if self.hang is not None:
            self.hang.wait(BLOCK_S)

    def start(self, node: str) -> None:
        self.calls.append(f"start {node}")


@pytest.fixture(autouse=True)
def no_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nemesis_module, "WARMUP_S", 0.0)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()
    for t in threading.enumerate():
        if t.name == "chaos-nemesis":
            t.join(timeout=10)
            assert not t.is_alive()


def _nemesis(c: FakeCluster) -> Nemesis:
    return Nemesis(cast(ChaosCluster, c), History(), recover_s=60.0)


def _steps(n: int, hold_s: float = 0.0) -> list[Step]:
    return [Step("kill-master", quiet_s=0.0, hold_s=hold_s, draw=0.0) for _ in range(n)]


def test_with_no_master_the_schedule_ends_at_its_deadline() -> None:
    n = _nemesis(FakeCluster(master=None))
    t0 = time.monotonic()
    n.run(_steps(50), threading.Event(), deadline_s=t0 + 0.5)
    assert time.monotonic() - t0 < 0.5 + SLACK_S, "not a 60 s recovery wait per step"
    assert (n.done, n.scheduled, n.ended) == (0, 50, "cut short at its deadline")
    assert n.unhealed == []  # cut short by the deadline is no failure to recover


def test_a_stop_ends_the_wait_for_a_master() -> None:
    stop = threading.Event()  # as the stall watcher sets it
    n = _nemesis(FakeCluster(master=None, asked=stop))
    t0 = time.monotonic()
    n.run(_steps(50), stop, deadline_s=t0 + 60)
    assert time.monotonic() - t0 < SLACK_S
    assert (n.done, n.ended) == (0, "stopped")


def test_a_hold_cut_by_the_deadline_is_still_healed() -> None:
    c = FakeCluster(master="n1")
    n = _nemesis(c)
    t0 = time.monotonic()
    n.run(_steps(3, hold_s=BLOCK_S), threading.Event(), deadline_s=t0 + 0.3)
    assert time.monotonic() - t0 < 0.3 + SLACK_S
    assert c.calls == ["kill n1", "start n1"]
    assert (n.done, n.ended) == (1, "cut short at its deadline")
    assert [op.f for op in n.h.ops] == ["fault", "heal"]


def test_a_step_that_hangs_is_abandoned_past_the_deadline_and_named(
    release: threading.Event,
) -> None:
    n = _nemesis(FakeCluster(master="n0", hang=release))
    stop = threading.Event()

    async def main() -> list[str]:
        return await run_schedule(n, _steps(2), stop, time.monotonic() + 0.2, grace_s=0.3)

    t0 = time.monotonic()
    problems = asyncio.run(main())
    assert time.monotonic() - t0 < 0.5 + SLACK_S
    assert problems == [
        "the nemesis was stuck in step 1/2 (kill-master) 0.3 s past its deadline: abandoned"
    ]
    assert stop.is_set()  # the thread stops once its call returns


def test_a_schedule_that_ends_in_time_is_no_problem() -> None:
    c = FakeCluster(master="n2")
    n = _nemesis(c)

    async def main() -> list[str]:
        return await run_schedule(n, _steps(2), threading.Event(), time.monotonic() + 30)

    assert asyncio.run(main()) == []
    assert (n.done, n.ended) == (2, "done")
    assert c.calls == ["kill n2", "start n2"] * 2
