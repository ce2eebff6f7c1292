"""The PROPERTIES block of a message record (docs/formats.md "Message"), and the error
every part of the record codec raises.

Invariants:
- PROPERTIES are ``name\\x01value\\x02`` pairs (UTF-8); names are non-empty and unique,
  and neither names nor values contain ``\\x01``/``\\x02``;
- TAGS, KEYS (space-separated) and UNIQ_KEY are RocketMQ's; PRODUCER_ID/PRODUCER_SEQ/
  BATCH_INDEX/BATCH_SIZE are the broker's producer-session properties, INNER_NUM a
  batch record's message count and INNER_BASE its first message's queue offset
  (RocketMQ's, ``broker.batch``). All of them are
  ``SYSTEM_PROPERTIES``: a producer may not set them itself.

The lowest of the codec modules: ``broker.message`` (the record) and ``broker.msgid``
build on it, and ``broker.message`` re-exports its names, so callers import the whole
record format from there.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping, Sequence
from typing import Final, TypeAlias

__all__ = [
    "BROKER_PROPERTIES",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "PROP_BATCH_INDEX",
    "PROP_BATCH_SIZE",
    "PROP_INNER_BASE",
    "PROP_INNER_NUM",
    "PROP_KEYS",
    "PROP_PRODUCER_ID",
    "PROP_PRODUCER_SEQ",
    "PROP_TAGS",
    "PROP_UNIQ_KEY",
    "SYSTEM_PROPERTIES",
    "Buffer",
    "MessageFormatError",
    "add_session",
    "decode_properties",
    "encode_properties",
    "index_keys",
    "inner_properties",
    "message_properties",
    "split_keys",
    "tags_and_keys",
]

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap


class MessageFormatError(ValueError):
    """A message record, property block or message id that violates the format."""


NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

PROP_TAGS: Final = "TAGS"
PROP_KEYS: Final = "KEYS"
PROP_UNIQ_KEY: Final = "UNIQ_KEY"
PROP_PRODUCER_ID: Final = "PRODUCER_ID"
PROP_PRODUCER_SEQ: Final = "PRODUCER_SEQ"
PROP_BATCH_INDEX: Final = "BATCH_INDEX"
PROP_BATCH_SIZE: Final = "BATCH_SIZE"
PROP_INNER_NUM: Final = "INNER_NUM"  # a batch record's message count (``broker.batch``)
PROP_INNER_BASE: Final = "INNER_BASE"  # a batch record's first queue offset (``broker.batch``)
SYSTEM_PROPERTIES: Final = frozenset(
    {
        PROP_TAGS,
        PROP_KEYS,
        PROP_UNIQ_KEY,
        PROP_PRODUCER_ID,
        PROP_PRODUCER_SEQ,
        PROP_BATCH_INDEX,
        PROP_BATCH_SIZE,
        PROP_INNER_NUM,
        PROP_INNER_BASE,
    }
)
# Set by the broker on the copies it writes (dead letters: broker/pop/applier.py; delay
# messages: broker/timers/applier.py) and shown to consumers, but never taken from a
# producer: each one tells an applier what a record ends.
BROKER_PROPERTIES: Final = frozenset(
    {
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_QUEUE_ID",
        "DLQ_ORIGIN_QUEUE_OFFSET",
        "DLQ_ORIGIN_MSG_ID",
        "DELIVERY_ATTEMPTS",
        "POP_EPOCH",
        "TIMER_DELIVER_MS",
        "TIMER_ORIGIN",
        "REAL_TOPIC",
        "REAL_QID",
        "TIMER_SHARDING_KEY",
        "TX_PRODUCER_GROUP",
        "TX_CHECK_AT",
        "TX_ORIGIN",
    }
)
_KEY_SEPARATOR: Final = " "


def _bad_property(name: str, value: str) -> str | None:
    """Why the pair cannot be encoded, or None. The slow path, run only on failure."""
    if not name:
        return "PROPERTIES: empty property name"
    for what, text in (("name", name), ("value", value)):
        for sep in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR):
            if sep in text:
                return f"PROPERTIES: property {what} {text!r} contains the separator {sep!r}"
    return None


def message_properties(
    user: Mapping[str, str],
    *,
    tags: str | None,
    keys: Sequence[str],
    uniq_key: str,
    session: tuple[str, int, int, int] | None = None,
) -> dict[str, str]:
    """A message's properties: the user's, then TAGS, KEYS, UNIQ_KEY and, for a producer
    session, (producer id, sequence, index in the batch, batch size)."""
    props = inner_properties(user, tags=tags, keys=keys)
    props[PROP_UNIQ_KEY] = uniq_key
    if session is not None:
        add_session(props, session)
    return props


def add_session(props: dict[str, str], session: tuple[str, int, int, int]) -> None:
    """The producer-session properties of (producer id, sequence, index in the batch,
    batch size), into ``props``."""
    pid, seq, index_in_batch, size = session
    props[PROP_PRODUCER_ID] = pid
    props[PROP_PRODUCER_SEQ] = str(seq)
    props[PROP_BATCH_INDEX] = str(index_in_batch)
    props[PROP_BATCH_SIZE] = str(size)


def inner_properties(
    user: Mapping[str, str], *, tags: str | None, keys: Sequence[str]
) -> dict[str, str]:
    """A batched message's properties (``broker.batch``): the user's, TAGS and KEYS; no
    UNIQ_KEY (its message id names it) and no session properties (the record has them)."""
    props = dict(user)
    if tags:
        props[PROP_TAGS] = tags
    if keys:
        props[PROP_KEYS] = " ".join(keys)
    return props


def encode_properties(props: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for every pair, UTF-8 (not length-checked; see encode_message).

    Raises ``MessageFormatError`` for an empty name or a name/value holding a separator.
    """
    if not props:
        return b""
    text = "".join([f"{k}\x01{v}\x02" for k, v in props.items()])
    # One count per separator checks every name and value at once: exactly one \x01 and
    # one \x02 per pair means none was smuggled inside a name or a value.
    n = len(props)
    if (
        text.count(NAME_VALUE_SEPARATOR) != n
        or text.count(PROPERTY_SEPARATOR) != n
        or ("" in props)
    ):
        for k, v in props.items():
            reason = _bad_property(k, v)
            if reason:
                raise MessageFormatError(reason)
    try:
        return text.encode()
    except UnicodeEncodeError as e:  # lone surrogates
        raise MessageFormatError(f"PROPERTIES: not encodable as UTF-8 ({e.reason})") from None


def decode_properties(raw: Buffer) -> dict[str, str]:
    """The inverse of ``encode_properties``.

    Strict, because every record was written by ``encode_properties``: each pair must be
    ``name\\x01value`` with a non-empty, unique name. The final ``\\x02`` is optional, as
    in RocketMQ's ``string2messageProperties``.
    """
    if not raw:
        return {}
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise MessageFormatError(
            f"PROPERTIES: not valid UTF-8 ({e.reason} at byte {e.start})"
        ) from None
    items = text.split(PROPERTY_SEPARATOR)
    if not items[-1]:
        items.pop()
    try:
        props = dict([item.split(NAME_VALUE_SEPARATOR) for item in items])
    except ValueError:
        bad = next(i for i in items if i.count(NAME_VALUE_SEPARATOR) != 1)
        raise MessageFormatError(
            f"PROPERTIES: pair {bad!r} is not name\\x01value with one separator"
        ) from None
    if len(props) != len(items) or "" in props:
        raise MessageFormatError("PROPERTIES: empty or duplicate property name")
    return props


def split_keys(keys: str | None) -> list[str]:
    # RocketMQ's IndexService splits KEYS on a single space and skips empty pieces.
    return [k for k in keys.split(_KEY_SEPARATOR) if k] if keys else []


def index_keys(props: Mapping[str, str]) -> list[str]:
    """Every key to index: KEYS split on spaces, then UNIQ_KEY (no duplicates)."""
    keys = split_keys(props.get(PROP_KEYS))
    uniq = props.get(PROP_UNIQ_KEY)
    if uniq and uniq not in keys:
        keys.append(uniq)
    return keys


def tags_and_keys(properties_raw: Buffer) -> tuple[str | None, list[str]]:
    """TAGS and every key to index (``index_keys``)."""
    props = decode_properties(properties_raw)
    return props.get(PROP_TAGS), index_keys(props)
