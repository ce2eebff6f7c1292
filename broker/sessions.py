"""Producer sessions on the master, as a sans-I/O state machine (docs/architecture.md).

A produce request may carry a session: ``producer_id`` and ``sequence``. The replicated
session table (``MetadataState.sessions``) says what of a producer's last batch is in the
log; this object adds what the table cannot know yet: the *attempts* this master is
making at a batch, so that a retry never appends a batch a second time.

Both drivers call it, so the simulation checks the code that runs: ``Broker`` (asyncio:
it awaits commits, dispatch and other attempts) and ``tests/sim/broker_sim.py`` (events
on a seeded clock). It decides; they wait and report back:

1. ``begin(key, size, ...)`` for every request, which answers one of
   - ``Answer``: from the table or from an attempt that was answered already (no append);
   - ``Join``: the same batch is being appended here; wait for that attempt's answer;
   - ``SettleFirst``: an attempt ended with an unknown outcome and what it appended may
     still commit in its term; wait until ``index`` is committed and dispatched (or the
     term ends), then ``begin`` again;
   - ``Append``: append ``messages[len(done):]`` (``done``: what the table already has,
     a batch cut short by a failover) as ``attempt``;
   - ``Refuse``: a sequence below the producer's last, or too many attempts in flight.
2. After an ``Append``, exactly one ``end(attempt, ...)``: with the answer (committed), or
   with none (refused before appending, or an unknown outcome). For an unknown outcome
   while still master in the attempt's term, first wait until everything appended so far
   is settled (committed and dispatched) and ask ``answer_from_table``: if the batch made
   it, that is the answer.

Invariants:
- at most one attempt per (producer, sequence), of one term; at most ``limit`` attempts;
- an attempt whose entries may still be unsettled in its term is kept after it ended
  (``ANSWERED`` with its answer, ``ORPHANED`` without): until then the table does not tell
  the whole truth about the batch, and appending it again could commit it twice (a
  settle that timed out leaves the first copy in the log, still able to commit);
- an attempt of an earlier term is dropped on sight: becoming MASTER waited for dispatch
  to reach the own-term NOOP, so the table holds whatever of it survived.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from . import errors

Result = tuple[int, int, int]
"""(queue id, queue offset, commitlog offset) of one message, as the table records it."""
Key = tuple[str, int]
"""(producer id, sequence): one batch."""


class BatchRecord(Protocol):
    """What a replicated table holds of a producer's last batch: the producers' session
    table (``metadata.ProducerSession``) or the send window (``sendwindow.Sent``)."""

    @property
    def seq(self) -> int: ...

    @property
    def results(self) -> list[Result]: ...

    @property
    def complete(self) -> bool: ...


class AttemptState(Enum):
    RUNNING = "running"  # appending, or waiting for its commit or settle
    ANSWERED = "answered"  # answered OK; kept until settled: retries get the answer
    ORPHANED = "orphaned"  # ended with an unknown outcome; kept until settled


@dataclass(eq=False, slots=True)
class Attempt:
    """This master's attempt at one batch (identity matters: drivers key waiters on it)."""

    key: Key
    term: int
    state: AttemptState = AttemptState.RUNNING
    settle_index: int = -1  # once ended: every entry it appended is at or below
    answer: list[Result] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    results: list[Result]
    deduplicated: bool = True


@dataclass(frozen=True, slots=True)
class Join:
    attempt: Attempt


@dataclass(frozen=True, slots=True)
class SettleFirst:
    attempt: Attempt
    index: int


@dataclass(frozen=True, slots=True)
class Append:
    attempt: Attempt
    done: list[Result]


@dataclass(frozen=True, slots=True)
class Refuse:
    error: errors.BrokerError


Decision = Answer | Join | SettleFirst | Append | Refuse
Settled = Callable[[int], bool]
"""``settled(index)``: is every entry up to ``index`` committed and dispatched here?"""


class ProducerSessions:
    """The attempts of one master (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.attempts: dict[Key, Attempt] = {}

    def begin(
        self,
        key: Key,
        size: int,
        *,
        term: int,
        table: Mapping[str, BatchRecord],
        settled: Settled,
    ) -> Decision:
        """What to do with a request for batch ``key`` of ``size`` messages, on a master
        of ``term`` whose replicated session table is ``table``."""
        a = self.attempts.get(key)
        if a is not None and a.term != term:
            del self.attempts[key]  # an earlier term's: the table knows (module doc)
            a = None
        if a is not None and a.state is AttemptState.ORPHANED:
            if not settled(a.settle_index):
                return SettleFirst(a, a.settle_index)
            del self.attempts[key]  # all of it is committed and dispatched: the table knows
            a = None
        if a is not None:
            if a.answer is not None:
                return Answer(list(a.answer))
            return Join(a)
        pid, seq = key
        done: list[Result] = []
        s = table.get(pid)
        if s is not None:
            if seq < s.seq:
                return Refuse(
                    errors.SequenceTooOldError(
                        f"producer {pid}: sequence {seq} is below the last one, {s.seq}",
                        last_sequence=s.seq,
                    )
                )
            if seq == s.seq:
                done = list(s.results[:size])
                if len(done) >= size:
                    return Answer(done)
        if len(self.attempts) >= self.limit:
            self._prune(term, settled)
            if len(self.attempts) >= self.limit:
                return Refuse(
                    errors.BusyError(
                        f"{self.limit} producer batches are in flight or settling",
                        retry_after_ms=200,
                    )
                )
        a = self.attempts[key] = Attempt(key, term)
        return Append(a, done)

    def _prune(self, term: int, settled: Settled) -> None:
        """Drop the attempts of earlier terms and the ended ones that are settled."""
        for key, a in list(self.attempts.items()):
            if a.term != term or (a.state is not AttemptState.RUNNING and settled(a.settle_index)):
                del self.attempts[key]

    @staticmethod
    def answer_from_table(
        attempt: Attempt, size: int, table: Mapping[str, BatchRecord]
    ) -> list[Result] | None:
        """After an unknown outcome, once everything appended is settled: the batch's
        results if the log holds all of it, else None (the client may retry)."""
        pid, seq = attempt.key
        s = table.get(pid)
        if s is not None and s.seq == seq and s.complete:
            return list(s.results[:size])
        return None

    def end(
        self,
        attempt: Attempt,
        *,
        answer: list[Result] | None,
        appended: bool,
        master_term: int | None,
        ledger_end: int,
        settled: Settled,
    ) -> None:
        """The attempt ended: answered (``answer``) or not. It stays while entries of it
        may be unsettled in its term (``master_term`` is this node's term as MASTER, None
        when it is not MASTER); else it goes."""
        if (
            self.attempts.get(attempt.key) is not attempt
            or attempt.state is not AttemptState.RUNNING
        ):
            return  # it ended already (or was dropped): one end per attempt
        if appended and master_term == attempt.term and not settled(ledger_end):
            attempt.settle_index = ledger_end
            attempt.answer = answer
            attempt.state = AttemptState.ANSWERED if answer is not None else AttemptState.ORPHANED
        else:
            del self.attempts[attempt.key]
