"""What the broker simulation hands the real broker objects in place of the asyncio
runtime: the Raft server of one simulated node (``SimServer``), the dispatcher's wait
(``SimReput``), and the producer-session rule with its decisions counted
(``CountedSessions``). The broker objects themselves (``Producer``, ``Topics``,
``MetadataLog``, ``WriteGate``, ``DLedgerCommitLog``) are the real ones; their waits end
in ``tests/sim/drive.py``'s ``Wait``s, settled by the simulation's events.

``SimServer`` keeps ``DLedgerServer``'s contract where the broker relies on it: reads see
committed bytes only; an append is proposed at once or refused at once
(``NotLeaderError`` for NOT_LEADER and LEADER_TRANSFERRING, as the server raises them),
and once proposed it ends in the (index, pos) of each body or
``AppendOutcomeUnknownError``; ``wait_committed`` and ``wait_no_transfer`` are bounded
by their time-outs, on the simulated clock.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.dispatch import Dispatch
from broker.metadata import MetadataState, ProducerSession, SnapshotFiles
from broker.sessions import (
    Answer,
    Append,
    Attempt,
    AttemptState,
    Decision,
    Join,
    Key,
    ProducerSessions,
    Refuse,
    Settled,
    SettleFirst,
)
from consumequeue import ConsumeQueueStore, KeyIndex
from dledger.codes import DLedgerCode, DLedgerError
from dledger.core.node import DLedgerCore, ProposalDone
from dledger.runtime.server import AppendOutcomeUnknownError, NotLeaderError
from dledger.store import AppendHook, FileStore

from .drive import Conditions, Wait

if TYPE_CHECKING:
    from .sim import SimNode, Simulation


class SimServer:
    """The parts of ``DLedgerServer`` the broker's objects use, over one incarnation of a
    simulated node: appends are proposals to its core (through ``Simulation.run``, which
    handles the Readies as for every other input) and the waits are ``Conditions``."""

    failed: BaseException | None = None  # a simulated node fails by crashing

    def __init__(
        self,
        sim: Simulation,
        n: SimNode,
        store: FileStore,
        conditions: Conditions,
        stats: Counter[str],
    ) -> None:
        self.sim = sim
        self.node = n
        self.generation = n.restarts
        self.store = store
        self.conditions = conditions
        self.stats = stats  # the simulation's: appends refused, by code
        self.proposals: dict[int, Wait[list[tuple[int, int]]]] = {}  # by proposal id

    @property
    def core(self) -> DLedgerCore | None:
        """This incarnation's core (None once the node crashed)."""
        n = self.node
        return n.core if n.restarts == self.generation else None

    @property
    def transferee(self) -> str | None:
        core = self.core
        return core.member_state.transferee if core is not None else None

    @property
    def committed_index(self) -> int:
        return self.store.committed_index

    @property
    def ledger_end_index(self) -> int:
        return self.store.ledger_end_index

    def add_append_hook(self, hook: AppendHook) -> None:
        self.store.add_append_hook(hook)

    def read_entries(self, spans: Sequence[tuple[int, int | None]]) -> list[bytes]:
        """``DLedgerServer.read_entries``: committed entries at ``(pos, body_size)``."""
        return self.store.read_entries_at(spans, max_end=self.store.committed_pos)

    def view(self, pos: int, size: int) -> contextlib.AbstractContextManager[memoryview]:
        """``DLedgerServer.view``: a zero-copy view of committed bytes."""
        return self.store.view(pos, size, limit_pos=self.store.committed_pos)

    def append_nowait(
        self, bodies: Sequence[bytes | bytearray | memoryview]
    ) -> Wait[list[tuple[int, int]]]:
        """Propose now, or raise the refusal; the ``Wait`` ends with the commit
        (``proposal_done``)."""
        core, n = self.core, self.node
        if core is None:
            raise DLedgerError(DLedgerCode.ILLEGAL_MEMBER_STATE, "server not started")
        done: Wait[list[tuple[int, int]]] = Wait(f"proposal on {n.node_id}")

        def propose(c: DLedgerCore) -> None:
            p = c.propose(bodies, self.sim.now_ms)
            self.proposals[p.proposal_id] = done  # before the Readies that may end it
            self.sim.trace(f"append {n.node_id} {p.first_index}+{len(bodies)}")

        try:
            self.sim.run(n, propose)
        except DLedgerError as e:
            self.sim.trace(f"append {n.node_id} refused {e.code.name}")
            self.stats[f"appends refused {e.code.name}"] += 1
            if e.code in (DLedgerCode.NOT_LEADER, DLedgerCode.LEADER_TRANSFERRING):
                raise NotLeaderError(e.code, e.message, core.member_state.leader_id) from None
            raise
        return done

    def proposal_done(self, done: ProposalDone) -> None:
        """A Ready's answer to a proposal: as ``DLedgerServer`` resolves its future."""
        w = self.proposals.pop(done.proposal.proposal_id, None)
        if w is None:
            return
        p = done.proposal
        if done.code is DLedgerCode.SUCCESS:
            w.set_result([(p.first_index + i, pos) for i, pos in enumerate(p.positions)])
        else:
            w.set_exception(AppendOutcomeUnknownError(done.code, "commit unknown"))

    async def wait_committed(self, index: int, timeout_s: float) -> bool:
        return await self.conditions.until(
            f"commit {index}", lambda: self.store.committed_index >= index, timeout_s
        )

    async def wait_no_transfer(self, timeout_s: float) -> bool:
        return await self.conditions.until(
            "no transfer", lambda: self.transferee is None, timeout_s
        )


class SimReput(Dispatch):
    """The real dispatcher, stepped by the simulation; only its wait is the
    simulation's (a ``Conditions`` wait on the simulated clock)."""

    def __init__(
        self,
        store: FileStore,
        cq: ConsumeQueueStore,
        keys: KeyIndex,
        meta: MetadataState,
        snapshots: SnapshotFiles,
        *,
        conditions: Conditions,
        checkpoint_path: Path,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            store, cq, keys, meta, snapshots, checkpoint_path=checkpoint_path, **kwargs
        )
        self.conditions = conditions

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        return await self.conditions.until(
            f"dispatch {index}", lambda: self.dispatched_index >= index, timeout_s
        )


_DECISIONS: dict[type, str] = {
    Answer: "answered from the session table",
    Join: "waited",  # for the same batch in flight here
    SettleFirst: "orphan waits",  # for an attempt that gave up to settle
    Append: "attempts",
    Refuse: "session refusals",
}


class CountedSessions(ProducerSessions):
    """The real producer-session rule (``broker/sessions.py``), its decisions counted in
    the simulation's stats: what the seeds are checked to exercise (``FIXED``)."""

    def __init__(self, limit: int, stats: Counter[str]) -> None:
        super().__init__(limit)
        self.stats = stats

    def begin(
        self,
        key: Key,
        size: int,
        *,
        term: int,
        table: Mapping[str, ProducerSession],
        settled: Settled,
    ) -> Decision:
        d = super().begin(key, size, term=term, table=table, settled=settled)
        self.stats[_DECISIONS[type(d)]] += 1
        if isinstance(d, Append) and d.done:
            self.stats["tails"] += 1  # a batch cut short by a failover, completed
        return d

    def end(self, attempt: Attempt, **kwargs: Any) -> None:
        super().end(attempt, **kwargs)
        if self.attempts.get(attempt.key) is attempt:
            self.stats["orphaned" if attempt.state is AttemptState.ORPHANED else "kept"] += 1
