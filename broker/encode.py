"""The encoding of a produce request, as pure functions: the messages a producer sent,
checked against the node's limits, become the records the commit log appends
(``OutgoingMessage``: one message each, or a batch record for each run of messages bound
for one queue, ``broker.batch``).

Nothing here reads a clock, draws a random key or keeps state: the store time, the
UNIQ_KEY source and the round-robin choice of a queue come in as arguments. ``Producer``
(``broker/produce.py``) passes the wall clock, random keys and its commit log's queue
selection; the broker simulation drives that same ``Producer`` with its own clock and
keys, so a change here is a change the simulation checks.

Errors are the client's (``InvalidArgumentError``, ``PayloadTooLargeError``), named by
the message's index in its producer batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from . import errors
from .batch import INNER_MIN_SIZE, encode_batch_record, queue_runs
from .commitlog import OutgoingMessage
from .message import (
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    SYSTEM_PROPERTIES,
    MessageFormatError,
    encode_message,
    encode_properties,
    message_properties,
)
from .metadata import TopicMeta
from .properties import BROKER_PROPERTIES, inner_properties
from .settings import Limits

_PROPERTY_NAME_RESERVED = (
    SYSTEM_PROPERTIES | BROKER_PROPERTIES | {PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY}
)
_INNER_RESERVED = _PROPERTY_NAME_RESERVED - {PROP_TAGS, PROP_KEYS}


def reserved_in_record(name: str) -> bool:
    """May an inner record a client built (``broker.records``) not hold property
    ``name``? TAGS and KEYS it holds; the message id, sessions and batches are the
    broker's, as are the properties of its copies."""
    return name in _INNER_RESERVED


Session = tuple[str, int, int]
"""(producer id, sequence, batch size): what each message of a session batch records."""
SelectQueues = Callable[[Sequence[tuple[int | None, str | None]]], list[int]]
"""The queue of each ``(queue_id, sharding_key)`` of a request, one round-robin pick for
all its unpinned messages (``DLedgerCommitLog.select_queues(topic, ..., sticky=True)``)."""


@dataclass(slots=True)
class NewMessage:
    """A message a producer hands the broker, before it is encoded (an ``OutgoingMessage``)
    and stored (a ``StoredMessage`` once decoded)."""

    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    sharding_key: str | None = None
    born_timestamp: int | None = None
    deliver_at_ms: int | None = None  # a delay message (broker/timers): its time
    uniq_key: str | None = None  # kept, not drawn: a delay message's copy keeps its own


def validate_messages(messages: Sequence[NewMessage], limits: Limits) -> None:
    """Refuse a request no node would take: empty, over a limit, a bad key, a reserved
    property name."""
    if not messages:
        raise errors.InvalidArgumentError("no messages")
    if len(messages) > limits.max_messages_per_request:
        raise errors.PayloadTooLargeError(
            f"{len(messages)} messages, over the limit of {limits.max_messages_per_request}"
        )
    total = 0
    for i, m in enumerate(messages):
        if len(m.body) > limits.max_body_bytes:
            raise errors.PayloadTooLargeError(
                f"message {i}: body of {len(m.body)} bytes, over {limits.max_body_bytes}"
            )
        total += len(m.body)
        if len(m.keys) > limits.max_keys_per_message:
            raise errors.InvalidArgumentError(
                f"message {i}: over {limits.max_keys_per_message} keys"
            )
        for k in m.keys:
            if not k or " " in k or "\x01" in k or "\x02" in k:
                raise errors.InvalidArgumentError(f"message {i}: invalid key {k!r}")
        for name in m.properties:
            if name in _PROPERTY_NAME_RESERVED:
                raise errors.InvalidArgumentError(f"message {i}: property {name} is reserved")
    if total > limits.max_request_bytes:
        raise errors.PayloadTooLargeError(
            f"request of {total} bytes, over the limit of {limits.max_request_bytes}"
        )


def encode_request(
    topic: TopicMeta,
    messages: Sequence[NewMessage],
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
    """The records of ``messages``, stored at ``now`` (ms) by ``store_host``. They are
    messages ``first_in_batch``... of ``session``'s batch (a retry appends the batch's
    missing tail). With ``batch_records`` (and more than one message) each run bound for
    one queue is one batch record (``select_queues`` picks the queues), several when its
    inner records pass ``max_record_bytes`` (what one entry of the log holds); else every
    message is its own record, its queue picked when offsets are assigned. Each single
    record draws one ``uniq_key()``, in message order."""
    r = _Request(topic, session, now, store_host, uniq_key, limits)
    if batch_records and len(messages) > 1:
        return _encode_batched(r, messages, first_in_batch, select_queues, max_record_bytes)
    return [_encode_single(r, m, first_in_batch + i) for i, m in enumerate(messages)]


@dataclass(slots=True)
class _Request:
    """What every record of one request shares (not frozen: one per request, cheap)."""

    topic: TopicMeta
    session: Session | None
    now: int
    store_host: tuple[str, int]
    uniq_key: Callable[[], str]
    limits: Limits

    def session_of(self, index_in_batch: int) -> tuple[str, int, int, int] | None:
        """(producer id, sequence, index in the batch, batch size) of one message."""
        s = self.session
        return None if s is None else (s[0], s[1], index_in_batch, s[2])


def _checked_properties(
    r: _Request, m: NewMessage, index_in_batch: int, props: dict[str, str]
) -> bytes:
    """``props`` encoded, within ``max_properties_bytes``, and the message's pinned
    queue checked: what every message of a request must pass."""
    lim = r.limits
    try:
        raw_props = encode_properties(props)
    except MessageFormatError as e:
        raise errors.InvalidArgumentError(f"message {index_in_batch}: {e}") from None
    if len(raw_props) > lim.max_properties_bytes:
        raise errors.PayloadTooLargeError(
            f"message {index_in_batch}: properties of {len(raw_props)} bytes as stored"
            f" (TAGS, KEYS and the broker's own included), over the limit of"
            f" {lim.max_properties_bytes}"
        )
    check_pinned_queue(m, index_in_batch, r.topic.queues)
    return raw_props


def check_pinned_queue(m: NewMessage, index_in_batch: int, queues: int) -> None:
    """``InvalidArgumentError`` unless the message's pinned queue (if any) is one of the
    topic's ``queues``."""
    if m.queue_id is not None and not 0 <= m.queue_id < queues:
        raise errors.InvalidArgumentError(
            f"message {index_in_batch}: queue_id {m.queue_id} is not in 0..{queues - 1}"
        )


def _encode_single(
    r: _Request, m: NewMessage, index_in_batch: int, *, queue_id: int | None = None
) -> OutgoingMessage:
    """One message as its own record; ``queue_id``: the queue picked already."""
    drawn = r.uniq_key()  # (drawn for every record, a kept key or not: in message order)
    props = message_properties(
        m.properties,
        tags=m.tags,
        keys=m.keys,
        uniq_key=drawn if m.uniq_key is None else m.uniq_key,
        session=r.session_of(index_in_batch),
    )
    raw_props = _checked_properties(r, m, index_in_batch, props)
    record = encode_message(
        topic=r.topic.name,
        body=m.body,
        properties=raw_props,
        born_timestamp=m.born_timestamp if m.born_timestamp is not None else r.now,
        store_timestamp=r.now,
        store_host=r.store_host,
    )
    if queue_id is not None:
        return OutgoingMessage(record, queue_id)
    return OutgoingMessage(record, m.queue_id, m.sharding_key)


def _encode_batched(
    r: _Request,
    messages: Sequence[NewMessage],
    first_in_batch: int,
    select_queues: SelectQueues,
    max_record_bytes: int | None,
) -> list[OutgoingMessage]:
    """The request as batch records (``broker.batch``): each run of consecutive
    messages bound for one queue becomes one record, a run of one (or a message with
    its own born time, which an inner record cannot hold) a single record. Unpinned
    messages share one round-robin queue (``select_queues``)."""
    raw = [
        _checked_properties(
            r, m, first_in_batch + i, inner_properties(m.properties, tags=m.tags, keys=m.keys)
        )
        for i, m in enumerate(messages)
    ]
    qids = select_queues([(m.queue_id, m.sharding_key) for m in messages])
    out: list[OutgoingMessage] = []
    alone = [m.born_timestamp is not None or m.uniq_key is not None for m in messages]
    sizes = [INNER_MIN_SIZE + len(m.body) + len(p) for m, p in zip(messages, raw, strict=True)]
    for i, j in queue_runs(qids, alone, sizes, max_record_bytes):
        if j - i == 1:
            out.append(_encode_single(r, messages[i], first_in_batch + i, queue_id=qids[i]))
            continue
        record = encode_batch_record(
            r.topic.name,
            [(m.body, p) for m, p in zip(messages[i:j], raw[i:j], strict=True)],
            session=r.session_of(first_in_batch + i),
            timestamp=r.now,
            store_host=r.store_host,
        )
        out.append(OutgoingMessage(record, qids[i], count=j - i))
    return out
