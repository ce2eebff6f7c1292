"""The chaos checker's delay-message rules (issue 29): what the producers' delay batches
and recalls (``tests/chaos/workload.py``) say against what every read saw, from the
history alone.

A delay message's *time* is a lower bound the client knows without the broker's clock:
the time its send asked (``deliver_at_ms``), or the moment the send was invoked plus its
``delay_ms`` (the broker reads the same kernel clock, later: network namespaces share
it), and, when the send was answered, the ``deliver_at_ms`` the answer said. No slack:
a store time is the master's wall clock (never behind this machine's, as it is this
machine's), and a read completed before the time saw the message before it.

The rules (each a list of the ``Verdict``):

- ``delay_early``: a delay message read (a pull, a poll, a POP receive, the drain) with
  a store time before its time, or by a read that completed before its time; a recall
  answered ``ALREADY_DELIVERED`` before its time;
- ``delay_lost``: a delay message whose send was acknowledged and that no recall may
  have cancelled (none answered OK, none of unknown outcome) was never read;
- ``delay_recall``: a delay message read although a recall of it answered OK (it was
  cancelled), and a recall of an acknowledged message's handle answered
  ``RECALL_HANDLE_NOT_FOUND``.

Delivered at most once is the general rule (``duplicated``: a value at two places), and
it holds for a send of unknown outcome too, which may or may not have been stored.
Measured: sends by outcome, recalls by outcome, how many were delivered, and how late
(store time minus the answered time) those acknowledged were.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgermq.demo.load import percentile

from .history import Delay, Op, Scheduled

if TYPE_CHECKING:
    from .checker import Verdict


@dataclass(slots=True)
class _Delayed:
    """One delay message: what was asked, how its send ended, what its recalls said."""

    asked: Delay
    invoked_ms: float  # the wall clock when its send was invoked
    outcome: str = "invoke"  # ok, fail, info (invoke: no completion in the history)
    done_ms: float | None = None  # the wall clock when its send completed
    answer: Scheduled | None = None
    recalls: list[tuple[str, str, float]] = field(default_factory=list)  # type, error, ms

    @property
    def time_ms(self) -> int:
        """The earliest it may be delivered (the module's docstring)."""
        a = self.asked
        at = a.deliver_at_ms if a.deliver_at_ms is not None else 0
        if a.delay_ms is not None:
            at = max(at, math.floor(self.invoked_ms) + a.delay_ms)
        if self.answer is not None:
            at = max(at, self.answer.deliver_at_ms)
        return at

    def latest_ms(self, now_ms: float) -> float | None:
        """The latest time it may have been stored with (None: certainly not stored);
        ``now_ms`` for a send under way."""
        if self.answer is not None:
            return self.answer.deliver_at_ms
        if self.outcome == "fail":
            return None
        a, done = self.asked, now_ms if self.done_ms is None else self.done_ms
        return done + (a.delay_ms or 0) if a.deliver_at_ms is None else max(a.deliver_at_ms, done)

    def recalled(self, type_: str) -> bool:
        return any(t == type_ for t, _, _ in self.recalls)


def _ms(wall_s: float | None) -> float:
    return (wall_s or 0.0) * 1000


def read_delays(history: Iterable[Op]) -> dict[str, _Delayed]:
    """Every delay message of the history, by value."""
    out: dict[str, _Delayed] = {}
    recalls: dict[str, Op] = {}  # process → its recall's invoke
    for op in history:
        if op.f == "delay" and op.type == "invoke":
            for a in op.value:
                out[a.value] = _Delayed(a, _ms(op.wall_s))
        elif op.f == "delay":
            for x in op.value:
                d = out.get(x.value)
                if d is None:
                    continue
                d.outcome, d.done_ms = op.type, _ms(op.wall_s)
                if op.type == "ok" and isinstance(x, Scheduled):
                    d.answer = x
        elif op.f == "recall" and op.type == "invoke":
            recalls[op.process] = op
        elif op.f == "recall":
            call = recalls.pop(op.process, None)
            d = None if call is None else out.get(call.value["value"])
            if d is not None:
                code = (op.error or "").split(":", 1)[0]
                d.recalls.append((op.type, code, _ms(op.wall_s)))
    return out


def to_deliver(delays: Mapping[str, _Delayed]) -> set[str]:
    """The delay messages certain to be delivered: acknowledged, and no recall may
    have cancelled them."""
    return {
        x
        for x, d in delays.items()
        if d.outcome == "ok" and not (d.recalled("ok") or d.recalled("info"))
    }


def check_delays(history: Sequence[Op], reads: Sequence[Op],
                 positions: Mapping[tuple[int, int], str], v: Verdict) -> None:  # fmt: skip
    """The rules over ``history``; ``reads``: every read (ok) whose values are ``Read``s or
    ``Popped``s; ``positions``: each place of the topic read → its value."""
    delays = read_delays(history)
    if not delays:
        return
    found: dict[str, int] = defaultdict(int)
    for value in positions.values():
        if value in delays:
            found[value] += 1
    _counts(delays, found, v)
    stored = _early(reads, delays, v)
    certain = to_deliver(delays)
    for value, d in sorted(delays.items()):
        for type_, code, at in d.recalls:
            if type_ == "fail" and code == "ALREADY_DELIVERED" and at < d.time_ms:
                v.delay_early.append(
                    f"{value}: a recall answered ALREADY_DELIVERED at {at:.0f}, before its "
                    f"time {d.time_ms}"
                )
            if type_ == "fail" and code == "RECALL_HANDLE_NOT_FOUND" and d.outcome == "ok":
                v.delay_recall.append(f"{value}: its recall handle {_handle(d)} not found")
        if d.recalled("ok") and value in found:
            v.delay_recall.append(f"{value}: read although a recall of it answered OK")
        if value in certain and value not in found:
            v.delay_lost.append(f"{value} (due {d.time_ms}, {_handle(d)})")
        if d.outcome == "ok" and value in stored:
            v.delay_late_ms.append(stored[value] - d.time_ms)


def _handle(d: _Delayed) -> str:
    return d.answer.recall_handle if d.answer is not None else "no handle"


def _counts(delays: Mapping[str, _Delayed], found: Mapping[str, int], v: Verdict) -> None:
    for value, d in delays.items():
        v.delay_sent += 1
        if d.outcome == "ok":
            v.delay_acknowledged += 1
        elif d.outcome == "fail":
            v.delay_failed += 1
        else:
            v.delay_indeterminate += 1
            v.delay_indeterminate_found += value in found
        for type_, _, _ in d.recalls:
            v.delay_recalls[type_] = v.delay_recalls.get(type_, 0) + 1
    v.delay_delivered = len(found)


def _early(reads: Iterable[Op], delays: Mapping[str, _Delayed], v: Verdict) -> dict[str, int]:
    """Every read of a delay message before its time; each one's store time."""
    stored: dict[str, int] = {}
    early: set[str] = set()
    for op in reads:
        done_ms = _ms(op.wall_s)
        for r in op.value:
            d = delays.get(r.value)
            if d is None:
                continue
            where = f"{r.value} (due {d.time_ms}) read by {op.process} {op.f}"
            if r.store_ms is not None:
                stored.setdefault(r.value, r.store_ms)
                if r.store_ms < d.time_ms:
                    early.add(f"{where}: stored at {r.store_ms}, {d.time_ms - r.store_ms} ms early")
            if op.wall_s is not None and done_ms < d.time_ms:
                early.add(f"{where}: the read ended at {done_ms:.0f}, before its time")
    v.delay_early.extend(sorted(early))
    return stored


def delay_summary(v: Verdict) -> dict[str, Any]:
    if not v.delay_sent:
        return {}
    late = v.delay_late_ms
    lateness = (
        f"p50 {percentile(late, 0.5):.0f} ms, p99 {percentile(late, 0.99):.0f} ms, "
        f"max {max(late)} ms"
        if late
        else "none read"
    )
    recalls = ", ".join(f"{k} {n}" for k, n in sorted(v.delay_recalls.items())) or "none"
    return {
        "delay messages": f"{v.delay_sent} sent, {v.delay_acknowledged} acknowledged, "
        f"{v.delay_failed} failed, {v.delay_indeterminate} indeterminate "
        f"({v.delay_indeterminate_found} delivered once); recalls: {recalls}; "
        f"{v.delay_delivered} delivered",
        "delay lateness (store - time, acknowledged)": lateness,
    }
