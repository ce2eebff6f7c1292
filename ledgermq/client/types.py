"""What the client sends and gets back: ``Message`` and its encoding into a produce body,
``ReceivedMessage`` (``PopMessage`` for a POP group's) and its decoding, and the
operations' results (``SendResult``, ``PullResult``, ``ArrowPage``, topics, groups and
their offsets, acks, cluster status). Plain data, no I/O."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias


@dataclass(slots=True)
class Message:
    """A message to send. ``str`` bodies travel as UTF-8, ``bytes`` as base64."""

    body: bytes | str
    key: str | None = None
    keys: Sequence[str] = ()
    tags: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    sharding_key: str | None = None
    # A delay message (docs/http.md): delivered at this time (ms since the epoch), or
    # this long after it is stored; one of the two.
    deliver_at_ms: int | None = None
    delay_ms: int | None = None


MessageLike: TypeAlias = Message | Mapping[str, Any] | bytes | str

_MESSAGE_FIELDS = (
    "key",
    "keys",
    "tags",
    "properties",
    "queue_id",
    "sharding_key",
    "deliver_at_ms",
    "delay_ms",
)


def encode_body(body: bytes | str) -> dict[str, Any]:
    if isinstance(body, str):
        return {"body": body, "encoding": "utf-8"}
    if isinstance(body, bytes | bytearray | memoryview):
        return {"body": base64.b64encode(body).decode("ascii"), "encoding": "base64"}
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


def encode_message(m: MessageLike) -> dict[str, Any]:
    """One message object of the produce body (docs/http.md)."""
    if isinstance(m, str | bytes | bytearray | memoryview):
        return encode_body(m)
    if isinstance(m, Message):
        out = encode_body(m.body)
        if m.key is not None:
            out["key"] = m.key
        if m.keys:
            out["keys"] = list(m.keys)
        if m.tags is not None:
            out["tags"] = m.tags
        if m.properties:
            out["properties"] = dict(m.properties)
        if m.queue_id is not None:
            out["queue_id"] = m.queue_id
        if m.sharding_key is not None:
            out["sharding_key"] = m.sharding_key
        if m.deliver_at_ms is not None:
            out["deliver_at_ms"] = m.deliver_at_ms
        if m.delay_ms is not None:
            out["delay_ms"] = m.delay_ms
        return out
    if isinstance(m, Mapping):
        if "body" not in m:
            raise ValueError("a message object needs a body")
        unknown = set(m) - {"body", "encoding", *_MESSAGE_FIELDS}
        if unknown:
            raise ValueError(f"unknown message fields: {sorted(unknown)}")
        body = m["body"]
        if isinstance(body, str) and m.get("encoding") == "base64":
            out = {"body": body, "encoding": "base64"}  # already encoded by the caller
        else:
            out = encode_body(body)
        out.update({k: m[k] for k in _MESSAGE_FIELDS if m.get(k) is not None})
        return out
    raise TypeError(f"cannot send a {type(m).__name__} as a message")


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a message was stored. A delay message has no queue yet (-1 for both): its
    ``deliver_at_ms`` and the ``recall_handle`` that cancels it instead."""

    msg_id: str
    queue_id: int
    queue_offset: int
    deliver_at_ms: int | None = None
    recall_handle: str | None = None


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    key: str | None = None
    keys: tuple[str, ...] = ()
    tags: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    store_timestamp: int = 0

    @property
    def text(self) -> str:
        """The body as text (invalid UTF-8 replaced)."""
        return self.body.decode("utf-8", errors="replace")


def _message_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    raw = d.get("body") or ""
    body = base64.b64decode(raw) if d.get("encoding") == "base64" else str(raw).encode()
    keys = d.get("keys") or ()
    return {
        "topic": str(d.get("topic", "")),
        "queue_id": int(d["queue_id"]),
        "queue_offset": int(d["queue_offset"]),
        "msg_id": str(d.get("msg_id", "")),
        "body": body,
        "key": d.get("key"),
        "keys": tuple(str(k) for k in keys),
        "tags": d.get("tags"),
        "properties": dict(d.get("properties") or {}),
        "born_timestamp": int(d.get("born_timestamp") or 0),
        "store_timestamp": int(d.get("store_timestamp") or 0),
    }


def decode_message(d: Mapping[str, Any]) -> ReceivedMessage:
    return ReceivedMessage(**_message_fields(d))


@dataclass(frozen=True, slots=True, kw_only=True)
class PopMessage(ReceivedMessage):
    """A message a POP group handed out (``PopConsumer.receive``): the pulled message's
    fields, the ``receipt_handle`` that acks, nacks and extends name (current until the
    message is acked, nacked, extended or delivered again), ``delivery_attempt`` (1 on
    the first delivery) and ``invisible_until`` (ms since the epoch, the master's clock:
    delivered again after it unless acked or extended)."""

    receipt_handle: str
    delivery_attempt: int
    invisible_until: int


def decode_pop_message(d: Mapping[str, Any]) -> PopMessage:
    return PopMessage(
        **_message_fields(d),
        receipt_handle=str(d["receipt_handle"]),
        delivery_attempt=int(d["delivery_attempt"]),
        invisible_until=int(d["invisible_until"]),
    )


@dataclass(frozen=True, slots=True)
class AckResult:
    """What an ack or a nack did to one handle: ``OK``, or ``INVALID_RECEIPT_HANDLE`` when
    the handle was not current (its message was acked, nacked, extended or delivered
    again; after a retried request, possibly by the first attempt)."""

    receipt_handle: str
    status: str  # OK | INVALID_RECEIPT_HANDLE

    @property
    def ok(self) -> bool:
        return self.status == "OK"


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND | NO_NEW_MSG | NO_MATCHED_MSG | OFFSET_ILLEGAL
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class ArrowPage:
    """A pull answered as an Arrow IPC stream: ``content`` holds ``count`` messages."""

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    count: int
    content: bytes | memoryview


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    queues: int
    created: bool | None = None  # from create_topic: False when it already existed


@dataclass(frozen=True, slots=True)
class QueueInfo:
    queue_id: int
    min_offset: int
    max_offset: int  # the next offset to be written


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    queues: list[QueueInfo]


@dataclass(frozen=True, slots=True)
class GroupOffset:
    """One queue of a group: an offsets group's ``committed_offset``, or a POP group's
    ``next_offset`` (the first never handed out) and ``in_flight``; ``lag`` counts what
    is not yet committed (acked or dead-lettered, for a POP group)."""

    topic: str
    queue_id: int
    committed_offset: int | None
    max_offset: int
    lag: int
    next_offset: int | None = None
    in_flight: int | None = None


@dataclass(frozen=True, slots=True)
class PopTopicState:
    """A POP group's messages of one topic: in flight now, and counted since the group
    began (the same on every node: the counts are replicated state)."""

    topic: str
    in_flight: int
    dead_lettered: int
    delivered: int = 0  # deliveries, first ones and again
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    expired: int = 0  # invisible times that passed without an ack or nack


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """``GET /v1/groups/{group}``: the group's mode and, for a POP group, its
    configuration (``retry`` as the API writes it: ``{"policy": "list", "delays_ms":
    [...]}`` or ``{"policy": "exponential", "initial_ms", "multiplier", "max_ms"}``) and
    per topic what is in flight and was dead-lettered."""

    group: str
    mode: str  # pop | offsets
    fifo: bool | None = None
    max_delivery_attempts: int | None = None
    retry: Mapping[str, Any] | None = None
    start: str | int | None = None  # latest | earliest | a store time (ms)
    topics: list[PopTopicState] = field(default_factory=list)
    redrive_next_offset: int | None = None  # the first dead letter not produced back


@dataclass(frozen=True, slots=True)
class Redriven:
    """What one ``redrive_dead_letters`` call did."""

    redriven: int  # dead letters produced back to their topics
    skipped: int  # dead letters whose topic no longer exists
    next_offset: int  # the first dead letter of the group not produced back yet


_POP_COUNTS = ("delivered", "redelivered", "acked", "nacked", "expired")


def parse_group(d: Mapping[str, Any]) -> GroupDescription:
    return GroupDescription(
        group=str(d["group"]),
        mode=str(d["mode"]),
        fifo=d.get("fifo"),
        max_delivery_attempts=d.get("max_delivery_attempts"),
        retry=d.get("retry"),
        start=d.get("start"),
        topics=[
            PopTopicState(
                str(t["topic"]),
                int(t["in_flight"]),
                int(t["dead_lettered"]),
                *(int(t.get(k, 0)) for k in _POP_COUNTS),
            )
            for t in d.get("topics") or ()
        ],
        redrive_next_offset=d.get("redrive_next_offset"),
    )


@dataclass(frozen=True, slots=True)
class ClusterNode:
    node_id: str
    raft_addr: str
    http_url: str | None
    match_index: int | None


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """``GET /v1/cluster`` of one node."""

    group: str
    node_id: str
    raft_role: str
    broker_role: str
    term: int
    leader_id: str | None
    leader_url: str | None
    nodes: list[ClusterNode]
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    dispatched_index: int
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as ``cluster_all`` saw it: its status, or why there is none."""

    node_id: str | None
    url: str | None
    status: ClusterStatus | None
    error: str | None = None


def parse_cluster(d: Mapping[str, Any]) -> ClusterStatus:
    return ClusterStatus(
        group=str(d.get("group", "")),
        node_id=str(d["node_id"]),
        raft_role=str(d.get("raft_role", "")),
        broker_role=str(d.get("broker_role", "")),
        term=int(d.get("term", -1)),
        leader_id=d.get("leader_id"),
        leader_url=d.get("leader_url"),
        nodes=[
            ClusterNode(
                node_id=str(n["node_id"]),
                raft_addr=str(n.get("raft_addr", "")),
                http_url=n.get("http_url"),
                match_index=n.get("match_index"),
            )
            for n in d.get("nodes") or ()
        ],
        ledger_begin_index=int(d.get("ledger_begin_index", -1)),
        ledger_end_index=int(d.get("ledger_end_index", -1)),
        committed_index=int(d.get("committed_index", -1)),
        dispatched_index=int(d.get("dispatched_index", -1)),
        raw=dict(d),
    )
