"""``PopGroups``: the master's side of shared consumption (docs/consuming.md).

The master decides from the replicated state (``MetadataState.pop``, the same on every
node) what a receive hands out, appends that decision (``pop.receive``) and answers
with what applying it handed out: a message is never given to a consumer before its
in-flight record is committed, so a new master knows it is out. Acks, nacks and
changes of the invisible time are appended the same way and answered from their
outcome; a message whose attempts are spent is written to ``%DLQ%<group>`` (the copy
and the end of its flight are one entry, ``broker/pop/applier.py``).

Concurrency on the master: offsets picked by a receive whose entry is not applied yet
are reserved (``_reserved``, counted per receive) and the queue's next offset as that
receive moves it is kept (``_pending_ends``), so two receives of one loop turn pick
different messages: a receive looks for fresh ones from past those under way, and says
so in its pick (``since``). Both are held only while their request runs (released in
``finally``), so nothing of them outlives a lost leadership. The applier checks every
pick again against the state the entry meets (it hands out nothing fresh from a pick
that looked past ``next``, whatever order the entries come in), so the overlay is for
liveness; safety does not rest on it.

A dead letter is the exception: its copy lands in ``%DLQ%<group>`` whether or not it
still ends the flight when it applies, so it must not race this master's own writes of
that flight. A flight being dead-lettered takes no ack, nack or new invisible time here
(``_ending``: INVALID) and no second dead letter; one whose ack, nack or change is
being appended is not dead-lettered (``_settling``); and before the copy is appended
everything in this node's log is applied (an ack appended before, an earlier copy whose
request ended without its outcome) and the flight checked again. A new master has
applied every entry of the terms before its own, so this master's appends are the only
ones to wait for.

The lock that makes selections one at a time is made by ``lock`` (``asyncio.Lock``; the
broker simulation drives this code without an event loop and hands it its own).

Invariants:
- every operation passes the ``WriteGate`` first: a SLAVE redirects, as for produce;
- a receive waits at most ``wait_ms`` (long polling), woken by new messages (arrivals)
  and by the next flight falling due, never by polling faster than ``POLL_SLICE_S``;
- at most ``max_pop_in_flight_per_queue`` messages of a queue are in flight for a group,
  and a request names at most ``max_receipt_handles`` handles;
- a dead letter ends the flight it copies (one copy per message, none of a message
  acked); a flight whose message retention deleted is acked here for the group once due
  (it can be neither handed out nor copied: done, as a message retention deleted before
  it was handed out); a receive ends such flights at most ``ENDING_ROUNDS`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import errors
from ..gate import WriteGate
from ..message import RecordHead
from ..metadata import MetadataState, TopicMeta
from ..names import check_group_name
from ..produce import NewMessage, Producer
from ..reads import MessageMaker, PulledMessage, Reads
from ..settings import BrokerSettings
from ..topics import MetadataLog, Topics
from .applier import (
    PROP_DELIVERY_ATTEMPTS,
    PROP_DLQ_ORIGIN_MSG_ID,
    PROP_DLQ_ORIGIN_QUEUE_ID,
    PROP_DLQ_ORIGIN_QUEUE_OFFSET,
    PROP_DLQ_ORIGIN_TOPIC,
    PROP_POP_EPOCH,
    PopApplier,
    dlq_topic,
)
from .state import MAX_TIME_MS, Delivered, Flight, Handle, PopConfig, PopState, QueueState

if TYPE_CHECKING:
    from ..dispatch import Dispatch

_M = TypeVar("_M")

POLL_SLICE_S = 1.0  # a waiting receive looks again at least this often
ENDING_ROUNDS = 4  # a receive dead-letters (or ends) and looks again at most this often
# The properties that tell an applier which record a copy ends: never copied again.
COPY_ORIGINS = ("TIMER_ORIGIN", "TX_ORIGIN", PROP_POP_EPOCH)
REDRIVE_PRODUCER = "%REDRIVE%"  # + group: the session of a group's redrive (no client's)
# What a dead letter has that its message had not: dropped when it is produced back.
DEAD_LETTER_PROPERTIES = (
    PROP_DLQ_ORIGIN_TOPIC,
    PROP_DLQ_ORIGIN_QUEUE_ID,
    PROP_DLQ_ORIGIN_QUEUE_OFFSET,
    PROP_DLQ_ORIGIN_MSG_ID,
    PROP_DELIVERY_ATTEMPTS,
    *COPY_ORIGINS,
)
_HANDLE = re.compile(r"v1:(\d{1,5}):(\d{1,19}):(\d{1,19})")


def _uncount(
    table: dict[tuple[str, str, int], Counter[int]], key: tuple[str, str, int], items: list[int]
) -> None:
    counts = table.get(key)
    if counts is None:
        return
    counts.subtract(items)
    for x in items:
        if counts[x] <= 0:
            del counts[x]
    if not counts:
        del table[key]


def _redrive_runs(
    letters: Sequence[tuple[int, PulledMessage]], most: int
) -> Iterator[tuple[int, str | None, list[NewMessage]]]:
    """Dead letters in offset order as runs bound for one topic, each at most ``most``
    long: (the run's first offset, the topic they came from, the messages as produced)."""
    run: list[NewMessage] = []
    first, topic = 0, None
    for o, m in letters:
        origin = m.properties.get(PROP_DLQ_ORIGIN_TOPIC)
        if run and (origin != topic or len(run) >= most):
            yield first, topic, run
            run = []
        if not run:
            first, topic = o, origin
        props = {k: v for k, v in m.properties.items() if k not in DEAD_LETTER_PROPERTIES}
        run.append(NewMessage(m.body, m.tags, m.keys, props, born_timestamp=m.born_timestamp))
    if run:
        yield first, topic, run


def handle_text(queue_id: int, offset: int, epoch: int) -> str:
    """A receipt handle as clients see it: no node, nothing node-local."""
    return f"v1:{queue_id}:{offset}:{epoch}"


def parse_handle(text: str) -> Handle | None:
    m = _HANDLE.fullmatch(text)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]))


def _with_offset(make: MessageMaker[_M]) -> MessageMaker[tuple[int, _M]]:
    """``make``, each message paired with its queue offset."""

    def made(
        h: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
    ) -> tuple[int, _M]:
        return queue_offset, make(h, queue_offset, address, body, props)

    return made


@dataclass(frozen=True, slots=True)
class Received(Generic[_M]):
    """A message a receive handed out: what the maker made of it, and its flight."""

    message: _M
    receipt_handle: str
    delivery_attempt: int
    invisible_until: int


@dataclass(slots=True)
class _Selection(Generic[_M]):
    # (queue, start, end, offsets, since): the op's (``PopState.receive``)
    picks: list[tuple[int, int, int, list[int], int]]
    made: dict[tuple[int, int], _M]  # (queue, offset) → the message made
    spent: list[tuple[int, int, Flight]]  # attempts spent: to the dead letters
    next_due: int | None  # the earliest flight due after now (a waiting receive wakes)
    ends: dict[int, int]  # each queue's offset past what this receive looked at
    gone: list[tuple[int, int, Flight]] = field(default_factory=list)  # retention took them


class PopGroups:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        gate: WriteGate,
        topics: Topics,
        metalog: MetadataLog,
        meta: MetadataState,
        reads: Reads,
        producer: Producer,
        dispatch: Dispatch,
        applier: PopApplier,
        clock: Callable[[], int],
        lock: Callable[[], AbstractAsyncContextManager[Any]] = asyncio.Lock,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.topics = topics
        self.metalog = metalog
        self.meta = meta
        self.reads = reads
        self.producer = producer
        self.dispatch = dispatch
        self.applier = applier
        self.clock = clock
        self._reserved: dict[tuple[str, str, int], Counter[int]] = {}
        self._pending_ends: dict[tuple[str, str, int], Counter[int]] = {}
        self._rr: dict[tuple[str, str], int] = {}  # where the next receive starts
        self._changed = asyncio.Event()  # set (and replaced) when an ack or nack lands
        self._lock = lock
        # (group, topic, queue, offset): flights whose ack, nack or new invisible time is
        # being appended, and flights being dead-lettered (module docstring)
        self._settling: Counter[tuple[str, str, int, int]] = Counter()
        self._ending: set[tuple[str, str, int, int]] = set()
        self._selecting: dict[tuple[str, str], AbstractAsyncContextManager[Any]] = {}
        self._redriving: dict[str, AbstractAsyncContextManager[Any]] = {}

    @property
    def state(self) -> PopState:
        return self.meta.pop

    # ---- configuration ---------------------------------------------------------------

    def config(self, group: str) -> PopConfig:
        """A POP group's configuration; ``GroupNotFoundError`` for any other group."""
        check_group_name(group)
        cfg = self.state.groups.get(group)
        if cfg is None:
            raise errors.GroupNotFoundError(f"group {group} is not a POP group")
        return cfg

    async def configure(self, group: str, doc: dict[str, Any]) -> PopConfig:
        """Create a POP group or change its configuration (``PUT /v1/groups/{group}``)."""
        check_group_name(group)
        try:
            cfg = PopConfig.from_json(doc)
        except (ValueError, TypeError) as e:
            raise errors.InvalidArgumentError(f"group config: {e}") from None
        await self.gate.require_master_soon()
        if group in self.meta.offsets:
            raise errors.GroupModeConflictError(
                f"group {group} commits offsets: its mode is offsets, not pop"
            )
        await self.metalog.append({"op": "pop.config", "group": group, "config": cfg.to_json()})
        return self.state.groups.get(group, cfg)

    async def _config_for_use(self, group: str) -> PopConfig:
        """The group's configuration, created with the defaults on its first use."""
        cfg = self.state.groups.get(group)
        if cfg is not None:
            return cfg
        return await self.configure(group, {})

    def _check_topic(self, topic: str) -> TopicMeta:
        return self.topics.get(topic)

    # ---- receive -----------------------------------------------------------------------

    async def receive(
        self,
        make: MessageMaker[_M],
        group: str,
        topic: str,
        *,
        max_messages: int = 32,
        invisible_ms: int = 30_000,
        wait_ms: int = 0,
        tags: str | None = None,
        attempt_id: str | None = None,
        owner: str | None = None,
        renew_ms: int = 0,
    ) -> list[Received[_M]]:
        """Hand out up to ``max_messages`` of ``topic`` to one consumer of ``group``,
        each invisible to the group for ``invisible_ms``; waits up to ``wait_ms`` for
        one. A FIFO receive retried with the same ``attempt_id`` gets the same messages
        while they are in flight. With ``owner`` (a client id) the flights are
        auto-renewed for that client (``renew``), for ``renew_ms`` at most."""
        check_group_name(group)
        lim = self.settings.limits
        if not 1 <= max_messages <= lim.max_pull_messages:
            raise errors.InvalidArgumentError(f"max_messages must be 1..{lim.max_pull_messages}")
        if not lim.min_invisible_ms <= invisible_ms <= lim.max_invisible_ms:
            raise errors.InvalidArgumentError(
                f"invisible_ms must be {lim.min_invisible_ms}..{lim.max_invisible_ms}"
            )
        if not 0 <= wait_ms <= lim.max_wait_ms:
            raise errors.InvalidArgumentError(f"wait_ms must be 0..{lim.max_wait_ms}")
        if attempt_id is not None and not 1 <= len(attempt_id) <= 128:
            raise errors.InvalidArgumentError("attempt_id: 1..128 characters")
        await self.gate.require_master_soon()
        t = self._check_topic(topic)
        cfg = await self._config_for_use(group)
        deadline = time.monotonic() + wait_ms / 1000
        rounds = 0
        while True:
            if attempt_id is not None:
                again = await self._same_attempt(make, group, t, attempt_id)
                if again:
                    return again
            # One selection at a time per group and topic: what one picks is reserved
            # before the next looks (the appends and their waits overlap).
            async with self._selection(group, t.name):
                sel = await self._select(make, group, t, cfg, max_messages, tags)
                self._reserve(group, t.name, sel)
            try:
                if sel.spent:
                    await self._dead_letter(group, t, sel.spent)
                if sel.gone:
                    await self._end_gone(group, t, sel.gone)
                renewed = (owner, renew_ms)
                if any(offsets for _, _, _, offsets, _ in sel.picks):
                    return await self._hand_out(group, t, sel, invisible_ms, attempt_id, renewed)
                if any(end > since for _, _, end, _, since in sel.picks):
                    # It passed over messages that are done for the group (no match for
                    # its tags; deleted by retention): next moves past them, or every
                    # receive would look at them again, and never past a scan's bound.
                    await self._hand_out(group, t, sel, invisible_ms, attempt_id, renewed)
            finally:
                self._release(group, t.name, sel)
            if (sel.spent or sel.gone) and rounds < ENDING_ROUNDS:
                rounds += 1
                continue  # their queues may hold more now
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            if sel.next_due is not None:
                left = min(left, max(0.0, (sel.next_due - self.clock()) / 1000) + 0.001)
            await self._wait_arrival(t, sel, min(left, POLL_SLICE_S))
            self.gate.require_master()

    def _selection(self, group: str, topic: str) -> AbstractAsyncContextManager[Any]:
        """The lock of the group's selections from the topic."""
        key = (group, topic)
        if key not in self._selecting:
            self._selecting[key] = self._lock()
        return self._selecting[key]

    def _reserve(self, group: str, topic: str, sel: _Selection[_M]) -> None:
        for q, offsets, end in self._held(sel):
            k = (group, topic, q)
            self._reserved.setdefault(k, Counter()).update(offsets)
            if end is not None:
                self._pending_ends.setdefault(k, Counter())[end] += 1

    def _release(self, group: str, topic: str, sel: _Selection[_M]) -> None:
        """Forget what ``_reserve`` held for ``sel`` (and only that): the entry is applied
        (or failed)."""
        for q, offsets, end in self._held(sel):
            k = (group, topic, q)
            _uncount(self._reserved, k, offsets)
            if end is not None:
                _uncount(self._pending_ends, k, [end])

    @staticmethod
    def _held(sel: _Selection[_M]) -> list[tuple[int, list[int], int | None]]:
        """Per queue: the offsets ``sel`` holds, and where its pick moves next (if any)."""
        held: list[tuple[int, list[int], int | None]] = [
            (q, offsets, end) for q, _, end, offsets, _ in sel.picks
        ]
        held += [(q, [o], None) for q, o, _ in sel.spent + sel.gone]
        return held

    def _pending_next(self, key: tuple[str, str, int]) -> int:
        """Where the receives under way here move the queue's next offset (-1: none)."""
        ends = self._pending_ends.get(key)
        return max(ends) if ends else -1

    async def _select(  # noqa: PLR0917 - the receive's arguments
        self,
        make: MessageMaker[_M],
        group: str,
        t: TopicMeta,
        cfg: PopConfig,
        max_messages: int,
        tags: str | None,
    ) -> _Selection[_M]:
        """What this receive would hand out now: per queue, from a rotating first queue
        (fair across queues), due redeliveries in offset order, then fresh messages."""
        now = self.clock()
        cap = self.settings.limits.max_pop_in_flight_per_queue
        sel: _Selection[_M] = _Selection([], {}, [], None, {})
        first = self._rr.get((group, t.name), 0) % t.queues
        self._rr[(group, t.name)] = first + 1
        left = max_messages
        for i in range(t.queues):
            q = (first + i) % t.queues
            key = (group, t.name, q)
            qs = self.state.queues.get(key)
            reserved = self._reserved.get(key, Counter())
            flights = {} if qs is None else qs.flights
            start = self._next_of(key, qs, cfg)  # (a queue not known yet starts there)
            since = max(start, self._pending_next(key))  # fresh ones: past those under way
            lo, hi = self.reads.queue_bounds(t.name, q)
            sel.ends[q] = max(since, hi)  # a queue it takes nothing fresh from: new ones wake it
            if left <= 0:
                continue
            if cfg.fifo and (reserved or (qs is not None and qs.blocked(now))):
                continue
            offsets: list[int] = []
            for o in sorted(flights):
                f = flights.get(o)  # None: acked meanwhile (a read below lets the loop run)
                if f is None or o in reserved:
                    continue
                if f.due > now:
                    sel.next_due = f.due if sel.next_due is None else min(sel.next_due, f.due)
                    continue
                if o < lo:
                    sel.gone.append((q, o, f))  # retention deleted it: done for the group
                    continue
                if f.attempt >= cfg.max_delivery_attempts:
                    if (group, t.name, q, o) not in self._settling:
                        sel.spent.append((q, o, f))  # (else after its ack, nack or change)
                    continue
                if left > 0 and (m := await self._one(make, t.name, q, o)) is not None:
                    sel.made[(q, o)] = m
                    offsets.append(o)
                    left -= 1
            end = since
            room = min(left, cap - len(flights) - len(reserved))
            if room > 0 and not (cfg.fifo and flights):
                r = await self.reads.pull(
                    _with_offset(make),
                    t.name,
                    q,
                    since,
                    max_messages=room,
                    tags=tags,
                    yield_first=False,  # (the selection lock is held: no idle turn)
                )
                end = max(since, r.next_offset)
                for o, m in r.messages:
                    sel.made[(q, o)] = m
                    offsets.append(o)
                left -= len(r.messages)
                sel.ends[q] = end
            if offsets or end > since:
                sel.picks.append((q, start, end, offsets, since))
        return sel

    def _next_of(self, key: tuple[str, str, int], qs: QueueState | None, cfg: PopConfig) -> int:
        """Where the queue's fresh messages start for the group: after what it handed out;
        on its first receive, where the group's ``start`` says, never below what
        retention kept."""
        _, topic, q = key
        lo, hi = self.reads.queue_bounds(topic, q)
        if qs is not None:
            # Not lifted to ``lo``: a pull from below what retention kept answers from its
            # head, and the receive moves next there (the rule takes fresh messages only
            # from a receive whose scan starts at or before next: ``PopState.receive``).
            nxt = qs.next
        elif cfg.start == "latest":
            nxt = hi
        elif cfg.start == "earliest":
            nxt = lo
        else:
            nxt = max(lo, self.reads.offset_for_time(topic, q, int(cfg.start)))
        return nxt

    async def _one(self, make: MessageMaker[_M], topic: str, q: int, offset: int) -> _M | None:
        """The message at ``offset`` of the queue, or None when retention deleted it."""
        r = await self.reads.pull(
            _with_offset(make), topic, q, offset, max_messages=1, yield_first=False
        )
        return next((m for o, m in r.messages if o == offset), None)

    async def _same_attempt(
        self, make: MessageMaker[_M], group: str, t: TopicMeta, attempt_id: str
    ) -> list[Received[_M]]:
        """The messages a receive with ``attempt_id`` handed out and that are still
        invisible: what its retry gets again (same handles)."""
        now = self.clock()
        out: list[Received[_M]] = []
        for q, qs in list(self.state.topic_queues(group, t.name)):
            for o in sorted(qs.flights):
                f = qs.flights.get(o)  # None: acked while a read below let the loop run
                if f is not None and f.attempt_id == attempt_id and f.visible_at > now:
                    m = await self._one(make, t.name, q, o)
                    if m is not None:
                        out.append(Received(m, handle_text(q, o, f.epoch), f.attempt, f.visible_at))
        return out

    async def _hand_out(  # noqa: PLR0917 - the receive's parts
        self,
        group: str,
        t: TopicMeta,
        sel: _Selection[_M],
        invisible_ms: int,
        attempt_id: str | None,
        renewed: tuple[str | None, int] = (None, 0),
    ) -> list[Received[_M]]:
        """Append the receive, and answer with what applying it handed out."""
        op: dict[str, Any] = {
            "op": "pop.receive",
            "group": group,
            "topic": t.name,
            "created": t.created_index,
            "invisible_ms": invisible_ms,
            "attempt_id": attempt_id,
            "picks": sel.picks,
        }
        if renewed[0] is not None:  # (older entries have neither)
            op["owner"], op["renew_ms"] = renewed
        index = await self.metalog.append(op)
        delivered = self.applier.outcome(index)
        if not isinstance(delivered, list):
            raise errors.UnknownOutcomeError("the receive was not applied in time; retry")
        out: list[Received[_M]] = []
        for d in delivered:
            assert isinstance(d, Delivered)
            out.append(
                Received(
                    sel.made[(d.queue_id, d.offset)],
                    handle_text(d.queue_id, d.offset, d.epoch),
                    d.attempt,
                    d.visible_at,
                )
            )
        return out

    async def _dead_letter(
        self, group: str, t: TopicMeta, spent: Sequence[tuple[int, int, Flight]]
    ) -> set[tuple[int, int]]:
        """Copy each message whose attempts are spent into ``%DLQ%<group>``: the copy
        carries its origin and the handle it ends (one entry: no second copy after a
        failover), appended only once this master's earlier writes are applied and the
        flight is still as selected (module docstring). A message retention deleted
        meanwhile is left to ``_end_gone``. The (queue, offset) of each flight a copy
        ended."""
        mine = {(group, t.name, q, o) for q, o, _ in spent} - self._ending
        self._ending.update(mine)
        ended: set[tuple[int, int]] = set()
        try:
            spent = [
                (q, o, f)
                for q, o, f in spent
                if (group, t.name, q, o) in mine and (group, t.name, q, o) not in self._settling
            ]
            if spent and await self._own_appends_applied():
                ended = await self._copy_dead(group, t, spent)
        finally:
            self._ending.difference_update(mine)
        self._moved()
        return ended

    async def _own_appends_applied(self) -> bool:
        """Whether everything in this node's log (this master's appends among them) is
        applied here, waiting up to ``append_timeout_ms``."""
        end = self.gate.server.ledger_end_index
        return await self.dispatch.wait_dispatched(end, self.settings.append_timeout_ms / 1000)

    async def _copy_dead(
        self, group: str, t: TopicMeta, spent: Sequence[tuple[int, int, Flight]]
    ) -> set[tuple[int, int]]:
        dlq = dlq_topic(group)
        if dlq not in self.meta.topics:
            await self.topics.create(dlq, 1, dead_letters=True)
        ended: set[tuple[int, int]] = set()
        for q, o, f in spent:
            if not self._current(group, t.name, (q, o, f.epoch)):
                continue  # acked, nacked or changed before: not spent as selected
            m = await self._one(self.reads.pulled_message, t.name, q, o)
            if m is None:
                continue
            # (a delay message's or a transaction's origin ended its own record: a copy
            # carrying it would look to their appliers like a second delivery)
            props = {k: v for k, v in m.properties.items() if k not in COPY_ORIGINS}
            props.update(
                {
                    PROP_DLQ_ORIGIN_TOPIC: t.name,
                    PROP_DLQ_ORIGIN_QUEUE_ID: str(q),
                    PROP_DLQ_ORIGIN_QUEUE_OFFSET: str(o),
                    PROP_DLQ_ORIGIN_MSG_ID: m.msg_id,
                    PROP_DELIVERY_ATTEMPTS: str(f.attempt),
                    PROP_POP_EPOCH: str(f.epoch),
                }
            )
            # (it keeps the message's UNIQ_KEY, as RocketMQ's dead letters do: a RocketMQ
            # client reading them sees the message id it sent)
            copy = NewMessage(m.body, m.tags, m.keys, props, queue_id=0, uniq_key=m.uniq_key)
            await self.producer.produce_to(self.topics.get(dlq), [copy], None, None)
            # Nothing else of this master writes the flight meanwhile, and every earlier
            # write was applied before: if it ended, this copy ended it.
            if not self._current(group, t.name, (q, o, f.epoch)):
                ended.add((q, o))
        return ended

    async def _end_gone(
        self, group: str, t: TopicMeta, gone: Sequence[tuple[int, int, Flight]]
    ) -> None:
        """Flights whose message retention deleted from the log can be neither handed out
        again nor copied into the dead letters: they are done for the group, acked here
        on its behalf (their handles end; a FIFO queue goes on)."""
        handles = [[q, o, f.epoch] for q, o, f in gone]
        await self.metalog.append(
            {"op": "pop.ack", "group": group, "topic": t.name, "handles": handles}
        )
        self._moved()

    async def _wait_arrival(self, t: TopicMeta, sel: _Selection[_M], timeout_s: float) -> None:
        """Until a queue of the topic grows past where this receive looked, an ack or a
        nack of the group changes what may go out, or ``timeout_s``."""
        waits = [
            asyncio.ensure_future(self.dispatch.wait_queue(t.name, q, end, timeout_s))
            for q, end in sel.ends.items()
        ]
        waits.append(asyncio.ensure_future(self._changed.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _moved(self) -> None:
        """Something a waiting receive may now hand out changed: wake them all."""
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- ack, nack, invisible -------------------------------------------------------------

    def _handles(self, handles: Sequence[str]) -> list[Handle | None]:
        lim = self.settings.limits.max_receipt_handles
        if not 1 <= len(handles) <= lim:
            raise errors.InvalidArgumentError(f"receipt_handles: 1..{lim} handles")
        return [parse_handle(h) for h in handles]

    async def _settle(
        self, group: str, topic: str, op: dict[str, Any], handles: Sequence[str]
    ) -> list[bool]:
        """Append an ack or a nack of the handles that are current here now; whether
        each held (a handle not current here is INVALID, with no write)."""
        check_group_name(group)
        parsed = self._handles(handles)
        await self.gate.require_master_soon()
        self.topics.get(topic)
        self.config(group)
        live = [h for h in parsed if h is not None and self._may_settle(group, topic, h)]
        held: dict[Handle, bool] = {}
        if live:
            with self._settling_of(group, topic, live):
                index = await self.metalog.append(
                    {**op, "group": group, "topic": topic, "handles": [list(h) for h in live]}
                )
            outcome = self.applier.outcome(index)
            if not isinstance(outcome, list):
                raise errors.UnknownOutcomeError("not applied in time; retry")
            held = {h: bool(ok) for h, ok in zip(live, outcome, strict=True)}
            self._moved()
        return [h is not None and held.get(h, False) for h in parsed]

    def _current(self, group: str, topic: str, h: Handle) -> bool:
        qs = self.state.queues.get((group, topic, h[0]))
        f = None if qs is None else qs.flights.get(h[1])
        return f is not None and f.epoch == h[2]

    def _may_settle(self, group: str, topic: str, h: Handle) -> bool:
        """The handle is current and its flight is not being dead-lettered here."""
        return self._current(group, topic, h) and (group, topic, h[0], h[1]) not in self._ending

    @contextmanager
    def _settling_of(self, group: str, topic: str, handles: Sequence[Handle]) -> Iterator[None]:
        """While an ack, nack or change of ``handles`` is appended: none is dead-lettered."""
        keys = [(group, topic, q, o) for q, o, _ in handles]
        self._settling.update(keys)
        try:
            yield
        finally:
            self._settling.subtract(keys)
            for k in keys:
                if self._settling[k] <= 0:
                    del self._settling[k]

    async def ack(self, group: str, topic: str, handles: Sequence[str]) -> list[bool]:
        """Each handle's message is done for the group, if the handle is current."""
        return await self._settle(group, topic, {"op": "pop.ack"}, handles)

    async def nack(
        self, group: str, topic: str, handles: Sequence[str], delay_ms: int | None = None
    ) -> list[bool]:
        """Each handle's message goes out again after ``delay_ms`` (the group's retry
        delay for its next attempt when None)."""
        if delay_ms is not None and not 0 <= delay_ms <= MAX_TIME_MS:
            raise errors.InvalidArgumentError(f"delay_ms must be 0..{MAX_TIME_MS}")
        return await self._settle(group, topic, {"op": "pop.nack", "delay_ms": delay_ms}, handles)

    async def change_invisible(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> Received[None]:
        """The handle's message stays invisible ``invisible_ms`` from now; its new
        handle (``InvalidReceiptHandleError`` when the handle is not current)."""
        lim = self.settings.limits
        if not 0 <= invisible_ms <= lim.max_invisible_ms:
            raise errors.InvalidArgumentError(f"invisible_ms must be 0..{lim.max_invisible_ms}")
        check_group_name(group)
        (h,) = self._handles([handle])
        await self.gate.require_master_soon()
        self.topics.get(topic)
        self.config(group)
        if h is None or not self._may_settle(group, topic, h):
            raise errors.InvalidReceiptHandleError("the receipt handle is not current")
        with self._settling_of(group, topic, [h]):
            index = await self.metalog.append(
                {
                    "op": "pop.invisible",
                    "group": group,
                    "topic": topic,
                    "handle": list(h),
                    "invisible_ms": invisible_ms,
                }
            )
        d = self.applier.outcome(index)
        if not isinstance(d, Delivered):
            raise errors.InvalidReceiptHandleError("the receipt handle is not current")
        self._moved()
        return Received(None, handle_text(d.queue_id, d.offset, d.epoch), d.attempt, d.visible_at)

    async def renew(
        self,
        group: str,
        topic: str,
        handles: Sequence[Handle],
        invisible_ms: int,
        *,
        stop: bool = False,
    ) -> list[bool]:
        """Auto-renewed flights (a push consumer's) stay invisible ``invisible_ms`` from
        now, their handles unchanged; with ``stop`` they are renewed no more. One entry
        (``pop.renew``), replicated as every change of an invisible time is, so a new
        master goes on from the renewed deadlines. Handles no longer current are left."""
        self.gate.require_master()
        live = [h for h in handles if self._may_settle(group, topic, h)]
        if not live:
            return []
        with self._settling_of(group, topic, live):
            index = await self.metalog.append(
                {
                    "op": "pop.renew",
                    "group": group,
                    "topic": topic,
                    "handles": [list(h) for h in live],
                    "invisible_ms": invisible_ms,
                    "stop": stop,
                }
            )
        outcome = self.applier.outcome(index)
        if stop:
            self._moved()
        return [bool(x) for x in outcome] if isinstance(outcome, list) else []

    async def dead_letter_now(self, group: str, topic: str, handles: Sequence[str]) -> list[bool]:
        """Copy each handle's message into ``%DLQ%<group>`` at once, ending its flight
        (``POST /v1/groups/{group}/dlq``), if the handle is current; whether each held.
        A message being handed out again meanwhile is not (its handle dies)."""
        check_group_name(group)
        parsed = self._handles(handles)
        await self.gate.require_master_soon()
        t = self.topics.get(topic)
        self.config(group)
        sel: _Selection[None] = _Selection([], {}, [], None, {})
        async with self._selection(group, topic):  # (none is being selected meanwhile)
            for h in dict.fromkeys(h for h in parsed if h is not None):
                q, o, epoch = h
                qs = self.state.queues.get((group, topic, q))
                f = None if qs is None else qs.flights.get(o)
                reserved = self._reserved.get((group, topic, q), Counter())
                if f is not None and f.epoch == epoch and o not in reserved:
                    sel.spent.append((q, o, f))
            self._reserve(group, topic, sel)
        try:
            ended = await self._dead_letter(group, t, sel.spent) if sel.spent else set()
        finally:
            self._release(group, topic, sel)
        return [h is not None and (h[0], h[1]) in ended for h in parsed]

    async def redrive(self, group: str, max_messages: int | None = None) -> dict[str, int]:
        """Produce up to ``max_messages`` dead letters of ``group`` back to the topics they
        came from, from the first not yet produced back (``POST
        /v1/groups/{group}/dlq/redrive``). Exactly once across failovers and retries: the
        copies of a run go out in a producer session whose sequence is the run's first
        dead-letter offset, and where the redrive got to is appended after them
        (``pop.redrive``); a repeat after a failover between the two is answered by the
        session. A dead letter whose topic is gone is skipped."""
        lim = self.settings.limits
        if max_messages is None:
            max_messages = lim.max_pull_messages
        if not 1 <= max_messages <= lim.max_pull_messages:
            raise errors.InvalidArgumentError(f"max_messages must be 1..{lim.max_pull_messages}")
        self.config(group)
        await self.gate.require_master_soon()
        if group not in self._redriving:
            self._redriving[group] = self._lock()
        async with self._redriving[group]:
            if not await self._own_appends_applied():  # (the position and the session)
                raise errors.UnknownOutcomeError("the log is not applied here yet; retry")
            dlq = dlq_topic(group)
            if dlq not in self.meta.topics:
                return {"redriven": 0, "skipped": 0, "next_offset": 0}
            lo, _ = self.reads.queue_bounds(dlq, 0)
            start = max(lo, self.state.redriven.get(group, 0))
            r = await self.reads.pull(
                _with_offset(self.reads.pulled_message), dlq, 0, start, max_messages=max_messages
            )
            redriven = skipped = 0
            for first, topic, copies in _redrive_runs(r.messages, lim.max_messages_per_request):
                if topic is None or topic not in self.meta.topics:
                    skipped += len(copies)
                    continue
                # (too old: produced back before a failover lost where the redrive got to)
                with contextlib.suppress(errors.SequenceTooOldError):
                    await self.producer.produce_to(
                        self.topics.get(topic), copies, REDRIVE_PRODUCER + group, first
                    )
                redriven += len(copies)
            end = max(start, r.next_offset)
            if end > self.state.redriven.get(group, 0):
                await self.metalog.append({"op": "pop.redrive", "group": group, "next": end})
            return {"redriven": redriven, "skipped": skipped, "next_offset": end}

    # ---- reading ---------------------------------------------------------------------------

    def describe(self, group: str) -> dict[str, Any]:
        """``GET /v1/groups/{group}``: its configuration, and per topic what is in flight
        and was dead-lettered."""
        cfg = self.config(group)
        topics = sorted({t for g, t, _ in self.state.queues if g == group})
        return {
            "group": group,
            **cfg.to_json(),
            "topics": [
                {
                    "topic": name,
                    "in_flight": self.state.in_flight(group, name),
                    **self.state.counts(group, name),
                }
                for name in topics
            ],
            "redrive_next_offset": self.state.redriven.get(group, 0),
        }

    def offsets(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        """Per queue: ``next_offset`` (the first never handed out), ``in_flight``,
        ``max_offset`` and ``lag`` (neither acknowledged nor dead-lettered)."""
        self.config(group)
        out = []
        for (g, name, q), qs in sorted(self.state.queues.items()):
            if g != group or (topic is not None and name != topic):
                continue
            _, hi = self.reads.queue_bounds(name, q)
            out.append(
                {
                    "topic": name,
                    "queue_id": q,
                    "next_offset": qs.next,
                    "in_flight": len(qs.flights),
                    "max_offset": hi,
                    "lag": max(0, hi - qs.next) + len(qs.flights),
                }
            )
        return out
