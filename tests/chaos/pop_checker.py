"""The chaos checker's POP rules (issue 28): what a POP group's consumers saw
(``tests/chaos/pop_workload.py``), checked from the history alone — no log, no node's
state — with what the clients cannot know taken as possible.

How a client's answers are ordered and timed: a receipt handle ``v1:<queue>:<offset>:
<epoch>`` names the log entry that set it (a receive, or a new invisible time), so a
message's deliveries are ordered by epoch whatever order their answers came in; and a
delivery's ``invisible_until`` is that entry's log time plus the ``invisible_ms`` its
receive asked, so the moment it was handed out, by the log's clock, is
``invisible_until - invisible_ms``: exact, no client clock involved. The log's clock is
the master's wall clock (the largest ``STORETIMESTAMP`` so far) and the nodes run on
this machine, so a client's wall clock (``Op.wall_s``) bounds when its request applied:
not before it was sent. That bound is used where only it exists — when a nack, a new
invisible time or an ack was sent — less ``SLACK_MS``: stamps are whole milliseconds
(truncated), the client's times are floats read just before the request goes out, and
both read one kernel clock (network namespaces share it), so a few milliseconds cover
it; 50 leaves room for a clock slewed by NTP. Each receive's hand-out time must lie
within its request's wall times, give or take the slack (``pop_invisible_until``): the
clocks agree, or the check says so.

The rules (each a list of the ``Verdict``):

- ``pop_acked_again``: a message whose ack was answered OK is never handed out again
  (no delivery with a later epoch than the acked handle's);
- ``pop_held_twice``: a message is not handed out again while an earlier delivery of it
  is invisible, nor before it is due again (the invisible time's end plus the group's
  retry delay for that attempt): between two deliveries a client saw, unless a nack or a
  new invisible time sent on the first (answered or not: it may have applied) let it go
  earlier. Deliveries whose answer no client saw (a lost receive) sit between them
  without loosening the rule: each waits for the one before it;
- ``pop_attempts``: delivery attempts go up with every delivery (by epoch), from 1, and
  stay within ``max_delivery_attempts``; one handle answered twice (a retried receive)
  says the same attempt and time;
- ``pop_fifo`` (a FIFO group): when a message of a queue is handed out, no other
  message of that queue is in flight and not yet due — unless an ack of it was sent by
  then (it may have ended it);
- at the end (the group drained, its dead letters and every node's lag read):
  ``pop_not_done``: every message of the topic (every one the drain found in the log)
  was acked (answered OK) once, or dead-lettered once, not both, not twice; one whose
  latest delivery's ack had an unknown outcome (an error, or ``INVALID_RECEIPT_HANDLE``
  that a retry whose first attempt applied also answers) counts as acked, uncertain;
  ``pop_dead_letters``: each dead letter holds a message of the topic, names its queue,
  offset and message id, after ``max_delivery_attempts`` attempts, and nothing of it was
  handed out after the handle it ended; ``pop_lag``: every node says the group's lag is
  0 on every queue.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.pop.service import parse_handle
from broker.pop.state import RetryPolicy
from tests.pop_rules import History, Seen

from .history import DeadLetter, Op, Popped

if TYPE_CHECKING:
    from .checker import Verdict

SLACK_MS = 50
POP_OPS = ("receive", "ack", "nack", "extend")
Key = tuple[int, int]  # queue, offset


def _ms(wall_s: float | None) -> float:
    return (wall_s or 0.0) * 1000


def _name(key: Key) -> str:
    return f"queue {key[0]} offset {key[1]}"


@dataclass(slots=True)
class _Group:
    """What the history says of the group's messages (``read``)."""

    fifo: bool
    attempts: int
    retry: RetryPolicy
    topic: str
    messages: dict[Key, History] = field(default_factory=lambda: defaultdict(History))
    handed_out: dict[tuple[Key, int], int] = field(default_factory=dict)  # log ms
    msg_ids: dict[Key, str] = field(default_factory=dict)
    acked: dict[Key, list[int]] = field(default_factory=lambda: defaultdict(list))  # epochs
    # (key, handle epoch) → the earliest wall ms an ack of it was sent (answered or not)
    ack_sent: dict[tuple[Key, int], float] = field(default_factory=dict)
    maybe_acked: set[tuple[Key, int]] = field(default_factory=set)  # unknown outcome
    dead: list[DeadLetter] | None = None  # read at the end
    lags: dict[str, dict[int, int]] = field(default_factory=dict)  # node → queue → lag

    def delay(self, attempt: int) -> int:
        return self.retry.delay(attempt)

    def received(self, key: Key) -> Iterator[Seen]:
        return (s for s in self.messages[key].seen if s.received)


def check_pop(history: Sequence[Op], positions: Mapping[Key, str], v: Verdict) -> None:
    """The POP rules over ``history`` (nothing when it has no POP group), the end's
    against ``positions`` (each place of the topic's log → its value)."""
    cfg = next((op.value for op in history if op.f == "pop-config" and op.type == "ok"), None)
    if cfg is None:
        return
    g = _Group(
        bool(cfg["fifo"]),
        int(cfg["max_delivery_attempts"]),
        RetryPolicy.from_json(cfg["retry"]),
        str(cfg["topic"]),
    )
    _read(history, g, v)
    for key, h in g.messages.items():
        _deliveries(key, h, g, v)
    if g.fifo:
        _fifo(g, v)
    if g.dead is not None:
        _end(g, positions, v)


# ---- the history --------------------------------------------------------------------------


def _read(history: Sequence[Op], g: _Group, v: Verdict) -> None:
    invoked: dict[str, Op] = {}
    for op in history:
        if op.f in POP_OPS and op.type == "invoke":
            invoked[op.process] = op
        elif op.f in POP_OPS:
            call = invoked.pop(op.process)
            if op.f == "receive" and op.type == "ok":
                _receive(call, op, g, v)
            elif op.f == "extend":
                _extend(call, op, g, v)
            elif op.f in ("ack", "nack"):
                _settle(call, op, g, v)
        elif op.f == "dlq" and op.type == "ok":
            g.dead = list(op.value)
        elif op.f == "pop-lag" and op.type == "ok" and op.node is not None:
            g.lags[op.node] = dict(op.value)


def _handle(text: str) -> tuple[Key, int] | None:
    h = parse_handle(text)
    return None if h is None else ((h[0], h[1]), h[2])


def _receive(call: Op, op: Op, g: _Group, v: Verdict) -> None:
    inv = int(call.value)
    lo, hi = _ms(call.wall_s) - SLACK_MS, _ms(op.wall_s) + SLACK_MS
    for p in op.value:
        assert isinstance(p, Popped)
        key: Key = (p.queue, p.offset)
        where = f"{op.process} at {op.time_s:.3f}: {_name(key)} ({p.handle})"
        parsed = _handle(p.handle)
        if parsed is None or parsed[0] != key:
            v.pop_attempts.append(f"{where}: a handle of another message")
            continue
        epoch = parsed[1]
        at = p.invisible_until - inv
        if not lo <= at <= hi:
            v.pop_invisible_until.append(
                f"{where}: handed out at {at} by its invisible_until, outside its request "
                f"[{lo + SLACK_MS:.0f}, {hi - SLACK_MS:.0f}] (± {SLACK_MS} ms)"
            )
        _, same = g.messages[key].insert(
            Seen(epoch, p.attempt, p.invisible_until, op.process, True)
        )
        if same is not None:
            if (same.attempt, same.visible_at) != (p.attempt, p.invisible_until):
                v.pop_attempts.append(
                    f"{where}: attempt {p.attempt} until {p.invisible_until}, and before "
                    f"attempt {same.attempt} until {same.visible_at}"
                )
            continue
        g.handed_out[(key, epoch)] = at
        g.msg_ids.setdefault(key, p.msg_id)
        v.pop_delivered += 1
        v.pop_redelivered += p.attempt > 1


def _attempt(g: _Group, key: Key, epoch: int) -> int:
    return next((s.attempt for s in g.messages[key].seen if s.epoch == epoch), 1)


def _extend(call: Op, op: Op, g: _Group, v: Verdict) -> None:
    """A new invisible time from when it was sent: answered, the message's next seen
    (its new handle); else a release (it may have applied)."""
    old = _handle(call.value["handle"])
    if old is None:
        return
    key, epoch = old
    h = g.messages[key]
    attempt = _attempt(g, key, epoch)
    visible = int(_ms(call.wall_s) + call.value["invisible_ms"] - SLACK_MS)
    new = _handle(op.value) if op.type == "ok" else None
    if new is None or new[0] != key:
        h.releases.append((epoch, visible, visible + g.delay(attempt)))
        if op.type == "ok":
            v.pop_attempts.append(f"{op.process}: new handle {op.value!r} for {_name(key)}")
        return
    h.insert(Seen(new[1], attempt, visible, op.process, False))
    v.pop_extended += 1


def _settle(call: Op, op: Op, g: _Group, v: Verdict) -> None:
    """An ack or a nack: answered OK it held; INVALID_RECEIPT_HANDLE or an error, it may
    have (by a lost first attempt)."""
    nack = call.f == "nack"
    handles = call.value["handles"] if nack else call.value
    sent = _ms(call.wall_s)
    for text in handles:
        parsed = _handle(text)
        if parsed is None:
            continue
        key, epoch = parsed
        status = op.value.get(text) if op.type == "ok" else None
        if nack:  # visible and due again after its delay (None: the group's)
            delay = call.value["delay_ms"]
            if delay is None:
                delay = g.delay(_attempt(g, key, epoch))
            at = int(sent + delay - SLACK_MS)
            g.messages[key].releases.append((epoch, at, at))
            v.pop_nacked += status == "OK"
            continue
        g.ack_sent[(key, epoch)] = min(sent, g.ack_sent.get((key, epoch), sent))
        if status == "OK":
            g.acked[key].append(epoch)
            v.pop_acked += 1
        else:
            g.maybe_acked.add((key, epoch))


# ---- the rules ----------------------------------------------------------------------------


def _deliveries(key: Key, h: History, g: _Group, v: Verdict) -> None:
    """Acked never again; never inside the last delivery's invisible time or before it
    is due; attempts up by at least one each time, within the group's."""
    last = None  # the last delivery before (by epoch)
    for i, s in enumerate(h.seen):
        if not s.received:
            continue
        at = g.handed_out[(key, s.epoch)]
        what = f"{_name(key)} handed out to {s.consumer} at {at} (epoch {s.epoch})"
        acks = [e for e in g.acked[key] if e < s.epoch]
        if acks:
            v.pop_acked_again.append(f"{what}, after its ack of epoch {acks[0]} answered OK")
        if i > 0:
            v.pop_held_twice += [
                f"{what}, {why}" for why in h.too_early(h.seen[i - 1], g.retry, at)
            ]
        least = 1 if last is None else last.attempt + 1
        if s.attempt < least or s.attempt > g.attempts:
            before = "none" if last is None else f"attempt {last.attempt} (epoch {last.epoch})"
            v.pop_attempts.append(
                f"{what}: attempt {s.attempt} after {before}, of {g.attempts} at most"
            )
        last = s


def _fifo(g: _Group, v: Verdict) -> None:
    """Per queue, every delivery and new invisible time in epoch order (log order, so
    hand-out times never go back): a delivery finds no other message of its queue whose
    flight may still hold the queue (not due, no ack sent)."""
    by_queue: dict[int, list[tuple[int, Key, Seen]]] = defaultdict(list)
    for key, h in g.messages.items():
        by_queue[key[0]] += [(s.epoch, key, s) for s in h.seen]
    for q, seen in sorted(by_queue.items()):
        seen.sort(key=lambda x: x[0])
        holding: dict[Key, tuple[float, Seen]] = {}  # key → (its flight ends by, it)
        i = 0
        while i < len(seen):
            epoch = seen[i][0]
            j = i
            while j < len(seen) and seen[j][0] == epoch:
                j += 1
            batch = seen[i:j]  # one entry's: handed out together
            keys = {k for _, k, _ in batch}
            for _, key, s in batch:
                if not s.received:
                    continue
                at = g.handed_out[(key, s.epoch)]
                for other in [k for k, (end, _) in holding.items() if end <= at]:
                    del holding[other]  # due, or an ack was sent: never holds again
                for other, (end, held) in sorted(holding.items()):
                    if other not in keys:
                        v.pop_fifo.append(
                            f"queue {q}: offset {key[1]} handed out to {s.consumer} at {at} "
                            f"(epoch {s.epoch}) while offset {other[1]} is in flight (epoch "
                            f"{held.epoch}, {held.consumer}, holds the queue until {end:.0f})"
                        )
            for _, key, s in batch:
                _, due = g.messages[key].floors(s, g.retry)
                acked = g.ack_sent.get((key, s.epoch))
                end = due if acked is None else min(due, acked - SLACK_MS)
                holding[key] = (end, s)
            i = j


def _end(g: _Group, positions: Mapping[Key, str], v: Verdict) -> None:
    dead = g.dead or []
    where: dict[str, Key] = {value: key for key, value in positions.items()}
    dead_at: dict[Key, list[DeadLetter]] = defaultdict(list)
    for d in dead:
        key = where.get(d.value)
        what = f"dead letter {d.value!r} (of {_name((d.origin_queue, d.origin_offset))})"
        if key is None:
            v.pop_dead_letters.append(f"{what}: no such message in the topic")
            continue
        dead_at[key].append(d)
        named = (d.origin_topic, d.origin_queue, d.origin_offset)
        if named != (g.topic, *key):
            v.pop_dead_letters.append(f"{what}: the message is at {g.topic} {_name(key)}")
        if d.origin_msg_id != g.msg_ids.get(key, d.origin_msg_id):
            v.pop_dead_letters.append(f"{what}: message id {d.origin_msg_id}, not {g.msg_ids[key]}")
        if d.attempts != g.attempts:
            v.pop_dead_letters.append(f"{what}: after {d.attempts} attempts, not {g.attempts}")
        later = [s.epoch for s in g.received(key) if s.epoch > d.epoch]
        if later:
            v.pop_dead_letters.append(
                f"{what}: it ended epoch {d.epoch}, handed out again at epoch {later[0]}"
            )
    v.pop_dead_lettered = len(dead)
    for key in sorted(positions):
        acks, copies = g.acked.get(key, []), dead_at.get(key, [])
        if len(acks) + len(copies) == 1:
            continue
        if acks or copies:
            v.pop_not_done.append(
                f"{_name(key)}: acked {len(acks)} times (epochs {acks}), dead-lettered "
                f"{len(copies)} times"
            )
        elif _maybe_acked(key, g):
            v.pop_acks_uncertain += 1
        else:
            h = g.messages.get(key)
            last = h.seen[-1] if h is not None and h.seen else None
            v.pop_not_done.append(
                f"{_name(key)} ({positions[key]!r}): neither acked nor dead-lettered "
                f"(its last handle: {last})"
            )
    _lags(g, positions, v)


def _maybe_acked(key: Key, g: _Group) -> bool:
    """The ack of the message's latest handle a client saw has an unknown outcome."""
    h = g.messages.get(key)
    return h is not None and bool(h.seen) and (key, h.seen[-1].epoch) in g.maybe_acked


def _lags(g: _Group, positions: Mapping[Key, str], v: Verdict) -> None:
    queues = sorted({q for q, _ in positions})
    if not g.lags:
        v.pop_lag.append("no node reported the group's lag")
    for node, lags in sorted(g.lags.items()):
        left = {q: lags.get(q) for q in queues if lags.get(q) != 0}
        left |= {q: n for q, n in lags.items() if n}
        if left:
            v.pop_lag.append(f"{node}: lag {dict(sorted(left.items()))} at the end")


def pop_summary(v: Verdict) -> dict[str, Any]:
    return {
        "POP delivered": f"{v.pop_delivered} ({v.pop_redelivered} again), acked "
        f"{v.pop_acked}, nacked {v.pop_nacked}, new invisible times {v.pop_extended}, "
        f"dead-lettered {v.pop_dead_lettered}, acks of unknown outcome ending a message "
        f"{v.pop_acks_uncertain}",
    }
