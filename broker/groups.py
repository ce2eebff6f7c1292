"""Consumer groups: the offsets each group committed per queue, and pulls from them.

A group's offsets are replicated metadata (``%SYS%META`` entries, ``broker/metadata.py``):
a commit is a write the master appends, and every replica answers reads of it alike. A
group that committed nothing for a queue starts at the earliest retained message, and
so does one whose offset retention passed. ``group_pull`` spends one response budget
across the queues it reads, and long-polls all of them at once when none has news.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from . import errors
from .gate import WriteGate
from .metadata import MetadataState, TopicMeta, op_commit_offsets
from .names import check_group_name
from .reads import MessageMaker, Reads, Sized
from .settings import BrokerSettings
from .topics import MetadataLog, Topics

if TYPE_CHECKING:
    from .dispatch import Dispatch

_M = TypeVar("_M")
_P = TypeVar("_P")


@dataclass(frozen=True, slots=True)
class GroupPullResult(Generic[_M]):
    messages: list[_M]
    next_offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class QueuePart(Generic[_P]):
    """One queue's part of a group pull (``QueuePull``): what was found there, how many
    messages, their stored bytes (``Sized``: what the response budget counts) and the
    queue's next offset."""

    queue_id: int
    found: _P
    count: int
    size: int
    next_offset: int


class QueuePull(Protocol[_P]):
    """``pull_queue(topic, queue_id, queue_offset, max_messages, max_bytes)``: one
    queue's part of a group pull, without waiting (``Reads.pull``'s rules: at most
    ``max_messages``, within ``max_bytes`` past the first message)."""

    def __call__(
        self, topic: str, queue_id: int, queue_offset: int, max_messages: int, max_bytes: int, /
    ) -> Awaitable[QueuePart[_P]]: ...


class ConsumerGroups:
    """The node's consumer groups: their committed offsets (written through the
    ``WriteGate`` and the ``MetadataLog``) and the pulls from them (through ``Reads``)."""

    def __init__(
        self,
        *,
        settings: BrokerSettings,
        gate: WriteGate,
        topics: Topics,
        metalog: MetadataLog,
        meta: MetadataState,
        reads: Reads,
        dispatch: Dispatch,
    ) -> None:
        self.gate = gate
        self.topics = topics
        self.metalog = metalog
        self.dispatch = dispatch  # a group pull long-polls its queues' arrivals
        self.settings = settings
        self.meta = meta
        self.reads = reads

    def _check_offsets_mode(self, group: str) -> None:
        """``GroupModeConflictError`` for a POP group: its offsets are the broker's."""
        check_group_name(group)
        if group in self.meta.pop.groups:
            raise errors.GroupModeConflictError(
                f"group {group} is a POP group: receive and ack (docs/consuming.md)"
            )

    def list_groups(self) -> list[str]:
        """Every group: those that committed offsets and the POP groups."""
        return sorted(set(self.meta.offsets) | set(self.meta.pop.groups))

    def group_offsets(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        check_group_name(group)
        topics = self.meta.offsets.get(group)
        if topics is None:
            raise errors.GroupNotFoundError(f"group {group} has committed no offsets")
        out = []
        for name in sorted(topics):
            if topic is not None and name != topic:
                continue
            t = self.meta.topics.get(name)
            if t is None:
                continue
            for qid in range(t.queues):
                committed = topics[name].get(qid)
                _, hi = self.reads.queue_bounds(name, qid)
                out.append(
                    {
                        "topic": name,
                        "queue_id": qid,
                        "committed_offset": committed,
                        "max_offset": hi,
                        "lag": hi - (committed or 0),
                    }
                )
        return out

    async def commit_offsets(
        self, group: str, topic: str, offsets: Mapping[int, int], *, forward: bool = True
    ) -> dict[int, int]:
        """Commit ``offsets``; where each of those queues stands after (with ``forward``,
        a commit behind the committed offset leaves it; a reset moves it anywhere)."""
        self.gate.require_master()  # a write: a slave may not know a topic the master made
        self._check_offsets_mode(group)
        t = self.topics.get(topic)
        clean: dict[int, int] = {}
        for qid, queue_offset in offsets.items():
            if not 0 <= qid < t.queues:
                raise errors.InvalidArgumentError(f"queue_id {qid} is not in 0..{t.queues - 1}")
            if queue_offset < 0:
                raise errors.InvalidArgumentError(
                    f"offset {queue_offset} for queue {qid} is negative"
                )
            clean[qid] = queue_offset
        if not clean:
            raise errors.InvalidArgumentError("no offsets")
        await self._check_within(t, clean)
        self._check_room_for(group)
        index = await self.metalog.append(op_commit_offsets(group, topic, clean, forward=forward))
        if self.dispatch.dispatched_index < index:  # committed, not applied here in time
            raise errors.UnknownOutcomeError(
                f"the commit of group {group} is in the log (entry {index}) but not applied"
                " here yet, so where the group stands is not known; ask again"
            )
        now = self.meta.offsets.get(group, {}).get(topic, {})
        return {q: now.get(q, o) for q, o in clean.items()}

    async def _check_within(self, t: TopicMeta, offsets: Mapping[int, int]) -> None:
        """An offset past a queue's max offset is refused (RocketMQ's OFFSET_OVERFLOW):
        it would skip messages not written yet and make the lag negative. What is
        committed and not yet dispatched here is waited for first (bounded)."""
        over = [q for q, o in offsets.items() if o > self.reads.queue_bounds(t.name, q)[1]]
        if over:
            await self.dispatch.wait_dispatched(
                self.gate.server.committed_index, self.settings.append_timeout_ms / 1000
            )
        for q in over:
            hi = self.reads.queue_bounds(t.name, q)[1]
            if offsets[q] > hi:
                raise errors.InvalidArgumentError(
                    f"offset {offsets[q]} for queue {q} is past its max offset {hi}",
                    max_offset=hi,
                )

    def _check_room_for(self, group: str) -> None:
        """``LimitReachedError`` (429) for a new group past ``max_groups``."""
        most = self.settings.limits.max_groups
        if group not in self.meta.offsets and len(self.meta.offsets) >= most:
            raise errors.LimitReachedError(f"{most} groups commit offsets already", limit=most)

    async def reset_offsets(self, group: str, topic: str, to: str | int) -> dict[int, int]:
        """Move a group's offsets to ``earliest``, ``latest`` or a store timestamp."""
        self.gate.require_master()  # a write: redirect before computing anything
        t = self.topics.get(topic)
        offsets = {}
        for qid in range(t.queues):
            lo, hi = self.reads.queue_bounds(topic, qid)
            if to == "earliest":
                offsets[qid] = lo
            elif to == "latest":
                offsets[qid] = hi
            elif isinstance(to, int):
                offsets[qid] = self.reads.offset_for_time(topic, qid, to)
            else:
                raise errors.InvalidArgumentError(
                    f"reset to {to!r}: want earliest, latest or a time"
                )
        return await self.commit_offsets(group, topic, offsets, forward=False)

    async def group_pull(
        self,
        make: MessageMaker[_M],
        group: str,
        topic: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = False,
    ) -> GroupPullResult[_M]:
        """Messages from the group's committed offsets (a new group starts at the
        earliest retained message), across the chosen queues, each made by ``make``
        (``Reads.pull``'s ``MessageMaker``)."""

        async def pull_queue(
            topic: str, queue_id: int, queue_offset: int, max_messages: int, max_bytes: int
        ) -> QueuePart[list[_M]]:
            sized = Sized(make)
            r = await self.reads.pull(
                sized, topic, queue_id, queue_offset, max_messages=max_messages, max_bytes=max_bytes
            )
            return QueuePart(queue_id, r.messages, len(r.messages), sized.size, r.next_offset)

        parts = await self.group_pull_parts(
            pull_queue,
            group,
            topic,
            max_messages=max_messages,
            wait_ms=wait_ms,
            queue_ids=queue_ids,
            auto_commit=auto_commit,
        )
        out = [m for p in parts for m in p.found]
        return GroupPullResult(out, {p.queue_id: p.next_offset for p in parts})

    async def group_pull_parts(
        self,
        pull_queue: QueuePull[_P],
        group: str,
        topic: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = False,
    ) -> list[QueuePart[_P]]:
        """``group_pull`` with each queue pulled by ``pull_queue`` (the JSON messages,
        a record page): the part of every queue it looked at, in the order looked at.
        The rules are the same whatever the parts hold: from the committed offsets, one
        response budget across the queues (each part's ``size``), a long poll of all of
        them at once, the commit of every part's ``next_offset`` with ``auto_commit``."""
        if auto_commit:
            self.gate.require_master()  # the commit is a write: go to the master before pulling
        self._check_offsets_mode(group)
        self.reads.check_pull_args(max_messages, wait_ms)
        t = self.topics.get(topic)
        # (each queue once, in the order given: a repeat would answer its messages twice)
        qids = list(range(t.queues)) if queue_ids is None else list(dict.fromkeys(queue_ids))
        for qid in qids:
            self.reads.check_queue(topic, qid)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            parts: list[QueuePart[_P]] = []
            count = 0
            # One response budget across the queues: once spent, the other queues wait
            # for the next pull (a queue's one message may pass what is left of it).
            budget = self.settings.limits.max_response_bytes
            for qid in qids:
                lo, _ = self.reads.queue_bounds(topic, qid)
                start = self.meta.committed_offset(group, topic, qid)
                start = lo if start is None or start < lo else start
                part = await pull_queue(topic, qid, start, max_messages - count, budget)
                parts.append(part)
                count += part.count
                budget -= part.size
                if count >= max_messages or budget <= 0:
                    break
            left = deadline - time.monotonic()
            if count or left <= 0:
                break
            await self._wait_any(topic, {p.queue_id: p.next_offset for p in parts}, left)
        if auto_commit and count:
            await self.commit_offsets(group, topic, {p.queue_id: p.next_offset for p in parts})
        return parts

    async def _wait_any(self, topic: str, next_offsets: dict[int, int], timeout_s: float) -> None:
        """Until one of the queues holds a message at its next offset (or the timeout)."""
        waits = [
            asyncio.ensure_future(self.dispatch.wait_queue(topic, qid, queue_offset, timeout_s))
            for qid, queue_offset in next_offsets.items()
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
