"""The I/O: ``SyncDriver`` and ``AsyncDriver`` run the sans-I/O operations with one
``httpx.Client`` or ``httpx.AsyncClient``, performing each ``Request`` and ``Sleep`` and
answering with a ``Reply`` or an ``Unreachable``; ``blocking`` and ``awaiting`` bind a
shared operation as a method of a sync or an async class. No protocol logic here."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

import httpx
import orjson

from .exchange import (
    ARROW_STREAM,
    Action,
    Exchange,
    Gen,
    Outcome,
    Reply,
    Request,
    Sleep,
    Unreachable,
)
from .settings import ClientSettings

T = TypeVar("T")
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


class Front:
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


class SyncDriver(Front, Generic[Ops]):
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


class AsyncDriver(Front, Generic[Ops]):
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


def blocking(
    op: Callable[Concatenate[Ops, P], Gen[T]],
) -> Callable[Concatenate[SyncDriver[Ops], P], T]:
    """A shared operation as a method of a sync class."""

    def method(self: SyncDriver[Ops], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(self._ops, *args, **kwargs))

    method.__name__ = op.__name__
    method.__doc__ = op.__doc__
    return method


def awaiting(
    op: Callable[Concatenate[Ops, P], Gen[T]],
) -> Callable[Concatenate[AsyncDriver[Ops], P], Coroutine[Any, Any, T]]:
    """A shared operation as a coroutine method of an async class."""

    async def method(self: AsyncDriver[Ops], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(self._ops, *args, **kwargs))

    method.__name__ = op.__name__
    method.__doc__ = op.__doc__
    return method
