"""RocketMQ 5 messages → the broker's ``NewMessage``, checked first (pure functions).

What a ``SendMessageRequest`` carries maps onto what our HTTP produce takes (docs/rocketmq.md):
the client's ``message_id`` is the stored UNIQ_KEY (so ``GET /v1/topics/T/messages?key=ID``
finds it, and every later copy keeps it), ``message_group`` is the sharding key (the
queue is the server's pick, ``broker.commitlog.sharding_queue``; the clients never choose
one) and is stored as RocketMQ's ``__SHARDINGKEY`` property,
``delivery_timestamp`` is ``deliver_at_ms`` (a delay message, ``broker/timers``), the
type TRANSACTION makes the request a transaction's half messages (``broker/transactions``),
marked ``TRAN_MSG=true`` as RocketMQ marks them (their copies keep it: delivered with
that type).

Every refusal is a ``SendRefusedError`` carrying the protocol's status code (the proxy's
rules, ``SendMessageActivity``): the whole request is refused before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from broker.encode import NewMessage
from broker.properties import BROKER_PROPERTIES, SYSTEM_PROPERTIES
from broker.sendwindow import is_send_id, send_session
from broker.settings import Limits
from broker.transactions.service import PROP_TRAN_MSG

from .protocol import definition_pb2 as pb

Code = pb.Code

SHARDING_KEY_PROPERTY = "__SHARDINGKEY"
TRANSACTION_PROPERTY = PROP_TRAN_MSG
# RocketMQ's own property names (MessageConst) that a producer may not set as user
# properties (the proxy answers ILLEGAL_MESSAGE_PROPERTY_KEY), and ours.
RESERVED_PROPERTIES = frozenset(
    {
        SHARDING_KEY_PROPERTY,
        "DELAY",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "TIMER_DELIVER_MS",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "MSG_REGION",
        "TRACE_ON",
        "WAIT",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "CLUSTER",
        "MAX_RECONSUME_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
    }
    | SYSTEM_PROPERTIES
    | BROKER_PROPERTIES
)
MAX_MESSAGE_ID_CHARS = 128
MAX_NAME_CHARS = 1024  # tags, keys, message groups, property names
# Control characters (the record format's separators among them) are refused in names.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# protobuf's Timestamp range ends at 9999-12-31T23:59:59Z.
MAX_TIMESTAMP_S = 253_402_300_799


class SendRefusedError(Exception):
    """A message the protocol refuses: ``code`` is the status the client gets."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class SendBatch:
    """A checked request: one topic, its messages, whether they are delay messages and
    whether a transaction's (each all or none, as a produce of ours takes them), and the
    client's id of the first message: the send's key in the send window
    (``broker/sendwindow.py``), so that a resend of the request is stored once."""

    topic: str
    messages: list[NewMessage]
    delayed: bool
    transactional: bool = False

    @property
    def message_id(self) -> str:
        return self.messages[0].uniq_key or ""


def _name_ok(text: str) -> bool:
    return 0 < len(text) <= MAX_NAME_CHARS and not _CONTROL.search(text) and text.strip() == text


def _timestamp_ms(ts: Timestamp) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def to_new_message(i: int, m: pb.Message, limits: Limits, now_ms: int) -> NewMessage:
    """Message ``i`` of a request as the broker takes it, or ``SendRefusedError``."""
    sp = m.system_properties
    if (
        not sp.message_id
        or len(sp.message_id) > MAX_MESSAGE_ID_CHARS
        or _CONTROL.search(sp.message_id)
        or not is_send_id(send_session(sp.message_id)[0])  # the send window's key
    ):
        raise SendRefusedError(
            Code.ILLEGAL_MESSAGE_ID, f"messages[{i}]: blank or invalid message_id"
        )
    if not m.body:
        raise SendRefusedError(Code.MESSAGE_BODY_EMPTY, f"messages[{i}]: the body is empty")
    if len(m.body) > limits.max_body_bytes:
        raise SendRefusedError(
            Code.MESSAGE_BODY_TOO_LARGE,
            f"messages[{i}]: body of {len(m.body)} bytes, over {limits.max_body_bytes}",
        )
    tag = sp.tag if sp.HasField("tag") else None
    if tag is not None and (not _name_ok(tag) or "|" in tag):
        raise SendRefusedError(Code.ILLEGAL_MESSAGE_TAG, f"messages[{i}]: invalid tag {tag!r}")
    keys = list(sp.keys)
    if len(keys) > limits.max_keys_per_message:
        raise SendRefusedError(
            Code.ILLEGAL_MESSAGE_KEY, f"messages[{i}]: over {limits.max_keys_per_message} keys"
        )
    for k in keys:
        if not _name_ok(k) or " " in k:
            raise SendRefusedError(Code.ILLEGAL_MESSAGE_KEY, f"messages[{i}]: invalid key {k!r}")
    props: dict[str, str] = {}
    for name, value in sorted(m.user_properties.items()):
        if not _name_ok(name) or name in RESERVED_PROPERTIES:
            raise SendRefusedError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"messages[{i}]: user property name {name!r} is reserved or invalid",
            )
        if "\x01" in value or "\x02" in value:
            raise SendRefusedError(
                Code.BAD_REQUEST,
                f"messages[{i}]: property {name!r} has a control character \\x01 or \\x02",
            )
        props[name] = value
    mtype = sp.message_type
    group = sp.message_group if sp.HasField("message_group") else None
    if group is not None and not _name_ok(group):
        raise SendRefusedError(Code.ILLEGAL_MESSAGE_GROUP, f"messages[{i}]: invalid message group")
    if (mtype == pb.FIFO) != (group is not None):
        raise SendRefusedError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"messages[{i}]: a message group goes with the type FIFO, and only with it",
        )
    deliver_at = _delivery_ms(i, m, limits, now_ms)
    if mtype not in (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION):
        raise SendRefusedError(Code.UNSUPPORTED, f"messages[{i}]: message type {mtype} unsupported")
    if group is not None:
        props[SHARDING_KEY_PROPERTY] = group
    if mtype == pb.TRANSACTION:
        props[TRANSACTION_PROPERTY] = "true"
    born = _timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else None
    return NewMessage(
        body=m.body,
        tags=tag,
        keys=keys,
        properties=props,
        sharding_key=group,
        born_timestamp=born if born is not None and 0 < born < 2**62 else None,
        deliver_at_ms=deliver_at,
        uniq_key=sp.message_id,
    )


def _delivery_ms(i: int, m: pb.Message, limits: Limits, now_ms: int) -> int | None:
    """A DELAY message's time (ms), checked against ``max_delay_ms``; None for others."""
    sp = m.system_properties
    has = sp.HasField("delivery_timestamp")
    if (sp.message_type == pb.DELAY) != has:
        raise SendRefusedError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"messages[{i}]: a delivery timestamp goes with the type DELAY, and only with it",
        )
    if not has:
        return None
    ts = sp.delivery_timestamp
    if not 0 <= ts.seconds <= MAX_TIMESTAMP_S:
        raise SendRefusedError(
            Code.ILLEGAL_DELIVERY_TIME,
            f"messages[{i}]: delivery timestamp {ts.seconds} s is outside the Timestamp range"
            " (a time in milliseconds where seconds are meant?)",
        )
    at = _timestamp_ms(ts)
    if at - now_ms > limits.max_delay_ms:
        raise SendRefusedError(
            Code.ILLEGAL_DELIVERY_TIME,
            f"messages[{i}]: delivered {at - now_ms} ms from now, over the limit of"
            f" {limits.max_delay_ms} ms",
        )
    return at


def to_send_batch(messages: Sequence[pb.Message], limits: Limits, now_ms: int) -> SendBatch:
    """A whole ``SendMessageRequest`` checked: one topic, within the request limits."""
    if not messages:
        raise SendRefusedError(Code.BAD_REQUEST, "no messages")
    if len(messages) > limits.max_messages_per_request:
        raise SendRefusedError(
            Code.PAYLOAD_TOO_LARGE,
            f"{len(messages)} messages, over {limits.max_messages_per_request}",
        )
    topic = messages[0].topic.name
    if not topic:
        raise SendRefusedError(Code.ILLEGAL_TOPIC, "messages[0] names no topic")
    if any(m.topic.name != topic for m in messages):
        raise SendRefusedError(Code.BAD_REQUEST, "the messages of one request name one topic")
    if sum(len(m.body) for m in messages) > limits.max_request_bytes:
        raise SendRefusedError(
            Code.PAYLOAD_TOO_LARGE, f"bodies over {limits.max_request_bytes} bytes in all"
        )
    out = [to_new_message(i, m, limits, now_ms) for i, m in enumerate(messages)]
    delayed = {m.deliver_at_ms is not None for m in out}
    if len(delayed) > 1:
        raise SendRefusedError(Code.BAD_REQUEST, "delay messages and others in one request")
    tx = {m.system_properties.message_type == pb.TRANSACTION for m in messages}
    if len(tx) > 1:
        raise SendRefusedError(
            Code.BAD_REQUEST, "a transaction's messages and others in one request"
        )
    return SendBatch(topic, out, delayed.pop(), tx.pop())
