"""A chaos run's history (Jepsen's shape): every operation a client or the
nemesis performs, as an ``invoke`` and then exactly one completion — ``ok`` (it
happened), ``fail`` (it certainly did not) or ``info`` (unknown: it may have happened).

Operations (``f``) and their values:

- ``send`` (a producer): invoke with the batch's unique values; ok with one ``Read`` per
  value (where the broker said it went); fail/info with the values again.
- ``poll`` (a group consumer), ``pull`` (a direct pull of one queue from one node),
  ``drain`` (the final read of every queue from one node): ok with the ``Read``s, in the
  order received; a pull's invoke holds ``(queue, offset)``.
- ``delay`` (a producer's batch of delay messages): invoke with one ``Delay`` per value
  (what was asked: ``deliver_at_ms`` or ``delay_ms``); ok with one ``Scheduled`` per
  value (the time the broker answered and the recall handle); fail/info with the
  ``Delay``s again. A delay message is read like any other once delivered.
- ``recall`` (a producer): invoke with ``{"value": ..., "handle": ...}``; ok: cancelled
  (200); fail: certainly not cancelled (``error``: ``ALREADY_DELIVERED`` or
  ``RECALL_HANDLE_NOT_FOUND``); info: unknown.
- ``commit`` (a group consumer's offsets): invoke and ok with ``{queue: offset}``.
- ``stale-commit`` (the stale committer: offsets the consumer polled earlier, below what
  it has had acknowledged since): invoke with ``{queue: offset}`` asked; ok with the
  broker's answer, ``{queue: offset}`` where each queue stands after it; fail/info with
  the offsets asked.
- ``offsets`` (a group's committed offsets as one node reports them): ok with
  ``{queue: committed}``; ``node`` names the node.
- ``fault`` / ``heal`` (the nemesis): info with ``{"kind": ..., "nodes": [...]}``, the
  moment it was done.

The POP group's operations (``tests/chaos/pop_checker.py`` checks them):

- ``pop-config``: ok with the group's configuration (``PopPlan.describe``), before any
  receive;
- ``receive`` (a POP consumer): invoke with the ``invisible_ms`` asked; ok with one
  ``Popped`` per message handed out;
- ``ack`` / ``nack``: invoke with the receipt handles (a nack: ``{"handles": ...,
  "delay_ms": ...}``); ok with ``{handle: status}`` (``OK`` or
  ``INVALID_RECEIPT_HANDLE``);
- ``extend`` (a new invisible time): invoke with ``{"handle": ..., "invisible_ms": ...}``;
  ok with the new handle;
- ``dlq``: ok with one ``DeadLetter`` per message of ``%DLQ%<group>``, read at the end;
- ``pop-lag``: ok with ``{queue: lag}`` as one node reports the group's offsets at the
  end; ``node`` names the node.

The transactional producers' operations (``tests/chaos/tx_workload.py``;
``tests/chaos/tx_checker.py`` checks them), keyed by the transaction's name:

- ``tx-begin``: invoke with ``{"name", "values", "fate"}``; ok with ``{"name", "id"}``
  (the transaction id the broker answered); fail/info with the invoke's value;
- ``tx-end`` (a producer, or the checker thread answering a check): invoke with
  ``{"name", "id", "action"}`` (``commit`` or ``rollback``); ok with those and
  ``"state"`` as answered; fail: certainly no effect (``TRANSACTION_RESOLVED``, the
  value then carrying the ``state`` the broker gave, or ``TRANSACTION_NOT_FOUND``);
  info: unknown;
- ``tx-checks`` (the checker thread's long poll): ok with one ``TxCheck`` per check;
- ``tx-pull`` (a direct pull of the transactions' topic from one node) and ``tx-drain``
  (the final read of it from one node, ``node`` naming it): ok with the ``Read``s;
- ``tx-pending``: ok with the ids of the group's transactions one node (``node``) has
  pending, at the end.

Times are seconds on one monotonic clock; each op also carries the wall clock
(``wall_s``, ``time.time``) when it was recorded: a POP group's invisible times are the
master's wall clock, and the nodes run on this machine's. The history is append-only and
bounded by the run (the workload's pacing); ``dump``/``load`` write it as JSON lines, so
a failing run's history can be checked again offline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

OpType = Literal["invoke", "ok", "fail", "info"]


class Read(NamedTuple):
    """One message as a client saw it: its unique value, its place and its store time
    (ms, the master's wall clock; None in a history written before it was kept)."""

    value: str
    queue: int
    offset: int
    store_ms: int | None = None


class Delay(NamedTuple):
    """A delay message asked for: delivered at ``deliver_at_ms``, or ``delay_ms`` after
    the broker stores it (the other one None)."""

    value: str
    deliver_at_ms: int | None
    delay_ms: int | None


class Scheduled(NamedTuple):
    """A delay message stored, as its send's answer said: its time and recall handle."""

    value: str
    deliver_at_ms: int
    recall_handle: str


@dataclass(frozen=True, slots=True)
class Op:
    process: str  # who: "producer-0", "consumer-0", "committer-1", "puller-0", "drain", …
    type: OpType
    f: str
    value: Any
    time_s: float
    node: str | None = None  # the node that answered, where one did
    error: str | None = None  # why a fail or info (the client's last error)
    wall_s: float | None = None  # the wall clock when it was recorded


class Popped(NamedTuple):
    """One message a POP receive handed out, as the consumer saw it."""

    value: str
    queue: int
    offset: int
    handle: str  # v1:<queue>:<offset>:<epoch>
    attempt: int  # 1 on the first delivery
    invisible_until: int  # ms, the log's time (the master's wall clock)
    msg_id: str
    store_ms: int | None = None  # the message's store time (None: an older history)


class TxCheck(NamedTuple):
    """One check of a transaction the broker handed out: its id, its messages' values
    and how many checks it had."""

    transaction_id: str
    values: tuple[str, ...]
    check_count: int


class DeadLetter(NamedTuple):
    """One message of ``%DLQ%<group>``: its body and its DLQ_* properties (-1 or "" for
    one missing or malformed)."""

    value: str
    origin_topic: str
    origin_queue: int
    origin_offset: int
    origin_msg_id: str
    attempts: int
    epoch: int  # POP_EPOCH: the handle of the flight it ended


class History:
    """The recorder: ``invoke`` returns a completion function that appends the op's one
    completion (asserted: never two)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.clock = clock
        self.wall = wall
        self.ops: list[Op] = []

    def invoke(self, process: str, f: str, value: Any) -> Callable[..., None]:
        self.ops.append(Op(process, "invoke", f, value, self.clock(), wall_s=self.wall()))
        done = False

        def complete(
            type_: OpType, value_: Any = value, node: str | None = None, error: str | None = None
        ) -> None:
            nonlocal done
            assert not done, f"{process} {f}: completed twice"
            assert type_ != "invoke"
            done = True
            self.ops.append(Op(process, type_, f, value_, self.clock(), node, error, self.wall()))

        return complete

    def info(self, process: str, f: str, value: Any, node: str | None = None) -> None:
        """An event with no duration (the nemesis's faults, a node's report)."""
        self.ops.append(Op(process, "info", f, value, self.clock(), node, wall_s=self.wall()))

    def ok(self, process: str, f: str, value: Any, node: str | None = None) -> None:
        """A read completed at once (a drain, an offsets report): invoke and ok."""
        self.invoke(process, f, None)("ok", value, node)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)


# The records kept in a history, by their tag in its JSON.
RECORDS: dict[str, type[Read | Popped | DeadLetter | Delay | Scheduled | TxCheck]] = {
    "r": Read,
    "p": Popped,
    "dl": DeadLetter,
    "dy": Delay,
    "sc": Scheduled,
    "tc": TxCheck,
}


def _encode(v: Any) -> Any:
    for tag, record in RECORDS.items():
        if isinstance(v, record):
            return {tag: list(v)}
    if isinstance(v, dict):
        return {"d": [[k, _encode(x)] for k, x in v.items()]}
    if isinstance(v, list | tuple):
        return [_encode(x) for x in v]
    return v


def _decode(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1 and (tag := next(iter(v))) in RECORDS:
        return RECORDS[tag](*(_decode(x) for x in v[tag]))
    if isinstance(v, dict) and "d" in v:
        return {k: _decode(x) for k, x in v["d"]}
    if isinstance(v, list):
        return tuple(_decode(x) for x in v)
    return v


def dump(ops: Iterable[Op], path: Path) -> None:
    with path.open("w") as f:
        for op in ops:
            row = [op.process, op.type, op.f, _encode(op.value), op.time_s, op.node, op.error,
                   op.wall_s]  # fmt: skip
            f.write(json.dumps(row) + "\n")


def load(path: Path) -> list[Op]:
    out = []
    for line in path.read_text().splitlines():
        process, type_, f, value, time_s, node, error, *wall = json.loads(line)  # (older: no wall)
        out.append(Op(process, type_, f, _decode(value), time_s, node, error, *wall))
    return out
