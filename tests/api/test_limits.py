"""Node-wide limits of the HTTP API (issue 17, HTTP): response byte budgets (pull, group
pull, key query, the Arrow page), parked long polls, topics and queues. Each is a
setting with a default (``broker.settings.Limits``); these tests run a node with small
ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from broker.settings import Limits
from dledger.store import StoreSettings
from ledgermq.client import AsyncAdmin, LimitReachedError
from tests.api.conftest import Node, node_settings, running_node
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
    async with running_node(settings) as node:
        yield node


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
    r = await big.broker.reads.pull(
        big.broker.reads.pulled_message,
        "alone",
        0,
        0,
        max_messages=100,
        max_bytes=small.max_response_bytes,
    )
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
    page = (await big.broker.reads.pull_page("arrow", 0, 0, max_messages=100)).page
    assert page.count == 2  # 2.5 MiB of pages: two 1 MiB records
    r = await big.broker.reads.pull_page("arrow", 0, 2, max_messages=100)
    assert r.page.count == 2 and r.next_offset == 4


# ---- long polls -----------------------------------------------------------------------------


def client_at(node: Node, host: str) -> httpx.AsyncClient:
    """Another client of the same app, from address ``host``."""
    transport = httpx.ASGITransport(app=node.app, client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://node")


async def test_long_polls_are_bounded_per_client_and_in_all(big: Node) -> None:
    r = await big.http.post("/v1/topics", json={"name": "lp", "queues": 1})
    assert r.status_code == 201
    polls = big.app.state.long_polls
    wait = {"offset": 0, "wait_ms": 5000}
    url = "/v1/topics/lp/queues/0/messages"
    async with client_at(big, "10.0.0.1") as a, client_at(big, "10.0.0.2") as b:
        parked = [asyncio.ensure_future(a.get(url, params=wait)) for _ in range(2)]
        await until(lambda: polls.total == 2, what="two long polls of a parked")
        r = await a.get(url, params=wait)  # a's third: over its own limit
        assert r.status_code == 429 and r.json()["error"]["code"] == "BUSY", r.text
        assert r.headers["retry-after"] == "1"
        assert (await a.get(url, params={"offset": 0})).status_code == 200  # no wait: free
        parked.append(
            asyncio.ensure_future(
                b.post("/v1/groups/gr/pull", json={"topic": "lp", "wait_ms": 5000})
            )
        )
        await until(lambda: polls.total == 3, what="b's group pull parked")
        r = await b.get(url, params=wait)  # b has room, the node has none
        assert r.status_code == 429 and "this node" in r.json()["error"]["message"], r.text
        r = await big.http.post("/v1/topics/lp/messages", json={"messages": [{"body": "wake"}]})
        assert r.status_code == 200
        answers = await asyncio.gather(*parked)
    assert [x.status_code for x in answers] == [200, 200, 200]
    assert polls.total == 0 and polls.by_client == {}


# ---- topics and queues ----------------------------------------------------------------------


async def test_topics_and_queues_are_bounded_before_anything_is_written(big: Node) -> None:
    """``max_topics`` 3, ``max_total_queues`` 10 (default queues 2): a create or an
    auto-create past either answers 429 LIMIT_REACHED and writes nothing."""
    for name, queues in (("t1", 4), ("t2", 4)):
        r = await big.http.post("/v1/topics", json={"name": name, "queues": queues})
        assert r.status_code == 201, r.text
    before = big.log_state()
    r = await big.http.post("/v1/topics", json={"name": "t3", "queues": 3})  # 11 queues
    assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"]["code"] == "LIMIT_REACHED" and r.json()["error"]["limit"] == 10
    assert big.log_state() == before
    r = await big.http.post("/v1/topics/t3/messages", json={"messages": [{"body": "x"}]})
    assert r.status_code == 200, r.text  # auto-created with 2 queues: 10 in all
    r = await big.http.post("/v1/topics/t4/messages", json={"messages": [{"body": "x"}]})
    assert r.status_code == 429 and r.json()["error"]["code"] == "LIMIT_REACHED", r.text
    before = big.log_state()
    r = await big.http.post("/v1/topics", json={"name": "t4", "queues": 1})  # the 4th topic
    assert r.status_code == 429 and "topics" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["limit"] == 3
    assert big.log_state() == before
    r = await big.http.post("/v1/topics", json={"name": "t1", "queues": 4})  # exists: fine
    assert r.status_code == 200
    async with AsyncAdmin("http://node", transport=httpx.ASGITransport(app=big.app)) as admin:
        with pytest.raises(LimitReachedError):
            await admin.create_topic("t5", queues=1)
        await admin.delete_topic("t1")
        assert (await admin.create_topic("t5", queues=1)).name == "t5"  # room again
