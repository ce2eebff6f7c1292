"""The record format of a send (docs/http.md "Produce in the record format"): the batch
as RocketMQ's client encodes one, inner records back to back, which the broker checks
and stores as they came, with no JSON to read and no object per message.

An inner record, big-endian: TOTALSIZE i32, MAGICCODE i32 (0), BODYCRC i32, FLAG i32,
BODY length i32 and bytes, PROPERTIES length i16 and bytes (``name\\x01value\\x02``,
UTF-8: TAGS, KEYS space-separated, the user's). The client writes BODYCRC as
``crc32(BODY) & 0x7FFFFFFF`` (RocketMQ's own client writes 0, which the broker also
takes): the broker checks it, so a body damaged on its way is refused, not stored.

What one request's messages share travels in the query: the queue (``queue_id``) or
the sharding key, the producer session. A batch the format cannot say (a delay message,
messages bound for different queues or sharding keys, a message given as a mapping, a
user property named TAGS or KEYS, which the broker refuses) goes as JSON:
``record_request`` answers None for it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from .types import Message, MessageLike

MEDIA_TYPE = "application/vnd.ledgermq.batch"
MAX_PROPERTIES_BYTES = 32_767  # RocketMQ reads the length as a signed short
_HEAD = struct.Struct(">iiIii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODY length
_U16 = struct.Struct(">H")
_MIN_SIZE = _HEAD.size + 2
_SEPARATORS = ("\x01", "\x02")
_OWN = frozenset({"TAGS", "KEYS"})  # the format's own properties, never the user's


def _properties(m: Message) -> bytes:
    pairs = dict(m.properties)
    if m.tags:
        pairs["TAGS"] = m.tags
    keys = ([m.key] if m.key is not None else []) + list(m.keys)
    if keys:
        pairs["KEYS"] = " ".join(keys)
    if not pairs:
        return b""
    for name, value in pairs.items():
        if not name or any(s in name or s in value for s in _SEPARATORS):
            raise ValueError(f"property {name!r}: a name and a value hold no \\x01 or \\x02")
    raw = "".join([f"{k}\x01{v}\x02" for k, v in pairs.items()]).encode()
    if len(raw) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties of {len(raw)} bytes, at most {MAX_PROPERTIES_BYTES}")
    return raw


def record_request(
    messages: Sequence[MessageLike],
) -> tuple[bytes, dict[str, str | int]] | None:
    """The body and the query of a send of ``messages`` in the record format, or None
    when the batch needs JSON (see the module doc)."""
    parts: list[bytes] = []
    target: tuple[int | None, str | None] | None = None
    pack_head, pack_u16, crc32 = _HEAD.pack, _U16.pack, zlib.crc32
    for m in messages:
        if isinstance(m, str):
            body, props = m.encode(), b""
            where: tuple[int | None, str | None] = (None, None)
        elif isinstance(m, bytes | bytearray | memoryview):
            body, props, where = bytes(m), b"", (None, None)
        elif isinstance(m, Message):
            if m.deliver_at_ms is not None or m.delay_ms is not None or _OWN & m.properties.keys():
                return None  # (TAGS or KEYS among the user's: JSON, which the broker refuses)
            body = m.body.encode() if isinstance(m.body, str) else bytes(m.body)
            props, where = _properties(m), (m.queue_id, m.sharding_key)
        else:
            return None
        if target is None:
            target = where
        elif where != target:
            return None
        size = _MIN_SIZE + len(body) + len(props)
        parts += (
            pack_head(size, 0, crc32(body) & 0x7FFF_FFFF, 0, len(body)),
            body,
            pack_u16(len(props)),
            props,
        )
    if target is None:
        return None
    query: dict[str, str | int] = {}
    if target[0] is not None:
        query["queue_id"] = target[0]
    if target[1] is not None:
        query["sharding_key"] = target[1]
    return b"".join(parts), query
