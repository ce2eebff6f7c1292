"""POP groups over HTTP on one in-process node (docs/consuming.md): a group shares a
topic's messages between its consumers, redelivers what was not acknowledged with the
next attempt, dead-letters what used up its attempts, and refuses stale handles."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from broker.pop.applier import dlq_topic
from tests.api.conftest import Node
from tests.waiting import until

pytestmark = pytest.mark.asyncio


async def _produce(node: Node, topic: str, bodies: list[str], **extra: Any) -> None:
    r = await node.http.post(
        f"/v1/topics/{topic}/messages",
        json={"messages": [{"body": b, **extra} for b in bodies]},
    )
    assert r.status_code == 200, r.text


async def _receive(node: Node, group: str, topic: str, **kw: Any) -> list[dict[str, Any]]:
    r = await node.http.post(f"/v1/groups/{group}/receive", json={"topic": topic, **kw})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = orjson.loads(r.content)["messages"]
    return messages


async def _ack(node: Node, group: str, topic: str, handles: list[str]) -> list[str]:
    r = await node.http.post(
        f"/v1/groups/{group}/ack", json={"topic": topic, "receipt_handles": handles}
    )
    assert r.status_code == 200, r.text
    return [x["status"] for x in orjson.loads(r.content)["results"]]


async def test_two_consumers_of_a_group_share_the_messages_and_acks_end_them(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "jobs", "queues": 4})
    r = await node.http.put("/v1/groups/workers", json={"start": "earliest"})
    assert r.status_code == 200, r.text
    assert orjson.loads(r.content)["max_delivery_attempts"] == 17
    await _produce(node, "jobs", [f"j{i}" for i in range(40)])
    a, b = await asyncio.gather(
        _receive(node, "workers", "jobs", max_messages=25),
        _receive(node, "workers", "jobs", max_messages=25),
    )
    bodies = [m["body"] for m in a + b]
    assert sorted(bodies) == sorted(f"j{i}" for i in range(40)), "each message to one of them"
    assert {m["delivery_attempt"] for m in a + b} == {1}
    assert await _receive(node, "workers", "jobs") == []  # all in flight
    statuses = await _ack(node, "workers", "jobs", [m["receipt_handle"] for m in a + b])
    assert statuses == ["OK"] * 40
    assert await _ack(node, "workers", "jobs", [a[0]["receipt_handle"]]) == [
        "INVALID_RECEIPT_HANDLE"
    ]
    r = await node.http.get("/v1/groups/workers")
    assert orjson.loads(r.content)["topics"] == [
        {"topic": "jobs", "in_flight": 0, "dead_lettered": 0}
    ]


async def test_an_unacked_message_comes_back_with_the_next_attempt_then_goes_to_the_dlq(
    node: Node,
) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    r = await node.http.put(
        "/v1/groups/g",
        json={
            "start": "earliest",
            "max_delivery_attempts": 2,
            "retry": {"policy": "list", "delays_ms": [0]},
        },
    )
    assert r.status_code == 200, r.text
    await _produce(node, "t", ["once"])
    [first] = await _receive(node, "g", "t", invisible_ms=200)
    assert first["delivery_attempt"] == 1
    [second] = await _receive(node, "g", "t", invisible_ms=200, wait_ms=3000)
    assert (second["delivery_attempt"], second["body"]) == (2, "once")
    assert second["receipt_handle"] != first["receipt_handle"]
    assert await _ack(node, "g", "t", [first["receipt_handle"]]) == ["INVALID_RECEIPT_HANDLE"]
    # The attempts are spent: the next receive dead-letters it instead of handing it out.
    assert await _receive(node, "g", "t", wait_ms=1000) == []
    dlq = dlq_topic("g")
    await until(lambda: node.broker.meta.pop.dead.get("g", {}).get("t") == 1, what="dead")
    r = await node.http.get(f"/v1/topics/{dlq}/queues/0/messages", params={"offset": 0})
    [dead] = orjson.loads(r.content)["messages"]
    assert dead["body"] == "once"
    assert dead["properties"]["DLQ_ORIGIN_TOPIC"] == "t"
    assert dead["properties"]["DLQ_ORIGIN_MSG_ID"] == first["msg_id"]
    assert dead["properties"]["DELIVERY_ATTEMPTS"] == "2"


async def test_a_nack_and_a_changed_invisible_time(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    await _produce(node, "t", ["a", "b"])
    got = await _receive(node, "g", "t", invisible_ms=60_000)
    assert [m["body"] for m in got] == ["a", "b"]
    r = await node.http.post(
        "/v1/groups/g/nack",
        json={"topic": "t", "receipt_handles": [got[0]["receipt_handle"]], "delay_ms": 0},
    )
    assert orjson.loads(r.content)["results"][0]["status"] == "OK"
    [again] = await _receive(node, "g", "t")
    assert (again["body"], again["delivery_attempt"]) == ("a", 2)
    r = await node.http.post(
        "/v1/groups/g/invisible",
        json={"topic": "t", "receipt_handle": got[1]["receipt_handle"], "invisible_ms": 5},
    )
    assert r.status_code == 200, r.text
    changed = orjson.loads(r.content)
    assert changed["receipt_handle"] != got[1]["receipt_handle"]
    r = await node.http.post(
        "/v1/groups/g/invisible",
        json={"topic": "t", "receipt_handle": got[1]["receipt_handle"], "invisible_ms": 5},
    )
    assert (r.status_code, r.json()["error"]["code"]) == (409, "INVALID_RECEIPT_HANDLE")
    assert await _ack(node, "g", "t", [changed["receipt_handle"], again["receipt_handle"]]) == [
        "OK",
        "OK",
    ]


async def test_bad_input_changes_nothing(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await node.http.put("/v1/groups/g", json={"start": "earliest"})
    before = node.log_state()
    for body in (
        {"topic": "t", "receipt_handles": ["nope", "v1:0:0:99999", "v1:x:1:2"]},
        {"topic": "t", "receipt_handles": ["v1:0:0:1"] * 3},
    ):
        statuses = await _ack(node, "g", "t", body["receipt_handles"])
        assert set(statuses) == {"INVALID_RECEIPT_HANDLE"}
    for path, body in (
        ("receive", {"topic": "t", "invisible_ms": -1}),
        ("receive", {"topic": "t", "max_messages": 0}),
        ("ack", {"topic": "t", "receipt_handles": []}),
        ("nack", {"topic": "t", "receipt_handles": ["v1:0:0:1"], "delay_ms": -5}),
    ):
        r = await node.http.post(f"/v1/groups/g/{path}", json=body)
        assert r.status_code == 422, (path, r.text)
    r = await node.http.put("/v1/groups/g", json={"mode": "offsets"})
    assert r.status_code == 422
    r = await node.http.put("/v1/groups/g", json={"retry": {"policy": "list", "delays_ms": []}})
    assert r.status_code == 422
    assert node.log_state() == before
    # An offsets group stays one: it cannot become a POP group.
    await _produce(node, "t", ["x"])
    r = await node.http.put("/v1/groups/old/offsets", json={"topic": "t", "offsets": {"0": 1}})
    assert r.status_code == 200, r.text
    r = await node.http.put("/v1/groups/old", json={})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "GROUP_MODE_CONFLICT")
