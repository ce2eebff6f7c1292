"""Every dependency of every route runs on the event loop: FastAPI runs a plain ``def``
dependency in its thread pool, one thread hop per dependency per request. Five of them
(broker, settings, metrics, long poll, access) halved the produce rate of one message
per request (http_bench: 291 against 545 requests/s) until they became ``async def``."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.routing import APIRoute

from api.app import create_app
from broker.broker import Broker
from broker.settings import BrokerSettings


def _api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every APIRoute, whether a FastAPI version flattens included routers or keeps
    them (``original_router`` in newer ones)."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        if inner is not None and hasattr(inner, "routes"):
            yield from _api_routes(inner.routes)


def _calls(dependant: Any) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def _is_async(call: Any) -> bool:
    if inspect.iscoroutinefunction(call):
        return True
    # a dependency class instance (fastapi.security's HTTPBearer): its __call__ counts
    method = vars(type(call)).get("__call__")
    return not inspect.isfunction(call) and inspect.iscoroutinefunction(method)


def test_no_route_dependency_runs_in_the_thread_pool() -> None:
    app = create_app(BrokerSettings(), Broker(BrokerSettings()), auth_token="t")
    routes = list(_api_routes(app.routes))
    assert len(routes) > 15
    seen = {call for r in routes for call in _calls(r.dependant)}
    assert len(seen) >= 6  # broker, settings, metrics, long poll, access, the token check
    sync = sorted(getattr(c, "__qualname__", repr(c)) for c in seen if not _is_async(c))
    assert sync == [], f"dependencies FastAPI would run in its thread pool: {sync}"
