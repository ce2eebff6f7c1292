"""The client's side of the binary fetch (docs/http.md "Pull in the record format"): a
pull answered as a record page, ``Accept: application/vnd.ledgermq.records``, decoded
lazily.

The page (docs/formats.md "Record pages"), big-endian: a 40-byte header (magic ``LMQR``,
version 1, status code, msg id prefix length, next_offset, min_offset, max_offset,
message count, records bytes), the msg id prefix (ASCII), one 16-byte entry per message
(queue_offset i64, its record's position in the records area u32, its index in the
record u32: 0 for an ordinary record, the inner message's for a batch record), then the
stored commitlog records back to back.

``decode_page`` checks the framing at once (header, lengths; each record once: it lies
in the records area, has a message record's MAGICCODE, and its TOTALSIZE, BODY, TOPIC
and PROPERTIES lengths add up; a batch record's inner records are walked and checked
the same way) and makes one ``RecordMessage`` per entry, which knows where its body and
properties lie: a ``ReceivedMessage`` whose fields are read from the record when asked
for (the body sliced out; TAGS and KEYS found in the properties block; the whole block
parsed once per distinct block and page when ``properties`` is read; the topic, the
timestamps, the msg id). Properties that are not strict UTF-8 pairs raise
``RecordPageError`` when read.

Invariants:
- a ``RecordMessage`` equals (``==``) the ``ReceivedMessage`` the JSON pull makes of
  the same message: same topic, queue, offsets, msg id, body bytes, key, keys, tags,
  user properties and timestamps; it hashes and pickles as that message does;
- TAGS and KEYS found alone are what the whole block's parse says, whenever it parses;
- it holds the page's buffer (one ``bytes``) alive, no copy per message until a field
  is read; ``body`` is a fresh ``bytes`` slice on each read.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import LedgerMQError
from .exchange import RECORD_PAGE
from .types import PopMessage, PullResult, ReceivedMessage

__all__ = [
    "MEDIA_TYPE",
    "QueuePage",
    "RecordMessage",
    "RecordPageError",
    "RecordPopMessage",
    "decode_group",
    "decode_page",
    "decode_received",
]

MEDIA_TYPE = RECORD_PAGE
MAGIC = b"LMQR"
VERSION = 1
STATUSES = ("FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL")
HEADER = struct.Struct(">4sBBHqqqII")
ENTRY_SIZE = 16

_MAGIC_CODE = -626843481  # RocketMQ's MESSAGE_MAGIC_CODE V1
_MIN_RECORD = 88 + 1 + 1 + 2  # broker.message.MIN_MESSAGE_SIZE: no body, a 1-byte topic
_HEAD = struct.Struct(">ii28xi44xi")  # TOTALSIZE, MAGICCODE, SYSFLAG (36), BODY length (84)
_QUEUE_ID = struct.Struct(">i")
_PHYSICAL = struct.Struct(">q")
_TIMES = struct.Struct(">q8xq")  # BORNTIMESTAMP at 40, STORETIMESTAMP at 56
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_INNER = struct.Struct(">i12xi")  # an inner record's TOTALSIZE and BODY length
_INNER_MIN = 22
_BATCH_FLAG = 0x80
# The broker's own properties (never the producer's): what ``properties`` leaves out.
_SYSTEM = frozenset(
    {
        "TAGS",
        "KEYS",
        "UNIQ_KEY",
        "PRODUCER_ID",
        "PRODUCER_SEQ",
        "BATCH_INDEX",
        "BATCH_SIZE",
        "INNER_NUM",
        "INNER_BASE",
    }
)


class RecordPageError(LedgerMQError):
    """A record page that does not hold together (a damaged answer, or not one)."""

    CODE = "BAD_RECORD_PAGE"

    def __init__(self, message: str) -> None:
        super().__init__(self.CODE, message)


# (body_at, body_len, props_at, props_len) of a message, positions in the page's buffer.
_Parts = tuple[int, int, int, int]
# (key, keys, tags, user properties) of a PROPERTIES block.
_Props = tuple[str | None, tuple[str, ...], str | None, Mapping[str, str]]


class _Page:
    """What a page's messages share: its buffer, the msg id prefix, and what was read
    once for all of them (each record's parts, a batch record's inner records, the
    parsed property blocks and topics)."""

    __slots__ = ("buf", "prefix", "props", "queue_id", "records", "topics")

    def __init__(self, buf: bytes, prefix: str, queue_id: int | None = None) -> None:
        self.buf = buf
        self.prefix = prefix
        self.queue_id = queue_id  # every record's QUEUEID (a page of many queues' answer)
        # by record position: its parts (ordinary) or its inner records' (batch)
        self.records: dict[int, list[_Parts]] = {}
        self.props: dict[bytes, _Props] = {}
        self.topics: dict[bytes, str] = {}

    def record(self, at: int, end: int) -> list[_Parts]:
        """The parts of the record at ``at`` (the area ends at ``end``), read and checked
        once: one entry for an ordinary record, one per inner record for a batch."""
        got = self.records.get(at)
        if got is not None:
            return got
        buf = self.buf
        if at + _MIN_RECORD > end:
            raise RecordPageError(f"record at {at}: past the records area")
        size, magic_code, sys_flag, body_len = _HEAD.unpack_from(buf, at)
        if magic_code != _MAGIC_CODE or size < _MIN_RECORD or at + size > end:
            raise RecordPageError(
                f"no message record at {at} (MAGICCODE {magic_code}, TOTALSIZE {size})"
            )
        topic_at = at + 88 + body_len
        if body_len < 0 or topic_at + 3 > at + size:
            raise RecordPageError(f"record at {at}: BODY length {body_len} does not fit")
        props_len_at = topic_at + 1 + buf[topic_at]
        if props_len_at + 2 > at + size:
            raise RecordPageError(f"record at {at}: TOPIC does not fit")
        (props_len,) = _U16.unpack_from(buf, props_len_at)
        if props_len_at + 2 + props_len != at + size:
            raise RecordPageError(f"record at {at}: PROPERTIES length disagrees with TOTALSIZE")
        if self.queue_id is not None and _QUEUE_ID.unpack_from(buf, at + 12)[0] != self.queue_id:
            raise RecordPageError(f"record at {at}: not of queue {self.queue_id}")
        if sys_flag & _BATCH_FLAG:
            got = _walk(buf, at + 88, topic_at)
        else:
            got = [(at + 88, body_len, props_len_at + 2, props_len)]
        self.records[at] = got
        return got

    def properties(self, raw: bytes) -> _Props:
        got = self.props.get(raw)
        if got is None:
            got = self.props[raw] = _parse_properties(raw)
        return got

    def topic(self, at: int) -> str:
        buf = self.buf
        (body_len,) = _I32.unpack_from(buf, at + 84)
        topic_at = at + 88 + body_len
        raw = buf[topic_at + 1 : topic_at + 1 + buf[topic_at]]
        topic = self.topics.get(raw)
        if topic is None:
            try:
                topic = self.topics[raw] = raw.decode()
            except UnicodeDecodeError:
                raise RecordPageError(f"record at {at}: TOPIC not UTF-8") from None
        return topic


def _walk(buf: bytes, at: int, end: int) -> list[_Parts]:
    out: list[_Parts] = []
    while at < end:
        if end - at < _INNER_MIN:
            raise RecordPageError(f"inner record at {at}: too short")
        size, body_len = _INNER.unpack_from(buf, at)
        if size < _INNER_MIN or size > end - at or not 0 <= body_len <= size - _INNER_MIN:
            raise RecordPageError(f"inner record at {at}: TOTALSIZE {size} does not fit")
        body_at = at + 20
        (props_len,) = _U16.unpack_from(buf, body_at + body_len)
        if _INNER_MIN + body_len + props_len != size:
            raise RecordPageError(f"inner record at {at}: PROPERTIES length disagrees")
        out.append((body_at, body_len, body_at + body_len + 2, props_len))
        at += size
    return out


def _parse_properties(raw: bytes) -> _Props:
    """RocketMQ's ``name\\x01value\\x02`` pairs: (key, keys, tags, user properties), as
    the JSON pull shows them (KEYS split on spaces, empty pieces dropped)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise RecordPageError(f"PROPERTIES: not UTF-8 ({e.reason})") from None
    items = text.split("\x02")
    if not items[-1]:
        items.pop()  # the last pair's \x02 is optional, as RocketMQ reads it
    try:
        props = dict([item.split("\x01") for item in items])
    except ValueError:
        bad = next(i for i in items if i.count("\x01") != 1)
        raise RecordPageError(f"PROPERTIES: pair {bad!r} is not name\\x01value") from None
    if len(props) != len(items) or "" in props:
        raise RecordPageError("PROPERTIES: an empty or repeated property name")
    tags, raw_keys = props.pop("TAGS", None), props.pop("KEYS", None)
    keys = tuple(filter(None, raw_keys.split(" "))) if raw_keys else ()
    if not props.keys().isdisjoint(_SYSTEM):  # (the producer's own are left)
        for name in props.keys() & _SYSTEM:
            del props[name]
    return (keys[0] if keys else None), keys, tags, props


_FIELDS = (
    "topic",
    "queue_id",
    "queue_offset",
    "msg_id",
    "body",
    "key",
    "keys",
    "tags",
    "properties",
    "born_timestamp",
    "store_timestamp",
)
_set = object.__setattr__
# A message whose properties were looked at once, without a parse (``RecordMessage``).
_LOOKED: Any = object()


class _RecordFields:
    """A record page message's fields, read from its record on first access (see the
    module docstring): what ``RecordMessage`` and ``RecordPopMessage`` share. No slots
    of its own: each of them holds ``_page``, ``_props`` and ``_where``."""

    __slots__ = ()

    _page: _Page
    # record position in the buffer, inner index, queue offset, then where the message's
    # body and properties lie (``_Parts``)
    _where: tuple[int, int, int, int, int, int, int]
    _props: _Props | None  # once parsed; ``_LOOKED`` once a field was found alone

    # ---- the fields -----------------------------------------------------------------------

    @property
    def queue_offset(self) -> int:
        return self._where[2]

    @property
    def queue_id(self) -> int:
        return int(_QUEUE_ID.unpack_from(self._page.buf, self._where[0] + 12)[0])

    @property
    def msg_id(self) -> str:
        at, inner = self._where[0], self._where[1]
        (physical,) = _PHYSICAL.unpack_from(self._page.buf, at + 28)
        return f"{self._page.prefix}{physical + inner:016X}"

    @property
    def topic(self) -> str:
        return self._page.topic(self._where[0])

    @property
    def body(self) -> bytes:
        w = self._where
        return self._page.buf[w[3] : w[3] + w[4]]

    def _properties(self) -> _Props:
        props = self._props
        if props is None or props is _LOOKED:
            w = self._where
            page = self._page
            props = page.properties(page.buf[w[5] : w[5] + w[6]])
            _set(self, "_props", props)
        return props

    @property
    def key(self) -> str | None:
        keys = self.keys
        return keys[0] if keys else None

    @property
    def keys(self) -> tuple[str, ...]:
        if self._props is None:  # the first look at the properties: find KEYS alone
            _set(self, "_props", _LOOKED)
            raw = self._find(b"KEYS\x01")
            return tuple(filter(None, raw.split(" "))) if raw else ()
        return self._properties()[1]  # a second: parse the whole block, once

    @property
    def tags(self) -> str | None:
        if self._props is None:
            _set(self, "_props", _LOOKED)
            return self._find(b"TAGS\x01")
        return self._properties()[2]

    def _find(self, name: bytes) -> str | None:
        """The value of the property ``name`` (with its ``\\x01``), read straight out of
        the message's PROPERTIES block without parsing the rest of it."""
        w, buf = self._where, self._page.buf
        start, end = w[5], w[5] + w[6]
        at = buf.find(name, start, end)
        while at > start and buf[at - 1] != 2:  # (inside another pair: look on)
            at = buf.find(name, at + 1, end)
        if at < 0:
            return None
        value_at = at + len(name)
        stop = buf.find(b"\x02", value_at, end)
        raw = buf[value_at : end if stop < 0 else stop]
        try:
            if b"\x01" not in raw:
                return raw.decode()
        except UnicodeDecodeError:
            pass
        raise RecordPageError(
            f"PROPERTIES of the message at queue offset {w[2]}: the value of"
            f" {name[:-1].decode()} is not UTF-8 or holds a \\x01"
        )

    @property
    def properties(self) -> Mapping[str, str]:
        return dict(self._properties()[3])

    @property
    def born_timestamp(self) -> int:
        return int(_TIMES.unpack_from(self._page.buf, self._where[0] + 40)[0])

    @property
    def store_timestamp(self) -> int:
        return int(_TIMES.unpack_from(self._page.buf, self._where[0] + 40)[1])

    def fields(self) -> tuple[Any, ...]:
        """Every field, in ``ReceivedMessage``'s order (all read now)."""
        self._properties()  # one parse for key, keys, tags and properties
        return tuple(getattr(self, f) for f in _FIELDS)


class RecordMessage(_RecordFields, ReceivedMessage):
    """A message of a record page: its fields read from the record on first access (see
    the module docstring). It compares equal to the ``ReceivedMessage`` of the same
    fields; pickling makes a plain ``ReceivedMessage``."""

    __slots__ = ("_page", "_props", "_where")

    def __init__(self, page: _Page, where: tuple[int, int, int, int, int, int, int]) -> None:
        _set(self, "_props", None)
        _set(self, "_page", page)
        _set(self, "_where", where)

    # ---- as a ReceivedMessage -------------------------------------------------------------

    def plain(self) -> ReceivedMessage:
        """This message as a plain ``ReceivedMessage`` (every field read now; it does
        not hold the page's buffer)."""
        return ReceivedMessage(*self.fields())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage) or type(other) not in (
            ReceivedMessage,
            RecordMessage,
        ):
            return NotImplemented
        return self.fields() == tuple(getattr(other, f) for f in _FIELDS)

    def __hash__(self) -> int:
        return hash(self.plain())

    def __reduce__(self) -> tuple[Any, ...]:
        return ReceivedMessage, self.fields()

    def __repr__(self) -> str:
        return repr(self.plain()).replace("ReceivedMessage(", "RecordMessage(", 1)


_POP_FIELDS = ("receipt_handle", "delivery_attempt", "invisible_until")


class RecordPopMessage(_RecordFields, PopMessage):
    """A message a POP receive answered in the record format (``decode_received``): a
    ``PopMessage`` whose message fields are read from its record on first access, its
    receipt as the answer gave it. It compares equal to the ``PopMessage`` of the same
    fields (the JSON receive's); pickling makes a plain ``PopMessage``."""

    __slots__ = ("_page", "_props", "_where")

    def plain(self) -> PopMessage:
        """This message as a plain ``PopMessage`` (every field read now)."""
        receipt = {f: getattr(self, f) for f in _POP_FIELDS}
        return PopMessage(*self.fields(), **receipt)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PopMessage) or type(other) not in (PopMessage, RecordPopMessage):
            return NotImplemented
        names = (*_FIELDS, *_POP_FIELDS)
        mine = (*self.fields(), *(getattr(self, f) for f in _POP_FIELDS))
        return mine == tuple(getattr(other, f) for f in names)

    def __hash__(self) -> int:
        return hash(self.plain())

    def __reduce__(self) -> tuple[Any, ...]:
        return _pop_message, (self.fields(), {f: getattr(self, f) for f in _POP_FIELDS})

    def __repr__(self) -> str:
        return repr(self.plain()).replace("PopMessage(", "RecordPopMessage(", 1)


def _pop_message(fields: tuple[Any, ...], receipt: dict[str, Any]) -> PopMessage:
    """A plain ``PopMessage`` (what a ``RecordPopMessage`` pickles as: its fields are
    keyword-only past the message's)."""
    return PopMessage(*fields, **receipt)


@dataclass(frozen=True, slots=True)
class RecordPage:
    """A decoded record page: the pull's result, and how big the records area was."""

    result: PullResult
    records_bytes: int


def decode_page(content: bytes | memoryview) -> RecordPage:
    """The pull result a record page holds (see the module docstring); ``RecordPageError``
    if its framing does not hold together."""
    buf = bytes(content)
    return _decode_page(buf, 0, len(buf), RecordMessage)


def _decode_page(
    buf: bytes,
    start: int,
    end: int,
    kind: type[RecordMessage] | type[RecordPopMessage],
    queue_id: int | None = None,
) -> RecordPage:
    """The record page ``buf[start:end]`` (no copy: its messages hold ``buf``), each
    message made a ``kind``; with ``queue_id``, every record of it that queue's."""
    size = end - start
    if size < HEADER.size:
        raise RecordPageError(f"{size} bytes: shorter than the {HEADER.size}-byte header")
    magic, version, status, prefix_len, next_offset, lo, hi, n, records_bytes = HEADER.unpack_from(
        buf, start
    )
    if magic != MAGIC or version != VERSION:
        raise RecordPageError(f"not a record page of version {VERSION} ({magic!r}, {version})")
    if status >= len(STATUSES):
        raise RecordPageError(f"status code {status} is not one of 0..{len(STATUSES) - 1}")
    table = start + HEADER.size + prefix_len
    area = table + n * ENTRY_SIZE
    if area + records_bytes != end:
        raise RecordPageError(
            f"{size} bytes, the header says {area + records_bytes - start}"
            f" ({n} messages, {records_bytes} record bytes)"
        )
    try:
        prefix = buf[start + HEADER.size : table].decode("ascii")
    except UnicodeDecodeError:
        raise RecordPageError("the msg id prefix is not ASCII") from None
    page = _Page(buf, prefix, queue_id)
    flat = struct.unpack_from(f">{'qII' * n}", buf, table)
    messages: list[ReceivedMessage] = []
    new, append, record = kind.__new__, messages.append, page.record
    for i in range(0, 3 * n, 3):
        queue_offset, rel, inner = flat[i], flat[i + 1], flat[i + 2]
        at = area + rel
        parts = record(at, end)
        if inner >= len(parts):
            raise RecordPageError(f"entry {i // 3}: the record at {rel} has no message {inner}")
        m = new(kind)
        _set(m, "_props", None)
        _set(m, "_page", page)
        _set(m, "_where", (at, inner, queue_offset, *parts[inner]))
        append(m)
    result = PullResult(STATUSES[status], messages, next_offset, lo, hi)
    return RecordPage(result, records_bytes)


# ---- answers of many queues: the group pull, the POP receive -------------------------------

GROUP_MAGIC = b"LMQG"
POP_MAGIC = b"LMQP"
GROUP_VERSION = 1
GROUP_HEADER = struct.Struct(">4sB3xII")  # magic, version, (reserved), pages, messages
PAGE_FRAME = struct.Struct(">II")  # queue_id, the page's bytes
RECEIPT = struct.Struct(">IqH")  # delivery_attempt, invisible_until, handle length


@dataclass(frozen=True, slots=True)
class QueuePage:
    """One queue's page of a group pull's record answer."""

    queue_id: int
    result: PullResult


def _decode_frames(
    buf: bytes, magic: bytes, kind: type[RecordMessage] | type[RecordPopMessage]
) -> tuple[list[QueuePage], int, int]:
    """The pages of an answer of many queues (``magic``), the message count its header
    says and where its receipts start."""
    if len(buf) < GROUP_HEADER.size:
        raise RecordPageError(f"{len(buf)} bytes: shorter than the {GROUP_HEADER.size}-byte header")
    got_magic, version, n_pages, n_messages = GROUP_HEADER.unpack_from(buf, 0)
    if got_magic != magic or version != GROUP_VERSION:
        raise RecordPageError(
            f"not an answer {magic.decode()} of version {GROUP_VERSION} ({got_magic!r}, {version})"
        )
    at = GROUP_HEADER.size
    receipts_at = at
    if magic == POP_MAGIC:  # the receipts come first: pass over them
        for i in range(n_messages):
            if at + RECEIPT.size > len(buf):
                raise RecordPageError(f"receipt {i}: past the end")
            at += RECEIPT.size + RECEIPT.unpack_from(buf, at)[2]
    pages: list[QueuePage] = []
    for i in range(n_pages):
        if at + PAGE_FRAME.size > len(buf):
            raise RecordPageError(f"page {i}: its frame is past the end")
        queue_id, size = PAGE_FRAME.unpack_from(buf, at)
        at += PAGE_FRAME.size
        if at + size > len(buf):
            raise RecordPageError(f"page {i}: {size} bytes, past the end")
        page = _decode_page(buf, at, at + size, kind, queue_id)
        pages.append(QueuePage(queue_id, page.result))
        at += size
    if at != len(buf):
        raise RecordPageError(f"{len(buf) - at} bytes after the last page")
    if sum(len(p.result.messages) for p in pages) != n_messages:
        raise RecordPageError(f"the header says {n_messages} messages, the pages hold others")
    return pages, n_messages, receipts_at


def decode_group(content: bytes | memoryview) -> list[QueuePage]:
    """A group pull's record answer (``LMQG``): the page of each queue it looked at, in
    the answer's order; ``RecordPageError`` if its framing does not hold together."""
    pages, _, _ = _decode_frames(bytes(content), GROUP_MAGIC, RecordMessage)
    return pages


def decode_received(content: bytes | memoryview) -> list[PopMessage]:
    """A POP receive's record answer (``LMQP``): its messages, each with its receipt;
    ``RecordPageError`` if its framing does not hold together."""
    buf = bytes(content)
    pages, n, at = _decode_frames(buf, POP_MAGIC, RecordPopMessage)
    out: list[PopMessage] = []
    messages = (m for p in pages for m in p.result.messages)
    for m in messages:
        attempt, invisible_until, length = RECEIPT.unpack_from(buf, at)
        at += RECEIPT.size
        try:
            handle = buf[at : at + length].decode("ascii")
        except UnicodeDecodeError:
            raise RecordPageError(f"receipt {len(out)}: the handle is not ASCII") from None
        at += length
        assert isinstance(m, RecordPopMessage)
        _set(m, "receipt_handle", handle)
        _set(m, "delivery_attempt", attempt)
        _set(m, "invisible_until", invisible_until)
        out.append(m)
    assert len(out) == n
    return out
