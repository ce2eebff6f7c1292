"""The I/O: ``SyncDriver`` and ``AsyncDriver`` run the sans-I/O operations with one
``httpx.Client`` or ``httpx.AsyncClient``, performing each ``Request`` and ``Sleep`` and
answering with a ``Reply`` or an ``Unreachable``; ``blocking`` and ``awaiting`` bind a
shared operation as a method of a sync or an async class; ``ThreadWorkers`` and
``TaskWorkers`` perform a POP run's ``Spawn`` and ``Collect``. No protocol logic here."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

import httpx
import orjson

from .exchange import (
    BINARY,
    Action,
    Exchange,
    Gen,
    Outcome,
    Reply,
    Request,
    Sleep,
    Unreachable,
)
from .popping import Collect, Ended, Spawn
from .settings import ClientSettings
from .types import PopMessage

T = TypeVar("T")
Act = TypeVar("Act")  # what an operation asks
Ans = TypeVar("Ans")  # what it is answered
Ops = TypeVar("Ops")
P = ParamSpec("P")


def _request_args(req: Request, settings: ClientSettings) -> dict[str, Any]:
    headers = {}
    if req.content is not None:
        headers["content-type"] = req.content_type or "application/json"
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
    if resp.is_success and headers.get("content-type") in BINARY:
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


class _Steps(Generic[Act, Ans, T]):
    """One running operation: ``next(outcome)`` is its next action, ``None`` once it
    has returned (into ``result``). The drivers only perform the actions."""

    def __init__(self, gen: Generator[Act, Ans | None, T]) -> None:
        self._gen = gen
        self.result: T

    def next(self, outcome: Ans | None) -> Act | None:
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
        return self._drive(gen, self._perform)

    def _drive(self, gen: Generator[Act, Ans | None, T], perform: Callable[[Act], Ans | None]) -> T:
        """Run ``gen``, each of its actions done by ``perform``."""
        steps = _Steps(gen)
        outcome: Ans | None = None
        with self._lock:
            while (action := steps.next(outcome)) is not None:
                outcome = perform(action)
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
        return await self._drive(gen, self._perform)

    async def _drive(
        self, gen: Generator[Act, Ans | None, T], perform: Callable[[Act], Awaitable[Ans | None]]
    ) -> T:
        steps = _Steps(gen)
        outcome: Ans | None = None
        async with self._lock:
            while (action := steps.next(outcome)) is not None:
                outcome = await perform(action)
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


# ---- the workers of a POP consumer's run (ledgermq.client.popping) --------------------------


class ThreadWorkers:
    """``Spawn`` and ``Collect`` for a sync ``run``: each handler in a thread of a pool of
    ``threads`` (the run never spawns more at once), ends reported through a queue;
    ``wake`` ends a ``Collect`` early (``stop()``, from any thread)."""

    def __init__(self, handler: Callable[[PopMessage], object], threads: int) -> None:
        self._handler = handler
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ledgermq-pop")
        self._ended: queue.SimpleQueue[Ended | None] = queue.SimpleQueue()

    def perform(self, action: Spawn | Collect) -> list[Ended] | None:
        if isinstance(action, Collect):
            return self._collect(action.timeout_s)
        token = action.token

        def ended(f: Future[object]) -> None:
            self._ended.put(Ended(token, f.exception()))

        self._pool.submit(self._handler, action.message).add_done_callback(ended)
        return None

    def _collect(self, timeout_s: float) -> list[Ended]:
        try:
            first = self._ended.get(timeout=timeout_s) if timeout_s > 0 else self._ended.get(False)
        except queue.Empty:
            return []
        got = [first]
        for _ in range(self._ended.qsize()):  # what else ended by now, without waiting
            got.append(self._ended.get_nowait())
        return [e for e in got if e is not None]

    def wake(self) -> None:
        self._ended.put(None)

    def close(self) -> None:
        """Let handlers still running end on their own (a thread cannot be stopped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class TaskWorkers:
    """``Spawn`` and ``Collect`` for an async ``run``: each handler a task; ``wake`` ends
    a ``Collect`` early (``stop()``, from any thread). Made on the run's loop."""

    def __init__(self, handler: Callable[[PopMessage], Awaitable[object]]) -> None:
        self._handler = handler
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[object]] = set()
        self._ended: asyncio.Queue[Ended | None] = asyncio.Queue()

    async def perform(self, action: Spawn | Collect) -> list[Ended] | None:
        if isinstance(action, Collect):
            return await self._collect(action.timeout_s)
        token = action.token

        def ended(t: asyncio.Task[object]) -> None:
            self._tasks.discard(t)
            self._ended.put_nowait(Ended(token, None if t.cancelled() else t.exception()))

        async def handle(m: PopMessage) -> object:
            return await self._handler(m)

        task = asyncio.create_task(handle(action.message))
        self._tasks.add(task)
        task.add_done_callback(ended)
        return None

    async def _collect(self, timeout_s: float) -> list[Ended]:
        await asyncio.sleep(0)  # handlers just spawned start; the loop is never starved
        try:
            first = (
                await asyncio.wait_for(self._ended.get(), timeout_s)
                if timeout_s > 0
                else self._ended.get_nowait()
            )
        except (TimeoutError, asyncio.QueueEmpty):
            return []
        got = [first]
        for _ in range(self._ended.qsize()):
            got.append(self._ended.get_nowait())
        return [e for e in got if e is not None]

    def wake(self) -> None:
        self._loop.call_soon_threadsafe(self._ended.put_nowait, None)

    async def close(self, timeout_s: float) -> None:
        """Cancel the handlers still running (their messages come back after their
        invisible time); wait up to ``timeout_s`` for them to end."""
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout_s)
