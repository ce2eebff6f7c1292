"""The chaos checker: a pure function from a history (``tests/chaos/history.py``) to a
verdict, in the vocabulary of Jepsen's queue and Kafka checkers.

What it finds (each a list in ``Verdict``; any entry makes the run invalid):

- ``lost``: a value whose send was acknowledged (ok) and that no read ever returned;
- ``unexpected``: a value read that no send ever carried (a phantom);
- ``duplicated``: a value found at two or more positions (queue, offset) — with
  producer sessions never allowed, whatever the send's outcome;
- ``inconsistent``: one position read with two different values (by two nodes, or two
  reads), or a value read elsewhere than where its acknowledgement put it;
- ``gaps``: a queue's offsets not contiguous — within one read (a pull, a poll, a node's
  drain), across one consumer's polls (``poll-skip``), or over everything read of a
  queue from its first offset;
- ``rewinds``: offsets going backwards within one read or across one consumer's polls
  (``nonmonotonic-poll``);
- ``offsets_backwards``: a group's committed offset, as one node reports it, lower than
  that node reported before (since its last restart: a restarted node may report from
  an older checkpoint until it has replayed); or a node's last report after the run
  lower than the last acknowledged commit (a stale commit's answer counts as one). A
  stale commit a broker applied as the last writer shows here when a node reports
  the lowered offset;
- ``commit_answers``: a stale commit's answer (where each queue stands after it) lower
  than what it asked, or lower than an offset the group was known to be at when it was
  invoked: acknowledged before (a commit's offsets, another stale commit's answer) or
  reported by a node before (a node reports only what is committed). The workload never
  resets the group, so nothing may move it back;
- the POP group's rules (``tests/chaos/pop_checker.py``): ``pop_acked_again``,
  ``pop_held_twice``, ``pop_attempts``, ``pop_fifo``, ``pop_invisible_until``, and at
  the end ``pop_not_done``, ``pop_dead_letters``, ``pop_lag``. What a POP consumer was
  handed out counts as a read of its place for ``unexpected`` and ``inconsistent``
  (not for the offsets' contiguity: a receive draws from every queue);
- the delay messages' rules (``tests/chaos/delay_checker.py``): ``delay_early``,
  ``delay_lost``, ``delay_recall``. A delay message's value counts for ``unexpected``,
  ``duplicated`` and ``inconsistent`` like any other once delivered (its send's answer
  names no place: it has none before its time);
- the transactions' rules (``tests/chaos/tx_checker.py``): ``tx_lost``, ``tx_visible``,
  ``tx_partial``, ``tx_duplicated``, ``tx_answers``, ``tx_unresolved``,
  ``tx_replicas``. The transactions have a topic of their own, read by ``tx-pull`` and
  ``tx-drain`` (not ``READS``); a transaction's message read in the workload's topic is
  ``tx_visible`` (and ``unexpected``).

What it measures: sends acknowledged, failed and indeterminate (``info``), and of the
indeterminate values how many turned out to be in the log (exactly once, else they are
``duplicated``) and how many not at all; per fault, the unavailability window: the
fault → the first acknowledgement of a send invoked at or after it (a send invoked
before may have been committed before the fault and answered after); and the longest
stall between acknowledgements until the next fault.

Invariants: the function reads only its argument, keeps every result sorted, and is
linear in the history's size (plus sorting).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from .delay_checker import check_delays, delay_summary
from .history import Op, Read
from .pop_checker import check_pop, pop_summary
from .tx_checker import check_transactions, tx_summary

READS = ("poll", "pull", "drain")
RESTARTING = ("kill",)  # fault kinds after which a node may report an older view (restarted)


@dataclass(frozen=True, slots=True)
class Window:
    """One fault and how long produce was unavailable after it (None: no produce was
    acknowledged after it); and the longest stall between two acknowledgements from
    the fault to the next one (a full disk is noticed a moment after the fault: the
    window alone would miss it)."""

    kind: str
    at_s: float
    window_s: float | None
    stall_s: float = 0.0


@dataclass(slots=True)
class Verdict:
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    indeterminate: int = 0
    indeterminate_found: int = 0
    indeterminate_absent: int = 0
    reads: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    rewinds: list[str] = field(default_factory=list)
    offsets_backwards: list[str] = field(default_factory=list)
    commit_answers: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    operations: dict[str, int] = field(default_factory=dict)
    # The POP group (tests/chaos/pop_checker.py)
    pop_delivered: int = 0
    pop_redelivered: int = 0
    pop_acked: int = 0
    pop_nacked: int = 0
    pop_extended: int = 0
    pop_dead_lettered: int = 0
    pop_acks_uncertain: int = 0
    pop_acked_again: list[str] = field(default_factory=list)
    pop_held_twice: list[str] = field(default_factory=list)
    pop_attempts: list[str] = field(default_factory=list)
    pop_fifo: list[str] = field(default_factory=list)
    pop_invisible_until: list[str] = field(default_factory=list)
    pop_not_done: list[str] = field(default_factory=list)
    pop_dead_letters: list[str] = field(default_factory=list)
    pop_lag: list[str] = field(default_factory=list)
    # Delay messages (tests/chaos/delay_checker.py)
    delay_sent: int = 0
    delay_acknowledged: int = 0
    delay_failed: int = 0
    delay_indeterminate: int = 0
    delay_indeterminate_found: int = 0
    delay_delivered: int = 0
    delay_recalls: dict[str, int] = field(default_factory=dict)  # by outcome
    delay_late_ms: list[int] = field(default_factory=list)  # store time - time, acknowledged
    delay_early: list[str] = field(default_factory=list)
    delay_lost: list[str] = field(default_factory=list)
    delay_recall: list[str] = field(default_factory=list)
    # Transactions (tests/chaos/tx_checker.py)
    tx_begun: int = 0
    tx_outcomes: dict[str, int] = field(default_factory=dict)  # begins by outcome
    tx_fates: dict[str, int] = field(default_factory=dict)
    tx_committed: int = 0  # in the topic whole at the end
    tx_absent: int = 0  # none of its messages in the topic at the end
    tx_checks: int = 0  # handed out to the checker thread
    tx_ends: dict[str, int] = field(default_factory=dict)  # "<who> <action> <outcome>"
    tx_lost: list[str] = field(default_factory=list)
    tx_visible: list[str] = field(default_factory=list)
    tx_partial: list[str] = field(default_factory=list)
    tx_duplicated: list[str] = field(default_factory=list)
    tx_answers: list[str] = field(default_factory=list)
    tx_unresolved: list[str] = field(default_factory=list)
    tx_replicas: list[str] = field(default_factory=list)

    ANOMALIES = (
        "lost",
        "unexpected",
        "duplicated",
        "inconsistent",
        "gaps",
        "rewinds",
        "offsets_backwards",
        "commit_answers",
        "pop_acked_again",
        "pop_held_twice",
        "pop_attempts",
        "pop_fifo",
        "pop_invisible_until",
        "pop_not_done",
        "pop_dead_letters",
        "pop_lag",
        "delay_early",
        "delay_lost",
        "delay_recall",
        "tx_lost",
        "tx_visible",
        "tx_partial",
        "tx_duplicated",
        "tx_answers",
        "tx_unresolved",
        "tx_replicas",
    )

    @property
    def valid(self) -> bool:
        return not any(getattr(self, a) for a in self.ANOMALIES)

    def anomalies(self) -> dict[str, list[str]]:
        return {a: getattr(self, a) for a in self.ANOMALIES if getattr(self, a)}


def check(history: Sequence[Op]) -> Verdict:
    """The verdict on one history (completions matched to invokes by process: each
    process runs one operation at a time)."""
    v = Verdict()
    v.operations = _operation_counts(history)
    sends = _sends(history, v)
    reads = [op for op in history if op.type == "ok" and op.f in READS]
    v.reads = sum(len(op.value) for op in reads)
    received = [op for op in history if op.type == "ok" and op.f == "receive"]
    positions = _positions(reads + received, v)
    _values(sends, positions, v)
    _contiguity(reads, positions, v)
    _pull_starts(history, v)
    _group_offsets(history, v)
    check_pop(history, positions, v)
    check_delays(history, reads + received, positions, v)
    check_transactions(history, reads + received, v)
    v.windows = _windows(history)
    return v


# ---- sends and values ---------------------------------------------------------------------


@dataclass(slots=True)
class _Sends:
    invoked: set[str] = field(default_factory=set)
    acked: dict[str, tuple[int, int]] = field(default_factory=dict)  # value → (queue, offset)
    indeterminate: set[str] = field(default_factory=set)


def _operation_counts(history: Iterable[Op]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for op in history:
        if op.type != "invoke":
            counts[f"{op.f} {op.type}"] += 1
    return dict(sorted(counts.items()))


def _sends(history: Iterable[Op], v: Verdict) -> _Sends:
    s = _Sends()
    for op in history:
        if op.f == "delay" and op.type == "invoke":  # (the rest: delay_checker.py)
            s.invoked.update(d.value for d in op.value)
        if op.f != "send":
            continue
        if op.type == "invoke":
            s.invoked.update(op.value)
            v.sent += len(op.value)
        elif op.type == "ok":
            for r in op.value:
                s.acked[r.value] = (r.queue, r.offset)
            v.acknowledged += len(op.value)
        elif op.type == "fail":
            v.failed += len(op.value)
        else:
            s.indeterminate.update(op.value)
            v.indeterminate += len(op.value)
    return s


def _positions(reads: Iterable[Op], v: Verdict) -> dict[tuple[int, int], str]:
    """(queue, offset) → the value read there (or handed out: ``Popped``); two values at
    one place are ``inconsistent``."""
    at: dict[tuple[int, int], str] = {}
    clash: set[str] = set()
    for op in reads:
        for r in op.value:
            seen = at.setdefault((r.queue, r.offset), r.value)
            if seen != r.value:
                clash.add(f"queue {r.queue} offset {r.offset}: {seen!r} and {r.value!r}")
    v.inconsistent.extend(sorted(clash))
    return at


def _values(s: _Sends, positions: Mapping[tuple[int, int], str], v: Verdict) -> None:
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for pos, value in sorted(positions.items()):
        where[value].append(pos)
    v.lost = sorted(x for x in s.acked if x not in where)
    v.unexpected = sorted(x for x in where if x not in s.invoked)
    v.duplicated = sorted(f"{x} at {ps}" for x, ps in where.items() if len(ps) > 1)
    for x, (q, o) in sorted(s.acked.items()):
        if x in where and (q, o) not in where[x]:
            v.inconsistent.append(f"{x}: acknowledged at queue {q} offset {o}, read {where[x]}")
    v.indeterminate_found = sum(1 for x in s.indeterminate if x in where)
    v.indeterminate_absent = len(s.indeterminate) - v.indeterminate_found


# ---- offsets --------------------------------------------------------------------------------


def _contiguity(reads: Sequence[Op], positions: Mapping[tuple[int, int], str], v: Verdict) -> None:
    for op in reads:
        _one_read(op, v)
    _polls(reads, v)
    by_queue: dict[int, list[int]] = defaultdict(list)
    for q, o in positions:
        by_queue[q].append(o)
    for q, offsets in sorted(by_queue.items()):
        first, last = min(offsets), max(offsets)
        missing = sorted(set(range(first, last + 1)) - set(offsets))
        if missing:
            v.gaps.append(f"queue {q}: offsets {_span(missing)} never read")


def _one_read(op: Op, v: Verdict) -> None:
    """Within one read, each queue's offsets go up by one; a pull starts where asked."""
    last: dict[int, int] = {}
    for r in op.value:
        before = last.get(r.queue)
        if before is not None and r.offset != before + 1:
            where = f"{op.process} {op.f}" + (f" from {op.node}" if op.node else "")
            kind = v.rewinds if r.offset <= before else v.gaps
            kind.append(f"{where} at {op.time_s:.3f}: queue {r.queue} {before} → {r.offset}")
        last[r.queue] = r.offset


def _pull_starts(history: Iterable[Op], v: Verdict) -> None:
    """A pull's first message is at the offset it asked for (a node may hold less,
    never start elsewhere)."""
    asked: dict[str, tuple[int, int]] = {}
    for op in history:
        if op.f != "pull":
            continue
        if op.type == "invoke":
            asked[op.process] = op.value
        elif op.type == "ok" and op.value:
            q, offset = asked[op.process]
            first = op.value[0].offset
            if first != offset:
                kind = v.rewinds if first < offset else v.gaps
                kind.append(
                    f"{op.process} pull from {op.node} at {op.time_s:.3f}: "
                    f"queue {q} asked {offset}, got {first}"
                )


def _polls(reads: Iterable[Op], v: Verdict) -> None:
    """One consumer's polls, in order: each queue goes on exactly after the last
    offset it returned (poll-skip, nonmonotonic-poll)."""
    last: dict[tuple[str, int], int] = {}
    for op in reads:
        if op.f != "poll":
            continue
        for q, offsets in _by_queue(op.value).items():
            before = last.get((op.process, q))
            if before is not None and offsets[0] != before + 1:
                kind = v.rewinds if offsets[0] <= before else v.gaps
                kind.append(
                    f"{op.process} poll at {op.time_s:.3f}: queue {q} {before} → {offsets[0]}"
                )
            last[(op.process, q)] = offsets[-1]


def _by_queue(reads: Iterable[Read]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for r in reads:
        out[r.queue].append(r.offset)
    return out


def _span(xs: Sequence[int], most: int = 5) -> str:
    head = ", ".join(map(str, xs[:most]))
    return head + (f" … ({len(xs)} in all)" if len(xs) > most else "")


def _group_offsets(history: Iterable[Op], v: Verdict) -> None:
    """Per node, committed offsets never go backwards between its restarts; the last
    report of each node is at least the last acknowledged commit; a stale commit's
    answer is at least where the group was known to be (``_stale_answer``)."""
    seen: dict[tuple[str, int], int] = {}
    committed: dict[int, int] = {}  # acknowledged: a commit's offsets, a stale one's answer
    known: dict[int, int] = {}  # the above, and every node's reports
    invoked: dict[str, tuple[dict[int, int], dict[int, int]]] = {}  # (asked, known then)
    final: dict[tuple[str, int], int] = {}
    for op in history:
        if op.f == "fault" and str(op.value.get("kind")).startswith(RESTARTING):
            for node in op.value.get("nodes", ()):
                for key in [k for k in seen if k[0] == node]:
                    del seen[key]
        elif op.f == "stale-commit" and op.type == "invoke":
            invoked[op.process] = (op.value, dict(known))
        elif op.f in ("commit", "stale-commit") and op.type == "ok":
            if op.f == "stale-commit":
                asked, then = invoked[op.process]
                _stale_answer(op, asked, then, v)
            for q, o in op.value.items():
                committed[q] = max(committed.get(q, 0), o)
                known[q] = max(known.get(q, 0), o)
        elif op.f == "offsets" and op.type == "ok" and op.node is not None:
            for q, o in op.value.items():
                known[q] = max(known.get(q, 0), o)
                before = seen.get((op.node, q))
                if before is not None and o < before:
                    v.offsets_backwards.append(
                        f"{op.node} at {op.time_s:.3f}: queue {q} committed {before} → {o}"
                    )
                seen[(op.node, q)] = o
                final[(op.node, q)] = o
    nodes = sorted({n for n, _ in final})
    for node in nodes:
        for q, o in sorted(committed.items()):
            got = final.get((node, q), 0)
            if got < o:
                v.offsets_backwards.append(
                    f"{node} at the end: queue {q} committed {got} < acknowledged {o}"
                )


def _stale_answer(op: Op, asked: Mapping[int, int], then: Mapping[int, int], v: Verdict) -> None:
    """A stale commit's answer: each queue asked where it stands after, at least what
    was asked and what the group was known to be at when the commit was invoked."""
    for q, o in sorted(asked.items()):
        got = op.value.get(q)
        floor = max(o, then.get(q, 0))
        if got is None or got < floor:
            why = "asked" if floor == o else "known before"
            v.commit_answers.append(
                f"{op.process} stale commit at {op.time_s:.3f}: queue {q} asked {o}, "
                f"answered {got} < {floor} ({why})"
            )


# ---- unavailability -------------------------------------------------------------------------


def _windows(history: Sequence[Op]) -> list[Window]:
    """Each fault → the first ok of a send invoked at or after it."""
    invoked_at: dict[str, float] = {}
    acks: list[tuple[float, float]] = []  # (invoke time, ok time), in ok order
    faults: list[tuple[str, float]] = []
    for op in history:
        if op.f == "fault":
            faults.append((str(op.value.get("kind")), op.time_s))
        elif op.f == "send" and op.type == "invoke":
            invoked_at[op.process] = op.time_s
        elif op.f == "send" and op.type == "ok":
            acks.append((invoked_at[op.process], op.time_s))
    ack_times = sorted(done for _, done in acks)
    out = []
    for i, (kind, at) in enumerate(faults):
        after = [done for invoked, done in acks if invoked >= at]
        until = faults[i + 1][1] if i + 1 < len(faults) else float("inf")
        marks = [at] + [t for t in ack_times if at < t <= until]
        stall = max((b - a for a, b in pairwise(marks)), default=0.0)
        out.append(Window(kind, at, min(after) - at if after else None, stall))
    return out


def summary(v: Verdict) -> dict[str, Any]:
    """The verdict's figures (not the anomalies' details), for a report."""
    return {
        "operations": sum(v.operations.values()),
        "sent": v.sent,
        "acknowledged": v.acknowledged,
        "failed": v.failed,
        "indeterminate": v.indeterminate,
        "indeterminate resolved": f"{v.indeterminate_found} in the log once, "
        f"{v.indeterminate_absent} absent",
        "read": v.reads,
        **pop_summary(v),
        **delay_summary(v),
        **tx_summary(v),
        **{a: len(getattr(v, a)) for a in Verdict.ANOMALIES},
    }
