"""The HTTP contract's bodies (docs/http.md) as pydantic models.

Requests are validated by these models (``extra="forbid"``: a misspelt field is an
error, not silently ignored). Hot responses (produce, pull) are built as plain dicts
and rendered with orjson; their models here document them in the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TOPIC_PATTERN = r"^[A-Za-z0-9_%|-]{1,127}$"
GROUP_PATTERN = r"^[A-Za-z0-9_%|-]{1,127}$"
NODE_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"

Encoding = Literal["utf-8", "base64"]
TopicName = Annotated[str, Field(pattern=TOPIC_PATTERN, examples=["orders"])]
QueueId = Annotated[int, Field(ge=0, le=65_535)]
Offset = Annotated[int, Field(ge=0, le=2**62)]


class _Request(BaseModel):
    # strict: a JSON number is an integer only if written as one (no "5", true or 1e3)
    model_config = ConfigDict(extra="forbid", strict=True, str_max_length=64 * 1024 * 1024)


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str = Field(examples=["TOPIC_NOT_FOUND"])
    message: str = Field(examples=["topic orders does not exist"])


class ErrorBody(BaseModel):
    """Every non-2xx answer; extra fields help (e.g. ``leader_url`` on NOT_MASTER)."""

    error: ErrorDetail


# ---- cluster ------------------------------------------------------------------------------


class ClusterNode(BaseModel):
    node_id: str
    role: Literal["voter", "learner"] = Field(
        default="voter", description="a learner receives the log and does not vote"
    )
    raft_addr: str
    http_url: str | None = None
    console_url: str | None = Field(
        default=None,
        description="where a browser reaches it (--console-urls), else its HTTP URL",
    )
    grpc_addr: str | None = Field(
        default=None, description="its RocketMQ 5 gRPC front (host:port), if known"
    )
    match_index: int | None = None


class DiskInfo(BaseModel):
    total_bytes: int = Field(description="the size of the data directory's file system")
    free_bytes: int = Field(description="free space there (for this node's user)")
    used_ratio: float = Field(description="used / total, as the store's full check reads it")
    full_ratio: float = Field(description="--disk-full-ratio: the log refuses appends above it")
    reserve_bytes: int = Field(description="a master refuses writes with less free than this")
    log_bytes: int = Field(description="bytes of Raft log this node keeps (end - begin)")
    full: bool = Field(description="this node refuses writes for lack of disk now")


class ClusterInfo(BaseModel):
    group: str
    node_id: str
    raft_role: Literal["LEADER", "FOLLOWER", "CANDIDATE"]
    broker_role: Literal["MASTER", "SLAVE"]
    term: int
    leader_id: str | None
    leader_url: str | None
    nodes: list[ClusterNode]
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    dispatched_index: int
    snapshot_index: int = Field(description="the newest metadata snapshot")
    snapshots_installed: int = Field(description="leader snapshots this node installed")
    diverged: str | None = Field(
        default=None,
        description="set when this node holds a committed entry its leader contradicts"
        " (the group lost acknowledged data): what and where",
    )
    version: str = Field(description="this node's LedgerMQ version", examples=["0.2.0"])
    disk: DiskInfo | None = Field(
        default=None, description="the data directory's file system; null if unreadable"
    )


class RoleEventInfo(BaseModel):
    at_ms: int = Field(description="when, by this node's clock (Unix ms)")
    event: Literal["role", "master", "transfer"] = Field(
        description="role: this node's Raft role or known leader changed; master: this"
        " node became MASTER, caught up; transfer: this node handed leadership to"
        " leader_id on request"
    )
    term: int
    raft_role: Literal["LEADER", "FOLLOWER", "CANDIDATE"] = Field(
        description="this node's Raft role then"
    )
    leader_id: str | None = Field(description="the leader known then (a transfer: its target)")


class ClusterHistory(BaseModel):
    node_id: str
    size: int = Field(description="how many events the node keeps (role_history_size)")
    recorded: int = Field(description="events recorded since the node started, dropped included")
    events: list[RoleEventInfo] = Field(description="oldest first")


class LeadershipRequest(_Request):
    to: str = Field(pattern=NODE_ID_PATTERN, examples=["n1"])


class LeadershipResult(BaseModel):
    leader_id: str
    term: int


class MemberAdd(_Request):
    node_id: str = Field(pattern=NODE_ID_PATTERN, examples=["n3"])
    raft_addr: str = Field(
        pattern=r"^[^\s:]+:[0-9]{1,5}$", max_length=300, examples=["10.0.0.4:20911"]
    )
    http_url: str | None = Field(
        default=None, pattern=r"^https?://\S+$", max_length=300, examples=["http://10.0.0.4:8080"]
    )


class Member(BaseModel):
    node_id: str
    role: Literal["voter", "learner"]
    raft_addr: str
    http_url: str | None = None
    incarnation: str | None = Field(
        default=None, description="its data directory's identity, once the master heard it"
    )
    match_index: int | None = Field(
        default=None, description="how far it has the log (on the master; None elsewhere)"
    )


class Members(BaseModel):
    config_index: int = Field(description="the configuration's log entry (-1: the first)")
    leader_id: str | None
    members: list[Member]


class MembershipResult(BaseModel):
    config_index: int = Field(description="the committed entry of the new configuration")


class Readiness(BaseModel):
    ready: bool
    reason: str | None = None


# ---- topics -------------------------------------------------------------------------------


class TopicCreate(_Request):
    name: TopicName
    queues: Annotated[int, Field(ge=1, le=65_536)] | None = Field(
        None, description="queue count; the broker's default when omitted", examples=[8]
    )


class TopicInfo(BaseModel):
    name: str
    queues: int


class TopicList(BaseModel):
    topics: list[TopicInfo]


class QueueInfo(BaseModel):
    queue_id: int
    min_offset: int
    max_offset: int = Field(description="the next offset to be written")


class TopicDescription(BaseModel):
    name: str
    queues: list[QueueInfo]


# ---- produce ------------------------------------------------------------------------------


class ProduceMessage(_Request):
    body: str = Field(examples=["hello"])
    encoding: Encoding = "utf-8"
    key: str | None = Field(None, max_length=1024, examples=["order-42"])
    keys: list[Annotated[str, Field(max_length=1024)]] | None = None
    tags: str | None = Field(None, max_length=1024, examples=["TagA"])
    properties: dict[str, str] | None = None
    queue_id: QueueId | None = None
    sharding_key: str | None = Field(None, max_length=1024)
    born_timestamp: Annotated[int, Field(ge=0, le=2**62)] | None = None
    deliver_at_ms: Annotated[int, Field(ge=0, le=2**62)] | None = Field(
        None, description="a delay message: delivered at this time (ms since the epoch)"
    )
    delay_ms: Annotated[int, Field(ge=0, le=2**62)] | None = Field(
        None, description="a delay message: delivered this long after it is stored"
    )


class TransactionSpec(_Request):
    producer_group: str = Field(
        pattern=GROUP_PATTERN, examples=["pg"], description="whose producers are checked"
    )


class ProduceRequest(_Request):
    messages: list[ProduceMessage] = Field(min_length=1)
    producer_id: str | None = Field(None, examples=["p-7d0c4f0e"])
    sequence: Annotated[int, Field(ge=0, le=2**62)] | None = Field(None, examples=[17])
    transaction: TransactionSpec | None = Field(
        None, description="store the messages as one transaction's half messages"
    )

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "messages": [{"body": "hello", "key": "order-42", "tags": "TagA"}],
                    "producer_id": "p-7d0c4f0e",
                    "sequence": 17,
                }
            ]
        },
    )


class ProduceResult(BaseModel):
    msg_id: str
    queue_id: int | None = Field(description="null for a delay message: set at delivery")
    queue_offset: int | None
    commitlog_offset: int
    deliver_at_ms: int | None = Field(None, description="a delay message's time")
    recall_handle: str | None = Field(
        None, description="a delay message's: DELETE /v1/delayed/{recall_handle} cancels it"
    )


class ProduceResponse(BaseModel):
    results: list[ProduceResult]
    transaction_id: str | None = Field(
        None, description="a transaction's: POST /v1/transactions/{transaction_id} ends it"
    )


# ---- consume ------------------------------------------------------------------------------


class MessageOut(BaseModel):
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    commitlog_offset: int
    body: str
    encoding: Encoding
    key: str | None
    keys: list[str]
    tags: str | None
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int


class PullResponse(BaseModel):
    status: Literal["FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"]
    messages: list[MessageOut]
    next_offset: int
    min_offset: int
    max_offset: int


class MessageList(BaseModel):
    messages: list[MessageOut]


class OffsetAnswer(BaseModel):
    offset: int


# ---- consumer groups ----------------------------------------------------------------------


class GroupList(BaseModel):
    groups: list[str]


class GroupOffset(BaseModel):
    topic: str
    queue_id: int
    committed_offset: int | None
    max_offset: int
    lag: int


class PopOffsets(BaseModel):
    """A POP group's queue: the first offset never handed out, what is in flight, and
    the lag (neither acknowledged nor dead-lettered)."""

    topic: str
    queue_id: int
    next_offset: int
    in_flight: int
    max_offset: int
    lag: int


class GroupOffsets(BaseModel):
    offsets: list[GroupOffset] | list[PopOffsets]


class CommitOffsets(_Request):
    topic: TopicName
    offsets: dict[str, Offset] = Field(
        min_length=1, description="queue id (as a string) → next offset", examples=[{"0": 12}]
    )


class ResetOffsets(_Request):
    topic: TopicName
    to: Literal["earliest", "latest"] | Annotated[int, Field(ge=0, le=2**62)] = Field(
        description="earliest, latest, or a store timestamp (ms)", examples=["earliest"]
    )


class OffsetsAnswer(BaseModel):
    offsets: dict[str, int]


class GroupPull(_Request):
    topic: TopicName
    max_messages: Annotated[int, Field(ge=1)] = 32
    wait_ms: Annotated[int, Field(ge=0)] = 0
    queue_ids: list[QueueId] | None = None
    auto_commit: bool = False
    encoding: Encoding = "utf-8"


class GroupPullResponse(BaseModel):
    messages: list[MessageOut]
    next_offsets: dict[str, int]


# ---- shared consumption (POP groups, docs/consuming.md) -----------------------------------


class RetryList(_Request):
    policy: Literal["list"]
    delays_ms: list[Annotated[int, Field(ge=0, le=604_800_000)]] = Field(
        min_length=1, max_length=64, examples=[[1000, 5000, 10000, 30000, 60000]]
    )


class RetryExponential(_Request):
    policy: Literal["exponential"]
    initial_ms: Annotated[int, Field(ge=0, le=604_800_000)] = 1000
    multiplier: Annotated[float, Field(ge=1, le=10)] = 2.0
    max_ms: Annotated[int, Field(ge=0, le=604_800_000)] = 7_200_000


class GroupConfig(_Request):
    mode: Literal["pop"] = "pop"
    fifo: bool = False
    max_delivery_attempts: Annotated[int, Field(ge=1, le=1000)] = 17
    retry: RetryList | RetryExponential | None = None
    start: Literal["latest", "earliest"] | Annotated[int, Field(ge=0, le=2**62)] = "latest"


class PopTopicState(BaseModel):
    """Messages of one topic in flight now, and counted since the group began (the same
    on every node: replicated state)."""

    topic: str
    in_flight: int
    dead_lettered: int
    delivered: int = Field(0, description="deliveries, first ones and again")
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    expired: int = Field(0, description="invisible times that passed without an ack or nack")


class GroupDescription(BaseModel):
    group: str
    mode: Literal["pop", "offsets"]
    fifo: bool | None = None
    max_delivery_attempts: int | None = None
    retry: dict[str, Any] | None = None
    start: str | int | None = None
    topics: list[PopTopicState] = []
    redrive_next_offset: int | None = Field(
        None, description="a POP group's first dead letter not produced back yet"
    )


class Receive(_Request):
    topic: TopicName
    max_messages: Annotated[int, Field(ge=1)] = 32
    invisible_ms: Annotated[int, Field(ge=0)] = 30_000
    wait_ms: Annotated[int, Field(ge=0)] = 0
    tags: Annotated[str | None, Field(max_length=4096, examples=["TagA||TagB"])] = None
    attempt_id: Annotated[str | None, Field(min_length=1, max_length=128)] = None
    encoding: Encoding = "utf-8"


class ReceivedMessage(MessageOut):
    receipt_handle: str = Field(examples=["v1:0:17:4211"])
    delivery_attempt: int
    invisible_until: int


class ReceiveResponse(BaseModel):
    messages: list[ReceivedMessage]


ReceiptHandle = Annotated[str, Field(min_length=1, max_length=64)]


class Ack(_Request):
    topic: TopicName
    receipt_handles: list[ReceiptHandle] = Field(min_length=1)


class Nack(Ack):
    delay_ms: Annotated[int | None, Field(ge=0, le=604_800_000)] = None


class HandleResult(BaseModel):
    receipt_handle: str
    status: Literal["OK", "INVALID_RECEIPT_HANDLE"]


class AckResponse(BaseModel):
    results: list[HandleResult]


class DeadLetter(Ack):
    """Received messages to copy into ``%DLQ%<group>`` at once."""


class Redrive(_Request):
    max_messages: Annotated[
        int | None, Field(ge=1, description="default and most: the max_pull_messages limit")
    ] = None


class RedriveResponse(BaseModel):
    redriven: int = Field(description="dead letters produced back to their topics")
    skipped: int = Field(description="dead letters whose topic no longer exists")
    next_offset: int = Field(description="the first dead letter not produced back yet")


class ChangeInvisible(_Request):
    topic: TopicName
    receipt_handle: ReceiptHandle
    invisible_ms: Annotated[int, Field(ge=0)]


class ChangeInvisibleResponse(BaseModel):
    receipt_handle: str
    delivery_attempt: int
    invisible_until: int


class EndTransaction(_Request):
    action: Literal["commit", "rollback"]


class TransactionEnded(BaseModel):
    transaction_id: str
    state: Literal["committed", "rolled_back"]


class TransactionCheck(BaseModel):
    transaction_id: str
    topic: str
    producer_group: str
    check_count: int
    messages: list[MessageOut]


class TransactionChecks(BaseModel):
    checks: list[TransactionCheck]


class PendingTransaction(BaseModel):
    transaction_id: str
    topic: str
    producer_group: str
    messages: int
    check_count: int
    born: int = Field(description="when its half messages were stored (ms since the epoch)")
    next_check: int


class PendingTransactions(BaseModel):
    transactions: list[PendingTransaction]
