"""POP consumer-group state: which messages of a topic a group has handed out, to be
acknowledged, retried or dead-lettered (docs/consuming.md).

This is replicated state, a pure function of the committed entries in log order (a
``StateApplier``, ``broker/pop/applier.py``): the master decides what to hand out from
this same state, appends its decision as an operation (``pop.receive``, ``pop.ack``,
``pop.nack``, ``pop.invisible``, ``pop.config``) or a dead letter, and answers from
what applying it did. Every replica applies the same operations to the same state, so a
new master continues with the same in-flight messages, deadlines, attempts and handles:
a failover changes nothing a consumer can see.

Per group, topic and queue (``QueueState``): ``next``, the first offset never handed
out, and the in-flight messages (``Flight``): offset → delivery attempt, handle epoch,
``visible_at`` (its invisible time ends) and ``due`` (it may be handed out again:
``visible_at`` plus the group's retry delay for its attempt, or a nack's delay). An
offset below ``next`` and not in flight is done: acknowledged, dead-lettered, or skipped
by a tag filter.

Invariants:
- time is the log's: an operation applies at ``ts``, the largest ``STORETIMESTAMP`` of
  the entries applied so far (stamped by the master), never a node's clock;
- a handle is (queue, offset, epoch) and the epoch is the index of the entry that set
  it, unique in the log: an ack, nack, change or dead letter needs the flight's current
  epoch, so a handle dies when its message is handed out again, nacked, changed or
  acknowledged, and names nothing node-local;
- a message is handed out again only once ``due <= ts`` and its attempts stay within
  ``max_delivery_attempts``; attempts never go down;
- FIFO: a queue with a flight not yet due hands out nothing (no later offset, no other
  redelivery); due flights go again in offset order before anything new;
- applying never raises on what the log holds: a delivery the state no longer allows
  (raced by another operation) is skipped and left out of the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..jsonint import json_int

# RocketMQ's default retry delays (messageDelayLevel from level 3 on: 16 retries).
ROCKETMQ_DELAYS_MS: tuple[int, ...] = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip
MAX_TIME_MS = 7 * 24 * 3_600_000  # no delay or invisible time above a week
MAX_ATTEMPTS = 1000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a message waits before its next delivery, by the attempts it had."""

    policy: str = "list"  # "list" | "exponential"
    delays_ms: tuple[int, ...] = ROCKETMQ_DELAYS_MS
    initial_ms: int = 1_000
    multiplier: float = 2.0
    max_ms: int = 7_200_000

    def delay(self, attempt: int) -> int:
        """The wait before delivery ``attempt + 1``, in ms."""
        if self.policy == "list":
            return self.delays_ms[min(attempt, len(self.delays_ms)) - 1] if attempt > 0 else 0
        return int(min(self.max_ms, self.initial_ms * self.multiplier ** max(0, attempt - 1)))

    def to_json(self) -> dict[str, Any]:
        if self.policy == "list":
            return {"policy": "list", "delays_ms": list(self.delays_ms)}
        return {
            "policy": "exponential",
            "initial_ms": self.initial_ms,
            "multiplier": self.multiplier,
            "max_ms": self.max_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RetryPolicy:
        """``ValueError`` on anything out of range."""
        kind = d.get("policy", "list")
        if kind == "list":
            delays = tuple(json_int(x, "delays_ms") for x in d.get("delays_ms", ROCKETMQ_DELAYS_MS))
            if not 1 <= len(delays) <= 64 or not all(0 <= x <= MAX_TIME_MS for x in delays):
                raise ValueError("delays_ms: 1..64 delays of 0..604800000 ms")
            return cls("list", delays)
        if kind == "exponential":
            initial = json_int(d.get("initial_ms", 1_000), "initial_ms")
            mult = d.get("multiplier", 2.0)
            top = json_int(d.get("max_ms", 7_200_000), "max_ms")
            if isinstance(mult, bool) or not isinstance(mult, int | float) or not 1 <= mult <= 10:
                raise ValueError("multiplier: 1..10")
            if not 0 <= initial <= top <= MAX_TIME_MS:
                raise ValueError("want 0 <= initial_ms <= max_ms <= 604800000")
            return cls("exponential", (), initial, float(mult), top)
        raise ValueError(f"retry policy {kind!r}: want list or exponential")


@dataclass(frozen=True, slots=True)
class PopConfig:
    """A POP group's configuration (``PUT /v1/groups/{group}``); fixed mode ``pop``."""

    fifo: bool = False
    max_delivery_attempts: int = 17  # RocketMQ's 16 retries
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    start: str | int = "latest"  # where a queue starts at the group's first receive

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": "pop",
            "fifo": self.fifo,
            "max_delivery_attempts": self.max_delivery_attempts,
            "retry": self.retry.to_json(),
            "start": self.start,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PopConfig:
        """``ValueError`` (``TypeError``) on a malformed configuration."""
        if d.get("mode", "pop") != "pop":
            raise ValueError("mode: want pop")
        fifo = d.get("fifo", False)
        if not isinstance(fifo, bool):
            raise ValueError("fifo: want true or false")
        attempts = json_int(d.get("max_delivery_attempts", 17), "max_delivery_attempts")
        if not 1 <= attempts <= MAX_ATTEMPTS:
            raise ValueError(f"max_delivery_attempts: 1..{MAX_ATTEMPTS}")
        start = d.get("start", "latest")
        if start not in ("latest", "earliest"):
            start = json_int(start, "start")
            if start < 0:
                raise ValueError("start: latest, earliest or a time in ms")
        return cls(fifo, attempts, RetryPolicy.from_json(d.get("retry", {})), start)


@dataclass(slots=True)
class Flight:
    """A message handed out and not yet acknowledged or dead-lettered."""

    attempt: int  # deliveries so far: 1 after the first
    epoch: int  # the entry index that set its handle
    visible_at: int  # log ms: its invisible time ends here
    due: int  # log ms: it may be handed out again from here
    attempt_id: str | None = None  # the receive's (FIFO retries of a receive)
    nacked: bool = False  # due by a nack, not by its invisible time passing
    # Auto-renewed (a RocketMQ push consumer's receive): the client whose liveness keeps
    # its invisible time going, and the log ms past which it is renewed no more. A
    # renewal keeps the epoch (the handle first given stays current); an ack, nack,
    # change or redelivery ends it.
    owner: str | None = None
    renew_until: int = 0


@dataclass(slots=True)
class QueueState:
    next: int  # the first offset never handed out
    flights: dict[int, Flight] = field(default_factory=dict)

    def blocked(self, ts: int) -> bool:
        """FIFO: a flight not yet due holds the whole queue."""
        return any(f.due > ts for f in self.flights.values())


Key = tuple[str, str, int]  # group, topic, queue id
# What ``PopState.stats`` counts per group and topic (``/metrics``, GET /v1/groups/{group}):
# deliveries (first ones and again), acks, nacks, invisible times that passed without an
# ack or nack (counted when the message goes out again or to the dead letters: an expiry
# needs no write), and dead letters.
STATS = ("delivered", "redelivered", "acked", "nacked", "expired", "dead_lettered")
Handle = tuple[int, int, int]  # queue id, offset, epoch


@dataclass(frozen=True, slots=True)
class Delivered:
    queue_id: int
    offset: int
    attempt: int
    epoch: int
    visible_at: int


class PopState:
    """Every POP group's configuration and queues, as of ``ts``."""

    def __init__(self) -> None:
        self.groups: dict[str, PopConfig] = {}
        self.queues: dict[Key, QueueState] = {}
        self.ts = 0
        # group → topic → counter (``STATS``) → count, the same on every replica
        self.stats: dict[str, dict[str, dict[str, int]]] = {}
        # group → the first offset of ``%DLQ%<group>`` not yet produced back (redrive)
        self.redriven: dict[str, int] = {}

    # ---- reading ---------------------------------------------------------------------

    def queue(self, group: str, topic: str, queue_id: int) -> QueueState | None:
        return self.queues.get((group, topic, queue_id))

    def topic_queues(self, group: str, topic: str) -> Iterator[tuple[int, QueueState]]:
        for (g, t, q), qs in self.queues.items():
            if g == group and t == topic:
                yield q, qs

    def in_flight(self, group: str, topic: str) -> int:
        return sum(len(qs.flights) for _, qs in self.topic_queues(group, topic))

    def counts(self, group: str, topic: str) -> dict[str, int]:
        """The group's counters (``STATS``) for the topic."""
        got = self.stats.get(group, {}).get(topic, {})
        return {name: got.get(name, 0) for name in STATS}

    def _count(self, group: str, topic: str, name: str, n: int = 1) -> None:
        if n:
            by_name = self.stats.setdefault(group, {}).setdefault(topic, {})
            by_name[name] = by_name.get(name, 0) + n

    # ---- applying (each at the log time ``ts``) -------------------------------------------

    def tick(self, ts: int) -> int:
        """The log time of the next operation: never behind an earlier one."""
        self.ts = max(self.ts, ts)
        return self.ts

    def configure(self, group: str, config: PopConfig) -> None:
        self.groups[group] = config

    def receive(
        self,
        index: int,
        group: str,
        topic: str,
        *,
        invisible_ms: int,
        attempt_id: str | None,
        picks: Iterable[tuple[int, int, int, Sequence[int], int]],
        owner: str | None = None,
        renew_ms: int = 0,
    ) -> list[Delivered]:
        """Hand out what ``picks`` name, where the state still allows: per queue
        ``(queue_id, start, end, offsets, since)``, the receive having looked for fresh
        messages in ``[since, end)`` (``owner``: auto-renewed for that client, for
        ``renew_ms`` at most); a queue not known yet starts at ``start``;
        ``offsets`` below ``next`` are due redeliveries, the others fresh offsets in
        ``[next, end)``; ``next`` moves to ``end`` (what lies between and was not handed
        out did not match the receive's tags: done for the group). A receive that looked
        from past ``next`` (past another receive's picks, whose entry is not applied
        here yet, or never will be) hands out nothing fresh there and leaves ``next``:
        it would pass over what lies before ``since``."""
        cfg = self.groups.get(group)
        if cfg is None:
            return []
        ts, out = self.ts, []
        for queue_id, start, end, offsets, since in picks:
            key = (group, topic, queue_id)
            qs = self.queues.get(key)
            if qs is None:
                qs = self.queues[key] = QueueState(start)
            if cfg.fifo and qs.blocked(ts):
                continue
            first_next = qs.next
            fresh_end = end if since <= first_next else first_next  # (else redeliveries only)
            for o in offsets:
                f = qs.flights.get(o)
                if f is not None:
                    if f.due > ts or f.attempt >= cfg.max_delivery_attempts:
                        continue
                    attempt = f.attempt + 1
                    self._count(group, topic, "redelivered")
                    if not f.nacked:
                        self._count(group, topic, "expired")
                elif first_next <= o < fresh_end:
                    attempt = 1
                else:
                    continue  # done already, or handed out by another receive
                visible = ts + invisible_ms
                qs.flights[o] = Flight(
                    attempt,
                    index,
                    visible,
                    visible + cfg.retry.delay(attempt),
                    attempt_id,
                    owner=owner,
                    renew_until=ts + renew_ms if owner is not None else 0,
                )
                out.append(Delivered(queue_id, o, attempt, index, visible))
            qs.next = max(qs.next, fresh_end)
        self._count(group, topic, "delivered", len(out))
        return out

    def ack(self, group: str, topic: str, handles: Iterable[Handle]) -> list[bool]:
        """Each handle's message is done, if the handle is current."""
        out = []
        for queue_id, offset, epoch in handles:
            qs = self.queues.get((group, topic, queue_id))
            f = None if qs is None else qs.flights.get(offset)
            ok = f is not None and f.epoch == epoch
            if ok:
                assert qs is not None
                del qs.flights[offset]
            out.append(ok)
        self._count(group, topic, "acked", sum(out))
        return out

    def nack(
        self, index: int, group: str, topic: str, handles: Iterable[Handle], delay_ms: int | None
    ) -> list[bool]:
        """Each current handle's message is due again after ``delay_ms`` (the group's
        retry delay for its next attempt when None); its handle dies."""
        cfg = self.groups.get(group)
        out = []
        for queue_id, offset, epoch in handles:
            f = self._current(group, topic, (queue_id, offset, epoch))
            if f is None or cfg is None:
                out.append(False)
                continue
            f.visible_at = f.due = self.ts + (
                cfg.retry.delay(f.attempt) if delay_ms is None else delay_ms
            )
            f.epoch = index
            f.nacked = True
            f.owner = None
            out.append(True)
        self._count(group, topic, "nacked", sum(out))
        return out

    def change_invisible(
        self, index: int, group: str, topic: str, handle: Handle, invisible_ms: int
    ) -> Delivered | None:
        """The current handle's invisible time ends ``invisible_ms`` from now; the new
        handle (epoch ``index``), or None when the handle is not current. Of an
        auto-renewed flight it is a nack: due when that time ends, renewed no more."""
        cfg = self.groups.get(group)
        f = self._current(group, topic, handle)
        if f is None or cfg is None:
            return None
        f.visible_at = self.ts + invisible_ms
        # An auto-renewed message's change is its push consumer's nack: the client chose
        # the delay from the group's retry policy (its Settings), no retry delay is added.
        nack = f.owner is not None
        f.due = f.visible_at + (0 if nack else cfg.retry.delay(f.attempt))
        f.epoch = index
        f.nacked = nack
        f.owner = None
        if nack:
            self._count(group, topic, "nacked")
        return Delivered(handle[0], handle[1], f.attempt, index, f.visible_at)

    def renew(
        self, group: str, topic: str, handles: Iterable[Handle], invisible_ms: int, stop: bool
    ) -> list[bool]:
        """Each current, auto-renewed handle's invisible time ends ``invisible_ms`` from
        now, its handle unchanged; with ``stop`` it is renewed no more (its client went:
        it goes out again once that time passes)."""
        cfg = self.groups.get(group)
        out = []
        for h in handles:
            f = self._current(group, topic, h)
            if f is None or cfg is None or f.owner is None:
                out.append(False)
                continue
            f.visible_at = self.ts + invisible_ms
            f.due = f.visible_at + cfg.retry.delay(f.attempt)
            if stop:
                f.owner = None
            out.append(True)
        return out

    def dead_letter(self, group: str, topic: str, handle: Handle) -> bool:
        """A dead letter of the handle's message was written: it is done, if the handle
        is current."""
        f = self._current(group, topic, handle)
        if f is None:
            return False
        qs = self.queues[(group, topic, handle[0])]
        del qs.flights[handle[1]]
        self._count(group, topic, "dead_lettered")
        if f.visible_at <= self.ts and not f.nacked:
            self._count(group, topic, "expired")
        return True

    def redrove(self, group: str, next_offset: int) -> None:
        """The dead letters of ``group`` below ``next_offset`` were produced back."""
        self.redriven[group] = max(self.redriven.get(group, 0), next_offset)

    def drop_topic(self, topic: str) -> None:
        """The topic was deleted: its queues, handed out or not, are gone."""
        for key in [k for k in self.queues if k[1] == topic]:
            del self.queues[key]
        for by_topic in self.stats.values():
            by_topic.pop(topic, None)

    def _current(self, group: str, topic: str, handle: Handle) -> Flight | None:
        queue_id, offset, epoch = handle
        qs = self.queues.get((group, topic, queue_id))
        f = None if qs is None else qs.flights.get(offset)
        return f if f is not None and f.epoch == epoch else None

    # ---- the snapshot part -------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "groups": {g: c.to_json() for g, c in self.groups.items()},
            "queues": [
                [
                    g,
                    t,
                    q,
                    qs.next,
                    [
                        [o, f.attempt, f.epoch, f.visible_at, f.due, f.attempt_id, f.nacked]
                        + ([f.owner, f.renew_until] if f.owner is not None else [])
                        for o, f in qs.flights.items()
                    ],
                ]
                for (g, t, q), qs in self.queues.items()
            ],
            "stats": self.stats,
            "redriven": self.redriven,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PopState:
        """``ValueError``, ``TypeError``, ``KeyError`` on a malformed part."""
        s = cls()
        s.ts = json_int(d["ts"], "ts")
        s.groups = {str(g): PopConfig.from_json(c) for g, c in d["groups"].items()}
        for g, t, q, nxt, flights in d["queues"]:
            qs = QueueState(json_int(nxt, "next"))
            for o, attempt, epoch, visible, due, aid, *more in flights:
                owner = str(more[1]) if len(more) >= 3 and more[1] is not None else None
                qs.flights[json_int(o, "offset")] = Flight(
                    json_int(attempt, "attempt"),
                    json_int(epoch, "epoch"),
                    json_int(visible, "visible_at"),
                    json_int(due, "due"),
                    None if aid is None else str(aid),
                    bool(more and more[0]),
                    owner,
                    json_int(more[2], "renew_until") if owner is not None else 0,
                )
            s.queues[(str(g), str(t), json_int(q, "queue id"))] = qs
        s.stats = {
            str(g): {
                str(t): {str(k): json_int(n, "count") for k, n in counts.items()}
                for t, counts in ts.items()
            }
            for g, ts in d.get("stats", {}).items()
        }
        for g, ts in d.get("dead", {}).items():  # (the part before the counters)
            for t, n in ts.items():
                s._count(str(g), str(t), "dead_lettered", json_int(n, "dead"))
        s.redriven = {str(g): json_int(n, "redriven") for g, n in d.get("redriven", {}).items()}
        return s
