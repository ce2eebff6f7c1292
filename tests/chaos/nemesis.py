"""The nemesis: faults on a seeded schedule against a ``ChaosCluster``.

``schedule(seed, duration_s)`` is pure: the same seed gives the same steps (kinds, quiet
gaps, hold times, the draw that picks among candidates), so the command a run prints
replays its schedule; which node is the master when a step comes is the cluster's
business, the step says only "the master" or "a slave". Kinds come in rounds, each a
seeded permutation of ``KINDS``: a run of ``len(KINDS)`` steps tries every kind once.

One fault at a time (each step: quiet gap, fault, hold, heal, then a bounded wait for
the cluster to be whole again), so the cluster keeps a quorum through the run and every
unavailability window belongs to one fault. The faults:

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

    def run(self, steps: list[Step], stop: threading.Event) -> None:
        """Every step, unless ``stop`` is set (checked between steps and during waits)."""
        if stop.wait(WARMUP_S):
            return
        for i, step in enumerate(steps):
            if stop.wait(step.quiet_s):
                return
            master = self._master()
            if master is None:
                self.unhealed.append(f"before {step.kind}: no master for {self.recover_s} s")
                continue
            heal = self.apply(step, master)
            stop.wait(step.hold_s)
            heal()
            self.say(f"step {i + 1}/{len(steps)}: {step.kind} healed")
            self._await_whole(step)

    def _master(self) -> str | None:
        """The current master (bounded: a previous heal waited for one)."""
        deadline = time.monotonic() + self.recover_s
        while time.monotonic() < deadline:
            m = self.c.master()
            if m is not None:
                return m
            time.sleep(0.1)
        return None

    def _await_whole(self, step: Step) -> None:
        """Every node ready, one master; else recorded (a node that exited by itself is
        a bug: its log tail goes into the record) and the run goes on."""
        try:
            self.c.wait_ready(timeout_s=self.recover_s)
        except (TimeoutError, RuntimeError) as e:
            self.unhealed.append(f"{step.kind}: {e}")
            self.h.info("nemesis", "unhealthy", {"kind": step.kind, "error": str(e)[:500]})
            for n in self.c.ids:  # the next fault needs every node running
                if not self.c.alive(n):
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
            cut = lambda: [c.lab.cut(master, s) for s in slaves]  # noqa: E731
            return self._fault(kind, [master], cut, c.heal_network)
        if kind == "bridge":
            a, b = (master, slave) if step.draw < 0.5 else tuple(slaves)
            return self._fault(kind, [a, b], lambda: c.lab.cut(a, b), c.heal_network)
        if kind == "one-way":
            cut = lambda: c.lab.cut(master, slave, one_way=True)  # noqa: E731
            return self._fault(kind, [master, slave], cut, c.heal_network)
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
