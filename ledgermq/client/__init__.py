"""The Python client (docs/client.md): ``Producer``, ``Consumer``, ``PopConsumer``, ``Admin``
and their async twins ``AsyncProducer``, ``AsyncConsumer``, ``AsyncPopConsumer``,
``AsyncAdmin``, over httpx.

How it is built (h11's way): every operation is written once, as a generator that
*yields* what it needs done — a ``Request`` to one URL, or a ``Sleep`` — and receives the
``Reply`` (or ``Unreachable``); it holds all the protocol logic: request bodies, response
parsing, error mapping, master discovery and caching, redirects, retries with backoff and
the deadline. The sync and async classes are thin drivers that run those generators with
an ``httpx.Client`` or an ``httpx.AsyncClient`` (a dozen lines each); their public
methods are the shared operations bound with ``blocking`` / ``awaiting``.

Routing (docs/http.md): writes go to the master, found with ``GET /v1/cluster`` on any
broker and cached; a ``307 NOT_MASTER`` moves the cache to its ``leader_url`` (redirects
are never followed by httpx, so the cache learns); ``503 NO_MASTER``, ``503
UNKNOWN_OUTCOME`` and ``429 BUSY`` are retried with exponential backoff and jitter (at
least ``Retry-After``); a broker that does not answer is skipped for the next one (a
produce waits ``produce_answer_timeout_s`` for an answer, not ``timeout_s``: a paused
master costs about an election, then the batch is retried under its session). Reads
prefer the master and fall back to any broker; one whose copy of a message is damaged
(``503 CORRUPT_ENTRY``) is skipped for the next at once. Every operation is bounded by
``ClientSettings.deadline_s`` and ``max_attempts`` (requests, redirects included).

Every write this client sends is safe to repeat: produce carries a producer session
(``producer_id``, ``sequence``) that the broker deduplicates; topic creation, offset
commits and resets, and leadership transfer are idempotent. That is why an unknown
outcome is retried. (A delete retried after an unknown outcome may answer
``TOPIC_NOT_FOUND``: the first attempt did it.)

Consumers are at-least-once: see ``ConsumerOps``. A POP group's consumers share a topic,
the broker handing each message to one of them until it is acked (``PopOps``; how its
receives, acks and extends are retried is in ``ledgermq.client.popping``).

A producer sends one batch at a time (a lock): the broker keeps only a session's last
batch, so a batch that overtook an earlier one would make the earlier one's retry
``SEQUENCE_TOO_OLD``. For parallel sends use several producers.

The package, by concern: ``errors`` (the exceptions and the code → class table),
``settings`` (``ClientSettings``), ``types`` (messages and results), ``exchange`` (the
sans-I/O routing and retries), ``operations``, ``consuming`` and ``popping`` (the
operations, written once), ``drivers`` (the I/O over httpx, and the threads or tasks of a
POP consumer's handlers) and ``fronts`` (the public classes). Import from
``ledgermq.client``: how the modules split it is not part of the API.
"""

from .consuming import Batch, ConsumerOps, Pacer, Start
from .drivers import tls_context
from .errors import (
    CLIENT_CODES,
    ERROR_CLASSES,
    UNTYPED_CODES,
    AlreadyDeliveredError,
    BrokerUnavailableError,
    BusyError,
    CorruptEntryError,
    DiskFullError,
    ForbiddenError,
    GroupModeConflictError,
    GroupNotFoundError,
    InvalidArgumentError,
    InvalidReceiptHandleError,
    LedgerMQError,
    LimitReachedError,
    MessageNotFoundError,
    NodeFailedError,
    NoMasterError,
    NotMasterError,
    PayloadTooLargeError,
    RecallHandleNotFoundError,
    SequenceTooOldError,
    TopicConflictError,
    TopicNotFoundError,
    TransactionNotFoundError,
    TransactionResolvedError,
    UnauthenticatedError,
    UnknownOutcomeError,
    make_error,
)
from .exchange import (
    ARROW_STREAM,
    RECORD_PAGE,
    RETRIED,
    Action,
    Call,
    Exchange,
    Gen,
    Outcome,
    Reply,
    Request,
    Sleep,
    Unreachable,
    backoff_delay_s,
    error_from_reply,
    master_url_from,
    redirect_target,
    retry_after_s,
)
from .fetch import (
    RecordMessage,
    RecordPageError,
    RecordPopMessage,
    decode_group,
    decode_page,
    decode_received,
)
from .fronts import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncPopConsumer,
    AsyncProducer,
    AsyncTransactionProducer,
    Consumer,
    PopConsumer,
    Producer,
    Transaction,
    TransactionProducer,
)
from .operations import PRODUCER_ID, AdminOps, ProducerOps, new_producer_id
from .popping import (
    DLQ_PREFIX,
    DLQ_PROPERTIES,
    Collect,
    Ended,
    PopOps,
    RunAction,
    RunGen,
    RunOptions,
    RunOutcome,
    RunSettings,
    RunStats,
    Spawn,
    dlq_topic,
)
from .settings import ClientOptions, ClientSettings, parse_brokers
from .transacting import Begun, Checker, TransactionCheck, TransactionMessage, TransactionOps
from .types import (
    AckResult,
    ArrowPage,
    ClusterNode,
    ClusterStatus,
    GroupDescription,
    GroupOffset,
    Message,
    MessageLike,
    NodeView,
    PopMessage,
    PopTopicState,
    PullResult,
    QueueInfo,
    ReceivedMessage,
    Redriven,
    SendResult,
    TopicDescription,
    TopicInfo,
    decode_message,
    decode_pop_message,
    encode_body,
    encode_message,
    parse_cluster,
    parse_group,
)

__all__ = [
    "ARROW_STREAM",
    "CLIENT_CODES",
    "DLQ_PREFIX",
    "DLQ_PROPERTIES",
    "ERROR_CLASSES",
    "PRODUCER_ID",
    "RECORD_PAGE",
    "RETRIED",
    "UNTYPED_CODES",
    "AckResult",
    "Action",
    "Admin",
    "AdminOps",
    "AlreadyDeliveredError",
    "ArrowPage",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncPopConsumer",
    "AsyncProducer",
    "AsyncTransactionProducer",
    "Batch",
    "Begun",
    "BrokerUnavailableError",
    "BusyError",
    "Call",
    "Checker",
    "ClientOptions",
    "ClientSettings",
    "ClusterNode",
    "ClusterStatus",
    "Collect",
    "Consumer",
    "ConsumerOps",
    "CorruptEntryError",
    "DiskFullError",
    "Ended",
    "Exchange",
    "ForbiddenError",
    "Gen",
    "GroupDescription",
    "GroupModeConflictError",
    "GroupNotFoundError",
    "GroupOffset",
    "InvalidArgumentError",
    "InvalidReceiptHandleError",
    "LedgerMQError",
    "LimitReachedError",
    "Message",
    "MessageLike",
    "MessageNotFoundError",
    "NoMasterError",
    "NodeFailedError",
    "NodeView",
    "NotMasterError",
    "Outcome",
    "Pacer",
    "PayloadTooLargeError",
    "PopConsumer",
    "PopMessage",
    "PopOps",
    "PopTopicState",
    "Producer",
    "ProducerOps",
    "PullResult",
    "QueueInfo",
    "RecallHandleNotFoundError",
    "ReceivedMessage",
    "RecordMessage",
    "RecordPageError",
    "RecordPopMessage",
    "Redriven",
    "Reply",
    "Request",
    "RunAction",
    "RunGen",
    "RunOptions",
    "RunOutcome",
    "RunSettings",
    "RunStats",
    "SendResult",
    "SequenceTooOldError",
    "Sleep",
    "Spawn",
    "Start",
    "TopicConflictError",
    "TopicDescription",
    "TopicInfo",
    "TopicNotFoundError",
    "Transaction",
    "TransactionCheck",
    "TransactionMessage",
    "TransactionNotFoundError",
    "TransactionOps",
    "TransactionProducer",
    "TransactionResolvedError",
    "UnauthenticatedError",
    "UnknownOutcomeError",
    "Unreachable",
    "backoff_delay_s",
    "decode_group",
    "decode_message",
    "decode_page",
    "decode_pop_message",
    "decode_received",
    "dlq_topic",
    "encode_body",
    "encode_message",
    "error_from_reply",
    "make_error",
    "master_url_from",
    "new_producer_id",
    "parse_brokers",
    "parse_cluster",
    "parse_group",
    "redirect_target",
    "retry_after_s",
    "tls_context",
]
