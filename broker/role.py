"""``RoleChangeHandler``: Raft roles → broker roles (docs/architecture.md).

FOLLOWER or CANDIDATE → SLAVE at once. LEADER → MASTER only once ``Promotion`` (the rule,
in ``broker/promotion.py``, shared with the simulation) says so; this module is its
asyncio driver: it waits for what the rule asks, on the host's events, and logs each
step with its time. The Raft and broker vocabularies meet here and nowhere else.

The handler sees the broker only through ``RoleHost``: the few facts and waits the
promotion needs, not the whole ``Broker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from enum import StrEnum
from typing import Protocol

from dledger.core.messages import Role
from dledger.core.node import RoleChange

from .promotion import Promotion, Step

log = logging.getLogger(__name__)

WAIT_SLICE_S = 0.1  # each wait is this short, so a lost leadership is seen at once


class BrokerRole(StrEnum):
    MASTER = "MASTER"
    SLAVE = "SLAVE"


class RoleHost(Protocol):
    """What the handler needs of the broker."""

    def set_role(self, role: BrokerRole, term: int, why: str) -> None: ...

    def leading(self, term: int) -> bool:
        """Whether this node is the Raft leader in ``term``."""
        ...

    def own_term_committed(self, term: int) -> bool: ...

    @property
    def committed_index(self) -> int: ...

    @property
    def dispatched_index(self) -> int: ...

    async def wait_committed(self, index: int, timeout_s: float) -> bool: ...

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool: ...

    def rebuild_queue_table(self) -> int:
        """Step 3: the next-queue-offset table from the consume queues; how many."""
        ...


class RoleChangeHandler:
    def __init__(self, host: RoleHost, catch_up_warn_ms: int) -> None:
        self.host = host
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
            self.host.set_role(BrokerRole.SLAVE, change.term, "leader, catching up")
            self._task = asyncio.get_running_loop().create_task(
                self._become_master(change.term), name=f"become-master-{change.term}"
            )
        else:
            # A node that is not the Raft leader can no longer append: refuse writes at
            # once, with the new leader's address when there is one.
            self.host.set_role(BrokerRole.SLAVE, change.term, change.role.value.lower())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _become_master(self, term: int) -> None:
        """Drive ``Promotion`` for ``term``: wait as it says, log each step, and on
        ``READY`` rebuild the queue table and become MASTER (the module docstring of
        ``broker/promotion.py`` says why each step is needed)."""
        h = self.host
        p = Promotion(term)
        started = time.monotonic()
        warn_at = started + self.catch_up_warn_s
        noop_ms = -1.0
        while True:
            step = p.advance(
                leading=h.leading(term),
                own_term_committed=h.own_term_committed(term),
                committed_index=h.committed_index,
                dispatched=h.dispatched_index,
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
                await h.wait_committed(h.committed_index + 1, WAIT_SLICE_S)
            else:
                assert p.catch_up_target is not None
                await h.wait_dispatched(p.catch_up_target, WAIT_SLICE_S)
        dispatched_ms = (time.monotonic() - started) * 1000
        log.info(
            "term %d: failover step 2/3: dispatched to %d (%.0f ms)",
            term,
            p.catch_up_target,
            dispatched_ms,
        )
        queues = h.rebuild_queue_table()
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
        h.set_role(
            BrokerRole.MASTER,
            term,
            f"caught up: NOOP committed in {noop_ms:.0f} ms, dispatched to {p.catch_up_target},"
            f" {queues} queues, {total_ms:.0f} ms in all",
        )
