"""The Python client (docs/client.md): ``Producer``, ``Consumer``, ``Admin`` and their async
twins ``AsyncProducer``, ``AsyncConsumer``, ``AsyncAdmin``, over httpx.

How it is built (h11's way): every operation is written once, as a generator that
*yields* what it needs done — a ``Request`` to one URL, or a ``Sleep`` — and receives the
``Reply`` (or ``Unreachable``); it holds all the protocol logic: request bodies, response
parsing, error mapping, master discovery and caching, redirects, retries with backoff and
the deadline. The sync and async classes are thin drivers that run those generators with
an ``httpx.Client`` or an ``httpx.AsyncClient`` (a dozen lines each); their public
methods are the shared operations bound with ``_blocking`` / ``_awaiting``.

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

Consumers are at-least-once: see ``ConsumerOps``.

A producer sends one batch at a time (a lock): the broker keeps only a session's last
batch, so a batch that overtook an earlier one would make the earlier one's retry
``SEQUENCE_TOO_OLD``. For parallel sends use several producers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import re
import ssl
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Self,
    TypeAlias,
    TypedDict,
    TypeVar,
)
from typing import Unpack as UnpackKw
from urllib.parse import quote, urlsplit

import httpx
import orjson

__all__ = [
    "Admin",
    "ArrowPage",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BrokerUnavailableError",
    "BusyError",
    "ClientOptions",
    "ClientSettings",
    "ClusterNode",
    "ClusterStatus",
    "Consumer",
    "DiskFullError",
    "ForbiddenError",
    "GroupNotFoundError",
    "GroupOffset",
    "InvalidArgumentError",
    "LedgerMQError",
    "LimitReachedError",
    "Message",
    "MessageLike",
    "MessageNotFoundError",
    "NoMasterError",
    "NodeFailedError",
    "NodeView",
    "NotMasterError",
    "PayloadTooLargeError",
    "Producer",
    "PullResult",
    "QueueInfo",
    "ReceivedMessage",
    "SendResult",
    "SequenceTooOldError",
    "TopicConflictError",
    "TopicDescription",
    "TopicInfo",
    "TopicNotFoundError",
    "UnauthenticatedError",
    "UnknownOutcomeError",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"  # api.media's; a test keeps them equal

# The broker's PRODUCER_ID (broker/metadata.py); a test keeps the two equal.
PRODUCER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


# ---- errors ---------------------------------------------------------------------------------


class LedgerMQError(Exception):
    """An error answered by a broker (``code`` is the API's, ``status`` the HTTP status,
    ``fields`` the body's extra fields), or raised by the client itself."""

    CODE = "ERROR"

    def __init__(
        self,
        code: str,
        message: str,
        status: int | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.fields: dict[str, Any] = dict(fields or {})


class NotMasterError(LedgerMQError):
    CODE = "NOT_MASTER"

    @property
    def leader_url(self) -> str | None:
        url = self.fields.get("leader_url")
        return url if isinstance(url, str) and url else None


class NoMasterError(LedgerMQError):
    CODE = "NO_MASTER"


class UnknownOutcomeError(LedgerMQError):
    CODE = "UNKNOWN_OUTCOME"


class TopicNotFoundError(LedgerMQError):
    CODE = "TOPIC_NOT_FOUND"


class TopicConflictError(LedgerMQError):
    CODE = "TOPIC_CONFLICT"


class InvalidArgumentError(LedgerMQError):
    CODE = "INVALID_ARGUMENT"


class PayloadTooLargeError(LedgerMQError):
    CODE = "PAYLOAD_TOO_LARGE"


class MessageNotFoundError(LedgerMQError):
    CODE = "MESSAGE_NOT_FOUND"


class GroupNotFoundError(LedgerMQError):
    CODE = "GROUP_NOT_FOUND"


class SequenceTooOldError(LedgerMQError):
    CODE = "SEQUENCE_TOO_OLD"


class BusyError(LedgerMQError):
    CODE = "BUSY"


class LimitReachedError(LedgerMQError):
    """The broker's limit of topics or queues is reached (not retried: room is made by
    deleting a topic or raising the limit)."""

    CODE = "LIMIT_REACHED"


class DiskFullError(LedgerMQError):
    """The master's disk is full: it refuses writes until space returns (by itself); the
    client retries within its deadline, as the answer's ``Retry-After`` says."""

    CODE = "DISK_FULL"


class NodeFailedError(LedgerMQError):
    """The node stopped working and is exiting; another takes over (retried)."""

    CODE = "NODE_FAILED"


class CorruptEntryError(LedgerMQError):
    """That broker's copy of the message is damaged (it refuses to serve it): a read
    goes on to the next broker at once, and raises this only when none served it."""

    CODE = "CORRUPT_ENTRY"


class UnauthenticatedError(LedgerMQError):
    """No token, or one the broker does not know."""

    CODE = "UNAUTHENTICATED"


class ForbiddenError(LedgerMQError):
    """The token's scopes do not cover the request."""

    CODE = "FORBIDDEN"


class BrokerUnavailableError(LedgerMQError):
    """No broker answered (connection refused, timeouts) within the deadline."""

    CODE = "BROKER_UNAVAILABLE"


_ERROR_CLASSES: dict[str, type[LedgerMQError]] = {
    cls.CODE: cls
    for cls in (
        NotMasterError,
        NoMasterError,
        UnknownOutcomeError,
        TopicNotFoundError,
        TopicConflictError,
        InvalidArgumentError,
        PayloadTooLargeError,
        MessageNotFoundError,
        GroupNotFoundError,
        SequenceTooOldError,
        BusyError,
        LimitReachedError,
        DiskFullError,
        NodeFailedError,
        CorruptEntryError,
        UnauthenticatedError,
        ForbiddenError,
        BrokerUnavailableError,
    )
}


def make_error(
    code: str, message: str, status: int | None = None, fields: Mapping[str, Any] | None = None
) -> LedgerMQError:
    """The typed exception for an API error code (``LedgerMQError`` for others)."""
    return _ERROR_CLASSES.get(code, LedgerMQError)(code, message, status, fields)


# ---- settings -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Every limit of the client. One *operation* (a send, a poll, an admin call) makes
    at most ``max_attempts`` requests (discovery and redirects included) within
    ``deadline_s``; one *request* waits ``timeout_s`` beyond any long-poll wait."""

    timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    deadline_s: float = 30.0
    max_attempts: int = 64
    # The first backoff is 20-40 ms, then doubling (equal jitter): a failover completes
    # in well under 100 ms after a crash (issue 18), so a client waits little for it.
    backoff_base_s: float = 0.04
    backoff_cap_s: float = 2.0
    # Redirects followed in a row before backing off (two nodes naming each other).
    max_redirects: int = 5
    # A manual-commit consumer ahead of its committed offsets pulls queue by queue and
    # long-polls one queue at a time for at most this long.
    sweep_wait_ms: int = 200
    auth_token: str | None = None
    verify: bool | str | ssl.SSLContext = True  # TLS: False, a CA bundle path, a context
    max_connections: int = 16
    # Proxies from the environment are ignored unless asked for: brokers are usually near.
    trust_env: bool = False
    # A produce (and the master discovery before it) that gets no answer within this
    # long is given up on that node: the master is looked for again and the batch
    # retried under its producer session (the broker deduplicates, or joins the attempt
    # still running). A commit takes a round trip and an fsync, milliseconds; a paused
    # or cut-off master would otherwise hold the send for all of ``timeout_s``, while a
    # new master is elected in about a second. Capped by ``timeout_s``.
    produce_answer_timeout_s: float = 1.5

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.deadline_s <= 0:
            raise ValueError("timeouts and the deadline must be positive")
        if self.max_attempts < 1 or self.max_redirects < 1 or self.max_connections < 1:
            raise ValueError("max_attempts, max_redirects and max_connections must be >= 1")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("want 0 < backoff_base_s <= backoff_cap_s")
        if self.sweep_wait_ms < 0:
            raise ValueError("sweep_wait_ms must be >= 0")
        if self.produce_answer_timeout_s <= 0:
            raise ValueError("produce_answer_timeout_s must be positive")


class ClientOptions(TypedDict, total=False):
    """``ClientSettings`` fields as constructor keywords."""

    timeout_s: float
    connect_timeout_s: float
    deadline_s: float
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    max_redirects: int
    sweep_wait_ms: int
    auth_token: str | None
    verify: bool | str | ssl.SSLContext
    max_connections: int
    trust_env: bool
    produce_answer_timeout_s: float


def backoff_delay_s(n: int, settings: ClientSettings, rng: random.Random) -> float:
    """The ``n``-th backoff (0-based): exponential, capped, with "equal jitter" (a
    uniform draw from the upper half) so that clients retrying together spread out."""
    ceiling = min(settings.backoff_cap_s, settings.backoff_base_s * (2 ** min(n, 30)))
    return rng.uniform(ceiling / 2, ceiling)


def parse_brokers(brokers: str | Sequence[str]) -> list[str]:
    """``"h0:8080, http://h1:8081/"`` → ``["http://h0:8080", "http://h1:8081"]``."""
    raw = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    out: list[str] = []
    for item in raw:
        url = item.strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"invalid broker URL {item.strip()!r}")
        if url not in out:
            out.append(url)
    if not out:
        raise ValueError("no broker URL given")
    return out


# ---- data -----------------------------------------------------------------------------------


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


MessageLike: TypeAlias = Message | Mapping[str, Any] | bytes | str

_MESSAGE_FIELDS = ("key", "keys", "tags", "properties", "queue_id", "sharding_key")


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
    msg_id: str
    queue_id: int
    queue_offset: int


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


def decode_message(d: Mapping[str, Any]) -> ReceivedMessage:
    raw = d.get("body") or ""
    body = base64.b64decode(raw) if d.get("encoding") == "base64" else str(raw).encode()
    keys = d.get("keys") or ()
    return ReceivedMessage(
        topic=str(d.get("topic", "")),
        queue_id=int(d["queue_id"]),
        queue_offset=int(d["queue_offset"]),
        msg_id=str(d.get("msg_id", "")),
        body=body,
        key=d.get("key"),
        keys=tuple(str(k) for k in keys),
        tags=d.get("tags"),
        properties=dict(d.get("properties") or {}),
        born_timestamp=int(d.get("born_timestamp") or 0),
        store_timestamp=int(d.get("store_timestamp") or 0),
    )


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
    topic: str
    queue_id: int
    committed_offset: int | None
    max_offset: int
    lag: int


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


def master_url_from(asked_url: str, d: Mapping[str, Any]) -> str | None:
    """Where the master is, by one node's ``/v1/cluster``: that node itself when it is
    MASTER (by the URL that reached it), else its ``leader_url`` — unless the leader is
    the node itself, still catching up, which takes no writes yet."""
    if d.get("broker_role") == "MASTER":
        return asked_url
    url = d.get("leader_url")
    if isinstance(url, str) and url and d.get("leader_id") != d.get("node_id"):
        return url.rstrip("/")
    return None


# ---- the sans-I/O core: actions out, outcomes in --------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """Send this to that URL (the drivers do it)."""

    method: str
    url: str
    params: Mapping[str, str | int] | None
    content: bytes | None
    timeout_s: float
    accept: str | None = None  # the client's default (JSON) unless set


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: Any  # parsed JSON, or None when the body is empty or not JSON
    text: str = ""
    content: bytes | memoryview = b""  # the raw body of a non-JSON answer (an Arrow stream)


@dataclass(frozen=True, slots=True)
class Unreachable:
    """No HTTP answer: connection refused, reset, timed out."""

    error: str


Action: TypeAlias = Request | Sleep
Outcome: TypeAlias = Reply | Unreachable
T = TypeVar("T")
Gen: TypeAlias = Generator[Action, Outcome | None, T]


@dataclass(frozen=True, slots=True)
class Call:
    """One API request before routing: path relative to a broker's base URL."""

    method: str
    path: str
    params: Mapping[str, str | int] | None = None
    body: Any = None
    write: bool = False  # needs the master
    wait_ms: int = 0  # the server may hold it this long (long polling)
    url: str | None = None  # this node only: no routing, no retries
    accept: str | None = None  # another representation than JSON (errors stay JSON)
    answer_timeout_s: float | None = None  # a node silent this long is skipped (writes)


def error_from_reply(reply: Reply) -> LedgerMQError:
    err = reply.body.get("error") if isinstance(reply.body, Mapping) else None
    if isinstance(err, Mapping) and isinstance(err.get("code"), str):
        fields = {k: v for k, v in err.items() if k not in ("code", "message")}
        return make_error(err["code"], str(err.get("message", "")), reply.status, fields)
    snippet = reply.text.strip().replace("\n", " ")[:200]
    return LedgerMQError(f"HTTP_{reply.status}", snippet or "no error body", reply.status)


def retry_after_s(reply: Reply, error: LedgerMQError) -> float:
    """The server's hint: the body's ``retry_after_ms``, else the ``Retry-After``
    header (seconds), else 0."""
    ms = error.fields.get("retry_after_ms")
    if isinstance(ms, int | float) and ms >= 0:
        return float(ms) / 1000
    try:
        return max(0.0, float(reply.headers.get("retry-after", "0")))
    except ValueError:
        return 0.0


def redirect_target(reply: Reply, error: LedgerMQError) -> str | None:
    """The master's base URL from a ``307 NOT_MASTER``: ``leader_url``, else the
    scheme and host of ``Location``."""
    url = error.fields.get("leader_url")
    if isinstance(url, str) and url:
        return url.rstrip("/")
    location = reply.headers.get("location")
    if location:
        parts = urlsplit(location)
        if parts.scheme in ("http", "https") and parts.netloc:
            return f"{parts.scheme}://{parts.netloc}"
    return None


RETRIED = {"NO_MASTER", "UNKNOWN_OUTCOME", "BUSY", "DISK_FULL", "NODE_FAILED"}
# Retried against the same master: it is the master, it is only busy or out of disk.
_SAME_MASTER = {"BUSY", "DISK_FULL"}


def _unavailable(message: str) -> BrokerUnavailableError:
    return BrokerUnavailableError(BrokerUnavailableError.CODE, message)


@dataclass(slots=True)
class _Round:
    """The retry state of one operation."""

    skip: set[str] = field(default_factory=set)  # tried this round, to no avail
    unreachable: dict[str, str] = field(default_factory=dict)  # URL → last error
    last: LedgerMQError | None = None
    attempts: int = 0
    backoffs: int = 0
    redirects: int = 0  # since the last backoff
    silent: set[str] = field(default_factory=set)  # gave no answer this round

    def not_there(self, url: str, error: str) -> None:
        self.skip.add(url)
        self.silent.add(url)
        self.unreachable[url] = error
        if self.last is None or isinstance(self.last, BrokerUnavailableError):
            self.last = _unavailable(f"{url}: {error}")

    def next_round(self) -> None:
        self.backoffs += 1
        self.redirects = 0
        self.skip.clear()
        self.silent.clear()


class Exchange:
    """Routing and retries for one client: the broker list, the cached master, and the
    ``exchange`` generator that turns a ``Call`` into a successful ``Reply`` or raises."""

    def __init__(
        self,
        brokers: str | Sequence[str],
        settings: ClientSettings,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.brokers = parse_brokers(brokers)
        self.settings = settings
        self.master: str | None = None
        self.rng = rng or random.Random()
        self.clock = clock
        self._rotation = 0

    def _request(self, url: str, call: Call, content: bytes | None, deadline: float) -> Request:
        left = max(0.001, deadline - self.clock())
        timeout = min(self.settings.timeout_s, left, call.answer_timeout_s or left)
        timeout += call.wait_ms / 1000
        return Request(call.method, url + call.path, call.params, content, timeout, call.accept)

    @staticmethod
    def _send(request: Request) -> Gen[Outcome]:
        outcome = yield request
        assert outcome is not None, "a driver answers every Request"
        return outcome

    def _pick(self, call: Call, skip: set[str]) -> str | None:
        """The next URL to try: the master if known (always for writes), else the
        brokers in rotation; ``None`` when this round has tried them all."""
        if self.master is not None and self.master not in skip:
            return self.master
        n = len(self.brokers)
        for i in range(n):
            url = self.brokers[(self._rotation + i) % n]
            if url not in skip:
                self._rotation = (self._rotation + i + 1) % n
                return url
        return None

    def exchange(self, call: Call) -> Gen[Reply]:  # noqa: PLR0912  # every routing rule of one call
        """Send ``call`` until a 2xx answer; raise the typed error otherwise."""
        content = orjson.dumps(call.body) if call.body is not None else None
        s = self.settings
        deadline = self.clock() + s.deadline_s
        if call.url is not None:  # one node, one try
            outcome = yield from self._send(self._request(call.url, call, content, deadline))
            if isinstance(outcome, Unreachable):
                raise _unavailable(f"{call.url}: {outcome.error}")
            if 200 <= outcome.status < 300:
                return outcome
            raise error_from_reply(outcome)
        r = _Round()
        while True:
            if r.attempts >= s.max_attempts or (r.attempts and self.clock() >= deadline):
                raise r.last or _unavailable(f"gave up after {r.attempts} requests")
            url = self._pick(call, r.skip)
            wait_s = 0.0
            if url is None or r.redirects > s.max_redirects:
                if r.last is None or isinstance(r.last, BrokerUnavailableError):
                    r.last = _unavailable(
                        "no broker answered: "
                        + "; ".join(f"{u}: {e}" for u, e in r.unreachable.items())
                    )
            elif call.write and self.master is None:
                yield from self._discover(url, r, deadline, call.answer_timeout_s)
                continue
            else:
                r.attempts += 1
                outcome = yield from self._send(self._request(url, call, content, deadline))
                if isinstance(outcome, Unreachable):
                    r.not_there(url, outcome.error)
                    if url == self.master:
                        self.master = None
                    continue
                if 200 <= outcome.status < 300:
                    return outcome
                r.last = err = error_from_reply(outcome)
                if isinstance(err, NotMasterError):
                    r.redirects += 1
                    target = redirect_target(outcome, err)
                    self.master = target if target not in (None, url) else None
                    if self.master is not None and self.master not in r.skip:
                        continue
                    self.master = None
                elif isinstance(err, CorruptEntryError) and not call.write:
                    r.skip.add(url)  # another replica's copy is intact: ask the next one
                    continue
                elif err.code in RETRIED:
                    if err.code not in _SAME_MASTER:
                        self.master = None  # leadership may have moved: rediscover
                    wait_s = retry_after_s(outcome, err)
                else:
                    raise err
            # Back off, then start a new round over every broker.
            delay = max(backoff_delay_s(r.backoffs, s, self.rng), wait_s)
            if self.clock() + delay > deadline:
                assert r.last is not None
                raise r.last
            r.next_round()
            yield Sleep(delay)

    def _discover(
        self, url: str, r: _Round, deadline: float, answer_timeout_s: float | None = None
    ) -> Gen[None]:
        """Master discovery: ask ``url`` who the master is. A master named that gave no
        answer this round (paused, cut off; the others have not noticed yet) is not
        asked again before the next round."""
        r.attempts += 1
        call = Call("GET", "/v1/cluster", answer_timeout_s=answer_timeout_s)
        outcome = yield from self._send(self._request(url, call, None, deadline))
        if isinstance(outcome, Unreachable):
            r.not_there(url, outcome.error)
            return
        r.skip.add(url)
        if outcome.status >= 500:
            r.last = error_from_reply(outcome)
            return
        if outcome.status != 200:
            raise error_from_reply(outcome)  # e.g. 401: no use asking the others
        self.master = master_url_from(url, outcome.body)
        if self.master in r.silent:
            r.last = NoMasterError(
                NoMasterError.CODE, f"{url} names {self.master}, which did not answer", 503
            )
            self.master = None
        elif self.master is None:
            r.last = NoMasterError(NoMasterError.CODE, f"{url} knows no master yet", 503)
        else:
            r.skip.discard(self.master)

    def get(self, path: str, params: Mapping[str, str | int] | None = None) -> Gen[Any]:
        reply = yield from self.exchange(Call("GET", path, params))
        return reply.body

    def write(self, method: str, path: str, body: Any = None) -> Gen[Reply]:
        return (yield from self.exchange(Call(method, path, body=body, write=True)))


def _path(*parts: str | int) -> str:
    """``/v1/topics/a%25b``: names may hold ``%`` and ``|``, so every part is quoted."""
    return "/v1/" + "/".join(quote(str(p), safe="") for p in parts)


def _queue_map(d: Mapping[str, Any]) -> dict[int, int]:
    return {int(q): int(o) for q, o in d.items()}


# ---- operations: written once, run by both drivers ------------------------------------------


class AdminOps:
    """Topic, group, cluster and query operations."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex

    def create_topic(self, name: str, queues: int | None = None) -> Gen[TopicInfo]:
        body: dict[str, Any] = {"name": name}
        if queues is not None:
            body["queues"] = queues
        reply = yield from self.ex.write("POST", "/v1/topics", body)
        d = reply.body
        return TopicInfo(str(d["name"]), int(d["queues"]), created=reply.status == 201)

    def list_topics(self) -> Gen[list[TopicInfo]]:
        d = yield from self.ex.get("/v1/topics")
        return [TopicInfo(str(t["name"]), int(t["queues"])) for t in d["topics"]]

    def describe_topic(self, name: str) -> Gen[TopicDescription]:
        d = yield from self.ex.get(_path("topics", name))
        queues = [
            QueueInfo(int(q["queue_id"]), int(q["min_offset"]), int(q["max_offset"]))
            for q in d["queues"]
        ]
        return TopicDescription(str(d["name"]), queues)

    def delete_topic(self, name: str) -> Gen[None]:
        yield from self.ex.write("DELETE", _path("topics", name))

    def cluster(self, url: str | None = None) -> Gen[ClusterStatus]:
        """One node's view: ``url``'s (no retries), or any broker's."""
        reply = yield from self.ex.exchange(Call("GET", "/v1/cluster", url=url))
        return parse_cluster(reply.body)

    def cluster_all(self) -> Gen[list[NodeView]]:
        """Every node: each broker URL, then each ``nodes[].http_url`` they report, asked
        once each. A node that does not answer comes back with ``error`` set."""
        answered: dict[str, NodeView] = {}  # node id → view
        failed: dict[str, str] = {}  # URL → why
        reported: dict[str, str | None] = {}  # node id → http_url, as the nodes say
        todo = list(self.ex.brokers)
        asked: set[str] = set()
        while todo:  # bounded: each URL once, and the membership is finite
            url = todo.pop(0)
            if url in asked:
                continue
            asked.add(url)
            try:
                st = yield from self.cluster(url)
            except LedgerMQError as e:
                failed[url] = str(e)
                continue
            answered.setdefault(st.node_id, NodeView(st.node_id, url, st))
            for n in st.nodes:
                if n.http_url:
                    reported[n.node_id] = n.http_url.rstrip("/")
                    todo.append(n.http_url.rstrip("/"))
                else:
                    reported.setdefault(n.node_id, None)
        views = dict(answered)
        for node_id, node_url in reported.items():
            if node_id not in views:
                why = failed.get(node_url, "did not answer") if node_url else "no HTTP URL known"
                views[node_id] = NodeView(node_id, node_url, None, why)
        claimed = {v.url for v in views.values()}
        strays = [NodeView(None, u, None, e) for u, e in failed.items() if u not in claimed]
        return [views[k] for k in sorted(views)] + strays

    def transfer_leadership(self, to: str) -> Gen[dict[str, Any]]:
        reply = yield from self.ex.write("POST", "/v1/cluster/leadership", {"to": to})
        self.ex.master = None  # it moved: rediscover
        return dict(reply.body or {})

    def groups(self) -> Gen[list[str]]:
        d = yield from self.ex.get("/v1/groups")
        return [str(g) for g in d["groups"]]

    def group_offsets(self, group: str, topic: str | None = None) -> Gen[list[GroupOffset]]:
        params = {"topic": topic} if topic is not None else None
        d = yield from self.ex.get(_path("groups", group, "offsets"), params)
        return [
            GroupOffset(
                str(o["topic"]),
                int(o["queue_id"]),
                None if o.get("committed_offset") is None else int(o["committed_offset"]),
                int(o["max_offset"]),
                int(o["lag"]),
            )
            for o in d["offsets"]
        ]

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> Gen[None]:
        body = {"topic": topic, "offsets": {str(q): o for q, o in sorted(offsets.items())}}
        yield from self.ex.write("PUT", _path("groups", group, "offsets"), body)

    def reset_offsets(
        self, group: str, topic: str, to: Literal["earliest", "latest"] | int
    ) -> Gen[dict[int, int]]:
        """Move a group to ``earliest``, ``latest`` or a store timestamp (ms)."""
        body = {"topic": topic, "to": to}
        reply = yield from self.ex.write("POST", _path("groups", group, "offsets", "reset"), body)
        return _queue_map((reply.body or {}).get("offsets") or {})

    def get_message(self, msg_id: str) -> Gen[ReceivedMessage]:
        d = yield from self.ex.get(_path("messages", msg_id))
        return decode_message(d)

    def query_by_key(
        self, topic: str, key: str, max_results: int = 64
    ) -> Gen[list[ReceivedMessage]]:
        d = yield from self.ex.get(
            _path("topics", topic, "messages"), {"key": key, "max": max_results}
        )
        return [decode_message(m) for m in d["messages"]]

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> Gen[int]:
        path = _path("topics", topic, "queues", queue_id, "offset")
        d = yield from self.ex.get(path, {"timestamp": timestamp_ms})
        return int(d["offset"])

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> Gen[PullResult]:
        """One queue from ``offset`` (RocketMQ's pull: ``status`` says what was found)."""
        params: dict[str, str | int] = {
            "offset": offset,
            "max_messages": max_messages,
            "wait_ms": wait_ms,
        }
        if tags is not None:
            params["tags"] = tags
        path = _path("topics", topic, "queues", queue_id, "messages")
        reply = yield from self.ex.exchange(Call("GET", path, params, wait_ms=wait_ms))
        d = reply.body
        return PullResult(
            status=str(d["status"]),
            messages=[decode_message(m) for m in d["messages"]],
            next_offset=int(d["next_offset"]),
            min_offset=int(d["min_offset"]),
            max_offset=int(d["max_offset"]),
        )

    def pull_arrow(
        self, topic: str, queue_id: int, offset: int, *, max_messages: int = 32, wait_ms: int = 0
    ) -> Gen[ArrowPage]:
        """``pull`` answered as an Arrow IPC stream (docs/spark.md): the stream's bytes, as
        they came, with the status and offsets (decode them with ``pyarrow.ipc``)."""
        params: dict[str, str | int] = {
            "offset": offset,
            "max_messages": max_messages,
            "wait_ms": wait_ms,
        }
        path = _path("topics", topic, "queues", queue_id, "messages")
        call = Call("GET", path, params, wait_ms=wait_ms, accept=ARROW_STREAM)
        reply = yield from self.ex.exchange(call)
        h = reply.headers
        try:
            return ArrowPage(
                status=h["ledgermq-pull-status"],
                next_offset=int(h["ledgermq-next-offset"]),
                min_offset=int(h["ledgermq-min-offset"]),
                max_offset=int(h["ledgermq-max-offset"]),
                count=int(h["ledgermq-message-count"]),
                content=reply.content,
            )
        except (KeyError, ValueError):
            raise LedgerMQError(
                "NOT_ARROW", f"{path}: the answer is not an Arrow pull ({h.get('content-type')})"
            ) from None


def new_producer_id() -> str:
    return f"p-{uuid.uuid4().hex}"


class ProducerOps:
    """A producer session: ``producer_id`` and a ``sequence`` that grows by one per
    batch. Retries of one batch resend the same (id, sequence): the broker answers them
    with the original results instead of appending again."""

    def __init__(self, ex: Exchange, producer_id: str | None, first_sequence: int) -> None:
        self.ex = ex
        self.producer_id = producer_id if producer_id is not None else new_producer_id()
        if not PRODUCER_ID.fullmatch(self.producer_id):
            raise ValueError(
                f"invalid producer_id {self.producer_id!r}: want {PRODUCER_ID.pattern}"
            )
        if first_sequence < 0:
            raise ValueError("first_sequence must be >= 0")
        self.sequence = first_sequence  # the next batch's

    def send(self, topic: str, messages: Iterable[MessageLike]) -> Gen[list[SendResult]]:
        """Send one batch; results in batch order, after quorum commit."""
        batch = [encode_message(m) for m in messages]
        if not batch:
            raise ValueError("no messages to send")
        sequence = self.sequence
        self.sequence += 1
        body = {"messages": batch, "producer_id": self.producer_id, "sequence": sequence}
        path = _path("topics", topic, "messages")
        answer_s = self.ex.settings.produce_answer_timeout_s
        call = Call("POST", path, body=body, write=True, answer_timeout_s=answer_s)
        reply = yield from self.ex.exchange(call)
        results = reply.body["results"]
        assert len(results) == len(batch), f"{len(results)} results for {len(batch)} messages"
        return [
            SendResult(str(r["msg_id"]), int(r["queue_id"]), int(r["queue_offset"]))
            for r in results
        ]

    def send_one(
        self,
        topic: str,
        body: bytes | str | Message,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        sharding_key: str | None = None,
    ) -> Gen[SendResult]:
        m = (
            body
            if isinstance(body, Message)
            else Message(
                body,
                key=key,
                tags=tags,
                properties=properties or {},
                queue_id=queue_id,
                sharding_key=sharding_key,
            )
        )
        results = yield from self.send(topic, [m])
        return results[0]


@dataclass(frozen=True, slots=True)
class Batch:
    """What one fetch returned, and where each queue's next fetch starts."""

    messages: list[ReceivedMessage]
    next_offsets: dict[int, int]


Start = Literal["earliest", "latest"]


class ConsumerOps:
    """Long-poll consumption of one topic by a consumer group, or without a group from
    ``start`` (then nothing is committed).

    ``positions`` is where this consumer is (the offset after what it delivered, per
    queue); ``committed`` what it knows to be committed. While nothing delivered is
    uncommitted, a fetch is one group pull from the committed offsets (served on the
    broker with long polling across all queues). A consumer that is ahead of its
    commits (``auto_commit=False`` without a ``commit()``, or no group) pulls queue by
    queue from its positions, so nothing is delivered twice by one consumer. With
    ``auto_commit`` each fetch first commits what the previous ones delivered: at least
    once, as Kafka's ``enable.auto.commit``."""

    def __init__(
        self,
        ex: Exchange,
        group: str | None,
        topic: str,
        *,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = True,
        start: Start = "earliest",
    ) -> None:
        self.ex = ex
        self.admin = AdminOps(ex)
        self.group = group
        self.topic = topic
        self.queue_ids = None if queue_ids is None else sorted(set(queue_ids))
        self.auto_commit = auto_commit and group is not None
        self.start: Start = start
        self.positions: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self._turn = 0  # rotates the queue a sweep starts with
        self._positioned = False  # every queue has a position

    def pending(self) -> dict[int, int]:
        """Positions not yet committed."""
        return {q: p for q, p in self.positions.items() if p > self.committed.get(q, -1)}

    def commit(self) -> Gen[dict[int, int]]:
        """Commit the positions (the offsets after what was delivered)."""
        todo = self.pending()
        if self.group is None or not todo:
            return {}
        yield from self.admin.commit_offsets(self.group, self.topic, todo)
        self.committed.update(todo)
        return todo

    def fetch(self, max_messages: int, wait_ms: int) -> Gen[Batch]:
        """Up to ``max_messages`` new messages, waiting up to ``wait_ms`` for one.
        Positions move only through ``deliver``/``finish``."""
        if self.auto_commit:
            yield from self.commit()
        if self.group is not None and not self.pending():
            return (yield from self._group_pull(self.group, max_messages, wait_ms))
        if not self._positioned:
            yield from self._start_positions()
        return (yield from self._sweep(max_messages, wait_ms))

    def hand_out(self, batch: Batch, pacer: Pacer) -> Iterator[ReceivedMessage]:
        """A fetched batch one message at a time: each counts as delivered once handed
        out, so a caller that stops early leaves the rest for the next fetch."""
        pacer.got(len(batch.messages))
        for m in batch.messages:
            self.deliver(m)
            yield m
        self.finish(batch)

    def deliver(self, m: ReceivedMessage) -> None:
        self.positions[m.queue_id] = max(self.positions.get(m.queue_id, 0), m.queue_offset + 1)

    def finish(self, batch: Batch) -> None:
        for q, o in batch.next_offsets.items():
            self.positions[q] = max(self.positions.get(q, 0), o)

    def _group_pull(self, group: str, max_messages: int, wait_ms: int) -> Gen[Batch]:
        body: dict[str, Any] = {"topic": self.topic, "max_messages": max_messages}
        body["wait_ms"] = wait_ms
        if self.queue_ids is not None:
            body["queue_ids"] = self.queue_ids
        call = Call("POST", _path("groups", group, "pull"), body=body, wait_ms=wait_ms)
        reply = yield from self.ex.exchange(call)
        nexts = _queue_map(reply.body["next_offsets"])
        got = [decode_message(m) for m in reply.body["messages"]]
        # What the group's committed offsets were (as this node saw them): the first
        # message of a queue, or where it stands with none.
        starts = dict(nexts)
        for m in reversed(got):
            starts[m.queue_id] = m.queue_offset
        for q, o in starts.items():
            self.committed[q] = max(self.committed.get(q, 0), o)
        # A node behind on a commit we made repeats messages we delivered: drop them.
        floor = {q: max(self.positions.get(q, 0), self.committed.get(q, 0)) for q in nexts}
        fresh = [m for m in got if m.queue_offset >= floor.get(m.queue_id, 0)]
        return Batch(fresh, nexts)

    def _start_positions(self) -> Gen[None]:
        """Every queue's position, once, for pulling queue by queue: a group's committed
        offset (a queue it has not committed starts at the earliest, as on the broker),
        without a group ``start``. Queues already positioned keep their place."""
        desc = yield from self.admin.describe_topic(self.topic)
        committed: dict[int, int | None] = {}
        if self.group is not None:
            try:
                offsets = yield from self.admin.group_offsets(self.group, self.topic)
                committed = {o.queue_id: o.committed_offset for o in offsets}
            except GroupNotFoundError:
                pass
        for q in desc.queues:
            if self.queue_ids is not None and q.queue_id not in self.queue_ids:
                continue
            if self.group is not None:
                start = max(committed.get(q.queue_id) or 0, q.min_offset)
                self.committed.setdefault(q.queue_id, start)
            else:
                start = q.min_offset if self.start == "earliest" else q.max_offset
            self.positions.setdefault(q.queue_id, start)
        self._positioned = True

    def _pull_from(self, q: int, max_messages: int, wait_ms: int) -> Gen[PullResult]:
        r = yield from self.admin.pull(
            self.topic, q, self.positions[q], max_messages=max_messages, wait_ms=wait_ms
        )
        if r.status == "OFFSET_ILLEGAL" and self.positions[q] < r.min_offset:
            # Retention deleted what was next: go on from the oldest retained message,
            # as RocketMQ does. (Past the end is a node behind the one that served us
            # before: wait for it, never rewind.)
            self.positions[q] = r.min_offset
        return r

    def _sweep(self, max_messages: int, wait_ms: int) -> Gen[Batch]:
        """Queue by queue from the positions; while nothing is found, long-poll one
        queue at a time (``sweep_wait_ms`` each, in turn) until ``wait_ms`` is spent."""
        queues = sorted(self.positions)
        if not queues:
            return Batch([], {})
        deadline = self.ex.clock() + wait_ms / 1000
        slice_ms = max(1, self.ex.settings.sweep_wait_ms)
        rounds = wait_ms // slice_ms + 2  # a bound on the loop, beyond the deadline's
        got: list[ReceivedMessage] = []
        nexts: dict[int, int] = {}
        for _ in range(rounds):
            turn = self._turn % len(queues)
            self._turn = turn + 1  # the next sweep starts one queue on: fairness
            order = queues[turn:] + queues[:turn]
            for q in order:
                r = yield from self._pull_from(q, max_messages - len(got), 0)
                got.extend(r.messages)
                nexts[q] = r.next_offset if r.status != "OFFSET_ILLEGAL" else self.positions[q]
                if len(got) >= max_messages:
                    break
            left_ms = int((deadline - self.ex.clock()) * 1000)
            if got or left_ms <= 0:
                break
            q = order[0]
            r = yield from self._pull_from(q, max_messages, min(left_ms, slice_ms))
            if r.messages:
                got.extend(r.messages)
                nexts[q] = r.next_offset
                break
        return Batch(got, nexts)

    def poll(self, max_messages: int = 32, wait_ms: int = 0) -> Gen[list[ReceivedMessage]]:
        batch = yield from self.fetch(max_messages, wait_ms)
        for m in batch.messages:
            self.deliver(m)
        self.finish(batch)
        return batch.messages

    def pull(
        self,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> Gen[PullResult]:
        """One queue from ``offset``; does not move the consumer."""
        return (
            yield from self.admin.pull(
                self.topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
            )
        )


class Pacer:
    """When a ``messages()`` iteration stops: after ``max_messages``, or when nothing
    arrived for ``max_idle_s`` (never, if ``None``)."""

    def __init__(
        self,
        clock: Callable[[], float],
        max_idle_s: float | None,
        max_messages: int | None,
        wait_ms: int,
        batch: int,
    ) -> None:
        if batch < 1 or wait_ms < 0:
            raise ValueError("batch must be >= 1 and wait_ms >= 0")
        self.clock = clock
        self.max_idle_s = max_idle_s
        self.left = max_messages
        self.wait_ms = wait_ms
        self.batch = batch
        self.idle_since = clock()

    def next_fetch(self) -> tuple[int, int] | None:
        """(max_messages, wait_ms) for the next fetch, or ``None`` to stop."""
        if self.left is not None and self.left <= 0:
            return None
        wait_ms = self.wait_ms
        if self.max_idle_s is not None:
            left_ms = int((self.idle_since + self.max_idle_s - self.clock()) * 1000)
            if left_ms <= 0:
                return None
            wait_ms = min(wait_ms, left_ms)
        return (self.batch if self.left is None else min(self.batch, self.left)), wait_ms

    def got(self, n: int) -> None:
        if n:
            self.idle_since = self.clock()
            if self.left is not None:
                self.left -= n


# ---- drivers --------------------------------------------------------------------------------

Ops = TypeVar("Ops")
P = ParamSpec("P")


def _request_args(req: Request, settings: ClientSettings) -> dict[str, Any]:
    headers = {"content-type": "application/json"} if req.content is not None else {}
    if req.accept is not None:
        headers["accept"] = req.accept
    return {
        "method": req.method,
        "url": req.url,
        "params": req.params,
        "content": req.content,
        "headers": headers,
        "timeout": httpx.Timeout(
            req.timeout_s, connect=min(settings.connect_timeout_s, req.timeout_s)
        ),
    }


def _reply(resp: httpx.Response) -> Reply:
    body: Any = None
    text = ""
    headers = {k.lower(): v for k, v in resp.headers.items()}
    if resp.is_success and headers.get("content-type") == ARROW_STREAM:
        return Reply(resp.status_code, headers, None, "", resp.content)
    if resp.content:
        try:
            body = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            text = resp.text
    return Reply(resp.status_code, headers, body, text)


def tls_context(verify: bool | str | ssl.SSLContext) -> bool | ssl.SSLContext:
    """httpx's ``verify`` for ours: a CA bundle path becomes an SSL context that trusts
    it (httpx deprecates the path form)."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify


def _client_args(s: ClientSettings) -> dict[str, Any]:
    headers = {"accept": "application/json", "user-agent": "ledgermq-python"}
    if s.auth_token:
        headers["authorization"] = f"Bearer {s.auth_token}"
    return {
        "headers": headers,
        "verify": tls_context(s.verify),
        "follow_redirects": False,  # 307 NOT_MASTER is handled by Exchange
        "trust_env": s.trust_env,
        "limits": httpx.Limits(max_connections=s.max_connections),
    }


def _settings(settings: ClientSettings | None, options: ClientOptions) -> ClientSettings:
    return replace(settings or ClientSettings(), **options)


class _Steps(Generic[T]):
    """One running operation: ``next(outcome)`` is its next action, ``None`` once it
    has returned (into ``result``). The drivers only perform the actions."""

    def __init__(self, gen: Gen[T]) -> None:
        self._gen = gen
        self.result: T

    def next(self, outcome: Outcome | None) -> Action | None:
        try:
            return self._gen.send(outcome)
        except StopIteration as stop:
            self.result = stop.value
            return None


def _unreachable(e: httpx.TransportError) -> Unreachable:
    return Unreachable(f"{type(e).__name__}: {e}".rstrip(": "))


class _Front:
    """What the public classes share: the constructor's needs from a driver."""

    # Producers and consumers hold state (a sequence, positions): one operation at a
    # time. Admin calls are independent.
    _serialize = True
    _exchange: Exchange

    def _open(
        self, brokers: str | Sequence[str], settings: ClientSettings, transport: Any
    ) -> Exchange:
        raise NotImplementedError

    @property
    def master(self) -> str | None:
        """The master's URL as last learnt (``None``: unknown)."""
        return self._exchange.master


class _SyncDriver(_Front, Generic[Ops]):
    """Runs operations with one ``httpx.Client`` (connections are reused)."""

    _ops: Ops

    def _open(
        self, brokers: str | Sequence[str], settings: ClientSettings, transport: Any
    ) -> Exchange:
        self._http = httpx.Client(transport=transport, **_client_args(settings))
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self._serialize else contextlib.nullcontext()
        )
        self._exchange = Exchange(brokers, settings)
        return self._exchange

    def _run(self, gen: Gen[T]) -> T:
        steps: _Steps[T] = _Steps(gen)
        outcome: Outcome | None = None
        with self._lock:
            while (action := steps.next(outcome)) is not None:
                outcome = self._perform(action)
        return steps.result

    def _perform(self, action: Action) -> Outcome | None:
        if isinstance(action, Sleep):
            time.sleep(action.seconds)
            return None
        try:
            return _reply(self._http.request(**_request_args(action, self._exchange.settings)))
        except httpx.TransportError as e:
            return _unreachable(e)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncDriver(_Front, Generic[Ops]):
    """Runs operations with one ``httpx.AsyncClient`` (connections are reused)."""

    _ops: Ops

    def _open(
        self, brokers: str | Sequence[str], settings: ClientSettings, transport: Any
    ) -> Exchange:
        self._http = httpx.AsyncClient(transport=transport, **_client_args(settings))
        self._lock: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Lock() if self._serialize else contextlib.nullcontext()
        )
        self._exchange = Exchange(brokers, settings)
        return self._exchange

    async def _run(self, gen: Gen[T]) -> T:
        steps: _Steps[T] = _Steps(gen)
        outcome: Outcome | None = None
        async with self._lock:
            while (action := steps.next(outcome)) is not None:
                outcome = await self._perform(action)
        return steps.result

    async def _perform(self, action: Action) -> Outcome | None:
        if isinstance(action, Sleep):
            await asyncio.sleep(action.seconds)
            return None
        args = _request_args(action, self._exchange.settings)
        try:
            return _reply(await self._http.request(**args))
        except httpx.TransportError as e:
            return _unreachable(e)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _blocking(
    op: Callable[Concatenate[Ops, P], Gen[T]],
) -> Callable[Concatenate[_SyncDriver[Ops], P], T]:
    """A shared operation as a method of a sync class."""

    def method(self: _SyncDriver[Ops], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(self._ops, *args, **kwargs))

    method.__name__ = op.__name__
    method.__doc__ = op.__doc__
    return method


def _awaiting(
    op: Callable[Concatenate[Ops, P], Gen[T]],
) -> Callable[Concatenate[_AsyncDriver[Ops], P], Coroutine[Any, Any, T]]:
    """A shared operation as a coroutine method of an async class."""

    async def method(self: _AsyncDriver[Ops], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(self._ops, *args, **kwargs))

    method.__name__ = op.__name__
    method.__doc__ = op.__doc__
    return method


# ---- the public classes ---------------------------------------------------------------------


class _AdminFront(_Front):
    _ops: AdminOps
    _serialize = False

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = AdminOps(ex)


class Admin(_SyncDriver[AdminOps], _AdminFront):
    """Topics, groups, cluster status, leadership and queries (blocking)."""

    create_topic = _blocking(AdminOps.create_topic)
    list_topics = _blocking(AdminOps.list_topics)
    describe_topic = _blocking(AdminOps.describe_topic)
    delete_topic = _blocking(AdminOps.delete_topic)
    cluster = _blocking(AdminOps.cluster)
    cluster_all = _blocking(AdminOps.cluster_all)
    transfer_leadership = _blocking(AdminOps.transfer_leadership)
    groups = _blocking(AdminOps.groups)
    group_offsets = _blocking(AdminOps.group_offsets)
    commit_offsets = _blocking(AdminOps.commit_offsets)
    reset_offsets = _blocking(AdminOps.reset_offsets)
    get_message = _blocking(AdminOps.get_message)
    query_by_key = _blocking(AdminOps.query_by_key)
    offset_for_timestamp = _blocking(AdminOps.offset_for_timestamp)
    pull = _blocking(AdminOps.pull)
    pull_arrow = _blocking(AdminOps.pull_arrow)


class AsyncAdmin(_AsyncDriver[AdminOps], _AdminFront):
    """``Admin`` for asyncio."""

    create_topic = _awaiting(AdminOps.create_topic)
    list_topics = _awaiting(AdminOps.list_topics)
    describe_topic = _awaiting(AdminOps.describe_topic)
    delete_topic = _awaiting(AdminOps.delete_topic)
    cluster = _awaiting(AdminOps.cluster)
    cluster_all = _awaiting(AdminOps.cluster_all)
    transfer_leadership = _awaiting(AdminOps.transfer_leadership)
    groups = _awaiting(AdminOps.groups)
    group_offsets = _awaiting(AdminOps.group_offsets)
    commit_offsets = _awaiting(AdminOps.commit_offsets)
    reset_offsets = _awaiting(AdminOps.reset_offsets)
    get_message = _awaiting(AdminOps.get_message)
    query_by_key = _awaiting(AdminOps.query_by_key)
    offset_for_timestamp = _awaiting(AdminOps.offset_for_timestamp)
    pull = _awaiting(AdminOps.pull)
    pull_arrow = _awaiting(AdminOps.pull_arrow)


class _ProducerFront(_Front):
    _ops: ProducerOps

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        producer_id: str | None = None,
        first_sequence: int = 0,
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        """``producer_id`` names the session (default: a fresh ``p-<uuid4>``); a caller
        resuming a session after a restart passes its id and the sequence after the
        last one it used as ``first_sequence``."""
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = ProducerOps(ex, producer_id, first_sequence)

    @property
    def producer_id(self) -> str:
        return self._ops.producer_id

    @property
    def sequence(self) -> int:
        """The sequence number the next batch will carry."""
        return self._ops.sequence


class Producer(_SyncDriver[ProducerOps], _ProducerFront):
    """Sends batches through the master, deduplicated across retries (blocking)."""

    send = _blocking(ProducerOps.send)
    send_one = _blocking(ProducerOps.send_one)


class AsyncProducer(_AsyncDriver[ProducerOps], _ProducerFront):
    """``Producer`` for asyncio."""

    send = _awaiting(ProducerOps.send)
    send_one = _awaiting(ProducerOps.send_one)


class _ConsumerFront(_Front):
    _ops: ConsumerOps

    def __init__(
        self,
        brokers: str | Sequence[str],
        group: str | None,
        topic: str,
        *,
        queue_ids: Sequence[int] | None = None,
        auto_commit: bool = True,
        start: Start = "earliest",
        settings: ClientSettings | None = None,
        transport: Any = None,
        **options: UnpackKw[ClientOptions],
    ) -> None:
        """``group=None`` reads without a group from ``start`` and commits nothing.
        With ``auto_commit`` (the default) every poll first commits what the previous
        polls returned, and ``close()`` commits the rest: at-least-once delivery."""
        if start not in ("earliest", "latest"):
            raise ValueError(f"start is earliest or latest, not {start!r}")
        ex = self._open(brokers, _settings(settings, options), transport)
        self._ops = ConsumerOps(
            ex, group, topic, queue_ids=queue_ids, auto_commit=auto_commit, start=start
        )

    @property
    def group(self) -> str | None:
        return self._ops.group

    @property
    def topic(self) -> str:
        return self._ops.topic

    @property
    def positions(self) -> dict[int, int]:
        """Per queue, the offset after the last message delivered."""
        return dict(self._ops.positions)

    @property
    def committed(self) -> dict[int, int]:
        """Per queue, the committed offset as this consumer knows it."""
        return dict(self._ops.committed)


class Consumer(_SyncDriver[ConsumerOps], _ConsumerFront):
    """Long-poll consumption of a topic by a group, with commits (blocking).
    ``for m in consumer`` runs until the caller breaks; ``messages(max_idle_s=...)``
    stops by itself."""

    poll = _blocking(ConsumerOps.poll)
    commit = _blocking(ConsumerOps.commit)
    pull = _blocking(ConsumerOps.pull)

    def messages(
        self,
        *,
        max_idle_s: float | None = None,
        max_messages: int | None = None,
        wait_ms: int = 1000,
        batch: int = 32,
    ) -> Iterator[ReceivedMessage]:
        """Messages one by one; a message counts as delivered when it is yielded, so a
        caller that breaks out commits (at ``close``) only what it has seen."""
        pacer = Pacer(self._exchange.clock, max_idle_s, max_messages, wait_ms, batch)
        while (want := pacer.next_fetch()) is not None:
            yield from self._ops.hand_out(self._run(self._ops.fetch(*want)), pacer)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return self.messages()

    def close(self) -> None:
        """Commit what was delivered (with ``auto_commit``), then close."""
        try:
            if self._ops.auto_commit:
                self.commit()
        finally:
            super().close()

    def __exit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:  # failing: commit nothing more
            super().close()
        else:
            self.close()


class AsyncConsumer(_AsyncDriver[ConsumerOps], _ConsumerFront):
    """``Consumer`` for asyncio; ``async for m in consumer``."""

    poll = _awaiting(ConsumerOps.poll)
    commit = _awaiting(ConsumerOps.commit)
    pull = _awaiting(ConsumerOps.pull)

    async def messages(
        self,
        *,
        max_idle_s: float | None = None,
        max_messages: int | None = None,
        wait_ms: int = 1000,
        batch: int = 32,
    ) -> AsyncIterator[ReceivedMessage]:
        """As ``Consumer.messages``."""
        clock = self._exchange.clock
        pacer = Pacer(clock, max_idle_s, max_messages, wait_ms, batch)
        while (want := pacer.next_fetch()) is not None:
            fetched = await self._run(self._ops.fetch(*want))
            for m in self._ops.hand_out(fetched, pacer):
                yield m

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        return self.messages()

    async def close(self) -> None:
        try:
            if self._ops.auto_commit:
                await self.commit()
        finally:
            await super().close()

    async def __aexit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:
            await super().close()
        else:
            await self.close()
