"""Transactional messages: replicated state, a pure function of the committed entries in
log order (``TransactionApplier``, ``broker/transactions/applier.py``).

A transaction is the messages of one produce request with ``transaction``, stored as
one record (a batch record for several) of the system topic ``HALF_TOPIC``: visible to
no consumer. Its id is the queue offset of its first message there (``tx1:<base>``).
``tx.commit`` makes the master append a copy of each message into its topic, carrying
``TX_ORIGIN`` (``<base>:<i>``): the copy and the record that message *i* is delivered
are one entry, so a failover delivers none twice and loses none (a new master copies
what a committed transaction still lacks). ``tx.rollback`` discards it. While it is
pending the master checks it: ``tx.check`` counts a check and sets the next one (time
from the entry, never a node's clock); past ``max_checks`` the master rolls it back.

Invariants:
- a transaction is resolved once: committed or rolled back, never both; a repeat of
  the same resolution changes nothing;
- each message of a committed transaction is copied at most once, and only after the
  commit; a rolled-back or pending one never;
- ``checks`` only grows and ``next_check`` is a log time;
- resolved transactions are remembered (``resolved``, the newest ``max_resolved``: the
  same ones on every replica, since eviction follows the log order) so a repeat of a
  commit or rollback answers the same; applying never raises on what the log holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..jsonint import json_int

PENDING, COMMITTED, ROLLED_BACK = "pending", "committed", "rolled_back"
STATS = ("begun", "committed", "rolled_back", "checks", "expired", "copied", "dropped")


@dataclass(slots=True)
class Transaction:
    base: int  # its first message's offset in the half topic: its id
    count: int  # messages
    group: str  # the producer group its checks go to
    topic: str
    born: int  # log ms its record was stored
    next_check: int  # log ms
    checks: int = 0
    state: str = PENDING
    copied: set[int] = field(default_factory=set)  # committed: messages copied so far

    def to_json(self) -> list[Any]:
        return [
            self.base,
            self.count,
            self.group,
            self.topic,
            self.born,
            self.next_check,
            self.checks,
            self.state,
            sorted(self.copied),
        ]

    @classmethod
    def from_json(cls, d: list[Any]) -> Transaction:
        base, count, group, topic, born, nxt, checks, state, copied = d
        if state not in (PENDING, COMMITTED):
            raise ValueError(f"transaction state {state!r}")
        return cls(
            json_int(base, "base"),
            json_int(count, "count"),
            str(group),
            str(topic),
            json_int(born, "born"),
            json_int(nxt, "next_check"),
            json_int(checks, "checks"),
            state,
            {json_int(i, "copied") for i in copied},
        )


class TransactionState:
    def __init__(self, max_resolved: int = 100_000) -> None:
        self.live: dict[int, Transaction] = {}  # pending, or committed and not all copied
        self.resolved: OrderedDict[int, str] = OrderedDict()  # base → committed|rolled_back
        self.max_resolved = max_resolved
        self.end = 0  # half offsets below were applied
        self.stats = dict.fromkeys(STATS, 0)

    def state_of(self, base: int) -> str | None:
        """pending, committed or rolled_back; None for no transaction known."""
        t = self.live.get(base)
        return t.state if t is not None else self.resolved.get(base)

    def pending(self) -> Iterator[Transaction]:
        return (t for t in self.live.values() if t.state == PENDING)

    def uncopied(self) -> Iterator[Transaction]:
        return (t for t in self.live.values() if t.state == COMMITTED)

    # ---- applying ---------------------------------------------------------------------

    def begun(  # noqa: PLR0917 - a record's fields
        self, base: int, count: int, group: str, topic: str, ts: int, first_check_ms: int
    ) -> None:
        """A transaction's record was applied (records come in offset order)."""
        if base < self.end or count < 1:
            return
        self.end = base + count
        self.live[base] = Transaction(base, count, group, topic, ts, ts + first_check_ms)
        self.stats["begun"] += 1

    def resolve(self, base: int, how: str, *, expired: bool = False) -> str | None:
        """Commit or roll back (``how``); the transaction's state after (the earlier
        resolution, for one resolved already), None for no transaction known."""
        t = self.live.get(base)
        if t is None or t.state != PENDING:
            return self.state_of(base)
        if how == ROLLED_BACK:
            del self.live[base]
            self._remember(base, ROLLED_BACK)
            if expired:
                self.stats["expired"] += 1
        else:
            t.state = COMMITTED
            self._remember(base, COMMITTED)
        self.stats[how] += 1
        return how

    def checked(self, base: int, ts: int, interval_ms: int) -> bool:
        """A check of a pending transaction was issued at ``ts``."""
        t = self.live.get(base)
        if t is None or t.state != PENDING:
            return False
        t.checks += 1
        t.next_check = ts + interval_ms
        self.stats["checks"] += 1
        return True

    def copied(self, base: int, i: int) -> bool:
        """Message ``i`` of a committed transaction was copied into its topic; False
        when that is not expected (copied already, not committed)."""
        t = self.live.get(base)
        if t is None or t.state != COMMITTED or not 0 <= i < t.count or i in t.copied:
            return False
        t.copied.add(i)
        self.stats["copied"] += 1
        if len(t.copied) == t.count:
            del self.live[base]
        return True

    def drop(self, base: int) -> bool:
        """A committed transaction whose topic is gone: what it has not copied is lost
        with the topic (counted as dropped)."""
        t = self.live.get(base)
        if t is None or t.state != COMMITTED:
            return False
        del self.live[base]
        self.stats["dropped"] += t.count - len(t.copied)
        return True

    def _remember(self, base: int, how: str) -> None:
        self.resolved[base] = how
        while len(self.resolved) > self.max_resolved:
            self.resolved.popitem(last=False)

    # ---- the snapshot part ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "end": self.end,
            "live": [t.to_json() for t in self.live.values()],
            "resolved": [[b, how] for b, how in self.resolved.items()],
            "stats": dict(self.stats),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], max_resolved: int = 100_000) -> TransactionState:
        """``ValueError``, ``TypeError``, ``KeyError`` on a malformed part."""
        s = cls(max_resolved)
        s.end = json_int(d["end"], "end")
        for raw in d["live"]:
            t = Transaction.from_json(raw)
            s.live[t.base] = t
        for base, how in d["resolved"]:
            if how not in (COMMITTED, ROLLED_BACK):
                raise ValueError(f"resolution {how!r}")
            s.resolved[json_int(base, "base")] = how
        s.stats = {k: json_int(d["stats"].get(k, 0), k) for k in STATS}
        return s
