"""The HTTP API (API.md §2 and §3) over one node's ``Broker``: ``create_app(settings, broker)``.

Nothing is built at import time: the node runner (``api.node``) makes the broker, starts
it, and serves this app with uvicorn on the same event loop as the Raft runtime.

Requests are validated by the pydantic models of ``api.models`` before the broker sees
them, and the broker checks its limits before anything is written, so bad input is
answered 4xx and changes nothing. Errors all have the body of API.md §2:
``{"error": {"code", "message", ...}}``. Writes on a SLAVE answer 307 to the same path
on the master; with no master known, 503 ``NO_MASTER`` with ``Retry-After``.

Produce and pull responses are rendered straight to JSON bytes with orjson (no response
model validation on the hot path); their models document them in the OpenAPI schema.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations,
# some of which use this app's limits, at route definition time.
import base64
import binascii
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from broker import errors
from broker.broker import Broker, PulledMessage
from broker.broker import ProduceMessage as BrokerMessage
from broker.role import BrokerRole
from broker.settings import BrokerSettings

from . import media, models
from .auth import Grant, TokenTable
from .metrics import NodeMetrics

try:  # the Arrow pull needs the optional `arrow` extra (pyarrow, numpy)
    from . import arrow as arrow_pull
except ImportError:  # pragma: no cover - the test environment installs it
    arrow_pull = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"
DEFAULT_RETRY_AFTER_S = 1


class JSONBytes(Response):
    """A JSON response rendered by orjson (FastAPI's ORJSONResponse is deprecated)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    **fields: Any,
) -> JSONBytes:
    return JSONBytes(
        {"error": {"code": code, "message": message, **fields}}, status_code=status, headers=headers
    )


def _error_docs(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": models.ErrorBody} for s in statuses}


# ---- conversions ----------------------------------------------------------------------------


def message_out(m: PulledMessage, encoding: str) -> dict[str, Any]:
    """A message as API.md §3 shows it; ``utf-8`` falls back to base64 per message."""
    body: str | None = None
    enc = "utf-8"
    if encoding == "utf-8":
        try:
            body = m.body.decode("utf-8")
        except UnicodeDecodeError:
            body = None
    if body is None:
        body, enc = base64.b64encode(m.body).decode("ascii"), "base64"
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "msg_id": m.msg_id,
        "commitlog_offset": m.commitlog_offset,
        "body": body,
        "encoding": enc,
        "key": m.keys[0] if m.keys else None,
        "keys": m.keys,
        "tags": m.tags,
        "properties": m.properties,
        "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp,
    }


def to_broker_message(i: int, m: models.ProduceMessage) -> BrokerMessage:
    if m.encoding == "base64":
        try:
            body = base64.b64decode(m.body, validate=True)
        except (binascii.Error, ValueError):
            raise errors.InvalidArgumentError(f"messages[{i}].body is not valid base64") from None
    else:
        body = m.body.encode("utf-8", "surrogatepass")
    keys: list[str] = []
    if m.key is not None:
        keys.append(m.key)
    if m.keys:
        keys.extend(k for k in m.keys if k not in keys)
    return BrokerMessage(
        body=body,
        tags=m.tags,
        keys=keys,
        properties=m.properties or {},
        queue_id=m.queue_id,
        sharding_key=m.sharding_key,
        born_timestamp=m.born_timestamp,
    )


def _validation_message(e: ValidationError | RequestValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    more = len(e.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


TopicPath = Annotated[str, Path(pattern=models.TOPIC_PATTERN, examples=["orders"])]
EncodingQuery = Annotated[models.Encoding, Query()]
GroupPath = Annotated[str, Path(pattern=models.GROUP_PATTERN, examples=["billing"])]


# ---- the app --------------------------------------------------------------------------------


def create_app(
    settings: BrokerSettings,
    broker: Broker,
    *,
    auth_token: str | None = None,
    auth_tokens: TokenTable | None = None,
    metrics_need_auth: bool = False,
) -> FastAPI:
    """The HTTP API of one node. ``broker`` is started (and stopped) by the caller.

    With ``auth_token`` (allowed everything) or ``auth_tokens`` (tokens with scopes, see
    ``api.auth``) every ``/v1`` request needs ``Authorization: Bearer <token>``: 401
    without a known one, 403 when its scopes do not cover the request. ``/healthz`` and
    ``/readyz`` stay open, ``/metrics`` too unless ``metrics_need_auth``."""
    limits = settings.limits
    max_pull_any = max(limits.max_pull_messages, limits.max_arrow_pull_messages)
    bearer = HTTPBearer(auto_error=False, description="a token of the node's --auth-token(s)")
    tokens: TokenTable | None = None
    if auth_token is not None or auth_tokens is not None:
        tokens = TokenTable() if auth_tokens is None else auth_tokens.copy()
        if auth_token is not None:
            tokens.add(auth_token, ["admin"])

    async def check_token(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if tokens is None:
            return
        grant = tokens.lookup(credentials.credentials) if credentials is not None else None
        if grant is None:
            raise errors.UnauthenticatedError("a valid bearer token is required")
        request.state.grant = grant

    def need(request: Request, action: str, topic: str | None = None) -> None:
        """403 unless the request's token may ``action`` (admin/produce/consume)."""
        grant: Grant | None = getattr(request.state, "grant", None)
        if grant is None:
            return  # no auth on this node
        if grant.admin if action == "admin" else grant.allows(action, topic):
            return
        what = f"{action} {topic}" if topic else action
        raise errors.ForbiddenError(f"this token may not {what}", needs=action)

    guarded = [Depends(check_token)] if tokens is not None else []
    v1 = APIRouter(dependencies=guarded, responses=_error_docs(401, 403) if guarded else None)
    metrics = NodeMetrics(broker)
    app = FastAPI(
        title="LedgerMQ",
        version="1",
        summary="A RocketMQ-style message broker on a DLedger-style Raft commitlog",
        description=(
            "Produce and consume over HTTP. Writes go to the master (a SLAVE answers "
            "307 to it); reads are served by every node from committed data. Every "
            'error body is {"error": {"code", "message", ...}}.'
        ),
        default_response_class=JSONBytes,
        responses=_error_docs(422, 500),
    )
    app.state.broker = broker
    app.state.metrics = metrics

    # ---- errors ------------------------------------------------------------------------

    def broker_error(request: Request, e: errors.BrokerError) -> JSONBytes:
        metrics.errors.labels(e.code).inc()
        fields = e.fields  # retry_after_ms stays: clients may wait less than a second
        if isinstance(e, errors.NotMasterError):
            if e.leader_url:
                url = e.leader_url.rstrip("/") + request.url.path
                if request.url.query:
                    url += "?" + request.url.query
                return error_response(307, e.code, e.message, headers={"Location": url}, **fields)
            return error_response(
                503,
                "NO_MASTER",
                f"the master is {e.leader_id}, whose URL this node does not know (set --peer-urls)",
                headers={"Retry-After": str(DEFAULT_RETRY_AFTER_S)},
                **fields,
            )
        headers = {"WWW-Authenticate": "Bearer"} if e.http_status == 401 else None
        if e.http_status in (429, 503, 507):
            retry_ms = e.fields.get("retry_after_ms", DEFAULT_RETRY_AFTER_S * 1000)
            headers = {"Retry-After": str(max(1, math.ceil(retry_ms / 1000)))}
        return error_response(e.http_status, e.code, e.message, headers=headers, **fields)

    @app.exception_handler(errors.BrokerError)
    async def _on_broker_error(request: Request, e: errors.BrokerError) -> Response:
        return broker_error(request, e)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, e: RequestValidationError) -> Response:
        metrics.errors.labels("INVALID_ARGUMENT").inc()
        return error_response(422, "INVALID_ARGUMENT", _validation_message(e))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, e: StarletteHTTPException) -> Response:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(e.status_code, "HTTP_ERROR")
        return error_response(e.status_code, code, str(e.detail), headers=e.headers)

    @app.exception_handler(Exception)
    async def _on_bug(request: Request, e: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        metrics.errors.labels("INTERNAL").inc()
        return error_response(500, "INTERNAL", f"internal error: {type(e).__name__}")

    # ---- probes and metrics ------------------------------------------------------------

    @app.get(
        "/healthz",
        tags=["cluster"],
        summary="the process is up and working (503 once it failed: it is exiting)",
    )
    async def healthz() -> Response:
        if broker.failed is not None:
            return JSONBytes({"status": "failed", "reason": repr(broker.failed)}, status_code=503)
        return JSONBytes({"status": "ok"})

    @app.get(
        "/readyz",
        tags=["cluster"],
        summary="a master is known and dispatch has caught up with commit",
        response_model=models.Readiness,
        responses={503: {"model": models.Readiness}},
    )
    async def readyz() -> Response:
        st = broker.status()
        reason = None
        if st["failed"] is not None:
            reason = f"node failed: {st['failed']}"
        elif st["dispatch_stall"] is not None:
            reason = f"dispatch stalled: {st['dispatch_stall']}"
        elif st["leader_id"] is None:
            reason = "no master known"
        elif st["dispatched_index"] < st["committed_index"]:
            reason = f"dispatch at {st['dispatched_index']} of {st['committed_index']}"
        elif st["leader_id"] == settings.node_id and broker.role is not BrokerRole.MASTER:
            reason = "leader still catching up"
        if reason:
            return JSONBytes({"ready": False, "reason": reason}, status_code=503)
        return JSONBytes({"ready": True, "reason": None})

    @app.get(
        "/metrics",
        tags=["cluster"],
        summary="Prometheus text exposition",
        dependencies=guarded if metrics_need_auth else [],
    )
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- cluster -----------------------------------------------------------------------

    @v1.get("/v1/cluster", tags=["cluster"], response_model=models.ClusterInfo)
    async def cluster() -> Response:
        st = broker.status()
        nodes = []
        for node_id, addr in sorted(settings.peer_map.items()):
            url = settings.peer_urls.get(node_id)
            if node_id == settings.node_id and settings.advertised_url:
                url = settings.advertised_url
            peer = st["peers"].get(node_id)
            match = peer["match_index"] if peer else None
            if node_id == settings.node_id and st["raft_role"] == "LEADER":
                match = st["ledger_end_index"]
            nodes.append(
                {"node_id": node_id, "raft_addr": addr, "http_url": url, "match_index": match}
            )
        leader_url = st["leader_url"]
        if st["leader_id"] == settings.node_id and settings.advertised_url:
            leader_url = settings.advertised_url
        return JSONBytes(
            {
                "group": st["group"],
                "node_id": st["node_id"],
                "raft_role": st["raft_role"],
                "broker_role": st["broker_role"],
                "term": st["term"],
                "leader_id": st["leader_id"],
                "leader_url": leader_url,
                "nodes": nodes,
                "ledger_begin_index": st["ledger_begin_index"],
                "ledger_end_index": st["ledger_end_index"],
                "committed_index": st["committed_index"],
                "dispatched_index": st["dispatched_index"],
                "snapshot_index": st["snapshot_index"],
                "snapshots_installed": st["snapshots_installed"],
            }
        )

    @v1.post(
        "/v1/cluster/leadership",
        tags=["cluster"],
        summary="transfer leadership; answers once the target leads",
        response_model=models.LeadershipResult,
        responses=_error_docs(307, 409, 503),
    )
    async def leadership(request: Request, body: models.LeadershipRequest) -> Response:
        need(request, "admin")
        await broker.transfer_leadership(body.to)
        st = broker.status()
        return JSONBytes({"leader_id": st["leader_id"] or body.to, "term": st["term"]})

    # ---- topics ------------------------------------------------------------------------

    @v1.post(
        "/v1/topics",
        tags=["topics"],
        status_code=201,
        response_model=models.TopicInfo,
        responses={200: {"model": models.TopicInfo}, **_error_docs(307, 409, 503)},
        summary="create a topic (201); the same again answers 200",
    )
    async def create_topic(request: Request, body: models.TopicCreate) -> Response:
        need(request, "admin")
        t, created = await broker.create_topic(body.name, body.queues)
        return JSONBytes({"name": t.name, "queues": t.queues}, status_code=201 if created else 200)

    @v1.get("/v1/topics", tags=["topics"], response_model=models.TopicList)
    async def list_topics() -> Response:
        return JSONBytes(
            {"topics": [{"name": t.name, "queues": t.queues} for t in broker.list_topics()]}
        )

    @v1.get(
        "/v1/topics/{topic}",
        tags=["topics"],
        response_model=models.TopicDescription,
        responses=_error_docs(404),
    )
    async def describe_topic(topic: TopicPath) -> Response:
        return JSONBytes(broker.describe_topic(topic))

    @v1.delete(
        "/v1/topics/{topic}",
        tags=["topics"],
        status_code=204,
        response_class=Response,
        responses=_error_docs(307, 404, 503),
    )
    async def delete_topic(request: Request, topic: TopicPath) -> Response:
        need(request, "admin")
        await broker.delete_topic(topic)
        return Response(status_code=204)

    # ---- produce -----------------------------------------------------------------------

    async def read_body(request: Request) -> bytes:
        """The request body, refused (413) as soon as it passes the request limit."""
        cap = limits.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise errors.PayloadTooLargeError(f"request body over {cap} bytes", limit=cap)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise errors.PayloadTooLargeError(f"request body over {cap} bytes", limit=cap)
            chunks.append(chunk)
        return b"".join(chunks)

    def parse_produce(raw: bytes, content_type: str, query: Any) -> models.ProduceRequest:
        if content_type.split(";", maxsplit=1)[0].strip().lower() == NDJSON:
            lines = [ln for ln in raw.split(b"\n") if ln.strip()]
            if len(lines) > limits.max_messages_per_request:
                raise errors.PayloadTooLargeError(
                    f"{len(lines)} messages; at most {limits.max_messages_per_request}"
                )
            msgs = []
            for n, line in enumerate(lines):
                try:
                    msgs.append(models.ProduceMessage.model_validate_json(line))
                except ValidationError as e:
                    raise errors.InvalidArgumentError(
                        f"line {n + 1}: {_validation_message(e)}"
                    ) from None
            seq = query.get("sequence")
            if seq is not None and not seq.isdigit():
                raise errors.InvalidArgumentError("sequence must be a non-negative integer")
            try:
                return models.ProduceRequest(
                    messages=msgs,
                    producer_id=query.get("producer_id"),
                    sequence=int(seq) if seq is not None else None,
                )
            except ValidationError as e:
                raise errors.InvalidArgumentError(_validation_message(e)) from None
        try:
            return models.ProduceRequest.model_validate_json(raw)
        except ValidationError as e:
            raise errors.InvalidArgumentError(_validation_message(e)) from None

    @v1.post(
        "/v1/topics/{topic}/messages",
        tags=["produce"],
        summary="produce a batch; answers after quorum commit",
        response_model=models.ProduceResponse,
        responses=_error_docs(307, 404, 409, 413, 429, 503, 507),
        openapi_extra={
            "parameters": [
                {
                    "name": "producer_id",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "the producer session of an NDJSON body",
                },
                {
                    "name": "sequence",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "the session sequence of an NDJSON body",
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
                },
            },
        },
    )
    async def produce(topic: TopicPath, request: Request) -> Response:
        need(request, "produce", topic)
        started = time.monotonic()
        raw = await read_body(request)
        req = parse_produce(raw, request.headers.get("content-type", ""), request.query_params)
        if len(req.messages) > limits.max_messages_per_request:
            raise errors.PayloadTooLargeError(
                f"{len(req.messages)} messages; at most {limits.max_messages_per_request}"
            )
        batch = [to_broker_message(i, m) for i, m in enumerate(req.messages)]
        results = await broker.produce(topic, batch, req.producer_id, req.sequence)
        metrics.produce_latency.observe(time.monotonic() - started)
        metrics.produced_messages.labels(topic).inc(len(batch))
        metrics.produced_bytes.labels(topic).inc(sum(len(m.body) for m in batch))
        return JSONBytes(
            {
                "results": [
                    {
                        "msg_id": r.msg_id,
                        "queue_id": r.queue_id,
                        "queue_offset": r.queue_offset,
                        "commitlog_offset": r.commitlog_offset,
                    }
                    for r in results
                ]
            }
        )

    # ---- consume -----------------------------------------------------------------------

    def messages_out(topic: str, found: Sequence[PulledMessage], encoding: str) -> list[Any]:
        if found:
            metrics.pulled_messages.labels(topic).inc(len(found))
            metrics.pulled_bytes.labels(topic).inc(sum(len(m.body) for m in found))
        return [message_out(m, encoding) for m in found]

    @v1.get(
        "/v1/topics/{topic}/queues/{queue_id}/messages",
        tags=["consume"],
        summary="pull from one queue (long polling with wait_ms)",
        description=media.ARROW_PULL_DOC,
        response_model=models.PullResponse,
        responses={200: media.ARROW_PULL_RESPONSE, **_error_docs(404, 406)},
    )
    async def pull(
        *,
        request: Request,
        topic: TopicPath,
        queue_id: Annotated[int, Path(ge=0, le=65_535)],
        offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
        # The JSON pull takes at most max_pull_messages (the broker checks), an Arrow one
        # max_arrow_pull_messages.
        max_messages: Annotated[int, Query(ge=1, le=max_pull_any)] = 32,
        wait_ms: Annotated[int, Query(ge=0, le=limits.max_wait_ms)] = 0,
        tags: Annotated[str | None, Query(max_length=4096, examples=["TagA||TagB"])] = None,
        encoding: EncodingQuery = "utf-8",
    ) -> Response:
        need(request, "consume", topic)
        if media.wants_arrow(request.headers.get("accept")):
            if arrow_pull is None:
                raise media.NotAcceptableError("install the ledgermq[arrow] extra for Arrow")
            with metrics.long_polls.track_inprogress():
                return await arrow_pull.pull_response(
                    broker,
                    metrics,
                    topic,
                    queue_id,
                    offset,
                    max_messages=max_messages,
                    wait_ms=wait_ms,
                    tags=tags,
                )
        with metrics.long_polls.track_inprogress():
            r = await broker.pull(
                topic, queue_id, offset, max_messages=max_messages, wait_ms=wait_ms, tags=tags
            )
        return JSONBytes(
            {
                "status": r.status,
                "messages": messages_out(topic, r.messages, encoding),
                "next_offset": r.next_offset,
                "min_offset": r.min_offset,
                "max_offset": r.max_offset,
            }
        )

    @v1.get(
        "/v1/topics/{topic}/queues/{queue_id}/offset",
        tags=["consume"],
        summary="the first offset whose store time is at or after a timestamp",
        response_model=models.OffsetAnswer,
        responses=_error_docs(404),
    )
    async def offset_for_time(
        request: Request,
        topic: TopicPath,
        queue_id: Annotated[int, Path(ge=0, le=65_535)],
        timestamp: Annotated[int, Query(ge=0, le=2**62)],
    ) -> Response:
        need(request, "consume", topic)
        return JSONBytes({"offset": broker.offset_for_time(topic, queue_id, timestamp)})

    @v1.get(
        "/v1/topics/{topic}/messages",
        tags=["query"],
        summary="messages carrying a key (or a UNIQ_KEY)",
        response_model=models.MessageList,
        responses=_error_docs(404),
    )
    async def query_by_key(
        request: Request,
        topic: TopicPath,
        key: Annotated[str, Query(min_length=1, max_length=1024)],
        max: Annotated[int, Query(ge=1, le=limits.max_key_query_results)] = 64,
        encoding: EncodingQuery = "utf-8",
    ) -> Response:
        need(request, "consume", topic)
        found = broker.query_by_key(topic, key, max)
        return JSONBytes({"messages": messages_out(topic, found, encoding)})

    @v1.get(
        "/v1/messages/{msg_id}",
        tags=["query"],
        response_model=models.MessageOut,
        responses=_error_docs(404),
    )
    async def get_message(
        request: Request,
        msg_id: Annotated[str, Path(max_length=256)],
        encoding: EncodingQuery = "utf-8",
    ) -> Response:
        m = broker.get_message(msg_id)
        need(request, "consume", m.topic)
        return JSONBytes(message_out(m, encoding))

    # ---- consumer groups ---------------------------------------------------------------

    @v1.get("/v1/groups", tags=["groups"], response_model=models.GroupList)
    async def list_groups(request: Request) -> Response:
        need(request, "consume")
        return JSONBytes({"groups": broker.list_groups()})

    @v1.get(
        "/v1/groups/{group}/offsets",
        tags=["groups"],
        response_model=models.GroupOffsets,
        responses=_error_docs(404),
    )
    async def group_offsets(
        request: Request,
        group: GroupPath,
        topic: Annotated[str | None, Query(pattern=models.TOPIC_PATTERN)] = None,
    ) -> Response:
        need(request, "consume", topic)
        return JSONBytes({"offsets": broker.group_offsets(group, topic)})

    def queue_ids(offsets: dict[str, int]) -> dict[int, int]:
        out = {}
        for k, v in offsets.items():
            if not k.isdigit() or len(k) > 5:
                raise errors.InvalidArgumentError(f"offsets: {k!r} is not a queue id")
            out[int(k)] = v
        return out

    @v1.put(
        "/v1/groups/{group}/offsets",
        tags=["groups"],
        summary="commit a group's offsets (replicated)",
        response_model=models.OffsetsAnswer,
        responses=_error_docs(307, 404, 503),
    )
    async def commit_offsets(
        request: Request, group: GroupPath, body: models.CommitOffsets
    ) -> Response:
        need(request, "consume", body.topic)
        offsets = queue_ids(body.offsets)
        await broker.commit_offsets(group, body.topic, offsets)
        return JSONBytes({"offsets": {str(q): o for q, o in sorted(offsets.items())}})

    @v1.post(
        "/v1/groups/{group}/offsets/reset",
        tags=["groups"],
        summary="move a group's offsets to earliest, latest or a store timestamp",
        response_model=models.OffsetsAnswer,
        responses=_error_docs(307, 404, 503),
    )
    async def reset_offsets(
        request: Request, group: GroupPath, body: models.ResetOffsets
    ) -> Response:
        need(request, "consume", body.topic)
        offsets = await broker.reset_offsets(group, body.topic, body.to)
        return JSONBytes({"offsets": {str(q): o for q, o in sorted(offsets.items())}})

    @v1.post(
        "/v1/groups/{group}/pull",
        tags=["groups"],
        summary="pull from the group's committed offsets (long polling with wait_ms)",
        response_model=models.GroupPullResponse,
        responses=_error_docs(307, 404, 503),
    )
    async def group_pull(request: Request, group: GroupPath, body: models.GroupPull) -> Response:
        need(request, "consume", body.topic)
        with metrics.long_polls.track_inprogress():
            r = await broker.group_pull(
                group,
                body.topic,
                max_messages=body.max_messages,
                wait_ms=body.wait_ms,
                queue_ids=body.queue_ids,
                auto_commit=body.auto_commit,
            )
        return JSONBytes(
            {
                "messages": messages_out(body.topic, r.messages, body.encoding),
                "next_offsets": {str(q): o for q, o in sorted(r.next_offsets.items())},
            }
        )

    app.include_router(v1)

    # ---- OpenAPI: the produce body is parsed by hand (JSON or NDJSON); add its schemas --

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (models.ProduceRequest, models.ProduceMessage):
                js = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(js.pop("$defs", {}))
                components[model.__name__] = js
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
