"""``RoleChangeHandler``: Raft roles → broker roles (docs/architecture.md).

FOLLOWER or CANDIDATE → SLAVE at once. LEADER → MASTER only once ``Promotion`` (the rule,
in ``broker/promotion.py``, shared with the simulation) says so; this module is its
asyncio driver: it waits for what the rule asks, on the Raft server's and the
dispatcher's events, and logs each step with its time. The Raft and broker vocabularies
meet here and nowhere else.

The handler is handed what the promotion reads and waits for (the Raft server, the
dispatcher, the queue-table rebuild) and the ``WriteGate`` whose role it sets; it calls
nothing of the ``Broker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dledger.core.messages import Role
from dledger.core.node import RoleChange
from dledger.runtime.server import DLedgerServer

from .gate import BrokerRole, WriteGate
from .promotion import Promotion, Step, own_term_committed

if TYPE_CHECKING:
    from .dispatch import Dispatch

log = logging.getLogger(__name__)

WAIT_SLICE_S = 0.1  # each wait is this short, so a lost leadership is seen at once


class RoleChangeHandler:
    def __init__(
        self,
        gate: WriteGate,
        server: DLedgerServer,
        dispatch: Dispatch,
        rebuild_queue_table: Callable[[], int],
        catch_up_warn_ms: int,
        *,
        on_master: Callable[[int], None] | None = None,
    ) -> None:
        self.gate = gate
        self.on_master = on_master  # called with the term once this node is MASTER
        self.server = server
        self.dispatch = dispatch
        # Step 3: the next-queue-offset table from the consume queues; how many queues.
        self.rebuild_queue_table = rebuild_queue_table
        self.catch_up_warn_s = catch_up_warn_ms / 1000
        self._task: asyncio.Task[None] | None = None
        # The last promotion's step timings in ms (issue 18): elected → NOOP committed
        # (step 1), → dispatched (step 2), the queue table (step 3), in all.
        self.last_promotion: dict[str, int] = {}

    def __call__(self, change: RoleChange) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        if change.role is Role.LEADER:
            self.gate.set_role(BrokerRole.SLAVE, change.term, "leader, catching up")
            self._task = asyncio.get_running_loop().create_task(
                self._become_master(change.term), name=f"become-master-{change.term}"
            )
        else:
            # A node that is not the Raft leader can no longer append: refuse writes at
            # once, with the new leader's address when there is one.
            self.gate.set_role(BrokerRole.SLAVE, change.term, change.role.value.lower())

    def _leading(self, term: int) -> bool:
        """Whether this node is the Raft leader in ``term``."""
        core = self.server.core
        return (
            core is not None
            and core.member_state.role is Role.LEADER
            and core.member_state.curr_term == term
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _become_master(self, term: int) -> None:
        """Drive ``Promotion`` for ``term``: wait as it says, log each step, and on
        ``READY`` rebuild the queue table and become MASTER (the module docstring of
        ``broker/promotion.py`` says why each step is needed)."""
        server, dispatch, store = self.server, self.dispatch, self.server.store
        assert store is not None, "role changes come once the server started"
        p = Promotion(term)
        started = time.monotonic()
        warn_at = started + self.catch_up_warn_s
        noop_ms = -1.0
        while True:
            step = p.advance(
                leading=self._leading(term),
                own_term_committed=own_term_committed(store, term),
                committed_index=server.committed_index,
                dispatched=dispatch.dispatched_index,
            )
            if p.catch_up_target is not None and noop_ms < 0:
                noop_ms = (time.monotonic() - started) * 1000
                log.info(
                    "term %d: failover step 1/3: own-term NOOP committed in %.0f ms", term, noop_ms
                )
            if step is Step.GIVE_UP:
                log.warning(
                    "term %d: not becoming MASTER: lost leadership while waiting for %s",
                    term,
                    "the NOOP" if noop_ms < 0 else "dispatch",
                )
                return
            if step is Step.READY:
                break
            if time.monotonic() > warn_at:  # keep trying while leader; say so when slow
                warn_at += self.catch_up_warn_s
                log.warning("term %d: still waiting for %s", term, step.value)
            if step is Step.WAIT_NOOP:
                await server.wait_committed(server.committed_index + 1, WAIT_SLICE_S)
            else:
                assert p.catch_up_target is not None
                await dispatch.wait_dispatched(p.catch_up_target, WAIT_SLICE_S)
        dispatched_ms = (time.monotonic() - started) * 1000
        log.info(
            "term %d: failover step 2/3: dispatched to %d (%.0f ms)",
            term,
            p.catch_up_target,
            dispatched_ms,
        )
        queues = self.rebuild_queue_table()
        total_ms = (time.monotonic() - started) * 1000
        log.info(
            "term %d: failover step 3/3: queue table rebuilt, %d queues (%.1f ms)",
            term,
            queues,
            total_ms - dispatched_ms,
        )
        self.last_promotion = {
            "promotion_noop_ms": round(noop_ms),
            "promotion_dispatch_ms": round(dispatched_ms - noop_ms),
            "promotion_table_ms": round(total_ms - dispatched_ms),
            "promotion_total_ms": round(total_ms),
        }
        self.gate.set_role(
            BrokerRole.MASTER,
            term,
            f"caught up: NOOP committed in {noop_ms:.0f} ms, dispatched to {p.catch_up_target},"
            f" {queues} queues, {total_ms:.0f} ms in all",
        )
        if self.on_master is not None:
            self.on_master(term)
