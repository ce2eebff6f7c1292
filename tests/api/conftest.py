"""Fixtures of the API tests: ``node``, one broker and its app in this process
(``create_app``), reached through httpx's ASGI transport, the fast path where a cluster
adds nothing; ``serving``, a node served by uvicorn on 127.0.0.1 from a background
thread, for blocking clients over real sockets. Clusters of node processes
(``cluster3``, ``fresh_cluster3``) are the ``process`` tier's, in
``tests/process/conftest.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
import uvicorn
from fastapi import FastAPI

from api.app import create_app
from broker.broker import Broker
from broker.settings import BrokerSettings, Limits
from consumequeue import ConsumeQueueSettings
from dledger.store import StoreSettings
from ledgermq.processes import free_ports
from tests.waiting import until

# The options of test clusters of node processes (tests/process, tests/spark): small
# segments, so the test data rolls files; production sizes otherwise.
CLUSTER_ARGS = ("--data-file-mb", "8", "--log-level", "INFO")
# The in-process node's limits are small so that the limit tests send little.
TEST_LIMITS = Limits(
    max_body_bytes=64 * 1024,
    max_properties_bytes=4096,
    max_messages_per_request=100,
    max_request_bytes=256 * 1024,
    max_pull_messages=100,
    max_wait_ms=5_000,
)


@dataclass
class Node:
    broker: Broker
    app: FastAPI
    http: httpx.AsyncClient

    def log_state(self) -> tuple[int, int]:
        """(ledger end index, end pos): what "the log unchanged" compares."""
        store = self.broker.store
        return store.ledger_end_index, store.ledger_end_pos


def node_settings(data_dir: Path, **overrides: Any) -> BrokerSettings:
    raft, http = free_ports(2)
    base = BrokerSettings(
        node_id="n0",
        peers=f"n0-127.0.0.1:{raft}",
        data_dir=data_dir,
        advertised_url=f"http://127.0.0.1:{http}",
        peer_urls={"n0": f"http://127.0.0.1:{http}"},
        limits=TEST_LIMITS,
        store=StoreSettings(data_file_size=1 << 20, index_file_size=64 * 1024),
        consume_queue=ConsumeQueueSettings(segment_units=64),
        dispatch_checkpoint_interval_ms=200,
    )
    return replace(base, **overrides)


@asynccontextmanager
async def running_node(settings: BrokerSettings) -> AsyncIterator[Node]:
    """A started broker with ``settings``, its app and a client of it; stopped after."""
    broker = Broker(settings)
    await broker.start()
    try:
        await until(lambda: broker.is_master, what="the single node becomes MASTER")
        app = create_app(settings, broker)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            yield Node(broker, app, http)
    finally:
        await broker.stop()


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(node_settings(tmp_path / "n0")) as n:
        yield n


@dataclass
class Served:
    """A node served over HTTP from a background thread."""

    url: str
    broker: Broker
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60) -> Any:
        """Run ``coro`` on the node's loop and wait for its result (bounded)."""
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout_s)


@contextmanager
def serving(settings: BrokerSettings, **app_options: Any) -> Iterator[Served]:
    """A started broker with ``settings`` and its app (``create_app(settings, broker,
    **app_options)``) served by uvicorn on a free port of 127.0.0.1, in a thread with
    its own event loop; stopped after."""
    (port,) = free_ports(1)
    ready: Future[Served] = Future()
    server: list[uvicorn.Server] = []

    async def main() -> None:
        broker = Broker(settings)
        await broker.start()
        try:
            await until(lambda: broker.is_master, what="the single node becomes MASTER")
            app = create_app(settings, broker, **app_options)
            config = uvicorn.Config(
                app, host="127.0.0.1", port=port, loop="none", lifespan="off", log_config=None
            )
            server.append(uvicorn.Server(config))
            serve = asyncio.ensure_future(server[0].serve())
            await until(lambda: server[0].started or serve.done(), what="uvicorn started")
            ready.set_result(Served(f"http://127.0.0.1:{port}", broker, asyncio.get_running_loop()))
            await serve
        finally:
            await broker.stop()

    def thread() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)

    t = threading.Thread(target=thread, name="served-node", daemon=True)
    t.start()
    node = ready.result(timeout=60)
    try:
        yield node
    finally:
        server[0].should_exit = True
        t.join(timeout=30)
        assert not t.is_alive(), "the served node did not stop"
