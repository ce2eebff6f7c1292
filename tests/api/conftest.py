"""Fixtures of the API tests: ``node``, one broker and its app in this process
(``create_app``), reached through httpx's ASGI transport, the fast path where a cluster
adds nothing. Clusters of node processes (``cluster3``, ``fresh_cluster3``) are the
``process`` tier's, in ``tests/process/conftest.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
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
