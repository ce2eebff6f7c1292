"""What every route file shares: the JSON response class, error bodies (docs/http.md), the
path and query types, and the dependencies through which a route reaches the node's
``Broker``, its settings and limits, its metrics and the request's token (FastAPI's
``Depends``).

The routes are module-level functions on module-level routers, so every app of the
process serves the same route objects: ``create_app`` puts the broker, settings,
metrics, token table and long-poll counter on ``app.state`` and the dependencies read
them from there; a route file holds no node of its own, and one test process can serve
several apps. A query parameter whose maximum is a node limit is a ``NodeMaximum``.
"""

# No `from __future__ import annotations`: FastAPI reads these annotations at runtime.
import contextlib
import functools
import hashlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.responses import Response

from broker import errors
from broker.broker import Broker
from broker.groups import ConsumerGroups
from broker.leadership import Leadership
from broker.membership import Membership
from broker.pop.service import PopGroups
from broker.produce import Producer
from broker.reads import Reads
from broker.settings import BrokerSettings, Limits
from broker.timers.service import Timers
from broker.topics import Topics
from broker.transactions.service import Transactions

from .. import models
from ..auth import Grant, TokenTable
from ..metrics import NodeMetrics

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


def broker_error_response(e: errors.BrokerError) -> JSONBytes:
    """A broker error's answer (docs/http.md): its status and body, ``WWW-Authenticate``
    on a 401 and ``Retry-After`` (whole seconds, at least one) on a retryable refusal."""
    headers = {"WWW-Authenticate": "Bearer"} if e.http_status == 401 else None
    if e.http_status in (429, 503, 507):
        retry_ms = e.fields.get("retry_after_ms", DEFAULT_RETRY_AFTER_S * 1000)
        headers = {"Retry-After": str(max(1, math.ceil(retry_ms / 1000)))}
    return error_response(e.http_status, e.code, e.message, headers=headers, **e.fields)


def error_docs(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI: these statuses answer the docs/http.md error body."""
    return {s: {"model": models.ErrorBody} for s in statuses}


def validation_message(e: ValidationError | RequestValidationError) -> str:
    """The first few validation errors, as one line ("messages.0.body: ...")."""
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    more = len(e.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


# ---- query parameters bounded by a node limit ---------------------------------------------
# FastAPI fixes a parameter's ``le`` when the route is declared, at import, and every app
# of the process serves the same routes, so a maximum that is one of the node's limits
# (one node may allow 5 s long polls, another in the same test process 30 s) cannot be
# an ``le``. Such a parameter is declared with ``NodeMaximum.query`` and the route checks
# it first thing (``check_maxima``: the same 422 ``le`` answered, before any other check
# of the route); the app's OpenAPI document shows the app's maximum (``node_maxima``).
# One difference remains: a request that also fails FastAPI's own validation of another
# parameter is answered that error alone (``le`` listed both); fixed, it gets this one.

NODE_MAXIMUM = "x-node-maximum"
"""The OpenAPI mark of such a parameter: the ``Limits`` fields of its maximum; each app's
document replaces it with ``maximum`` (``node_maxima``)."""


@dataclass(frozen=True, slots=True)
class NodeMaximum:
    """A query parameter ``param`` at most the largest of the node's ``limits`` (names
    of ``Limits`` fields)."""

    param: str
    limits: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = set(self.limits) - set(Limits.__dataclass_fields__)
        assert self.limits and not unknown, f"not fields of Limits: {sorted(unknown)}"

    def of(self, limits: Limits) -> int:
        top: int = max(getattr(limits, name) for name in self.limits)
        return top

    def query(self, **kwargs: Any) -> Any:
        """The parameter's ``Query`` (``ge``, examples, ...), marked for the document."""
        return Query(json_schema_extra={NODE_MAXIMUM: list(self.limits)}, **kwargs)


def check_maxima(limits: Limits, *values: tuple[NodeMaximum, int]) -> None:
    """422 ``INVALID_ARGUMENT`` for each parameter over its node maximum, with the error
    FastAPI's ``le`` gave (``query.wait_ms: Input should be less than or equal to 5000``)."""
    errs = []
    for bound, value in values:
        top = bound.of(limits)
        if value > top:
            errs.append(
                {
                    "type": "less_than_equal",
                    "loc": ("query", bound.param),
                    "msg": f"Input should be less than or equal to {top}",
                    "input": value,
                    "ctx": {"le": top},
                }
            )
    if errs:
        raise RequestValidationError(errs)


def node_maxima(schema: dict[str, Any], limits: Limits) -> None:
    """Write the maximum of every ``NodeMaximum`` parameter of an OpenAPI document for a
    node with ``limits`` (where FastAPI puts an ``le``'s, before ``minimum``)."""
    for operations in schema.get("paths", {}).values():
        for op in operations.values():
            for param in op.get("parameters", []) if isinstance(op, dict) else []:
                js = param.get("schema", {})
                names = js.get(NODE_MAXIMUM)
                if names is None:
                    continue
                top = NodeMaximum(param["name"], tuple(names)).of(limits)
                fields = [(k, v) for k, v in js.items() if k != NODE_MAXIMUM]
                at = next((i for i, (k, _) in enumerate(fields) if k == "minimum"), len(fields))
                fields.insert(at, ("maximum", top))
                param["schema"] = dict(fields)


TopicPath = Annotated[str, Path(pattern=models.TOPIC_PATTERN, examples=["orders"])]
GroupPath = Annotated[str, Path(pattern=models.GROUP_PATTERN, examples=["billing"])]
NodeIdPath = Annotated[str, Path(pattern=models.NODE_ID_PATTERN, examples=["n3"])]
QueuePath = Annotated[int, Path(ge=0, le=65_535)]
EncodingQuery = Annotated[models.Encoding, Query()]


# ---- dependencies -------------------------------------------------------------------------
# Every one is ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool,
# a thread hop per dependency per request (measured: produce b=1 ran at half the rate
# with five of them; tests/api/test_routes_deps.py keeps them async).


async def _broker(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


# The broker's collaborators (``broker/broker.py`` builds them): a route names the one it
# uses, not the whole node.


async def _producer(request: Request) -> Producer:
    producer: Producer = request.app.state.broker.producer
    return producer


async def _reads(request: Request) -> Reads:
    reads: Reads = request.app.state.broker.reads
    return reads


async def _topics(request: Request) -> Topics:
    topics: Topics = request.app.state.broker.topics
    return topics


async def _groups(request: Request) -> ConsumerGroups:
    groups: ConsumerGroups = request.app.state.broker.groups
    return groups


async def _pop(request: Request) -> PopGroups:
    pop: PopGroups = request.app.state.broker.pop
    return pop


async def _timers(request: Request) -> Timers:
    timers: Timers = request.app.state.broker.timers
    return timers


async def _transactions(request: Request) -> Transactions:
    transactions: Transactions = request.app.state.broker.transactions
    return transactions


async def _leadership(request: Request) -> Leadership:
    leadership: Leadership = request.app.state.broker.leadership
    return leadership


async def _membership(request: Request) -> Membership:
    membership: Membership = request.app.state.broker.membership
    return membership


async def _settings(request: Request) -> BrokerSettings:
    settings: BrokerSettings = request.app.state.settings
    return settings


async def _metrics(request: Request) -> NodeMetrics:
    metrics: NodeMetrics = request.app.state.metrics
    return metrics


async def _limits(request: Request) -> Limits:
    limits: Limits = request.app.state.settings.limits
    return limits


BrokerDep = Annotated[Broker, Depends(_broker)]
ProducerDep = Annotated[Producer, Depends(_producer)]
ReadsDep = Annotated[Reads, Depends(_reads)]
TopicsDep = Annotated[Topics, Depends(_topics)]
GroupsDep = Annotated[ConsumerGroups, Depends(_groups)]
LeadershipDep = Annotated[Leadership, Depends(_leadership)]
MembershipDep = Annotated[Membership, Depends(_membership)]
PopDep = Annotated[PopGroups, Depends(_pop)]
TimersDep = Annotated[Timers, Depends(_timers)]
TransactionsDep = Annotated[Transactions, Depends(_transactions)]
SettingsDep = Annotated[BrokerSettings, Depends(_settings)]
LimitsDep = Annotated[Limits, Depends(_limits)]
MetricsDep = Annotated[NodeMetrics, Depends(_metrics)]

bearer = HTTPBearer(auto_error=False, description="a token of the node's --auth-token(s)")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (HTTPBearer's parse)."""
    scheme, token = get_authorization_scheme_param(authorization)
    return token if scheme.lower() == "bearer" and token else None


def grant_of(tokens: TokenTable, token: str | None) -> Grant:
    """What ``token`` may do; 401 (``UnauthenticatedError``) for none or an unknown one.
    The one token check: ``check_token`` and the request guard (before a body is read)."""
    grant = tokens.lookup(token) if token else None
    if grant is None:
        raise errors.UnauthenticatedError("a valid bearer token is required")
    return grant


async def check_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """``authorize`` as a route dependency (HTTPBearer's parse, in the OpenAPI document)."""
    authorize(request, credentials.credentials if credentials else None)


def authorize(request: Request, token: str | None) -> None:
    """401 without a token the node knows (when it has any); the grant goes on the
    request for ``Access``."""
    tokens: TokenTable | None = request.app.state.tokens
    if tokens is not None:
        request.state.grant = grant_of(tokens, token)


class Access:
    """What the request's token may do (docs/operations.md); everything on a node without auth."""

    def __init__(self, grant: Grant | None) -> None:
        self.grant = grant

    def need(self, action: str, topic: str | None = None) -> None:
        """403 unless the token may ``action`` (admin / produce / consume) ``topic``."""
        grant = self.grant
        if grant is None:
            return
        if grant.admin if action == "admin" else grant.allows(action, topic):
            return
        what = f"{action} {topic}" if topic else action
        raise errors.ForbiddenError(f"this token may not {what}", needs=action)

    def need_group(self, group: str) -> None:
        """403 unless the token may reset ``group``'s offsets (``admin`` or
        ``group:<group>``)."""
        grant = self.grant
        if grant is None or grant.owns_group(group):
            return
        raise errors.ForbiddenError(
            f"this token may not reset group {group}'s offsets (admin or group:{group})",
            needs=f"group:{group}",
        )

    def need_any(self, actions: tuple[str, ...], topic: str) -> None:
        """403 unless the token may do one of ``actions`` on ``topic``."""
        grant = self.grant
        if grant is None or grant.admin or any(grant.allows(a, topic) for a in actions):
            return
        raise errors.ForbiddenError(
            f"this token may not {' or '.join(actions)} {topic}", needs=actions[0]
        )

    def may(self, action: str, topic: str) -> bool:
        grant = self.grant
        return grant is None or grant.admin or grant.allows(action, topic)


class LongPolls:
    """The pulls parked on this node (``wait_ms`` > 0), in all and per client: each holds
    a request, a task and a socket for up to ``max_wait_ms``. Past either limit a new
    one is refused with 429 ``BUSY`` and ``Retry-After`` (the client backs off); a pull
    without a wait is not counted. One per app, on ``app.state``."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self.by_client: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, client: str, wait_ms: int) -> Iterator[None]:
        """A slot for one long poll of ``client`` while the block runs."""
        if wait_ms <= 0:
            yield
            return
        held = self.by_client.get(client, 0)
        if self.total >= self.max_total:
            raise errors.BusyError(
                f"{self.total} long polls parked on this node, its limit", retry_after_ms=1000
            )
        if held >= self.max_per_client:
            raise errors.BusyError(
                f"{held} long polls of this client parked, its limit", retry_after_ms=1000
            )
        self.total += 1
        self.by_client[client] = held + 1
        try:
            yield
        finally:
            self.total -= 1
            if self.by_client[client] == 1:
                del self.by_client[client]
            else:
                self.by_client[client] -= 1


def client_of(request: Request) -> str:
    """Who a request counts against: its bearer token (a digest of it), else its peer
    address."""
    token = bearer_token(request.headers.get("authorization"))
    if token is not None:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]
    return "addr:" + (request.client.host if request.client else "?")


async def _long_poll(request: Request) -> Callable[[int], contextlib.AbstractContextManager[None]]:
    polls: LongPolls = request.app.state.long_polls
    return functools.partial(polls.hold, client_of(request))


LongPollDep = Annotated[
    Callable[[int], contextlib.AbstractContextManager[None]], Depends(_long_poll)
]
"""``with long_poll(wait_ms):`` around a pull: a slot of this client's (or 429)."""


async def _access(request: Request) -> Access:
    return Access(getattr(request.state, "grant", None))


AccessDep = Annotated[Access, Depends(_access)]
