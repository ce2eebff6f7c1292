"""The JSON rendering of messages (docs/http.md): one renderer, ``JSONMessages``, for every
read that answers messages as JSON: the pull, the group pull, the lookups by key and by
message id.

``JSONMessages`` is a ``MessageMaker`` (``broker.reads``): the broker hands it each
message's record fields and views of its BODY and PROPERTIES, and it renders the
message's JSON object straight into pre-built fragments, with no object in between;
the answers are those objects joined into their envelope.

Invariants:
- a message renders to exactly what ``orjson.dumps`` makes of the object docs/http.md
  shows, byte for byte: its fields in the documented order, ``key`` the first of
  ``keys`` (KEYS split on spaces, empty pieces dropped), ``properties`` the producer's
  own only; a body that is not UTF-8 falls back to base64 for that message alone;
- the numbers are integers and a message id is hex: nothing in them to escape; every
  string (topic, body, properties) goes through ``orjson.dumps``.
"""

from __future__ import annotations

import base64
import contextlib
import functools
from collections.abc import Mapping

import orjson

from broker.message import PROP_KEYS, PROP_TAGS, SYSTEM_PROPERTIES, RecordHead
from broker.msgid import msg_id_maker
from broker.pop.service import Received
from broker.properties import decode_properties, split_keys
from broker.reads import PullResult

__all__ = ["JSONMessages", "group_pull_json", "messages_json", "pull_json", "received_json"]

_msg_ids = functools.cache(msg_id_maker)  # a node's group is checked and hex-encoded once

_MESSAGE_JSON = (
    b'{"topic":%b,"queue_id":%d,"queue_offset":%d,"msg_id":"%b","commitlog_offset":%d,'
    b'"body":%b,"encoding":"%b",%b,"born_timestamp":%d,"store_timestamp":%d}'
)
_PULL_JSON = b'{"status":"%b","messages":[%b],"next_offset":%d,"min_offset":%d,"max_offset":%d}'


class JSONMessages:
    """The ``MessageMaker`` of JSON messages (see the module docstring), for one answer
    with one body ``encoding`` (``utf-8`` or ``base64``). Its properties are decoded
    and rendered once per distinct PROPERTIES block (a batch record's messages share
    one as a rule; at most ``PROPS_CACHE`` are kept per answer)."""

    PROPS_CACHE = 256
    __slots__ = ("_base64", "_msg_id", "_props", "_topics", "body_bytes")

    def __init__(self, group: str, encoding: str) -> None:
        self._msg_id = _msg_ids(group)
        self._base64 = encoding == "base64"
        self._topics: dict[str, bytes] = {}
        self._props: dict[bytes, bytes] = {}
        self.body_bytes = 0  # of the messages made: the pulled-bytes metric

    def __call__(
        self, h: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
    ) -> bytes:
        self.body_bytes += len(body)
        topic = self._topics.get(h.topic)
        if topic is None:
            topic = self._topics[h.topic] = orjson.dumps(h.topic)
        text, enc = None, b"utf-8"
        if not self._base64:
            with contextlib.suppress(UnicodeDecodeError):  # then base64, for this message
                text = orjson.dumps(str(body, "utf-8"))
        if text is None:
            text, enc = b'"%b"' % base64.b64encode(body), b"base64"
        raw = bytes(props)
        rest = self._props.get(raw)
        if rest is None:
            rest = self._properties(raw)
        return _MESSAGE_JSON % (
            topic,
            h.queue_id,
            queue_offset,
            self._msg_id(address).encode(),
            address,
            text,
            enc,
            rest,
            h.born_timestamp,
            h.store_timestamp,
        )

    def with_topic(
        self, h: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
    ) -> tuple[str, bytes]:
        """A ``MessageMaker`` of (topic, JSON): for a lookup that checks what the reader
        may see before it answers."""
        return h.topic, self(h, queue_offset, address, body, props)

    def _properties(self, raw: bytes) -> bytes:
        """``"key":…,"keys":…,"tags":…,"properties":…`` of an encoded PROPERTIES block."""
        props = decode_properties(raw)
        keys = split_keys(props.get(PROP_KEYS))
        user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
        out = b'"key":%b,"keys":%b,"tags":%b,"properties":%b' % (
            orjson.dumps(keys[0] if keys else None),
            orjson.dumps(keys),
            orjson.dumps(props.get(PROP_TAGS)),
            orjson.dumps(user),
        )
        if len(self._props) < self.PROPS_CACHE:
            self._props[raw] = out
        return out


def pull_json(r: PullResult[bytes]) -> bytes:
    """A pull's answer (docs/http.md) of messages ``JSONMessages`` made."""
    return _PULL_JSON % (
        r.status.encode(),
        b",".join(r.messages),
        r.next_offset,
        r.min_offset,
        r.max_offset,
    )


def group_pull_json(messages: list[bytes], next_offsets: Mapping[str, int]) -> bytes:
    """A group pull's answer (docs/http.md) of messages ``JSONMessages`` made, and each
    queue's next offset, as the body shows them (``{"0": 12}``)."""
    return b'{"messages":[%b],"next_offsets":%b}' % (
        b",".join(messages),
        orjson.dumps(next_offsets),
    )


def messages_json(messages: list[bytes]) -> bytes:
    """A key query's answer (docs/http.md) of messages ``JSONMessages`` made."""
    return b'{"messages":[%b]}' % b",".join(messages)


def received_json(received: list[Received[bytes]]) -> bytes:
    """A POP receive's answer (docs/consuming.md): each message ``JSONMessages`` made,
    with its receipt handle, delivery attempt and invisible time after its fields."""
    return b'{"messages":[%b]}' % b",".join(
        b'%b,"receipt_handle":"%b","delivery_attempt":%d,"invisible_until":%d}'
        % (r.message[:-1], r.receipt_handle.encode(), r.delivery_attempt, r.invisible_until)
        for r in received
    )
