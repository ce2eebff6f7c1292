"""The consumer's operations: ``ConsumerOps`` (positions, commits, group pulls and
queue-by-queue sweeps; at-least-once) and ``Pacer`` (when a ``messages()`` iteration
stops). Written once, run by the sync and the async consumer."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import GroupNotFoundError, InvalidArgumentError, LedgerMQError
from .exchange import RECORD_PAGE, Call, Exchange, Gen
from .fetch import decode_group
from .operations import AdminOps, api_path, queue_map
from .types import PullResult, ReceivedMessage, decode_message


@dataclass(frozen=True, slots=True)
class Batch:
    """What one fetch returned, and where each queue's next fetch starts."""

    messages: list[ReceivedMessage]
    next_offsets: dict[int, int]


Start = Literal["earliest", "latest"]


class ConsumerOps:
    """Long-poll consumption of one topic by a consumer group, or without a group from
    ``start`` (then nothing is committed).

    ``positions`` is where this consumer is (the offset after what it delivered, per
    queue); ``committed`` what it knows to be committed. While nothing delivered is
    uncommitted, a fetch is one group pull from the committed offsets (served on the
    broker with long polling across all queues). A consumer that is ahead of its
    commits (``auto_commit=False`` without a ``commit()``, or no group) pulls queue by
    queue from its positions, so nothing is delivered twice by one consumer. With
    ``auto_commit`` each fetch first commits what the previous ones delivered: at least
    once, as Kafka's ``enable.auto.commit``."""

    def __init__(
        self,
        ex: Exchange,
        group: str | None,
        topic: str,
        *,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = True,
        start: Start = "earliest",
    ) -> None:
        self.ex = ex
        self.admin = AdminOps(ex)
        self.group = group
        self.topic = topic
        self.queue_ids = None if queue_ids is None else sorted(set(queue_ids))
        self.auto_commit = auto_commit and group is not None
        self.start: Start = start
        self.positions: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self._turn = 0  # rotates the queue a sweep starts with
        self._positioned = False  # every queue has a position

    def pending(self) -> dict[int, int]:
        """Positions not yet committed."""
        return {q: p for q, p in self.positions.items() if p > self.committed.get(q, -1)}

    def commit(self) -> Gen[dict[int, int]]:
        """Commit the positions (the offsets after what was delivered)."""
        todo = self.pending()
        if self.group is None or not todo:
            return {}
        yield from self.admin.commit_offsets(self.group, self.topic, todo)
        self.committed.update(todo)
        return todo

    def fetch(self, max_messages: int, wait_ms: int) -> Gen[Batch]:
        """Up to ``max_messages`` new messages, waiting up to ``wait_ms`` for one.
        Positions move only through ``deliver``/``finish``."""
        if self.auto_commit:
            yield from self.commit()
        if self.group is not None and not self.pending():
            return (yield from self._group_pull(self.group, max_messages, wait_ms))
        if not self._positioned:
            yield from self._start_positions()
        return (yield from self._sweep(max_messages, wait_ms))

    def hand_out(self, batch: Batch, pacer: Pacer) -> Iterator[ReceivedMessage]:
        """A fetched batch one message at a time: each counts as delivered once handed
        out, so a caller that stops early leaves the rest for the next fetch."""
        pacer.got(len(batch.messages))
        for m in batch.messages:
            self.deliver(m)
            yield m
        self.finish(batch)

    def deliver(self, m: ReceivedMessage) -> None:
        self.positions[m.queue_id] = max(self.positions.get(m.queue_id, 0), m.queue_offset + 1)

    def finish(self, batch: Batch) -> None:
        for q, o in batch.next_offsets.items():
            self.positions[q] = max(self.positions.get(q, 0), o)

    def _group_pull(self, group: str, max_messages: int, wait_ms: int) -> Gen[Batch]:
        body: dict[str, Any] = {"topic": self.topic, "max_messages": max_messages}
        body["wait_ms"] = wait_ms
        if self.queue_ids is not None:
            body["queue_ids"] = self.queue_ids
        path = api_path("groups", group, "pull")
        accept = RECORD_PAGE if self.ex.settings.record_pull else None
        reply = yield from self.ex.exchange(
            Call("POST", path, body=body, wait_ms=wait_ms, accept=accept)
        )
        if reply.headers.get("content-type") == RECORD_PAGE:
            pages = decode_group(reply.content)
            nexts = {p.queue_id: p.result.next_offset for p in pages}
            got = [m for p in pages for m in p.result.messages]
        elif reply.body is not None:  # (asked for JSON, or a node that makes no record pages)
            nexts = queue_map(reply.body["next_offsets"])
            got = [decode_message(m) for m in reply.body["messages"]]
        else:
            raise LedgerMQError(
                "BAD_RECORD_PAGE", f"{path}: answered {reply.headers.get('content-type')}"
            )
        # What the group's committed offsets were (as this node saw them): the first
        # message of a queue, or where it stands with none.
        starts = dict(nexts)
        for m in reversed(got):
            starts[m.queue_id] = m.queue_offset
        for q, o in starts.items():
            self.committed[q] = max(self.committed.get(q, 0), o)
        # A node behind on a commit we made repeats messages we delivered: drop them.
        floor = {q: max(self.positions.get(q, 0), self.committed.get(q, 0)) for q in nexts}
        fresh = [m for m in got if m.queue_offset >= floor.get(m.queue_id, 0)]
        return Batch(fresh, nexts)

    def _start_positions(self) -> Gen[None]:
        """Every queue's position, once, for pulling queue by queue: a group's committed
        offset (a queue it has not committed starts at the earliest, as on the broker),
        without a group ``start``. Queues already positioned keep their place."""
        desc = yield from self.admin.describe_topic(self.topic)
        missing = set(self.queue_ids or ()) - {q.queue_id for q in desc.queues}
        if missing:  # (a group pull is refused by the broker alike)
            raise InvalidArgumentError(
                InvalidArgumentError.CODE,
                f"queue_id {min(missing)} is not in 0..{len(desc.queues) - 1} of {self.topic}",
            )
        committed: dict[int, int | None] = {}
        if self.group is not None:
            try:
                offsets = yield from self.admin.group_offsets(self.group, self.topic)
                committed = {o.queue_id: o.committed_offset for o in offsets}
            except GroupNotFoundError:
                pass
        for q in desc.queues:
            if self.queue_ids is not None and q.queue_id not in self.queue_ids:
                continue
            if self.group is not None:
                start = max(committed.get(q.queue_id) or 0, q.min_offset)
                self.committed.setdefault(q.queue_id, start)
            else:
                start = q.min_offset if self.start == "earliest" else q.max_offset
            self.positions.setdefault(q.queue_id, start)
        self._positioned = True

    def _pull_from(self, q: int, max_messages: int, wait_ms: int) -> Gen[PullResult]:
        r = yield from self.admin.pull(
            self.topic, q, self.positions[q], max_messages=max_messages, wait_ms=wait_ms
        )
        if r.status == "OFFSET_ILLEGAL" and self.positions[q] < r.min_offset:
            # Retention deleted what was next: go on from the oldest retained message,
            # as RocketMQ does. (Past the end is a node behind the one that served us
            # before: wait for it, never rewind.)
            self.positions[q] = r.min_offset
        return r

    def _sweep(self, max_messages: int, wait_ms: int) -> Gen[Batch]:
        """Queue by queue from the positions; while nothing is found, long-poll one
        queue at a time (``sweep_wait_ms`` each, in turn) until ``wait_ms`` is spent."""
        queues = sorted(self.positions)
        if not queues:
            return Batch([], {})
        deadline = self.ex.clock() + wait_ms / 1000
        slice_ms = max(1, self.ex.settings.sweep_wait_ms)
        rounds = wait_ms // slice_ms + 2  # a bound on the loop, beyond the deadline's
        got: list[ReceivedMessage] = []
        nexts: dict[int, int] = {}
        for _ in range(rounds):
            turn = self._turn % len(queues)
            self._turn = turn + 1  # the next sweep starts one queue on: fairness
            order = queues[turn:] + queues[:turn]
            for q in order:
                r = yield from self._pull_from(q, max_messages - len(got), 0)
                got.extend(r.messages)
                nexts[q] = r.next_offset if r.status != "OFFSET_ILLEGAL" else self.positions[q]
                if len(got) >= max_messages:
                    break
            left_ms = int((deadline - self.ex.clock()) * 1000)
            if got or left_ms <= 0:
                break
            q = order[0]
            r = yield from self._pull_from(q, max_messages, min(left_ms, slice_ms))
            if r.messages:
                got.extend(r.messages)
                nexts[q] = r.next_offset
                break
        return Batch(got, nexts)

    def poll(self, max_messages: int = 32, wait_ms: int = 0) -> Gen[list[ReceivedMessage]]:
        batch = yield from self.fetch(max_messages, wait_ms)
        for m in batch.messages:
            self.deliver(m)
        self.finish(batch)
        return batch.messages

    def pull(
        self,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> Gen[PullResult]:
        """One queue from ``offset``; does not move the consumer."""
        return (
            yield from self.admin.pull(
                self.topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
            )
        )


class Pacer:
    """When a ``messages()`` iteration stops: after ``max_messages``, or when nothing
    arrived for ``max_idle_s`` (never, if ``None``)."""

    def __init__(
        self,
        clock: Callable[[], float],
        max_idle_s: float | None,
        max_messages: int | None,
        wait_ms: int,
        batch: int,
    ) -> None:
        if batch < 1 or wait_ms < 0:
            raise ValueError("batch must be >= 1 and wait_ms >= 0")
        self.clock = clock
        self.max_idle_s = max_idle_s
        self.left = max_messages
        self.wait_ms = wait_ms
        self.batch = batch
        self.idle_since = clock()

    def next_fetch(self) -> tuple[int, int] | None:
        """(max_messages, wait_ms) for the next fetch, or ``None`` to stop."""
        if self.left is not None and self.left <= 0:
            return None
        wait_ms = self.wait_ms
        if self.max_idle_s is not None:
            left_ms = int((self.idle_since + self.max_idle_s - self.clock()) * 1000)
            if left_ms <= 0:
                return None
            wait_ms = min(wait_ms, left_ms)
        return (self.batch if self.left is None else min(self.batch, self.left)), wait_ms

    def got(self, n: int) -> None:
        if n:
            self.idle_since = self.clock()
            if self.left is not None:
                self.left -= n

    def busy(self) -> None:
        """Not idle now, though nothing arrived (a POP run's handler just ended)."""
        self.idle_since = self.clock()
