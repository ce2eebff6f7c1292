"""Produce in the record format (docs/http.md "Produce in the record format"):
the request's body is RocketMQ's batch encoding of its messages, inner records back to
back (``broker.batch``), which the client built; the broker checks them and stores them
as they came, the BODY of one batch record per run (``encode_inner_batch``).

``parse_inner_batch`` checks a body once, with one walk and no ``NewMessage`` per
message: the framing (``batch.inner_records``), each BODYCRC (0, as RocketMQ's client
writes it, or ``crc32(BODY) & 0x7FFFFFFF``, then verified and stored as 0), each
message's limits (body, properties as stored, keys), its properties (strict
``name\\x01value\\x02`` UTF-8, no name the broker owns: the message id, sessions and
batches are the broker's), and the request's (message count, bytes). Any failure is
``InvalidArgumentError`` or ``PayloadTooLargeError`` naming the first bad inner record;
nothing is written.

``InnerBatch`` is what ``Producer.produce`` takes in place of a list of ``NewMessage``:
a sequence of the request's messages whose slices (a retry's missing tail) share the
checked buffer. A run of one message, and a node without batch records, store the
messages as single records (``InnerBatch.message``: decoded then, as a JSON produce's).

Invariants:
- ``starts`` holds ``len + 1`` increasing offsets into ``buf``: message ``i`` is
  ``buf[starts[i]:starts[i + 1]]``, a checked inner record whose BODYCRC is 0;
- every message of the request goes to one queue: ``queue_id``, else the queue of
  ``sharding_key``, else one round-robin pick.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import overload

from . import errors
from .batch import encode_batch_body, inner_records, queue_runs
from .commitlog import OutgoingMessage
from .encode import NewMessage, SelectQueues, Session, encode_request, reserved_in_record
from .message import PROP_KEYS, PROP_TAGS, MessageFormatError
from .metadata import TopicMeta
from .properties import decode_properties
from .settings import Limits

MEDIA_TYPE = "application/vnd.ledgermq.batch"
_CRC_AT = 8  # an inner record's BODYCRC: after TOTALSIZE and MAGICCODE
_U32 = struct.Struct(">I")
_ZERO = bytes(4)


@dataclass(frozen=True, slots=True)
class InnerBatch(Sequence[NewMessage]):
    """A record-format request's messages (see the module doc); its items decode as
    ``NewMessage`` only when asked (a single record, a node without batch records)."""

    buf: bytes
    starts: tuple[int, ...]
    queue_id: int | None = None
    sharding_key: str | None = None
    body_bytes: int = 0  # the request's bodies, for its metrics (a slice keeps them)

    def __len__(self) -> int:
        return len(self.starts) - 1

    @overload
    def __getitem__(self, i: int) -> NewMessage: ...

    @overload
    def __getitem__(self, i: slice) -> InnerBatch: ...

    def __getitem__(self, i: int | slice) -> NewMessage | InnerBatch:
        if isinstance(i, slice):
            first, last, step = i.indices(len(self))
            if step != 1:
                raise ValueError("an InnerBatch slices with step 1 only")
            last = max(first, last)
            return InnerBatch(
                self.buf,
                self.starts[first : last + 1],
                self.queue_id,
                self.sharding_key,
                self.body_bytes,
            )
        return self.message(range(len(self))[i])

    def __iter__(self) -> Iterator[NewMessage]:
        return (self.message(i) for i in range(len(self)))

    def sizes(self) -> list[int]:
        """Each message's inner record size."""
        s = self.starts
        return [s[i + 1] - s[i] for i in range(len(s) - 1)]

    def inner(self, first: int, last: int) -> memoryview:
        """Messages ``first``..``last - 1`` as they are stored: a batch record's BODY."""
        return memoryview(self.buf)[self.starts[first] : self.starts[last]]

    def message(self, i: int) -> NewMessage:
        """Message ``i`` decoded (checked by ``parse_inner_batch``)."""
        at = self.starts[i]
        (r,) = inner_records(self.buf, at, self.starts[i + 1])
        props = decode_properties(self.buf[r.props_at : r.props_at + r.props_len])
        tags, keys = props.pop(PROP_TAGS, None), props.pop(PROP_KEYS, "")
        return NewMessage(
            body=self.buf[r.body_at : r.body_at + r.body_len],
            tags=tags,
            keys=tuple(keys.split()),
            properties=props,
            queue_id=self.queue_id,
            sharding_key=self.sharding_key,
        )


def parse_inner_batch(
    raw: bytes, limits: Limits, *, queue_id: int | None = None, sharding_key: str | None = None
) -> InnerBatch:
    """The checked messages of a record-format body (see the module doc)."""
    try:
        records = inner_records(raw, 0, len(raw))
    except MessageFormatError as e:
        raise errors.InvalidArgumentError(f"record format: {e}") from None
    if len(records) > limits.max_messages_per_request:
        raise errors.PayloadTooLargeError(
            f"{len(records)} messages, over the limit of {limits.max_messages_per_request}"
        )
    zeroed: bytearray | None = None
    starts = [0]
    at = total = 0
    max_body, max_props, max_keys = (
        limits.max_body_bytes,
        limits.max_properties_bytes,
        limits.max_keys_per_message,
    )
    crc32, unpack_crc = zlib.crc32, _U32.unpack_from
    for i, r in enumerate(records):
        body_end = r.body_at + r.body_len
        if r.body_len > max_body:
            raise errors.PayloadTooLargeError(
                f"inner record {i}: body of {r.body_len} bytes, over {max_body}"
            )
        total += r.body_len
        if r.props_len > max_props:
            raise errors.PayloadTooLargeError(
                f"inner record {i}: properties of {r.props_len} bytes, over the limit of"
                f" {max_props}"
            )
        (crc,) = unpack_crc(raw, at + _CRC_AT)
        if crc:
            if crc != crc32(raw[r.body_at : body_end]) & 0x7FFF_FFFF:
                raise errors.InvalidArgumentError(
                    f"inner record {i}: BODYCRC {crc:#010x} is not crc32(BODY) & 0x7FFFFFFF"
                )
            if zeroed is None:
                zeroed = bytearray(raw)  # stored as RocketMQ's client writes it: 0
            zeroed[at + _CRC_AT : at + _CRC_AT + 4] = _ZERO
        if r.props_len:
            _check_properties(i, raw[r.props_at : r.props_at + r.props_len], max_keys)
        at += r.size
        starts.append(at)
    if total > limits.max_request_bytes:
        raise errors.PayloadTooLargeError(
            f"request of {total} bytes, over the limit of {limits.max_request_bytes}"
        )
    buf = raw if zeroed is None else bytes(zeroed)
    return InnerBatch(buf, tuple(starts), queue_id, sharding_key, total)


def _check_properties(i: int, block: bytes, max_keys: int) -> None:
    try:
        props = decode_properties(block)
    except MessageFormatError as e:
        raise errors.InvalidArgumentError(f"inner record {i}: {e}") from None
    for name in props:
        if reserved_in_record(name):
            raise errors.InvalidArgumentError(f"inner record {i}: property {name} is reserved")
    keys = props.get(PROP_KEYS)
    if keys is not None:
        split = keys.split(" ")
        if len(split) > max_keys or not all(split):
            raise errors.InvalidArgumentError(
                f"inner record {i}: KEYS: at most {max_keys} keys, separated by one space"
            )
    tags = props.get(PROP_TAGS)
    if tags is not None and not tags:
        raise errors.InvalidArgumentError(f"inner record {i}: TAGS is empty")


def encode_inner_batch(
    topic: TopicMeta,
    batch: InnerBatch,
    *,
    session: Session | None,
    first_in_batch: int,
    now: int,
    store_host: tuple[str, int],
    uniq_key: Callable[[], str],
    limits: Limits,
    batch_records: bool,
    select_queues: SelectQueues,
    max_record_bytes: int | None = None,
) -> list[OutgoingMessage]:
    """``encode_request`` for a record-format request: the queue picked once, each run
    of inner records that fits one entry (``max_record_bytes``) stored as it came, as
    the BODY of a batch record; a run of one message, or every message on a node
    without batch records, a single record of its own (decoded, as a JSON produce's)."""
    n = len(batch)
    if batch.queue_id is not None and not 0 <= batch.queue_id < topic.queues:
        raise errors.InvalidArgumentError(
            f"queue_id {batch.queue_id} is not in 0..{topic.queues - 1}"
        )
    (qid,) = select_queues([(batch.queue_id, batch.sharding_key)])

    def singles(first: int, last: int) -> list[OutgoingMessage]:
        return encode_request(
            topic,
            [replace(batch[i], queue_id=qid, sharding_key=None) for i in range(first, last)],
            session=session,
            first_in_batch=first_in_batch + first,
            now=now,
            store_host=store_host,
            uniq_key=uniq_key,
            limits=limits,
            batch_records=False,
            select_queues=select_queues,
        )

    if not batch_records or n == 1:
        return singles(0, n)
    out: list[OutgoingMessage] = []
    for i, j in queue_runs([qid] * n, [False] * n, batch.sizes(), max_record_bytes):
        if j - i == 1:
            out += singles(i, j)
            continue
        record = encode_batch_body(
            topic.name,
            batch.inner(i, j),
            j - i,
            session=None
            if session is None
            else (session[0], session[1], first_in_batch + i, session[2]),
            timestamp=now,
            store_host=store_host,
        )
        out.append(OutgoingMessage(record, qid, count=j - i))
    return out
