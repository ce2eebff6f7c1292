"""The routes are module-level functions on module-level routers (issue 27, item 2): a
tool or a test names and imports one (``from api.routes.messages import produce``);
every app of the process serves those same functions, and what differs between apps
(limits, broker, tokens) reaches them through ``app.state``, never through a closure.
A query parameter whose maximum is a node limit (``NodeMaximum``) is checked by its
route with the answer FastAPI's ``le`` gave, and each app's OpenAPI document shows its
own maximum."""

from __future__ import annotations

import inspect
from dataclasses import replace
from types import ModuleType
from typing import Any

import httpx
import pytest
from fastapi import APIRouter
from fastapi.routing import APIRoute

from api import app as app_module
from api.app import create_app
from api.routes import (
    cluster,
    common,
    groups,
    messages,
    pop,
    probes,
    prometheus,
    query,
    topics,
    transactions,
)
from api.routes.groups import group_pull
from api.routes.messages import offset_for_time, produce, pull
from api.routes.query import query_by_key
from broker.broker import Broker
from broker.settings import BrokerSettings, Limits
from tests.api.conftest import Node
from tests.api.test_routes_deps import _api_routes

ROUTE_MODULES = (
    probes,
    prometheus,
    cluster,
    topics,
    messages,
    query,
    groups,
    pop,
    transactions,
)


def _served(routes: list[Any]) -> dict[tuple[str, str], Any]:
    """(method, path) → endpoint of every APIRoute under ``routes``."""
    return {(m, r.path): r.endpoint for r in _api_routes(routes) for m in sorted(r.methods or ())}


def test_handlers_are_importable_by_name_and_are_the_routers_routes() -> None:
    served = _served(messages.router.routes)
    assert served["POST", "/v1/topics/{topic}/messages"] is produce
    assert served["GET", "/v1/topics/{topic}/queues/{queue_id}/messages"] is pull
    assert served["GET", "/v1/topics/{topic}/queues/{queue_id}/offset"] is offset_for_time
    assert _served(query.router.routes)["GET", "/v1/topics/{topic}/messages"] is query_by_key
    assert _served(groups.router.routes)["POST", "/v1/groups/{group}/pull"] is group_pull


@pytest.mark.parametrize("module", ROUTE_MODULES, ids=lambda m: m.__name__)
def test_each_route_file_has_one_router_of_module_level_functions(module: ModuleType) -> None:
    routers = [v for v in vars(module).values() if isinstance(v, APIRouter)]
    assert routers == [module.router]
    assert module.router.routes
    assert all(isinstance(r, APIRoute) for r in module.router.routes)
    for fn in _served(module.router.routes).values():
        assert inspect.iscoroutinefunction(fn), fn
        # a module-level function of this file: no closure, no ``<locals>`` in its name
        assert fn.__module__ == module.__name__
        assert fn.__qualname__ == fn.__name__, fn.__qualname__
        assert getattr(module, fn.__name__) is fn
        assert fn.__closure__ is None
        # no docstring: FastAPI would publish it as the operation's description
        assert fn.__doc__ is None, fn.__name__


def test_every_app_serves_the_modules_functions_and_nothing_else() -> None:
    settings = BrokerSettings()
    served = {k: v for m in ROUTE_MODULES for k, v in _served(m.router.routes).items()}
    assert len(served) == sum(len(m.router.routes) for m in ROUTE_MODULES)  # no path twice
    one = create_app(settings, Broker(settings))
    other = create_app(settings, Broker(settings), auth_token="t", metrics_need_auth=False)
    assert _served(one.routes) == served
    assert _served(other.routes) == served
    # the error handlers are module-level functions too, reading the app's metrics
    for exc, handler in app_module.ERROR_HANDLERS:
        assert one.exception_handlers[exc] is handler
        assert handler.__qualname__ == handler.__name__


def _maximum(doc: dict[str, Any], path: str, name: str) -> int:
    params = doc["paths"][path]["get"]["parameters"]
    (param,) = [p for p in params if p["name"] == name]
    assert common.NODE_MAXIMUM not in param["schema"]
    maximum: int = param["schema"]["maximum"]
    return maximum


PULL = "/v1/topics/{topic}/queues/{queue_id}/messages"
KEY_QUERY = "/v1/topics/{topic}/messages"


def test_each_apps_document_shows_its_own_node_maxima() -> None:
    small = Limits(max_pull_messages=7, max_arrow_pull_messages=9, max_wait_ms=11,
                   max_key_query_results=13)  # fmt: skip
    docs = []
    for limits in (Limits(), small, Limits()):
        settings = BrokerSettings(limits=limits)
        docs.append(create_app(settings, Broker(settings)).openapi())
    default, mine, again = docs
    assert _maximum(default, PULL, "max_messages") == 10_000
    assert _maximum(default, PULL, "wait_ms") == 30_000
    assert _maximum(default, KEY_QUERY, "max") == 1024
    assert _maximum(mine, PULL, "max_messages") == 9
    assert _maximum(mine, PULL, "wait_ms") == 11
    assert _maximum(mine, KEY_QUERY, "max") == 13
    assert again == default


def test_a_node_maximum_names_fields_of_limits() -> None:
    with pytest.raises(AssertionError, match="not fields of Limits"):
        common.NodeMaximum("wait_ms", ("max_wait_seconds",))


@pytest.mark.asyncio
async def test_two_apps_in_one_process_enforce_their_own_limits(node: Node) -> None:
    """The node's app (max_wait_ms 5000, max_pull_messages 100) and a second app over
    the same broker with smaller limits: the same route functions, each app's bounds
    (the broker keeps its own checks, with its own limits: the second app's are tighter)."""
    r = await node.http.post(
        "/v1/topics/two/messages", json={"messages": [{"body": "a", "queue_id": 0}]}
    )
    assert r.status_code == 200, r.text
    tight = replace(
        node.broker.settings.limits,
        max_wait_ms=100,
        max_pull_messages=50,
        max_arrow_pull_messages=5,
        max_key_query_results=3,
    )
    over: list[tuple[str, dict[str, int | str], str]] = [
        (
            "/v1/topics/two/queues/0/messages",
            {"wait_ms": 101},
            "query.wait_ms: Input should be less than or equal to 100",
        ),
        (
            "/v1/topics/two/queues/0/messages",
            {"max_messages": 51},  # the larger of max_pull_messages (50) and 5
            "query.max_messages: Input should be less than or equal to 50",
        ),
        (
            "/v1/topics/two/messages",
            {"key": "k", "max": 4},
            "query.max: Input should be less than or equal to 3",
        ),
    ]
    second = create_app(replace(node.broker.settings, limits=tight), node.broker)
    transport = httpx.ASGITransport(app=second)
    async with httpx.AsyncClient(transport=transport, base_url="http://second") as http:
        for path, params, message in over:
            r = await http.get(path, params=params)
            assert r.status_code == 422, r.text
            assert r.json() == {"error": {"code": "INVALID_ARGUMENT", "message": message}}
            mine = await node.http.get(path, params=params)
            assert mine.status_code == 200, mine.text
        # both over: both named, in the order of the parameters (as FastAPI's le did)
        r = await http.get(
            "/v1/topics/two/queues/0/messages", params={"wait_ms": 101, "max_messages": 51}
        )
        assert r.json()["error"]["message"] == (
            "query.max_messages: Input should be less than or equal to 50; "
            "query.wait_ms: Input should be less than or equal to 100"
        )
        # at the maximum: served
        r = await http.get("/v1/topics/two/queues/0/messages", params={"wait_ms": 100})
        assert r.status_code == 200, r.text
        assert [m["body"] for m in r.json()["messages"]] == ["a"]
        # each app counts its own error answers (the handlers read app.state.metrics)
        text = (await http.get("/metrics")).text
        assert 'ledgermq_http_errors_total{code="INVALID_ARGUMENT"} 4.0' in text
    assert 'code="INVALID_ARGUMENT"' not in (await node.http.get("/metrics")).text
