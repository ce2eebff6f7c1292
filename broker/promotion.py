"""LEADER → MASTER, as a sans-I/O state machine (docs/architecture.md).

A node that the Raft group elected leader takes writes only once it knows the queue
offsets every committed message holds. ``Promotion`` is that rule for one term; it reads
numbers and answers what to wait for, and its drivers do the waiting: the asyncio
``RoleChangeHandler`` (``broker/role.py``) and the deterministic simulation
(``tests/sim/broker_sim.py``), so the simulation checks the code that runs.

The steps, each needed for a reason:

1. wait for this term's NOOP to commit. Entries of earlier terms that survive in the log
   are committed only then (Raft §5.4.2); until they are, the queue offsets they hold are
   unknown, so the next ones cannot be assigned;
2. wait for dispatch to reach the index committed when step 1 ended: the consume queues
   and the metadata (topics, producer sessions) must hold every committed entry, or the
   table built next would reuse taken offsets, and sessions would miss batches a retry
   must not append again;
3. (the driver, on ``READY``) rebuild the next-queue-offset table from the consume queues
   (``queue_table_from``): they are the committed truth, whereas an old table (if this
   node was master before) may count offsets of entries truncated since; then MASTER.

Leadership lost at any point (another term, another role): ``GIVE_UP``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from consumequeue import ConsumeQueueStore
from dledger.store.base import LogStore

from .metadata import MetadataState


class Step(Enum):
    WAIT_NOOP = "the own-term NOOP to commit"
    WAIT_DISPATCH = "dispatch to catch up"
    READY = "ready: rebuild the queue table, then MASTER"
    GIVE_UP = "leadership lost"


@dataclass(slots=True)
class Promotion:
    """The promotion of this node in ``term`` (see the module docstring)."""

    term: int
    catch_up_target: int | None = None  # step 2's index, fixed when step 1 ends

    def advance(
        self, *, leading: bool, own_term_committed: bool, committed_index: int, dispatched: int
    ) -> Step:
        """Where the promotion stands, given the node's state now (``leading``: it is
        the Raft leader in ``term``)."""
        if not leading:
            return Step.GIVE_UP
        if self.catch_up_target is None:
            if not own_term_committed:
                return Step.WAIT_NOOP
            self.catch_up_target = committed_index
        if dispatched < self.catch_up_target:
            return Step.WAIT_DISPATCH
        return Step.READY


def own_term_committed(store: LogStore, term: int) -> bool:
    """Whether the committed index reached an entry of ``term`` (the leader's NOOP)."""
    c = store.committed_index
    return c >= store.ledger_begin_index and store.term_at(c) == term


def queue_table_from(meta: MetadataState, cq: ConsumeQueueStore) -> dict[tuple[str, int], int]:
    """Step 3: the next queue offset of every queue of every topic, from the consume
    queues."""
    table = {}
    for name, topic in meta.topics.items():
        for qid in range(topic.queues):
            q = cq.find(name, qid)
            table[(name, qid)] = q.max_offset if q is not None else 0
    return table
