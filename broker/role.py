"""``RoleChangeHandler``: Raft roles → broker roles (DESIGN §5, CHECKLIST MQ-03).

FOLLOWER or CANDIDATE → SLAVE at once. LEADER → MASTER only after three steps, each
needed for a reason written where it happens in ``_become_master``. The Raft and broker
vocabularies meet here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from consumequeue import ConsumeQueueStore
from dledger.core.messages import Role
from dledger.core.node import RoleChange
from dledger.store import FileStore

from .metadata import MetadataState

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)


class BrokerRole(StrEnum):
    MASTER = "MASTER"
    SLAVE = "SLAVE"


def queue_table_from(meta: MetadataState, cq: ConsumeQueueStore) -> dict[tuple[str, int], int]:
    """The next queue offset of every queue of every topic, from the consume queues."""
    table = {}
    for name, topic in meta.topics.items():
        for qid in range(topic.queues):
            q = cq.find(name, qid)
            table[(name, qid)] = q.max_offset if q is not None else 0
    return table


def own_term_committed(store: FileStore, term: int) -> bool:
    """Whether the committed index reached an entry of ``term`` (the leader's NOOP)."""
    c = store.committed_index
    return c >= store.ledger_begin_index and store.term_at(c) == term


class RoleChangeHandler:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._task: asyncio.Task[None] | None = None

    def __call__(self, change: RoleChange) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        if change.role is Role.LEADER:
            self.broker.set_role(BrokerRole.SLAVE, change.term, "leader, catching up")
            self._task = asyncio.get_running_loop().create_task(
                self._become_master(change.term), name=f"become-master-{change.term}"
            )
        else:
            # A node that is not the Raft leader can no longer append: refuse writes at
            # once, with the new leader's address when there is one.
            self.broker.set_role(BrokerRole.SLAVE, change.term, change.role.value.lower())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _become_master(self, term: int) -> None:
        b = self.broker
        server, store, dispatcher = b.server, b.store, b.dispatcher
        started = time.monotonic()
        warn_s = b.settings.master_catch_up_timeout_ms / 1000
        warn_at = [started + warn_s]

        def slow(what: str) -> None:  # keep trying while leader; say so when it is slow
            if time.monotonic() > warn_at[0]:
                warn_at[0] += warn_s
                log.warning("term %d: still waiting for %s", term, what)

        # Step 1 — wait for this term's NOOP to commit. Entries of earlier terms that
        # survive in our log are committed only then (Raft §5.4.2); until they are,
        # we cannot know the queue offsets they hold, so we cannot assign the next ones.
        while not own_term_committed(store, term):
            if not self._still_leader(term):
                return self._give_up(term, "lost leadership before the NOOP committed")
            slow("the own-term NOOP to commit")
            await server.wait_committed(store.committed_index + 1, 0.1)
        noop_ms = (time.monotonic() - started) * 1000
        log.info("term %d: failover step 1/3: own-term NOOP committed in %.0f ms", term, noop_ms)

        # Step 2 — wait for dispatch to reach the committed index: the consume queues
        # and the metadata (topics, producer sessions) must hold every committed entry,
        # or the table built next would reuse taken offsets and sessions would miss
        # batches a retry must not append again.
        target = store.committed_index
        while not await dispatcher.wait_dispatched(target, 0.1):
            if not self._still_leader(term):
                return self._give_up(term, "lost leadership while dispatching")
            slow(f"dispatch to reach {target}")
        log.info(
            "term %d: failover step 2/3: dispatched to %d (%.0f ms)",
            term,
            target,
            (time.monotonic() - started) * 1000,
        )

        # Step 3 — rebuild the next-queue-offset table from the consume queues: they are
        # the committed truth, whereas an old table (if this node was master before)
        # may count offsets of entries that were truncated since.
        table = queue_table_from(b.meta, b.cq)
        if not self._still_leader(term):
            return self._give_up(term, "lost leadership while catching up")
        b.commitlog.reset_queue_table(table)
        log.info("term %d: failover step 3/3: queue table rebuilt, %d queues", term, len(table))
        b.set_role(
            BrokerRole.MASTER,
            term,
            f"caught up: NOOP committed in {noop_ms:.0f} ms, dispatched to {target}, "
            f"{len(table)} queues, {(time.monotonic() - started) * 1000:.0f} ms in all",
        )
        return None

    def _still_leader(self, term: int) -> bool:
        core = self.broker.server.core
        return core is not None and core.ms.role is Role.LEADER and core.ms.curr_term == term

    def _give_up(self, term: int, why: str) -> None:
        log.warning("term %d: not becoming MASTER: %s", term, why)
