"""What the broker simulation's side workloads share (``tests/sim/pop_sim.py``: POP
groups; ``tests/sim/delay_sim.py``: delay messages): clients whose draws come from a
stream of the seed's own, so a seed drawn without them runs as it did before they
existed; requests sent to a node the client believes is MASTER and served there by the
node's real broker code (``BrokerSimulation._request``, ``_serve``); and the check that
every replica's state of a kind is the same at the same applied index.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from broker.gate import BrokerRole
from broker.metadata import SYSTEM_TOPICS
from broker.pop.applier import DLQ_PREFIX
from broker.produce import NewMessage

if TYPE_CHECKING:
    from .broker_sim import BrokerNode, BrokerSimulation
    from .sim import SimNode

Reply = Callable[[str, Any], None]  # ("ok" | "refused" | "unknown", payload)


def user_topics(bn: BrokerNode) -> list[str]:
    """The topics clients produce to and commit offsets of: not a POP group's dead
    letters (``%DLQ%<group>``) nor the broker's own (the timer topic), written by the
    master alone."""
    return [
        t for t in sorted(bn.meta.topics) if not t.startswith(DLQ_PREFIX) and t not in SYSTEM_TOPICS
    ]


def target(sim: BrokerSimulation, rng: random.Random) -> SimNode | None:
    """Where a client sends a write: a node it believes is master (perhaps a paused or
    deposed one), now and then any node (which refuses), or nobody yet."""
    masters = [
        n
        for n in sim.nodes
        if (bn := sim.brokers.get(n.node_id)) is not None and bn.role is BrokerRole.MASTER
    ]
    if masters and rng.random() < 0.9:
        return rng.choice(masters)
    alive = [n for n in sim.nodes if n.core is not None]
    return rng.choice(alive) if alive and rng.random() < 0.5 else None


@dataclass(slots=True)
class Batch:
    """A producer's batch in a producer session, sent until acknowledged."""

    pid: str
    seq: int
    topic: str
    messages: list[NewMessage]
    attempts: int = 0


@dataclass(slots=True)
class ProducerClient:
    pid: str
    next_seq: int = 0
    batch: Batch | None = None
    attempt: int = 0  # the attempt awaiting a reply; 0 = none


class SideClients:
    """The clients of one side workload, on the simulation's events, with the draws of
    the stream ``stream``."""

    def __init__(self, sim: BrokerSimulation, stream: str) -> None:
        self.sim = sim
        self.rng = random.Random(stream)
        self._attempts = 0

    def _next_attempt(self) -> int:
        self._attempts += 1
        return self._attempts

    def _later(self, lo_ms: int, hi_ms: int, what: str, fn: Callable[[], None]) -> None:
        self.sim.at(self.sim.now_ms + self.rng.randint(lo_ms, hi_ms), what, fn)

    def _target(self) -> SimNode | None:
        return target(self.sim, self.rng)  # (with this workload's draws)

    def _send(
        self,
        what: str,
        handler: Callable[[BrokerNode], Coroutine[Any, Any, Any]],
        reply: Reply,
        ok: Callable[[Any], Any] = lambda x: x,
    ) -> bool:
        """Send a request to a node (False: nobody to send it to); a client time-out
        answers "unknown" unless the reply came first (``reply`` sorts that out)."""
        sim = self.sim
        n = self._target()
        if n is None:
            return False
        sim.at(
            sim.now_ms + sim.bknobs.client_timeout_ms,
            "client timeout",
            lambda: reply("unknown", "client timeout"),
        )

        def handle() -> None:
            bn = sim._bn(n)
            sim._serve(n, bn, what, handler(bn), reply, ok)

        sim._request(n, what, handle, reply, self.rng)
        return True


class SameAtIndex:
    """Every node's state of one kind is the same at the same applied index (by digest:
    the first node to get to an index sets it)."""

    def __init__(self) -> None:
        self._first: dict[int, tuple[str, str]] = {}

    def differs(self, node_id: str, applied: int, doc: Any) -> str | None:
        """The node whose state at ``applied`` differs from ``doc``, or None."""
        digest = hashlib.sha256(orjson.dumps(doc)).hexdigest()
        first = self._first.setdefault(applied, (node_id, digest))
        return None if first[1] == digest else first[0]
