"""The HTTP API (docs/http.md) over one node's ``Broker``: ``create_app(settings, broker)``.

Nothing is built at import time: the node runner (``ledgermq.node``) makes the broker, starts
it, and serves this app with uvicorn on the same event loop as the Raft runtime. The
routes live in ``api/routes/`` (one file per resource); this module composes them: the
node's state on ``app.state`` (which the routes' dependencies read), the request guard
(``api.guard``: every body capped, and a body without a valid token refused, before it
is read), the token check on ``/v1``, the long-poll counter, the error handlers that
give every error the body of docs/http.md (``{"error": {"code", "message", ...}}``), and
the OpenAPI document.

Requests are validated by the pydantic models of ``api.models`` before the broker sees
them, and the broker checks its limits before anything is written, so bad input is
answered 4xx and changes nothing. Writes on a SLAVE answer 307 to the same path on the
master; with no master known, 503 ``NO_MASTER`` with ``Retry-After``. Produce and pull
responses are rendered straight to JSON bytes with orjson (no response model validation
on the hot path); their models document them in the OpenAPI schema.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from broker import errors
from broker.broker import Broker
from broker.settings import BrokerSettings

from . import http_protocol, models
from .auth import TokenTable
from .cors import ClusterCORS, ConsoleFiles
from .guard import RequestGuard
from .metrics import METRICS_CACHE_S, NodeMetrics
from .routes import (
    cluster,
    groups,
    messages,
    pop,
    probes,
    prometheus,
    query,
    topics,
    transactions,
)
from .routes.common import (
    DEFAULT_RETRY_AFTER_S,
    JSONBytes,
    LongPolls,
    broker_error_response,
    check_token,
    error_docs,
    error_response,
    node_maxima,
    validation_message,
)

log = logging.getLogger(__name__)

CONSOLE_DIR = Path(__file__).resolve().parent / "console"
"""The web console's files (docs/console.md), served at ``/console/``: package data."""

# The codes the node's connections answer before a request reaches this app (431, 408,
# 503: api.http_protocol, which ledgermq.node serves it with) are the API's codes too.
CONNECTION_ERRORS = (
    http_protocol.HeadersTooLargeError,
    http_protocol.RequestTimeoutError,
    http_protocol.TooManyConnectionsError,
)


def create_app(
    settings: BrokerSettings,
    broker: Broker,
    *,
    auth_token: str | None = None,
    auth_tokens: TokenTable | None = None,
    metrics_need_auth: bool | None = None,
    metrics_cache_s: float = METRICS_CACHE_S,
) -> FastAPI:
    """The HTTP API of one node. ``broker`` is started (and stopped) by the caller.

    With ``auth_token`` (allowed everything) or ``auth_tokens`` (tokens with scopes, see
    ``api.auth``) every ``/v1`` request needs ``Authorization: Bearer <token>``: 401
    without a known one, 403 when its scopes do not cover the request. ``/healthz`` and
    ``/readyz`` stay open; ``/metrics`` (which names every topic) needs a token too
    unless ``metrics_need_auth`` is False (None: when there are tokens); a rendered
    ``/metrics`` answers the scrapes of the next ``metrics_cache_s`` seconds."""
    tokens: TokenTable | None = None
    if auth_token is not None or auth_tokens is not None:
        tokens = TokenTable() if auth_tokens is None else auth_tokens.copy()
        if auth_token is not None:
            tokens.add(auth_token, ["admin"])
    metrics = NodeMetrics(broker, cache_s=metrics_cache_s)
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
        responses=error_docs(422, 500),
    )
    app.state.broker = broker
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.tokens = tokens
    limits = settings.limits
    app.state.long_polls = LongPolls(limits.max_long_polls, limits.max_long_polls_per_client)
    for exc, handler in ERROR_HANDLERS:
        app.add_exception_handler(exc, handler)
    app.add_middleware(RequestGuard, limits=settings.limits, tokens=tokens, metrics=metrics)
    # Outermost: a preflight from another node's console is answered before the guard.
    app.add_middleware(ClusterCORS, settings=settings, members=broker.member_urls)

    # The routers are the modules' own, shared by every app of the process; what differs
    # between apps is chosen here, where they are included: the token check of /v1 and
    # of /metrics.
    app.include_router(probes.router)
    metrics_closed = tokens is not None and metrics_need_auth is not False
    app.include_router(
        prometheus.router, dependencies=[Depends(check_token)] if metrics_closed else []
    )
    guarded = [Depends(check_token)] if tokens is not None else []
    for router in (
        cluster.router,
        topics.router,
        messages.router,
        query.router,
        groups.router,
        pop.router,
        transactions.router,
    ):
        app.include_router(
            router, dependencies=guarded, responses=error_docs(401, 403) if guarded else None
        )
    # One-message produces pay FastAPI's per-request machinery most: the route is served
    # ahead of it by a plain Starlette route doing the same (``produce_direct``).
    app.router.routes.insert(
        0, Route("/v1/topics/{topic}/messages", messages.produce_direct, methods=["POST"])
    )
    # The web console: static files that call the API above from the browser, with the
    # same tokens (docs/console.md); open, like any page: the data is what the API guards.
    app.add_route("/console", _to_console, include_in_schema=False)
    console = ConsoleFiles(directory=CONSOLE_DIR, settings=settings, members=broker.member_urls)
    app.mount("/console", console, name="console")
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


async def _to_console(request: Request) -> Response:
    return RedirectResponse("/console/", status_code=307)


# ---- error handlers ------------------------------------------------------------------------
# Every error answers the error body of docs/http.md; a broker's NOT_MASTER is a 307 to
# the same path on the master, and a retryable refusal carries ``Retry-After``. Each
# counts itself in the metrics of the app that answers (``app.state.metrics``).


def _metrics_of(request: Request) -> NodeMetrics:
    metrics: NodeMetrics = request.app.state.metrics
    return metrics


async def on_broker_error(request: Request, e: errors.BrokerError) -> Response:
    _metrics_of(request).errors.labels(e.code).inc()
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
    return broker_error_response(e)


async def on_invalid(request: Request, e: RequestValidationError) -> Response:
    _metrics_of(request).errors.labels("INVALID_ARGUMENT").inc()
    return error_response(422, "INVALID_ARGUMENT", validation_message(e))


async def on_http_error(request: Request, e: StarletteHTTPException) -> Response:
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(e.status_code, "HTTP_ERROR")
    return error_response(e.status_code, code, str(e.detail), headers=e.headers)


async def on_client_gone(request: Request, e: ClientDisconnect) -> Response:
    # The client went away before its body arrived (it gave up on a paused node, say):
    # nothing was read, nothing is done, nobody reads the answer. Not a bug.
    _metrics_of(request).errors.labels("CLIENT_DISCONNECT").inc()
    log.info("%s %s: the client went away before its body arrived", request.method,
             request.url.path)  # fmt: skip
    return error_response(499, "CLIENT_DISCONNECT", "the client went away")


async def on_bug(request: Request, e: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.scope.get("path"))
    _metrics_of(request).errors.labels("INTERNAL").inc()
    return error_response(500, "INTERNAL", f"internal error: {type(e).__name__}")


# Each handler takes its own class (Starlette's type says ``Exception``): ``...`` here.
ERROR_HANDLERS: tuple[tuple[type[Exception], Callable[..., Awaitable[Response]]], ...] = (
    (errors.BrokerError, on_broker_error),
    (RequestValidationError, on_invalid),
    (StarletteHTTPException, on_http_error),
    (ClientDisconnect, on_client_gone),
    (Exception, on_bug),
)
"""Each exception class and its handler, in the order ``create_app`` adds them."""


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, with the schemas of the produce body, which the route
    parses by hand (JSON or NDJSON) and so does not declare as a parameter, and this
    node's maxima of the parameters bounded by its limits (``NodeMaximum``)."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        settings: BrokerSettings = app.state.settings
        node_maxima(schema, settings.limits)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (models.ProduceRequest, models.ProduceMessage):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(js.pop("$defs", {}))
            components[model.__name__] = js
        app.openapi_schema = schema
    return app.openapi_schema
