"""What the walk hands the appliers: one committed entry decoded once (``Committed``,
RocketMQ's ``DispatchRequest``), and what an applier is (its ``CommitLogDispatcher``).

Two kinds of applier, told apart by where they are registered (``Dispatch``):

- a ``StateApplier`` holds replicated state (topics and group offsets, producer
  sessions): a deterministic function of the committed entries in log order. The walk
  hands it each entry exactly once: only entries above ``MetadataState.applied_index``
  (a restart replays the entries an older snapshot lacks, and no others). It reads time
  from the entries (``store_timestamp``, stamped by the master), never from the node's
  clock, does no I/O and never raises on what the log holds (logged and skipped, alike
  on every replica): every replica reaches the same state. Its part of the metadata
  snapshot (``snapshot_part``, ``parse_part``, ``adopt_part``) is what a restart and a
  follower behind the log head start from (``broker/dispatch/snapshots.py``);
- a plain ``Applier`` builds derived files (the consume queues, the key index): it
  gets every entry the walk reads, a replay's too, and is idempotent by position. The
  dispatch checkpoint records how far its files go, and a restart cuts them back to it
  or rebuilds them from the log (``broker/dispatch/recovery.py``). It may raise
  ``OSError`` (a full disk): the entry then stays undispatched and is handed to every
  ``Applier`` again (not to the state appliers, which have it) until it goes through.

Invariants of a ``Committed``: a message record (NOOPs and entries that are not message
records reach no applier: the walk logs and skips them) whose PHYSICALOFFSET is its
``pos + 48``; its properties, every message's tags hash and keys were decoded here, once.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from consumequeue import tags_hash
from dledger.store import BODY_OFFSET, MAGIC_NORMAL

from ..batch import INNER_BATCH_FLAG, InnerRecord, batch_inners
from ..jsonint import decimal
from ..message import (
    PROP_TAGS,
    MessageFormatError,
    RecordHead,
    decode_head,
    decode_message,
    decode_properties,
    tags_and_keys,
)
from ..metadata import SYS_TOPIC, TIMER_TOPIC
from ..properties import index_keys

PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # a delay message's time (broker/timers)

P = TypeVar("P")

ENTRY_HEAD = struct.Struct(">iiqqq")  # magic, size, index, term, pos (docs/formats.md)


_UNPARSED: Any = object()


@dataclass(slots=True)  # not frozen: that costs 1 us more per entry, and none changes it
class Committed:
    """One committed message record, as every applier sees it."""

    index: int
    pos: int
    size: int  # the entry's, header included
    raw: bytes  # the read the entry lies in
    body_at: int  # where its message record starts in ``raw``
    info: RecordHead
    system: bool  # a ``%SYS%META`` operation: it goes to no queue and has no keys
    inners: list[InnerRecord] | None  # a batch record's messages; None: one message
    props: dict[str, str]  # the record's properties (a batch record's outer block)
    tags_hashes: Sequence[int]  # one per message, at queue offsets info.queue_offset + i
    keys: Sequence[tuple[int, list[str]]]  # (commitlog offset, keys) of each message with keys
    _operation: Any = _UNPARSED  # a system record's body, parsed once (``operation``)

    @property
    def commitlog_offset(self) -> int:
        return self.pos + BODY_OFFSET

    @property
    def count(self) -> int:
        """How many messages it holds."""
        return 1 if self.inners is None else len(self.inners)

    def body(self) -> bytes:
        return decode_message(self.raw, self.body_at, verify_crc=False).body

    def operation(self) -> Any:
        """A ``%SYS%META`` record's operation, its JSON body parsed once for every
        applier; ``orjson.JSONDecodeError`` (each time) when it is not JSON."""
        if self._operation is _UNPARSED:
            try:
                self._operation = orjson.loads(self.body())
            except orjson.JSONDecodeError as e:
                self._operation = e
        if isinstance(self._operation, orjson.JSONDecodeError):
            raise self._operation
        return self._operation


def decode(  # noqa: PLR0917 - the entry header's fields, as the walk unpacks them
    raw: bytes, off: int, magic: int, index: int, pos: int, size: int
) -> Committed:
    """The entry at ``raw[off:]`` (its header's fields given); ``MessageFormatError`` when
    it is not a message record this node can dispatch."""
    if magic != MAGIC_NORMAL:
        raise MessageFormatError(f"entry magic {magic}")
    body_at = off + BODY_OFFSET
    info = decode_head(raw, body_at)
    commitlog_offset = pos + BODY_OFFSET
    if info.physical_offset != commitlog_offset:
        raise MessageFormatError(
            f"PHYSICALOFFSET {info.physical_offset} is not pos + 48 = {commitlog_offset}"
        )
    inners = batch_inners(raw, body_at)[1] if info.sys_flag & INNER_BATCH_FLAG else None
    if info.topic == SYS_TOPIC:
        return Committed(index, pos, size, raw, body_at, info, True, inners, {}, (), ())
    props = decode_properties(raw[info.props_at : info.props_at + info.props_len])
    if inners is None:
        keys = index_keys(props)
        if info.topic == TIMER_TOPIC:  # its unit's tag code is its time (broker/timers)
            units: tuple[int] = (_deliver_ms(props),)
        else:
            units = (tags_hash(props.get(PROP_TAGS)),)
        found = ((commitlog_offset, keys),) if keys else ()
        return Committed(index, pos, size, raw, body_at, info, False, None, props, units, found)
    # A batch record (``broker.batch``): message i's keys at address commitlog_offset + i,
    # and its own tags hash.
    hashes: list[int] = []
    all_keys: list[tuple[int, list[str]]] = []
    for i, r in enumerate(inners):
        if not r.props_len:
            hashes.append(0)  # tags_hash(None)
            continue
        tags, msg_keys = tags_and_keys(raw[r.props_at : r.props_at + r.props_len])
        if msg_keys:
            all_keys.append((commitlog_offset + i, msg_keys))
        hashes.append(tags_hash(tags))
    return Committed(index, pos, size, raw, body_at, info, False, inners, props, hashes, all_keys)


def _deliver_ms(props: Mapping[str, str]) -> int:
    raw = props.get(PROP_TIMER_DELIVER_MS, "")
    return decimal(raw) or 0


class Applier(Protocol):
    """Builds one kind of state from committed entries (RocketMQ's ``CommitLogDispatcher``;
    the module docstring says what each kind may and must do)."""

    def apply(self, e: Committed) -> None:
        """Take one committed entry, in index order."""
        ...


class StateApplier(Applier, Protocol[P]):
    """An applier of replicated state, with its part of the metadata snapshot: a few
    top-level fields of the snapshot's JSON object, of names no other part uses."""

    def snapshot_part(self) -> dict[str, Any]:
        """Its fields, as of the last entry applied."""
        ...

    def parse_part(self, doc: Mapping[str, Any]) -> P:
        """Its fields read from a snapshot (``doc``: the whole object), changing nothing;
        any malformed field is a ``KeyError``, ``TypeError``, ``ValueError`` or
        ``AttributeError``. An applier added later reads a snapshot written before it
        existed (without its fields) as its empty state, not as an error."""
        ...

    def adopt_part(self, part: P) -> None:
        """Become what ``parse_part`` read (a restart, a leader's snapshot)."""
        ...
