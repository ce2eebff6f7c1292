"""RocketMQ 5 consumers over POP groups (docs/rocketmq.md, docs/consuming.md):
ReceiveMessage, AckMessage and ChangeInvisibleDuration as ``PopGroups``' receive, ack and
change of the invisible time, on the master (``MasterCalls`` takes them there).

A consumer group is a POP group, made with the defaults on its first receive (start
``latest``, as RocketMQ's proxy pops); a receive draws from every queue of the topic,
whatever queue the request names (the Node client always names queue 0). Receipt handles
are the POP group's (``v1:queue:offset:epoch``): nothing node-local, valid after a
failover.

``ProtoMessages`` renders a stored message as the ``Message`` both official clients
decode: body encoding IDENTITY, an MD5 body digest in upper-case hex (the one format
Python and Node.js agree on), the client's message id (UNIQ_KEY), tag, keys, the
producer's own properties (never ours or RocketMQ's system ones), message group and
type, delivery time, born and store times, queue and offset; the receive adds the
receipt handle and the delivery attempt (≥ 1).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker import errors
from broker.message import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, RecordHead
from broker.msgid import msg_id_maker
from broker.pop.service import PopGroups, Received, parse_handle
from broker.properties import decode_properties, split_keys

from .codes import broker_error_code
from .convert import RESERVED_PROPERTIES, SHARDING_KEY_PROPERTY, TRANSACTION_PROPERTY
from .protocol import definition_pb2 as pb
from .protocol import service_pb2 as spb

Code = pb.Code
MAX_BATCH = 32  # the proxy's cap on a receive (ProxyUtils.MAX_MSG_NUMS_FOR_POP_REQUEST)
DEFAULT_INVISIBLE_MS = 60_000  # what the proxy picks when a client names none (push)
DEFAULT_LONG_POLL_MS = 20_000
# Of the client's deadline, kept back to answer in time after a long poll.
LONG_POLL_RESERVE_MS = 500
_msg_ids = functools.cache(msg_id_maker)


def _ts(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _ms(d: Duration) -> int:
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


class ProtoMessages:
    """The ``MessageMaker`` of protocol ``Message``s for one receive (see the module doc)."""

    __slots__ = ("_msg_id", "namespace", "store_host")

    def __init__(self, group: str, store_host: str, namespace: str = "") -> None:
        self._msg_id = _msg_ids(group)
        self.store_host = store_host
        self.namespace = namespace

    def __call__(
        self, h: RecordHead, queue_offset: int, address: int, body: memoryview, props: memoryview
    ) -> pb.Message:
        raw = bytes(body)
        p = decode_properties(bytes(props))
        sp = pb.SystemProperties(
            message_id=p.get(PROP_UNIQ_KEY) or self._msg_id(address),
            keys=split_keys(p.get(PROP_KEYS)),
            body_digest=pb.Digest(type=pb.MD5, checksum=hashlib.md5(raw).hexdigest().upper()),
            body_encoding=pb.IDENTITY,
            born_timestamp=_ts(h.born_timestamp),
            store_timestamp=_ts(h.store_timestamp),
            store_host=self.store_host,
            queue_id=h.queue_id,
            queue_offset=queue_offset,
        )
        if PROP_TAGS in p:
            sp.tag = p[PROP_TAGS]
        group = p.get(SHARDING_KEY_PROPERTY)
        deliver_at = p.get("TIMER_DELIVER_MS")
        if group is not None:
            sp.message_type, sp.message_group = pb.FIFO, group
        elif deliver_at is not None and deliver_at.isdigit():
            sp.message_type = pb.DELAY
            sp.delivery_timestamp.CopyFrom(_ts(int(deliver_at)))
        elif p.get(TRANSACTION_PROPERTY) == "true":
            sp.message_type = pb.TRANSACTION
        else:
            sp.message_type = pb.NORMAL
        origin = p.get("DLQ_ORIGIN_TOPIC")
        if origin is not None:
            sp.dead_letter_queue.topic = origin
            sp.dead_letter_queue.message_id = p.get("DLQ_ORIGIN_MSG_ID", "")
        return pb.Message(
            topic=pb.Resource(name=h.topic, resource_namespace=self.namespace),
            user_properties={k: v for k, v in p.items() if k not in RESERVED_PROPERTIES},
            system_properties=sp,
            body=raw,
        )


@dataclass(frozen=True, slots=True)
class AutoRenew:
    """A push consumer's receive: its client, the server's invisible time, and how long
    it is renewed at most (ms)."""

    owner: str
    invisible_ms: int
    max_ms: int


class ConsumeRefusedError(Exception):
    """A consumer request the protocol refuses: ``code`` is the status the client gets."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def tags_of(f: pb.FilterExpression) -> str | None:
    """A TAG filter as our tags expression (None: every message)."""
    if f.type == pb.SQL:
        raise ConsumeRefusedError(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported")
    text = f.expression.strip()
    if not text or text == "*":
        return None
    tags = [t.strip() for t in text.split("||")]
    if any(not t for t in tags):
        raise ConsumeRefusedError(Code.ILLEGAL_FILTER_EXPRESSION, f"tag expression {text!r}")
    return "||".join(tags)


def check_receive(r: spb.ReceiveMessageRequest, max_wait_ms: int) -> None:
    """What is refused before a receive goes to the master."""
    if not r.group.name:
        raise ConsumeRefusedError(Code.ILLEGAL_CONSUMER_GROUP, "no consumer group")
    if not r.message_queue.topic.name:
        raise ConsumeRefusedError(Code.ILLEGAL_TOPIC, "no topic")
    tags_of(r.filter_expression)
    if r.batch_size < 0:
        raise ConsumeRefusedError(Code.BAD_REQUEST, f"batch_size {r.batch_size}")
    if r.HasField("invisible_duration") and _ms(r.invisible_duration) <= 0:
        raise ConsumeRefusedError(Code.ILLEGAL_INVISIBLE_TIME, "invisible duration must be > 0")
    if r.HasField("long_polling_timeout") and _ms(r.long_polling_timeout) < 0:
        raise ConsumeRefusedError(Code.ILLEGAL_POLLING_TIME, "negative long polling timeout")


def _refusal(e: errors.BrokerError, *, handles: bool = False) -> ConsumeRefusedError:
    """``e`` as the protocol's refusal; with ``handles`` (an ack, a change of the
    invisible time) a group that does not exist makes the handles invalid: the clients
    give up on INVALID_RECEIPT_HANDLE (a Python push consumer retries any other refusal
    of an ack for ever)."""
    if isinstance(e, errors.InvalidReceiptHandleError) or (
        handles and isinstance(e, errors.GroupNotFoundError)
    ):
        return ConsumeRefusedError(Code.INVALID_RECEIPT_HANDLE, e.message)
    if isinstance(e, errors.GroupModeConflictError | errors.GroupNotFoundError):
        return ConsumeRefusedError(Code.ILLEGAL_CONSUMER_GROUP, e.message)
    if isinstance(e, errors.InvalidArgumentError) and "group" in e.message:
        return ConsumeRefusedError(Code.ILLEGAL_CONSUMER_GROUP, e.message)
    return ConsumeRefusedError(broker_error_code(e), e.message)


async def receive(
    pop: PopGroups,
    r: spb.ReceiveMessageRequest,
    *,
    time_remaining_s: float | None,
    max_wait_ms: int,
    make: Callable[[str], ProtoMessages],
    renew: AutoRenew | None = None,
) -> list[spb.ReceiveMessageResponse]:
    """A receive on the master: the stream's items (status, messages, delivery time).
    With ``auto_renew`` (push consumers) and ``renew``, the invisible time is the
    server's (unless the request names one) and renewed for the client
    (``api/rocketmq/renew.py``). ``NotMasterError``/``NoMasterError`` propagate (to
    ``MasterCalls``)."""
    try:
        check_receive(r, max_wait_ms)
        lpt = _ms(r.long_polling_timeout) if r.HasField("long_polling_timeout") else None
        wait_ms = DEFAULT_LONG_POLL_MS if lpt is None else lpt
        if time_remaining_s is not None:
            wait_ms = min(wait_ms, int(time_remaining_s * 1000) - LONG_POLL_RESERVE_MS)
        wait_ms = max(0, min(wait_ms, max_wait_ms))
        renewed = renew if r.auto_renew and renew is not None else None
        default_ms = DEFAULT_INVISIBLE_MS if renewed is None else renewed.invisible_ms
        invisible = _ms(r.invisible_duration) if r.HasField("invisible_duration") else default_ms
        lim = pop.settings.limits
        if not lim.min_invisible_ms <= invisible <= lim.max_invisible_ms:
            raise ConsumeRefusedError(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {invisible} ms: want {lim.min_invisible_ms}"
                f"..{lim.max_invisible_ms} ms",
            )
        maker = make(r.group.resource_namespace)
        got = await pop.receive(
            maker,
            r.group.name,
            r.message_queue.topic.name,
            max_messages=max(1, min(r.batch_size or MAX_BATCH, MAX_BATCH)),
            invisible_ms=invisible,
            wait_ms=wait_ms,
            tags=tags_of(r.filter_expression),
            attempt_id=r.attempt_id if r.HasField("attempt_id") and r.attempt_id else None,
            owner=None if renewed is None else renewed.owner,
            renew_ms=0 if renewed is None else renewed.max_ms,
        )
    except (errors.NotMasterError, errors.NoMasterError):
        raise
    except errors.BrokerError as e:
        return receive_refused(_refusal(e).code, e.message)
    except ConsumeRefusedError as e:
        return receive_refused(e.code, e.message)
    return received(got)


def received(got: list[Received[pb.Message]]) -> list[spb.ReceiveMessageResponse]:
    now = Timestamp()
    now.GetCurrentTime()
    if not got:
        none = pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message")
        return [
            spb.ReceiveMessageResponse(status=none),
            spb.ReceiveMessageResponse(delivery_timestamp=now),
        ]
    out = [spb.ReceiveMessageResponse(status=pb.Status(code=Code.OK, message="OK"))]
    for g in got:
        m = g.message
        m.system_properties.receipt_handle = g.receipt_handle
        m.system_properties.delivery_attempt = g.delivery_attempt
        out.append(spb.ReceiveMessageResponse(message=m))
    out.append(spb.ReceiveMessageResponse(delivery_timestamp=now))
    return out


def receive_refused(code: int, message: str) -> list[spb.ReceiveMessageResponse]:
    now = Timestamp()
    now.GetCurrentTime()
    return [
        spb.ReceiveMessageResponse(status=pb.Status(code=code, message=message)),  # type: ignore[arg-type]
        spb.ReceiveMessageResponse(delivery_timestamp=now),
    ]


async def ack(pop: PopGroups, r: spb.AckMessageRequest) -> spb.AckMessageResponse:
    """Each entry's message done for the group, if its handle is current."""

    def refused(code: int, text: str) -> spb.AckMessageResponse:
        st = pb.Status(code=code, message=text)  # type: ignore[arg-type]
        return spb.AckMessageResponse(
            status=st,
            entries=[
                spb.AckMessageResultEntry(
                    message_id=e.message_id, receipt_handle=e.receipt_handle, status=st
                )
                for e in r.entries
            ],
        )

    if not r.group.name:
        return refused(Code.ILLEGAL_CONSUMER_GROUP, "no consumer group")
    if not r.topic.name:
        return refused(Code.ILLEGAL_TOPIC, "no topic")
    if not r.entries:
        return refused(Code.BAD_REQUEST, "no entries")
    try:
        held = await pop.ack(r.group.name, r.topic.name, [e.receipt_handle for e in r.entries])
    except (errors.NotMasterError, errors.NoMasterError):
        raise
    except errors.BrokerError as e:
        return refused(_refusal(e, handles=True).code, e.message)
    ok = pb.Status(code=Code.OK, message="OK")
    bad = pb.Status(code=Code.INVALID_RECEIPT_HANDLE, message="the receipt handle is not current")
    entries = [
        spb.AckMessageResultEntry(
            message_id=e.message_id, receipt_handle=e.receipt_handle, status=ok if h else bad
        )
        for e, h in zip(r.entries, held, strict=True)
    ]
    top = ok if all(held) else bad
    if any(held) and not all(held):
        top = pb.Status(code=Code.MULTIPLE_RESULTS, message="some receipt handles are not current")
    return spb.AckMessageResponse(status=top, entries=entries)


async def change_invisible(
    pop: PopGroups, r: spb.ChangeInvisibleDurationRequest
) -> spb.ChangeInvisibleDurationResponse:
    """The message stays invisible for the new duration from now; its new handle."""

    def refused(code: int, text: str) -> spb.ChangeInvisibleDurationResponse:
        st = pb.Status(code=code, message=text)  # type: ignore[arg-type]
        return spb.ChangeInvisibleDurationResponse(status=st, receipt_handle=r.receipt_handle)

    if not r.group.name:
        return refused(Code.ILLEGAL_CONSUMER_GROUP, "no consumer group")
    if not r.topic.name:
        return refused(Code.ILLEGAL_TOPIC, "no topic")
    invisible = _ms(r.invisible_duration)
    if not 0 <= invisible <= pop.settings.limits.max_invisible_ms:
        return refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible} ms")
    try:
        got = await pop.change_invisible(r.group.name, r.topic.name, r.receipt_handle, invisible)
    except (errors.NotMasterError, errors.NoMasterError):
        raise
    except errors.BrokerError as e:
        return refused(_refusal(e, handles=True).code, e.message)
    return spb.ChangeInvisibleDurationResponse(
        status=pb.Status(code=Code.OK, message="OK"), receipt_handle=got.receipt_handle
    )


async def forward_to_dead_letters(
    pop: PopGroups, r: spb.ForwardMessageToDeadLetterQueueRequest
) -> spb.ForwardMessageToDeadLetterQueueResponse:
    """A FIFO push consumer gave up on a message (its local retries are spent): a copy
    goes to ``%DLQ%<group>`` at once and its flight ends (``PopGroups.dead_letter_now``).
    A handle that is well formed but no longer current (the message was acked, or its
    invisible time passed and it went out again) is answered OK with nothing done: the
    Python client retries any other answer every second for ever, holding its message
    group; a malformed one is INVALID_RECEIPT_HANDLE."""

    def answer(code: int, text: str) -> spb.ForwardMessageToDeadLetterQueueResponse:
        st = pb.Status(code=code, message=text)  # type: ignore[arg-type]
        return spb.ForwardMessageToDeadLetterQueueResponse(status=st)

    if not r.group.name:
        return answer(Code.ILLEGAL_CONSUMER_GROUP, "no consumer group")
    if not r.topic.name:
        return answer(Code.ILLEGAL_TOPIC, "no topic")
    if parse_handle(r.receipt_handle) is None:
        return answer(Code.INVALID_RECEIPT_HANDLE, "malformed receipt handle")
    try:
        (held,) = await pop.dead_letter_now(r.group.name, r.topic.name, [r.receipt_handle])
    except (errors.NotMasterError, errors.NoMasterError):
        raise
    except errors.BrokerError as e:
        return answer(_refusal(e, handles=True).code, e.message)
    if held:
        return answer(Code.OK, "OK")
    return answer(Code.OK, "the receipt handle is not current: nothing forwarded")


def group_config_of(pop: PopGroups, group: str) -> Any:
    """The replicated configuration of a POP group, or None (not made yet)."""
    return pop.state.groups.get(group)
