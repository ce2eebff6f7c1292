"""Node-wide limits of the HTTP API (issue 17, HTTP): response byte budgets (pull, group
pull, key query, the Arrow page), parked long polls, topics and queues. Each is a
setting with a default (``broker.settings.Limits``); these tests run a node with small
ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from api.app import create_app
from api.client import AsyncAdmin, LimitReachedError
from broker.broker import Broker
from broker.settings import Limits
from dledger.store import StoreSettings
from tests.api.conftest import TEST_LIMITS, Node, node_settings
from tests.waiting import until

pytestmark = pytest.mark.asyncio

MiB = 1 << 20
BIG = Limits(
    max_body_bytes=2 * MiB,
    max_request_bytes=4 * MiB,
    max_messages_per_request=100,
    max_pull_messages=100,
    max_wait_ms=5_000,
    max_response_bytes=3 * MiB + MiB // 2,  # three 1 MiB messages and their headers
    max_arrow_page_bytes=2 * MiB + MiB // 2,
    max_long_polls=3,
    max_long_polls_per_client=2,
    max_topics=3,
    max_total_queues=10,
)


@pytest_asyncio.fixture
async def big(tmp_path: Path) -> AsyncIterator[Node]:
    """A node whose limits these tests reach: 1 MiB bodies, small budgets and counts."""
    settings = node_settings(
        tmp_path / "n0",
        limits=BIG,
        default_queues=2,
        store=StoreSettings(data_file_size=32 * MiB, index_file_size=256 * 1024),
    )
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


async def produce_big(node: Node, topic: str, n: int, queue_id: int = 0) -> list[str]:
    """``n`` messages of 1 MiB (one request each), key ``big``; their bodies."""
    bodies = []
    for i in range(n):
        body = f"{i:04d}" + "x" * (MiB - 4)
        msg = {"body": body, "key": "big", "queue_id": queue_id}
        r = await node.http.post(f"/v1/topics/{topic}/messages", json={"messages": [msg]})
        assert r.status_code == 200, r.text
        bodies.append(body)
    return bodies


# ---- response byte budgets ------------------------------------------------------------------


async def test_a_pull_of_big_messages_answers_fewer_and_continues(big: Node) -> None:
    bodies = await produce_big(big, "b", 8)
    got: list[str] = []
    offset = 0
    for _ in range(8):  # bounded: at least one message a pull
        r = await big.http.get(
            "/v1/topics/b/queues/0/messages", params={"offset": offset, "max_messages": 100}
        )
        page = r.json()
        assert page["status"] == "FOUND", page
        assert 1 <= len(page["messages"]) <= 3  # the budget holds three
        got += [m["body"] for m in page["messages"]]
        assert page["next_offset"] == offset + len(page["messages"])
        offset = page["next_offset"]
        if offset == 8:
            break
    assert got == bodies  # each once, in order
    assert len(got) == 8


async def test_a_message_bigger_than_the_budget_comes_alone(big: Node) -> None:
    await produce_big(big, "alone", 3)
    small = replace(BIG, max_response_bytes=MiB // 2)
    r = await big.broker.pull("alone", 0, 0, max_messages=100, max_bytes=small.max_response_bytes)
    assert [m.queue_offset for m in r.messages] == [0] and r.next_offset == 1


async def test_group_pull_and_key_query_keep_the_budget(big: Node) -> None:
    bodies = await produce_big(big, "g", 3, queue_id=0) + await produce_big(big, "g", 3, queue_id=1)
    seen: list[str] = []
    for _ in range(6):
        r = await big.http.post(
            "/v1/groups/billing/pull", json={"topic": "g", "max_messages": 100, "auto_commit": True}
        )
        messages = r.json()["messages"]
        if not messages:
            break
        assert len(messages) <= 4  # the budget, and at most one message past what was left
        seen += [m["body"] for m in messages]
    assert sorted(seen) == sorted(bodies)
    r = await big.http.get("/v1/topics/g/messages", params={"key": "big", "max": 64})
    assert 1 <= len(r.json()["messages"]) <= 3


async def test_an_arrow_page_keeps_its_budget(big: Node) -> None:
    await produce_big(big, "arrow", 5)
    page = (await big.broker.pull_page("arrow", 0, 0, max_messages=100)).page
    assert page.count == 2  # 2.5 MiB of pages: two 1 MiB records
    r = await big.broker.pull_page("arrow", 0, 2, max_messages=100)
    assert r.page.count == 2 and r.next_offset == 4
