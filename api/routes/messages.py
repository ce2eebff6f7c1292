"""Produce to a topic and pull from one of its queues (docs/http.md), JSON or NDJSON in, JSON
or an Arrow IPC stream out (docs/spark.md): ``router`` and its routes ``produce``,
``pull`` and ``offset_for_time``, with the parsing and rendering they use."""

import base64
import binascii
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Query, Request
from pydantic import ValidationError
from starlette.responses import Response

from broker import errors, records
from broker.broker import NewMessage, ProduceResult
from broker.jsonint import decimal
from broker.produce import Producer, now_ms
from broker.settings import Limits
from broker.timers.service import Scheduled, Timers
from broker.transactions.service import Transactions

from .. import fetch, media, models
from ..json_messages import JSONMessages, pull_json
from ..json_shape import check_json_shape, ndjson_lines
from ..metrics import NodeMetrics
from .common import (
    NDJSON,
    Access,
    AccessDep,
    EncodingQuery,
    JSONBytes,
    LimitsDep,
    LongPollDep,
    MetricsDep,
    NodeMaximum,
    ProducerDep,
    QueuePath,
    ReadsDep,
    TimersDep,
    TopicPath,
    TransactionsDep,
    authorize,
    bearer_token,
    check_maxima,
    error_docs,
    validation_message,
)

try:  # the Arrow pull needs the optional `arrow` extra (pyarrow, numpy)
    from .. import arrow as arrow_pull
except ImportError:  # pragma: no cover - the test environment installs it
    arrow_pull = None  # type: ignore[assignment]


def to_broker_message(i: int, m: Mapping[str, Any]) -> NewMessage:
    """Message ``i`` of a produce request, as ``ProduceMessage``'s fields (a validated
    model's ``vars``, or a plain body's dict from ``plain_produce``)."""
    text = m["body"]
    if m.get("encoding") == "base64":
        try:
            body = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise errors.InvalidArgumentError(f"messages[{i}].body is not valid base64") from None
    else:
        body = text.encode("utf-8", "surrogatepass")
    keys: list[str] = []
    key, more = m.get("key"), m.get("keys")
    if key is not None:
        keys.append(key)
    if more:
        keys.extend(k for k in more if k not in keys)
    at, delay = m.get("deliver_at_ms"), m.get("delay_ms")
    if at is not None and delay is not None:
        raise errors.InvalidArgumentError(f"messages[{i}]: deliver_at_ms or delay_ms, not both")
    return NewMessage(
        body=body,
        tags=m.get("tags"),
        keys=keys,
        properties=m.get("properties") or {},
        queue_id=m.get("queue_id"),
        sharding_key=m.get("sharding_key"),
        born_timestamp=m.get("born_timestamp"),
        deliver_at_ms=now_ms() + delay if delay is not None else at,
    )


@dataclass(frozen=True, slots=True)
class ParsedProduce:
    """A produce request's messages (``ProduceMessage``'s fields) and session."""

    messages: Sequence[Mapping[str, Any]]
    producer_id: str | None
    sequence: int | None
    transaction_group: str | None = None  # a transaction's producer group

    @classmethod
    def of(cls, req: models.ProduceRequest) -> "ParsedProduce":
        group = None if req.transaction is None else req.transaction.producer_group
        return cls([vars(m) for m in req.messages], req.producer_id, req.sequence, group)


_REQUEST_FIELDS = frozenset(models.ProduceRequest.model_fields)
_MESSAGE_FIELDS = frozenset(models.ProduceMessage.model_fields)
_SHORT_FIELDS = ("key", "tags", "sharding_key")  # max_length=1024 in ProduceMessage
_ENCODINGS = frozenset({"utf-8", "base64"})
_MAX_SHORT = 1024
_MAX_INT = 2**62


def _plain_message(m: object) -> bool:
    """Is ``m`` (from orjson) a message in exactly the forms ``ProduceMessage`` takes as
    they are: the right JSON types, within their bounds, no coercion needed?"""
    if type(m) is not dict or not m.keys() <= _MESSAGE_FIELDS or type(m.get("body")) is not str:
        return False
    if m.get("encoding", "utf-8") not in _ENCODINGS:
        return False
    for name in _SHORT_FIELDS:
        v = m.get(name)
        if v is not None and (type(v) is not str or len(v) > _MAX_SHORT):
            return False
    keys, props = m.get("keys"), m.get("properties")
    if keys is not None and (
        type(keys) is not list or any(type(k) is not str or len(k) > _MAX_SHORT for k in keys)
    ):
        return False
    if props is not None and (
        type(props) is not dict or any(type(v) is not str for v in props.values())
    ):
        return False
    q = m.get("queue_id")
    return (q is None or (type(q) is int and 0 <= q <= 65_535)) and all(
        v is None or (type(v) is int and 0 <= v <= _MAX_INT)
        for v in (m.get("born_timestamp"), m.get("deliver_at_ms"), m.get("delay_ms"))
    )


def plain_produce(raw: bytes) -> ParsedProduce | None:
    """A JSON produce body read with orjson, when it is made only of the plain forms
    (``_plain_message``) that ``ProduceRequest`` would take unchanged: the same messages
    without a model per message. None for anything else (a syntax error, an unknown
    field, a type to coerce or refuse): the model then reads it, with its errors."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict or not doc.keys() <= _REQUEST_FIELDS or "transaction" in doc:
        return None
    msgs, pid, seq = doc.get("messages"), doc.get("producer_id"), doc.get("sequence")
    if type(msgs) is not list or not msgs or not all(_plain_message(m) for m in msgs):
        return None
    if (pid is not None and type(pid) is not str) or (
        seq is not None and (type(seq) is not int or not 0 <= seq <= _MAX_INT)
    ):
        return None
    return ParsedProduce(msgs, pid, seq)


def parse_produce(raw: bytes, content_type: str, query: Any, limits: Limits) -> ParsedProduce:
    """A produce body, JSON (``ProduceRequest``, or ``plain_produce`` when it reads the
    same) or NDJSON (a message per line, the session in the query), counted
    (``check_json_shape``) before anything is built."""
    if content_type.split(";", maxsplit=1)[0].strip().lower() == NDJSON:
        lines = ndjson_lines(raw, limits.max_messages_per_request)
        check_json_shape(
            raw,
            limits.max_messages_per_request,
            limits.max_json_strings_per_message,
            messages=len(lines),
        )
        msgs = []
        for n, line in enumerate(lines):
            try:
                msgs.append(models.ProduceMessage.model_validate_json(line))
            except ValidationError as e:
                raise errors.InvalidArgumentError(
                    f"line {n + 1}: {validation_message(e)}"
                ) from None
        seq = _query_int(query, "sequence", _MAX_INT, "2^62")
        try:
            group = query.get("transaction_producer_group")
            req = models.ProduceRequest(
                messages=msgs,
                producer_id=query.get("producer_id"),
                sequence=seq,
                transaction=None if group is None else models.TransactionSpec(producer_group=group),
            )
        except ValidationError as e:
            raise errors.InvalidArgumentError(validation_message(e)) from None
        return ParsedProduce.of(req)
    check_json_shape(raw, limits.max_messages_per_request, limits.max_json_strings_per_message)
    plain = plain_produce(raw)
    if plain is not None:
        return plain
    try:
        return ParsedProduce.of(models.ProduceRequest.model_validate_json(raw))
    except ValidationError as e:
        raise errors.InvalidArgumentError(validation_message(e)) from None


def _query_int(query: Any, name: str, top: int, top_text: str | None = None) -> int | None:
    """Query parameter ``name``, ASCII digits up to ``top`` (None: not given)."""
    text = query.get(name)
    if text is None:
        return None
    value = decimal(text)
    if value is None or value > top:
        raise errors.InvalidArgumentError(f"{name} must be an integer in 0..{top_text or top}")
    return value


def parse_record_produce(
    raw: bytes, query: Any, limits: Limits
) -> tuple[records.InnerBatch, str | None, int | None]:
    """A record-format body (``broker.records``) and its query: ``queue_id`` or
    ``sharding_key`` (every message goes to one queue), ``producer_id`` and
    ``sequence``."""
    queue_id = _query_int(query, "queue_id", 65_535)
    sharding_key = query.get("sharding_key")
    if sharding_key is not None and not 0 < len(sharding_key) <= _MAX_SHORT:
        raise errors.InvalidArgumentError(f"sharding_key: 1..{_MAX_SHORT} characters")
    if queue_id is not None and sharding_key is not None:
        raise errors.InvalidArgumentError("queue_id or sharding_key, not both")
    seq = _query_int(query, "sequence", _MAX_INT, "2^62")
    inner = records.parse_inner_batch(raw, limits, queue_id=queue_id, sharding_key=sharding_key)
    return inner, query.get("producer_id"), seq


_PRODUCE_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": "producer_id",
            "in": "query",
            "required": False,
            "schema": {"type": "string"},
            "description": "the producer session of an NDJSON or record-format body",
        },
        {
            "name": "sequence",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0},
            "description": "the session sequence of an NDJSON or record-format body",
        },
        {
            "name": "queue_id",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0, "maximum": 65535},
            "description": "the queue of every message of a record-format body",
        },
        {
            "name": "sharding_key",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "maxLength": 1024},
            "description": "the sharding key of every message of a record-format body",
        },
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
            NDJSON: {
                "schema": {"$ref": "#/components/schemas/ProduceMessage"},
                "example": '{"body": "a"}\n{"body": "b", "tags": "TagA"}\n',
            },
            records.MEDIA_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "RocketMQ's batch encoding: inner records back to back"
                    " (docs/http.md, Produce in the record format)",
                },
            },
        },
    },
}


router = APIRouter()
"""The routes of this file. Each is a module-level function with a comment, not a
docstring (FastAPI would publish one as the operation's description)."""

_RESULT_JSON = b'{"msg_id":"%b","queue_id":%d,"queue_offset":%d,"commitlog_offset":%d}'


def produce_answer(results: Sequence[ProduceResult], transaction: str | None = None) -> Response:
    """The produce answer: one result per message, in batch order, rendered into a
    pre-built fragment (a message id is hex: nothing in it to escape). A transaction's
    results say where its half messages lie, and its id follows them."""
    rows = [
        _RESULT_JSON % (r.msg_id.encode(), r.queue_id, r.queue_offset, r.commitlog_offset)
        for r in results
    ]
    tail = b"" if transaction is None else b',"transaction_id":"%b"' % transaction.encode()
    return Response(
        b'{"results":[%b]%b}' % (b",".join(rows), tail), media_type=JSONBytes.media_type
    )


def runs_answer(placed: Sequence[tuple[int, int, int]], msg_id_prefix: str) -> Response:
    """The compact produce answer (``results=runs``): the messages' places as runs of
    ``[queue_id, queue_offset, commitlog_offset, count]`` (message ``i`` of a run at
    offset + ``i`` and address + ``i``), and what every message id starts with (its
    address in 16 hex digits follows)."""
    runs: list[list[int]] = []
    for q, o, c in placed:
        if runs and (r := runs[-1])[0] == q and r[1] + r[3] == o and r[2] + r[3] == c:
            r[3] += 1
        else:
            runs.append([q, o, c, 1])
    return JSONBytes({"msg_id_prefix": msg_id_prefix, "runs": runs})


def scheduled_answer(results: Sequence[Scheduled]) -> Response:
    """The produce answer of delay messages: no queue yet, a time and a recall handle."""
    return JSONBytes(
        {
            "results": [
                {
                    "msg_id": r.msg_id,
                    "queue_id": None,
                    "queue_offset": None,
                    "commitlog_offset": r.commitlog_offset,
                    "deliver_at_ms": r.deliver_at_ms,
                    "recall_handle": r.recall_handle,
                }
                for r in results
            ]
        }
    )


# ``POST /v1/topics/{topic}/messages``: a batch, JSON or NDJSON, after quorum commit.
@router.post(
    "/v1/topics/{topic}/messages",
    tags=["produce"],
    summary="produce a batch; answers after quorum commit",
    response_model=models.ProduceResponse,
    responses=error_docs(307, 404, 409, 413, 429, 503, 507),
    openapi_extra=_PRODUCE_OPENAPI,
)
async def produce(
    *,
    topic: TopicPath,
    request: Request,
    producer: ProducerDep,
    timers: TimersDep,
    transactions: TransactionsDep,
    limits: LimitsDep,
    metrics: MetricsDep,
    access: AccessDep,
) -> Response:
    return await produce_with(
        topic, request, producer, timers, transactions, limits, metrics, access
    )


_TOPIC = re.compile(models.TOPIC_PATTERN)


async def produce_direct(request: Request) -> Response:
    """``produce`` without FastAPI's per-request machinery (dependencies, the endpoint's
    wrapping; issue 31: a fifth of a one-message produce's CPU), served ahead of it
    (``create_app``), which stays for the OpenAPI document: the same token check
    (``authorize``), path check and answer (``produce_with``)."""
    app = request.app
    authorize(request, bearer_token(request.headers.get("authorization")))
    topic = request.path_params["topic"]
    if not _TOPIC.match(topic):
        raise errors.InvalidArgumentError(
            f"path.topic: String should match pattern '{models.TOPIC_PATTERN}'"
        )
    broker, settings = app.state.broker, app.state.settings
    access = Access(getattr(request.state, "grant", None))
    return await produce_with(
        topic,
        request,
        broker.producer,
        broker.timers,
        broker.transactions,
        settings.limits,
        app.state.metrics,
        access,
    )


async def produce_with(  # noqa: PLR0917 - the route's collaborators, as FastAPI hands them
    topic: str,
    request: Request,
    producer: Producer,
    timers: Timers,
    transactions: Transactions,
    limits: Limits,
    metrics: NodeMetrics,
    access: Access,
) -> Response:
    access.need("produce", topic)
    started = time.monotonic()
    raw = await request.body()  # capped at max_request_bytes by the RequestGuard
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", maxsplit=1)[0].strip().lower() == records.MEDIA_TYPE:
        inner, pid, seq = parse_record_produce(raw, request.query_params, limits)
        if request.query_params.get("results") == "runs":
            placed = await producer.produce_placed(topic, inner, pid, seq)
            answer = runs_answer(placed, producer.msg_id_prefix)
        else:
            answer = produce_answer(await producer.produce(topic, inner, pid, seq))
        metrics.produce_latency.observe(time.monotonic() - started)
        metrics.count_produced(topic, len(inner), inner.body_bytes)
        return answer
    req = parse_produce(raw, content_type, request.query_params, limits)
    if len(req.messages) > limits.max_messages_per_request:
        raise errors.PayloadTooLargeError(
            f"{len(req.messages)} messages; at most {limits.max_messages_per_request}"
        )
    batch = [to_broker_message(i, m) for i, m in enumerate(req.messages)]
    if req.transaction_group is not None:
        begun = await transactions.produce(
            topic, batch, req.transaction_group, req.producer_id, req.sequence
        )
        answer = produce_answer(begun.results, begun.transaction_id)
    elif batch[0].deliver_at_ms is not None or batch[-1].deliver_at_ms is not None:
        scheduled = await timers.produce(topic, batch, req.producer_id, req.sequence)
        answer = scheduled_answer(scheduled)
    else:
        answer = produce_answer(await producer.produce(topic, batch, req.producer_id, req.sequence))
    metrics.produce_latency.observe(time.monotonic() - started)
    metrics.count_produced(topic, len(batch), sum(len(m.body) for m in batch))
    return answer


# The JSON pull takes at most max_pull_messages (the broker checks), an Arrow one
# max_arrow_pull_messages.
PULL_MAX_MESSAGES = NodeMaximum("max_messages", ("max_pull_messages", "max_arrow_pull_messages"))
PULL_WAIT_MS = NodeMaximum("wait_ms", ("max_wait_ms",))


# ``GET /v1/topics/{topic}/queues/{queue_id}/messages``: one queue, JSON, Arrow or records.
@router.get(
    "/v1/topics/{topic}/queues/{queue_id}/messages",
    tags=["consume"],
    summary="pull from one queue (long polling with wait_ms)",
    description=media.ARROW_PULL_DOC,
    response_model=models.PullResponse,
    responses={200: media.ARROW_PULL_RESPONSE, **error_docs(404, 406, 429, 503)},
)
async def pull(
    *,
    request: Request,
    reads: ReadsDep,
    limits: LimitsDep,
    metrics: MetricsDep,
    access: AccessDep,
    long_poll: LongPollDep,
    topic: TopicPath,
    queue_id: QueuePath,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    max_messages: Annotated[int, PULL_MAX_MESSAGES.query(ge=1)] = 32,
    wait_ms: Annotated[int, PULL_WAIT_MS.query(ge=0)] = 0,
    tags: Annotated[str | None, Query(max_length=4096, examples=["TagA||TagB"])] = None,
    encoding: EncodingQuery = "utf-8",
) -> Response:
    check_maxima(limits, (PULL_MAX_MESSAGES, max_messages), (PULL_WAIT_MS, wait_ms))
    access.need("consume", topic)
    answer = media.pull_format(request.headers.get("accept"))
    if answer in (media.RECORDS, media.ARROW_STREAM):
        respond = fetch.pull_response
        if answer == media.ARROW_STREAM:
            if arrow_pull is None:
                raise media.NotAcceptableError("install the ledgermq[arrow] extra for Arrow")
            respond = arrow_pull.pull_response
        with long_poll(wait_ms), metrics.long_polls.track_inprogress():
            return await respond(
                reads,
                metrics,
                topic,
                queue_id,
                offset,
                max_messages=max_messages,
                wait_ms=wait_ms,
                tags=tags,
            )
    make = JSONMessages(reads.settings.group, encoding)
    with long_poll(wait_ms), metrics.long_polls.track_inprogress():
        r = await reads.pull(
            make, topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
        )
    metrics.count_pulled(topic, len(r.messages), make.body_bytes)
    return Response(pull_json(r), media_type=JSONBytes.media_type)


# ``GET /v1/topics/{topic}/queues/{queue_id}/offset``: an offset by store time.
@router.get(
    "/v1/topics/{topic}/queues/{queue_id}/offset",
    tags=["consume"],
    summary="the first offset whose store time is at or after a timestamp",
    response_model=models.OffsetAnswer,
    responses=error_docs(404, 429, 503),
)
async def offset_for_time(
    topic: TopicPath,
    queue_id: Annotated[int, Path(ge=0, le=65_535)],
    timestamp: Annotated[int, Query(ge=0, le=2**62)],
    reads: ReadsDep,
    access: AccessDep,
) -> Response:
    access.need("consume", topic)
    return JSONBytes({"offset": reads.offset_for_time(topic, queue_id, timestamp)})


@router.delete(
    "/v1/delayed/{recall_handle}",
    tags=["produce"],
    summary="cancel a delay message before its delivery",
    responses=error_docs(307, 404, 409, 503),
)
async def recall(
    recall_handle: Annotated[str, Path(min_length=1, max_length=64, examples=["t1:17"])],
    timers: TimersDep,
    access: AccessDep,
) -> Response:
    topic = await timers.topic_of(recall_handle)
    access.need("produce", topic) if topic is not None else access.need("admin")
    await timers.cancel(recall_handle)
    return JSONBytes({"recall_handle": recall_handle, "status": "CANCELLED"})
