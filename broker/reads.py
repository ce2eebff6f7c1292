"""Reading committed, dispatched messages: pulls by queue offset (JSON messages or raw
pages for the Arrow encoders), and the lookups by store time, message id and key.

Every read serves only what dispatch made visible, on every node alike, and only from
committed log: the consume queues and the key index name records, the commit log holds
them. A record whose entry fails its CRC is never served: it is counted, logged (at
most every ``CORRUPT_LOG_INTERVAL_S``) and refused with ``CORRUPT_ENTRY``, and another
replica serves it. While a leader's snapshot replaces the consume queues and the key
index (in a thread), reads of them are refused with 429 BUSY.

Bounds: a pull answers at most ``max_messages`` and, past its first message, at most
``max_bytes`` of stored records; a tag filter passes over at most
``max_filter_scan_units`` units per pull before it answers where it got to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar

from consumequeue import UNIT_SIZE, ConsumeQueueStore, KeyIndex, parse_tag_expression
from consumequeue.queue import UNIT as PAGE_UNIT
from dledger.codes import DLedgerCode, DLedgerError
from dledger.store import BODY_OFFSET, CorruptEntryError, FileStore

from . import errors
from .batch import INNER_MIN_SIZE, InnerRecord, inner_records
from .commitlog import DLedgerCommitLog
from .message import (
    INNER_BATCH_FLAG,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    STORE_TIMESTAMP_POS,
    SYSTEM_PROPERTIES,
    MessageFormatError,
    RecordHead,
    check_ipv4,
    decode_head,
)
from .metadata import SYS_TOPIC, TopicMeta
from .msgid import msg_id_maker, parse_msg_id
from .pages import RawPage, RawPullResult, damaged_record, units_within
from .positions import last_index_within
from .properties import decode_properties, split_keys, tags_and_keys
from .settings import BrokerSettings
from .topics import Topics

if TYPE_CHECKING:
    from .dispatch import Dispatch

log = logging.getLogger(__name__)

CORRUPT_LOG_INTERVAL_S = 10.0  # refused reads of damaged entries are logged this often
_OUT_OF_RANGE = DLedgerCode.INDEX_OUT_OF_RANGE


@dataclass(frozen=True, slots=True)
class PulledMessage:
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    commitlog_offset: int
    body: bytes
    tags: str | None
    keys: list[str]
    uniq_key: str | None
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    size: int  # the stored record's bytes: what response budgets count


_M = TypeVar("_M")

MessageMaker: TypeAlias = Callable[[RecordHead, int, int, memoryview, memoryview], _M]
"""``make(head, queue_offset, address, body, properties)``: what a read answers for
one message (a pull's, a group pull's, a lookup's by id or key), made straight from the
record it lies in (``head``, its ``decode_head``): its queue offset, its message address
(the message id's offset) and views of its BODY and encoded PROPERTIES, valid during the
call. ``Reads.pulled_message`` makes a ``PulledMessage``; the HTTP front makes its JSON
with no object in between."""


def stored_size(head: RecordHead, body: memoryview, properties: memoryview) -> int:
    """The stored bytes of a message (what response budgets count): its record's, or in
    a batch record its inner record's (``broker.batch``)."""
    if head.sys_flag & INNER_BATCH_FLAG:
        return INNER_MIN_SIZE + len(body) + len(properties)
    return head.size


class Sized(Generic[_M]):
    """A ``MessageMaker``: ``make``'s messages, with the ``stored_size`` of those made
    summed in ``size`` (a group pull's budget across its queues)."""

    __slots__ = ("make", "size")

    def __init__(self, make: MessageMaker[_M]) -> None:
        self.make = make
        self.size = 0

    def __call__(
        self, head: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
    ) -> _M:
        self.size += stored_size(head, body, props)
        return self.make(head, queue_offset, address, body, props)


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A committed record decoded for pulls once, whichever of its messages are read:
    its head and, for a batch record (``broker.batch``), its walked inner records."""

    record: memoryview
    head: RecordHead
    inners: list[InnerRecord] | None
    # TAGS by PROPERTIES block: a batch record's messages share one as a rule, so a tag
    # filter decodes it once for all of them.
    _tags: dict[bytes, str | None] = field(default_factory=dict)

    @classmethod
    def of(cls, record: memoryview) -> _Decoded:
        h = decode_head(record)
        check_ipv4(h.sys_flag)
        if not h.sys_flag & INNER_BATCH_FLAG:
            return cls(record, h, None)
        return cls(record, h, inner_records(record, h.body_at, h.body_at + h.body_len))

    @property
    def offset(self) -> int:
        return self.head.physical_offset

    @property
    def count(self) -> int:
        """How many messages the record holds."""
        return 1 if self.inners is None else len(self.inners)

    def make(self, queue_offset: int, make: MessageMaker[_M]) -> _M:
        """The record's message at ``queue_offset`` (a batch record's QUEUEOFFSET is its
        first message's: ``broker.batch``), made by ``make``."""
        rec, h = self.record, self.head
        if self.inners is None:
            body_at, body_len, props_at, props_len = h.body_at, h.body_len, h.props_at, h.props_len
            i = 0
        else:
            i = queue_offset - h.queue_offset
            if not 0 <= i < len(self.inners):
                raise MessageFormatError(
                    f"batch record at {h.physical_offset}: queue offset {queue_offset} is"
                    f" not in {h.queue_offset}..{h.queue_offset + len(self.inners) - 1}"
                )
            _, _, body_at, body_len, props_at, props_len = self.inners[i]
        return make(
            h,
            h.queue_offset + i,
            h.physical_offset + i,
            rec[body_at : body_at + body_len],
            rec[props_at : props_at + props_len],
        )

    def tags(self, queue_offset: int) -> str | None:
        """The exact TAGS of the message at ``queue_offset``."""
        raw = bytes(self.make(queue_offset, _properties_of))
        if raw not in self._tags:
            self._tags[raw] = decode_properties(raw).get(PROP_TAGS)
        return self._tags[raw]


def _properties_of(
    head: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
) -> memoryview:
    return props


@dataclass(frozen=True, slots=True)
class PullResult(Generic[_M]):
    status: str  # FOUND | NO_NEW_MSG | NO_MATCHED_MSG | OFFSET_ILLEGAL
    messages: list[_M]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class _Selection:
    """The units a pull answers (``Reads._select``) and where the next pull starts:
    an unfiltered selection's as stored, a filtered one's unpacked."""

    next_offset: int
    raw: bytes = b""
    """Unfiltered: the units as stored (``broker.pages``), back to back."""
    first: int = 0
    """Unfiltered: the queue offset of ``raw``'s first unit."""
    picked: list[tuple[int, int, int, int]] | None = None
    """Filtered: ``(queue_offset, commitlog_offset, size, tags_hash)`` of each unit."""
    records: dict[int, _Decoded] | None = None
    """Filtered: the records read to check the tags, decoded, by commitlog offset: every
    picked unit's record is here (and maybe some after the last)."""

    @property
    def count(self) -> int:
        return len(self.raw) // UNIT_SIZE if self.picked is None else len(self.picked)

    def page(self) -> tuple[bytes, Sequence[int]]:
        """The units as stored and their queue offsets."""
        if self.picked is None:
            return self.raw, range(self.first, self.first + self.count)
        units = b"".join([PAGE_UNIT.pack(c, size, t) for _, c, size, t in self.picked])
        return units, [o for o, _, _, _ in self.picked]

    def units(self) -> list[tuple[int, int, int]]:
        """``(queue_offset, commitlog_offset, size)`` of each unit."""
        if self.picked is not None:
            return [(o, c, size) for o, c, size, _ in self.picked]
        unpacked = PAGE_UNIT.iter_unpack(self.raw)
        return [(o, c, size) for o, (c, size, _) in enumerate(unpacked, self.first)]


_Found = TypeVar("_Found")
_Found_co = TypeVar("_Found_co", covariant=True)


class _Scan(Protocol[_Found_co]):
    """One look at a queue: (what was found, how many messages, the next queue offset)."""

    def __call__(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> tuple[_Found_co, int, int]: ...


def _candidates(
    found: Sequence[tuple[int, int, int, int]],
    start: int,
    *,
    hashes: frozenset[int],
    slots: int,
    budget: int,
    last_record: int,
    taken: bool,
) -> tuple[int, list[int]]:
    """A filtered pull's rule, written once: from ``found[start]`` on (units
    ``(queue_offset, commitlog_offset, size, tags_hash)``), what it takes if every unit
    whose tags hash is in ``hashes`` matches. It stops before a unit whose new record
    would pass ``budget`` once anything is taken (``taken``, or a candidate here), and
    after ``slots`` candidates. Returns the index after the last unit looked at and the
    indexes of the candidates. A message of the record ``last_record`` (a batch record's
    next one) costs no bytes."""
    picked: list[int] = []
    end = start
    for _, commitlog_offset, size, thash in found[start:]:
        new_record = commitlog_offset != last_record
        if (taken or picked) and new_record and size > budget:
            break
        end += 1
        if thash not in hashes:
            continue
        picked.append(end - 1)
        if new_record:
            budget -= size
            last_record = commitlog_offset
        if len(picked) >= slots:
            break
    return end, picked


class Reads:
    """The broker's reads (``Broker.pull``, ``pull_page``, ``offset_for_time``,
    ``get_message``, ``query_by_key``, ``queue_bounds`` delegate here)."""

    def __init__(
        self,
        *,
        settings: BrokerSettings,
        commitlog: DLedgerCommitLog,
        store: FileStore,
        cq: ConsumeQueueStore,
        keys: KeyIndex,
        topics: Topics,
        dispatch: Dispatch,
        stats: dict[str, int],
    ) -> None:
        self.settings = settings
        self.store = store
        self.topics = topics
        # Waits for a queue's next message (long polls), the snapshot install that
        # holds the reads off, and the min offsets retention moved.
        self.dispatch = dispatch
        self.commitlog = commitlog
        self.cq = cq
        self.keys = keys
        self.stats = stats  # the broker's: "pulled", "corrupt_reads" counted here
        self._corrupt_logged_at = -1e18
        self._msg_id = msg_id_maker(settings.group)

    def require_derived(self) -> None:
        """Reads of the consume queues and the key index wait out a snapshot install
        (its thread is replacing the files): 429 BUSY with a short Retry-After."""
        if self.dispatch.installing:
            raise errors.BusyError(
                "installing a snapshot from the leader; retry shortly", retry_after_ms=200
            )

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        self.require_derived()
        q = self.cq.find(topic, queue_id)
        return (0, 0) if q is None else (q.min_offset, q.max_offset)

    def describe_topic(self, name: str) -> dict[str, Any]:
        """The topic and each queue's bounds (``GET /topics/{topic}``)."""
        t = self.topics.get(name)
        return {
            "name": t.name,
            "queues": [
                {"queue_id": q, "min_offset": lo, "max_offset": hi}
                for q in range(t.queues)
                for lo, hi in [self.queue_bounds(name, q)]
            ],
        }

    def _record(self, commitlog_offset: int, size: int | None = None) -> memoryview:
        """A committed record, checked (``DLedgerCommitLog.read_record``: the entry CRC
        covers the whole record, so the record's own BODYCRC adds nothing). A damaged
        copy is counted, logged and refused with ``CORRUPT_ENTRY``: never served, and
        another replica serves it."""
        try:
            return self.commitlog.read_record(commitlog_offset, size)
        except CorruptEntryError as e:
            raise self._damaged(commitlog_offset, e.index, e.message) from None

    def read_record(self, commitlog_offset: int, size: int) -> memoryview:
        """The committed record a consume-queue unit names (``commitlog_offset``,
        ``size``), checked as every read is (``_record``)."""
        return self._record(commitlog_offset, size)

    def _check_page(self, data: memoryview, units: bytes, base: int) -> None:
        """The Arrow pull's check of a chunk of records (``RawPage.check``): the same
        refusal as ``_record`` for the first damaged one."""
        bad = damaged_record(data, units, base)
        if bad is not None:
            raise self._damaged(bad, -1, f"the entry holding commitlog offset {bad} fails its CRC")

    def _damaged(self, commitlog_offset: int, index: int, why: str) -> errors.CorruptEntryError:
        self.stats["corrupt_reads"] += 1
        now = time.monotonic()
        if now - self._corrupt_logged_at >= CORRUPT_LOG_INTERVAL_S:
            self._corrupt_logged_at = now
            log.error(
                "refused to serve a damaged entry (%d such reads so far): %s",
                self.stats["corrupt_reads"],
                why,
            )
        return errors.CorruptEntryError(
            f"the message at commitlog offset {commitlog_offset} is damaged on node"
            f" {self.settings.node_id} (entry {index}: its CRC does not hold); read it"
            " from another replica",
            node_id=self.settings.node_id,
            commitlog_offset=commitlog_offset,
        )

    def _read_pulled(self, units: list[tuple[int, int, int]], make: MessageMaker[_M]) -> list[_M]:
        """The messages of a page of consume-queue units ``(queue_offset,
        commitlog_offset, size)``, their records read in one go (a batch record once for
        all its messages) and checked like ``_record``, each made by ``make`` from its
        record."""
        records = self._read_records(units)
        out: list[_M] = []
        decoded = None
        for queue_offset, commitlog_offset, _ in units:
            if decoded is None or commitlog_offset != decoded.offset:
                decoded = _Decoded.of(records[commitlog_offset])
            out.append(decoded.make(queue_offset, make))
        return out

    def messages_of(self, units: list[tuple[int, int, int]]) -> list[PulledMessage]:
        """The ``PulledMessage`` of each consume-queue unit ``(queue_offset,
        commitlog_offset, size)``, read in one go like a pull's page (the release of
        delay messages, ``broker/timers``); ``DLedgerError`` if a record is not there."""
        return self._read_pulled(units, self.pulled_message)

    def _read_records(self, units: Sequence[tuple[int, int, int]]) -> dict[int, memoryview]:
        """The records the units ``(queue_offset, commitlog_offset, size)`` name, by
        commitlog offset, read in one go and checked like ``_record``."""
        spans: list[tuple[int, int]] = []
        for _, commitlog_offset, size in units:
            if not spans or spans[-1][0] != commitlog_offset:
                spans.append((commitlog_offset, size))
        try:
            records = self.commitlog.read_records(spans)
        except CorruptEntryError as e:
            raise self._damaged(e.pos + BODY_OFFSET, e.index, e.message) from None
        return {offset: record for (offset, _), record in zip(spans, records, strict=True)}

    def pulled_message(
        self, h: RecordHead, queue_offset: int, address: int, body: memoryview, raw: memoryview
    ) -> PulledMessage:
        """A ``MessageMaker`` of ``PulledMessage``s: every field decoded."""
        props = decode_properties(raw)
        return PulledMessage(
            topic=h.topic,
            queue_id=h.queue_id,
            queue_offset=queue_offset,
            msg_id=self._msg_id(address),
            commitlog_offset=address,
            body=bytes(body),
            tags=props.get(PROP_TAGS),
            keys=split_keys(props.get(PROP_KEYS)),
            uniq_key=props.get(PROP_UNIQ_KEY),
            properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES},
            born_timestamp=h.born_timestamp,
            store_timestamp=h.store_timestamp,
            size=stored_size(h, body, raw),
        )

    def check_queue(self, topic: str, queue_id: int) -> TopicMeta:
        t = self.topics.get(topic)
        if not 0 <= queue_id < t.queues:
            raise errors.InvalidArgumentError(f"queue_id {queue_id} is not in 0..{t.queues - 1}")
        return t

    def check_pull_args(self, max_messages: int, wait_ms: int, limit: int | None = None) -> None:
        lim = self.settings.limits
        most = lim.max_pull_messages if limit is None else limit
        if not 1 <= max_messages <= most:
            raise errors.InvalidArgumentError(f"max_messages must be 1..{most}")
        if not 0 <= wait_ms <= lim.max_wait_ms:
            raise errors.InvalidArgumentError(f"wait_ms must be 0..{lim.max_wait_ms}")

    async def pull(
        self,
        make: MessageMaker[_M],
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
        max_bytes: int | None = None,
        yield_first: bool = True,
    ) -> PullResult[_M]:
        """Messages of one queue from ``queue_offset`` (RocketMQ's PullStatus vocabulary),
        each made by ``make`` (``pulled_message`` for ``PulledMessage``s): ``max_messages``
        of them, fewer when their stored bytes would pass ``max_bytes`` (default
        ``max_response_bytes``), but always one: a message bigger than the budget is
        answered alone, so a consumer never stalls on it. ``yield_first=False``: no turn
        of the loop first (a caller holding a lock across the pull, whose request yields
        elsewhere: a POP selection)."""
        status, found, next_offset, lo, hi = await self._pull_loop(
            partial(self._scan, make),
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            max_bytes=self.settings.limits.max_response_bytes if max_bytes is None else max_bytes,
            wait_ms=wait_ms,
            tags=tags,
            yield_first=yield_first,
        )
        return PullResult(status, found or [], next_offset, lo, hi)

    async def pull_page(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
        json_limits: bool = False,
        max_bytes: int | None = None,
    ) -> RawPullResult:
        """``pull``, with the messages as stored (``broker.pages``) for columnar encoders;
        a page's records hold at most ``max_arrow_page_bytes`` (or one record) and it
        takes at most ``max_arrow_pull_messages``. ``json_limits``: the JSON pull's
        limits instead (``max_response_bytes``, ``max_pull_messages``), for the record
        pages of ``api.fetch``, which answer exactly what a JSON pull would; with
        ``max_bytes`` (a group pull's budget left), that many bytes instead."""
        lim = self.settings.limits
        if max_bytes is None:
            max_bytes = lim.max_response_bytes if json_limits else lim.max_arrow_page_bytes
        status, page, next_offset, lo, hi = await self._pull_loop(
            self._scan_page,
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            tags=tags,
            limit=None if json_limits else lim.max_arrow_pull_messages,
        )
        return RawPullResult(status, page or RawPage(b""), next_offset, lo, hi)

    async def _pull_loop(
        self,
        scan: _Scan[_Found],
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        wait_ms: int,
        tags: str | None,
        limit: int | None = None,
        yield_first: bool = True,
    ) -> tuple[str, _Found | None, int, int, int]:
        """The pull protocol, whatever form the messages take: (status, what ``scan``
        found or None, next queue offset, min offset, max offset). ``limit`` bounds
        ``max_messages`` (default: the JSON pull's ``max_pull_messages``)."""
        # Yield once per pull: a caller pulling back to back in-process would otherwise
        # hold the event loop (and the Raft node on it) for as long as data is there.
        if yield_first:
            await asyncio.sleep(0)
        self.check_queue(topic, queue_id)
        self.check_pull_args(max_messages, wait_ms, limit)
        hashes = parse_tag_expression(tags)
        wanted = None
        if hashes is not None and tags:
            wanted = {t.strip() for t in tags.split("||") if t.strip()}
        deadline = time.monotonic() + wait_ms / 1000
        scanned = 0  # units a tag filter passed over: bounded per pull
        while True:
            lo, hi = self.queue_bounds(topic, queue_id)
            if queue_offset < lo or queue_offset > hi:
                return "OFFSET_ILLEGAL", None, lo if queue_offset < lo else hi, lo, hi
            if queue_offset < hi:
                try:
                    found, count, next_offset = scan(
                        topic,
                        queue_id,
                        queue_offset,
                        max_messages=max_messages,
                        max_bytes=max_bytes,
                        hashes=hashes,
                        wanted=wanted,
                    )
                except DLedgerError as e:
                    if not self._deleted_under_us(e, topic, queue_id, lo):
                        raise
                    continue  # the bounds moved past what retention deleted: look again
                if count:
                    self.stats["pulled"] += count
                    return "FOUND", found, next_offset, lo, hi
                scanned += next_offset - queue_offset
                queue_offset = next_offset
                status = "NO_MATCHED_MSG"
                if scanned >= self.settings.limits.max_filter_scan_units:
                    # A filter that matches nothing in a long backlog: answer where the
                    # scan got to (the client goes on from there) instead of holding
                    # the loop through all of it.
                    return status, None, queue_offset, lo, hi
                if queue_offset < hi:
                    await asyncio.sleep(0)  # more backlog to scan: let the loop run first
                    continue
            else:
                status = "NO_NEW_MSG"
            left = deadline - time.monotonic()
            if left <= 0:
                lo, hi = self.queue_bounds(topic, queue_id)
                return status, None, queue_offset, lo, hi
            await self.dispatch.wait_queue(topic, queue_id, queue_offset, left)

    def _deleted_under_us(self, e: DLedgerError, topic: str, queue_id: int, lo: int) -> bool:
        """A record the queue still listed was gone (retention deleted the log head
        between the bounds check and the read, before the dispatcher's next beat moved
        the min offsets): move them now. True when the queue's min offset moved, so the
        pull checks its bounds again and answers ``OFFSET_ILLEGAL`` from the new head;
        False for any other error, which is the caller's to raise."""
        if e.code is not DLedgerCode.INDEX_OUT_OF_RANGE:
            return False
        self.dispatch.correct_min_offsets()
        return self.queue_bounds(topic, queue_id)[0] > lo

    def _select(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> _Selection:
        """The units a pull answers from ``queue_offset``, for both pulls alike.

        Without a tag filter: the next ``max_messages`` units, as few as keep their
        records within ``max_bytes`` (``units_within``: at least one), as one slice. With
        one: the units whose message's exact TAGS are ``wanted``, in queue order, at most
        ``max_messages``, passing over the others (a unit whose tags hash is not in
        ``hashes`` without reading it; one whose hash is, its record read: a tags-hash
        collision is no match, so it spends neither a slot nor bytes), and stopping
        before a message whose record would pass what is left of ``max_bytes`` once one
        is taken. The next offset is the one after the last unit looked at.

        A filtered selection reads the records of the units it checks a few at a time
        (``_read_ahead``): those it would take if they all matched, in one read of the
        log; ``_Selection.records`` keeps them decoded for the JSON pull."""
        self.require_derived()
        q = self.cq.find(topic, queue_id)
        if q is None:
            return _Selection(queue_offset)
        if hashes is None:
            first, units = q.read_raw(queue_offset, max_messages)
            units = units_within(units, max_bytes)
            count = len(units) // UNIT_SIZE
            return _Selection(first + count if count else queue_offset, units, first)
        found = q.read(queue_offset, max(max_messages * 4, 1024))
        records: dict[int, _Decoded] = {}
        kept: list[tuple[int, int, int, int]] = []
        next_offset = queue_offset
        budget = max_bytes
        last_record = -1  # the messages of a batch record count its bytes once
        pos = 0
        # Rounds: the rule (``_candidates``) says what a pull takes from ``pos`` if every
        # tags-hash candidate matches; their records are read in one go; the exact tags
        # then decide. A candidate that does not match spent nothing, so the next round
        # goes on from where this one stopped with what is really left. Without a
        # collision the second round stops at once.
        while pos < len(found) and len(kept) < max_messages:
            end, candidates = _candidates(
                found,
                pos,
                hashes=hashes,
                slots=max_messages - len(kept),
                budget=budget,
                last_record=last_record,
                taken=bool(kept),
            )
            if end == pos:
                break  # the budget is spent: found[pos] starts the next pull
            unread = [found[i][:3] for i in candidates if found[i][1] not in records]
            if unread:
                for offset, record in self._read_records(unread).items():
                    records[offset] = _Decoded.of(record)
            for i in candidates:
                unit_offset, commitlog_offset, size, _ = found[i]
                if wanted is not None and records[commitlog_offset].tags(unit_offset) not in wanted:
                    continue  # a tags-hash collision: the exact tags decide
                new_record = commitlog_offset != last_record
                if kept and new_record and size > budget:
                    # The round counted this record's bytes at an earlier message of it
                    # that did not match: it is new here, and over what is left.
                    return _Selection(unit_offset, picked=kept, records=records)
                kept.append(found[i])
                if new_record:
                    budget -= size
                    last_record = commitlog_offset
            next_offset = found[end - 1][0] + 1
            pos = end
        return _Selection(next_offset, picked=kept, records=records)

    def _scan(
        self,
        make: MessageMaker[_M],
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> tuple[list[_M], int, int]:
        """``_select``, each message made by ``make`` (a filtered selection's from the
        records it read to check the tags)."""
        s = self._select(
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            hashes=hashes,
            wanted=wanted,
        )
        if s.picked is not None and s.records is not None:
            out = [s.records[c].make(o, make) for o, c, _, _ in s.picked]
        else:
            units = s.units()
            out = self._read_pulled(units, make) if units else []
        return out, len(out), s.next_offset

    def _scan_page(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        hashes: frozenset[int] | None,
        wanted: set[str] | None,
    ) -> tuple[RawPage, int, int]:
        """``_select`` for ``pull_page``: the units as they are, no object per message."""
        s = self._select(
            topic,
            queue_id,
            queue_offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            hashes=hashes,
            wanted=wanted,
        )
        if not s.count:
            return RawPage(b""), 0, s.next_offset
        units, offsets = s.page()
        page = RawPage(
            units,
            self.commitlog.view,
            self.settings.store.data_file_size,
            check=self._check_page,
            queue_offsets=offsets,
        )
        return page, s.count, s.next_offset

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is at or after ``timestamp_ms``."""
        self.check_queue(topic, queue_id)
        self.require_derived()
        q = self.cq.find(topic, queue_id)
        if q is None:
            return 0

        def reached(commitlog_offset: int, size: int) -> bool:
            raw = self._record(commitlog_offset, size)[STORE_TIMESTAMP_POS:][:8]
            return int.from_bytes(raw, "big", signed=True) >= timestamp_ms

        return q.first_offset_at_or_after(reached)

    def get_message(self, make: MessageMaker[_M], msg_id: str) -> _M:
        """The message a message id names, made by ``make``; ``MessageNotFoundError``
        when there is none (another group's id, no message at its address)."""
        try:
            group, commitlog_offset = parse_msg_id(msg_id)
        except MessageFormatError as e:
            raise errors.InvalidArgumentError(f"invalid msg_id: {e}") from None
        if group != self.settings.group:
            raise errors.MessageNotFoundError(f"msg_id {msg_id} belongs to group {group}")
        m = self._message_at(commitlog_offset, make)
        if m is None:
            raise errors.MessageNotFoundError(f"no message {msg_id}")
        return m

    def message_at(self, address: int) -> PulledMessage | None:
        """The message at a message address, every field decoded (None: none there)."""
        return self._message_at(address, self.pulled_message)

    def _message_at(self, address: int, make: MessageMaker[_M]) -> _M | None:
        """The message at a message address (a message id's, the key index's), made by
        ``make``: a record's commitlog offset, or inside a batch record the record's
        offset plus the message's index (``broker.batch``). None when no message is
        there, or when what is there does not read as one (``MessageFormatError``)."""
        store = self.store
        if address < store.ledger_begin_pos + BODY_OFFSET or address + 4 > store.committed_pos:
            return None
        try:
            # No size: the address is a client's (a message id), so no entry there is
            # "not found", and only an entry found there and damaged is CORRUPT_ENTRY.
            record, offset = self._record(address), address
        except DLedgerError as e:
            found = self._record_holding(address) if e.code is _OUT_OF_RANGE else None
            if found is None:
                return None
            record, offset = found
        try:
            decoded = _Decoded.of(record)
            i = address - offset
            if decoded.offset != offset or decoded.head.topic == SYS_TOPIC:
                return None
            if not 0 <= i < decoded.count:
                return None
            return decoded.make(decoded.head.queue_offset + i, make)
        except MessageFormatError:
            return None

    def _record_holding(self, address: int) -> tuple[memoryview, int] | None:
        """The committed record (and its commitlog offset) that holds ``address``, which
        is not a record's start: a batch record's, maybe (a binary search of the log)."""
        store = self.store
        index = last_index_within(store, address, store.committed_index)
        if index < store.ledger_begin_index:
            return None
        meta = store.get_meta(index)
        offset = meta.pos + BODY_OFFSET
        try:
            return self._record(offset, meta.size - BODY_OFFSET), offset
        except DLedgerError:
            return None

    def query_by_key(
        self, make: MessageMaker[_M], topic: str, key: str, max_results: int = 64
    ) -> list[_M]:
        """The messages of ``topic`` whose KEYS or UNIQ_KEY is ``key``, oldest first, made
        by ``make``: at most ``max_results``, and past the first, as many as keep their
        stored bytes within ``max_response_bytes``."""
        t = self.topics.get(topic)
        limit = self.settings.limits.max_key_query_results
        if not 1 <= max_results <= limit:
            raise errors.InvalidArgumentError(f"max must be 1..{limit}")
        # The key index holds every message's keys, whatever became of its topic: a
        # message before the current incarnation's create entry belongs to a deleted one.
        store = self.store
        floor = -1
        if t.created_index >= store.ledger_begin_index:
            floor = store.get_meta(t.created_index).pos

        out: list[_M] = []
        budget = self.settings.limits.max_response_bytes

        def take(
            h: RecordHead, queue_offset: int, address: int, body: memoryview, raw: memoryview
        ) -> bool:
            """Add the message to ``out`` (made by ``make``) if it is of ``topic`` and
            carries the key (the index may return hash collisions); False once the
            response budget is spent: fewer than asked."""
            nonlocal budget
            if h.topic != topic:
                return True
            if key not in tags_and_keys(raw)[1]:  # KEYS and UNIQ_KEY
                return True
            size = stored_size(h, body, raw)
            if out and size > budget:
                return False
            out.append(make(h, queue_offset, address, body, raw))
            budget -= size
            return True

        self.require_derived()
        for commitlog_offset in self.keys.query(key, max_results * 2):
            if commitlog_offset <= floor:
                continue
            if self._message_at(commitlog_offset, take) is False or len(out) >= max_results:
                break
        return out
