"""The nemesis: faults on a seeded schedule against a ``ChaosCluster``.

``schedule(seed, duration_s)`` is pure: the same seed gives the same steps (kinds, quiet
gaps, hold times, the draw that picks among candidates), so the command a run prints
replays its schedule; which node is the master when a step comes is the cluster's
business, the step says only "the master" or "a slave". Kinds come in rounds, each a
seeded permutation of ``KINDS``: a run of ``len(KINDS)`` steps tries every kind once.

One fault at a time (each step: quiet gap, fault, hold, heal, then a bounded wait for
the cluster to be whole again), so the cluster keeps a quorum through the run and every
unavailability window belongs to one fault. ``run`` ends when the steps do, when told
to stop (the run halts, or a stall made it INVALID), or at its deadline: every wait
looks at both, and a step under way is healed before it returns. The faults:

- ``kill-master`` / ``kill-slave``: SIGKILL, restarted at the heal;
- ``pause-master`` / ``pause-slave``: SIGSTOP, SIGCONT at the heal (the hold is longer
  than the election timeout: a paused master is replaced);
- ``isolate-node``: a node's cable down (cut off from everyone, the test included);
- ``isolate-master``: the master cut from both others, clients still reach it (the
  master away from the majority: it must step down, nothing it accepts may commit);
- ``bridge``: two nodes cut from each other, both still reach the third (a split that
  is not transitive);
- ``one-way``: the master's packets to one slave vanish, the slave's still arrive (an
  asymmetric cut);
- ``transfer``: leadership transfer to a slave, mid-load;
- ``disk-full-master`` / ``disk-full-slave``: a ballast file leaves the node's tmpfs
  below the broker's reserve (writes refused with 507, or pushes refused), removed at
  the heal.

Every fault and heal goes into the history as ``info`` (``kind``, ``nodes``) at the
moment it was done.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from .cluster import RESERVE_MB, ChaosCluster
from .history import History

KINDS = (
    "kill-master",
    "kill-slave",
    "pause-master",
    "pause-slave",
    "isolate-node",
    "isolate-master",
    "bridge",
    "one-way",
    "transfer",
    "disk-full-master",
    "disk-full-slave",
)
WARMUP_S = 3.0  # load runs this long before the first fault
RECOVER_SLICE_S = 5.0  # a recovery wait looks at stop and the deadline this often
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    quiet_s: float  # before the fault
    hold_s: float  # the fault lasts this long
    draw: float  # in [0, 1): picks among candidate nodes


def schedule(seed: int, duration_s: float, *, quiet_s: tuple[float, float] = (2.0, 4.0),
             hold_s: tuple[float, float] = (2.5, 4.0)) -> list[Step]:  # fmt: skip
    """Steps whose quiet gaps and holds fit ``duration_s`` (recovery waits come on top)."""
    rng = random.Random(seed)
    steps: list[Step] = []
    total = WARMUP_S
    for _ in range(10_000):  # bounded: each step takes at least quiet_s[0]
        kinds = list(KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            step = Step(kind, rng.uniform(*quiet_s), rng.uniform(*hold_s), rng.random())
            total += step.quiet_s + step.hold_s
            if total > duration_s:
                return steps
            steps.append(step)
    return steps


class Nemesis:
    """Runs steps against ``cluster``, recording into ``history``."""

    def __init__(self, cluster: ChaosCluster, history: History, *, recover_s: float = 60.0,
                 say: Callable[[str], None] = lambda _s: None) -> None:  # fmt: skip
        self.c = cluster
        self.h = history
        self.recover_s = recover_s
        self.say = say
        self.unhealed: list[str] = []  # steps after which the cluster did not recover
        self.scheduled = 0  # steps in the schedule
        self.done = 0  # steps done (fault, hold, heal)
        self.current: str | None = None  # the step under way, if any
        self.ended: str | None = None  # "done", "stopped", "cut short at its deadline"

    def run(self, steps: list[Step], stop: threading.Event,
            deadline_s: float = math.inf) -> None:  # fmt: skip
        """Every step in order, until ``stop`` is set or the monotonic ``deadline_s``
        passes (looked at between steps and in every wait: a step under way is healed,
        its hold and recovery wait cut short). ``done``, ``current`` and ``ended`` say
        how far it got."""
        self.scheduled = len(steps)
        try:
            if self._wait(stop, WARMUP_S, deadline_s):
                return
            for i, step in enumerate(steps):
                if self._wait(stop, step.quiet_s, deadline_s):
                    return
                self.current = f"step {i + 1}/{len(steps)} ({step.kind})"
                master = self._master(stop, deadline_s)
                if master is None:
                    if self._over(stop, deadline_s):
                        return
                    self.unhealed.append(f"before {step.kind}: no master for {self.recover_s} s")
                    continue
                heal = self.apply(step, master)
                try:
                    self._wait(stop, step.hold_s, deadline_s)
                finally:
                    heal()
                self.done += 1
                self.say(f"step {i + 1}/{len(steps)}: {step.kind} healed")
                self._await_whole(step, stop, deadline_s)
            self.ended = "done"
        finally:
            self.current = None
            if self.ended is None:
                self.ended = "stopped" if stop.is_set() else "cut short at its deadline"

    @staticmethod
    def _over(stop: threading.Event, deadline_s: float) -> bool:
        return stop.is_set() or time.monotonic() >= deadline_s

    @staticmethod
    def _wait(stop: threading.Event, seconds: float, deadline_s: float) -> bool:
        """Wait ``seconds`` unless stopped or past the deadline first: whether it was."""
        stop.wait(max(0.0, min(seconds, deadline_s - time.monotonic())))
        return Nemesis._over(stop, deadline_s)

    def _master(self, stop: threading.Event, deadline_s: float) -> str | None:
        """The current master (bounded: ``recover_s``, the deadline, ``stop``)."""
        until = min(time.monotonic() + self.recover_s, deadline_s)
        while time.monotonic() < until and not stop.is_set():
            m = self.c.master()
            if m is not None:
                return m
            stop.wait(0.1)
        return None

    def _await_whole(self, step: Step, stop: threading.Event, deadline_s: float) -> None:
        """Every node ready, one master, within ``recover_s``; else recorded (a node
        that exited by itself is a bug: its log tail goes into the record) and the run
        goes on. Looked at in slices, so that ``stop`` and the deadline end the wait
        (the end of the run heals everything)."""
        until = min(time.monotonic() + self.recover_s, deadline_s)
        error: Exception | None = None
        for _ in range(10_000):  # bounded: every try takes a slice of the time left
            if self._over(stop, deadline_s):
                return
            left_s = until - time.monotonic()
            try:
                self.c.wait_ready(timeout_s=max(0.0, min(RECOVER_SLICE_S, left_s)))
                return
            except RuntimeError as e:  # a node exited by itself
                error = e
                break
            except TimeoutError as e:
                error = e
                if left_s <= RECOVER_SLICE_S:
                    break
        if error is None or self._over(stop, deadline_s):
            return  # cut short by the deadline or stop, not a failure to recover
        self.unhealed.append(f"{step.kind}: {error}")
        self.h.info("nemesis", "unhealthy", {"kind": step.kind, "error": str(error)[:500]})
        for n in self.c.ids:  # the next fault needs every node running
            if not self.c.alive(n) and not stop.is_set():
                self.c.start(n)

    def _record(self, f: str, kind: str, nodes: list[str]) -> None:
        self.h.info("nemesis", f, {"kind": kind, "nodes": tuple(nodes)})
        if f == "fault":
            self.say(f"{kind} {', '.join(nodes)}")

    # ---- the faults -----------------------------------------------------------------------

    def apply(self, step: Step, master: str) -> Callable[[], None]:
        """Do ``step``'s fault; its heal."""
        c, kind = self.c, step.kind
        slaves = [n for n in c.ids if n != master]
        slave = slaves[int(step.draw * len(slaves))]
        anyone = c.ids[int(step.draw * len(c.ids))]
        target = master if kind.endswith("-master") else slave
        if kind.startswith("kill-"):
            return self._fault(kind, [target], lambda: c.kill(target), lambda: c.start(target))
        if kind.startswith("pause-"):
            return self._fault(kind, [target], lambda: c.pause(target), lambda: c.resume(target))
        if kind.startswith("disk-full-"):
            ballast = c.ballast(target)
            # The master: below its reserve (appends refused, 507). A slave: nearly
            # nothing left (the leader's pushes refused); the other two make a quorum.
            free = (RESERVE_MB - 8) * MiB if target == master else 1 * MiB
            return self._fault(kind, [target], lambda: ballast.leave_free(free), ballast.remove)
        if kind == "isolate-node":
            return self._fault(kind, [anyone], lambda: c.lab.link_down(anyone), c.heal_network)
        if kind == "isolate-master":

            def cut_off() -> None:
                for s in slaves:
                    c.lab.cut(master, s)

            return self._fault(kind, [master], cut_off, c.heal_network)
        if kind == "bridge":
            a, b = (master, slave) if step.draw < 0.5 else tuple(slaves)
            return self._fault(kind, [a, b], lambda: c.lab.cut(a, b), c.heal_network)
        if kind == "one-way":
            one_way = lambda: c.lab.cut(master, slave, one_way=True)  # noqa: E731
            return self._fault(kind, [master, slave], one_way, c.heal_network)
        assert kind == "transfer", kind
        return self._transfer(kind, master, slave)

    def _fault(self, kind: str, nodes: list[str], do: Callable[[], object],
               undo: Callable[[], object]) -> Callable[[], None]:  # fmt: skip
        """``do`` now and record it; the heal runs ``undo`` and records that."""
        do()
        self._record("fault", kind, nodes)

        def heal() -> None:
            undo()
            self._record("heal", kind, nodes)

        return heal

    def _transfer(self, kind: str, master: str, to: str) -> Callable[[], None]:
        self._record("fault", kind, [master, to])
        try:
            r = httpx.post(
                self.c.urls[master] + "/v1/cluster/leadership", json={"to": to}, timeout=15
            )
            outcome = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            outcome = f"no answer: {e!r}"
        self.h.info("nemesis", "transfer-answer", {"kind": kind, "answer": outcome})
        return lambda: self._record("heal", kind, [master, to])

    def heal_all(self) -> None:
        """The end of a run: every fault undone, every node running."""
        self.c.heal_network()
        for n in self.c.ids:
            self.c.ballast(n).remove()
            self.c.resume(n)
            if not self.c.alive(n):
                self.c.start(n)
        self._record("heal", "all", list(self.c.ids))
