"""The HTTP contract (docs/http.md) on one in-process node: every endpoint, its error
cases, and "bad input changes nothing" (the log's end is compared before and after)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from api.app import create_app
from api.auth import TokenTable
from consumequeue import ConsumeQueueError
from ledgermq.client import AsyncProducer, ForbiddenError, UnauthenticatedError
from tests.api.conftest import TEST_LIMITS, Node
from tests.waiting import until

pytestmark = pytest.mark.asyncio


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"].isupper() and body["error"]["message"], body
    return body["error"]  # type: ignore[no-any-return]


async def produce(node: Node, topic: str, *messages: dict[str, Any], **extra: Any) -> Any:
    r = await node.http.post(
        f"/v1/topics/{topic}/messages", json={"messages": list(messages), **extra}
    )
    assert r.status_code == 200, r.text
    return r.json()["results"]


# ---- probes --------------------------------------------------------------------------------


async def test_healthz_readyz_and_metrics(node: Node) -> None:
    assert (await node.http.get("/healthz")).json() == {"status": "ok"}
    r = await node.http.get("/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True
    await produce(node, "m", {"body": "x" * 10}, {"body": "y" * 5})
    await node.http.get("/v1/topics/m/queues/0/messages")
    text = (await node.http.get("/metrics")).text
    for series in (
        "ledgermq_produce_latency_seconds_count 1.0",
        "ledgermq_raft_commit_latency_seconds_count",
        'ledgermq_produced_messages_total{topic="m"} 2.0',
        'ledgermq_produced_bytes_total{topic="m"} 15.0',
        'ledgermq_raft_role{role="LEADER"} 1.0',
        "ledgermq_committed_index",
        "ledgermq_dispatch_lag_entries 0.0",
        'ledgermq_queue_max_offset{queue_id="0",topic="m"}',
        "ledgermq_dispatch_stalled 0.0",
        "ledgermq_node_failed 0.0",
        'ledgermq_raft_refused_total{reason="stranger_frames"} 0.0',
    ):
        assert series in text, series


async def test_a_deleted_topics_series_go_with_it(node: Node) -> None:
    """Issue 32: /metrics kept every deleted topic's counters for ever (11.7 KB → 1.06 MB
    after 1,980 create/produce/delete cycles); a render drops them."""
    metrics = node.app.state.metrics
    sizes = []
    for i in range(30):  # bounded: create, produce, pull, delete, render
        await produce(node, f"gone-{i}", {"body": "x"})
        r = await node.http.get(f"/v1/topics/gone-{i}/queues/0/messages")
        assert r.status_code == 200
        text = metrics.render_now(None).decode()
        assert f'ledgermq_pulled_messages_total{{topic="gone-{i}"}}' in text
        assert (await node.http.delete(f"/v1/topics/gone-{i}")).status_code in (200, 204)
        assert metrics.forget_deleted_topics() == 1
        text = metrics.render_now(None).decode()
        assert f'topic="gone-{i}"' not in text
        sizes.append(len(text))
    assert max(sizes) - min(sizes) < 200, sizes  # histograms' counts grow, not per name


async def test_a_failed_node_fails_its_probes_and_refuses_writes(node: Node) -> None:
    """Crash-only (issue 17): once the node stopped working (a dead task, a failed
    fsync) it says so on /healthz and /readyz and takes no write while it exits."""
    await produce(node, "f", {"body": "before"})
    node.broker.server.fail("a test's own failure", RuntimeError("boom"))
    r = await node.http.get("/healthz")
    assert r.status_code == 503 and r.json()["status"] == "failed"
    r = await node.http.get("/readyz")
    assert r.status_code == 503 and "failed" in r.json()["reason"]
    r = await node.http.post("/v1/topics/f/messages", json={"messages": [{"body": "after"}]})
    assert r.status_code == 503 and error_of(r)["code"] in ("NODE_FAILED", "NO_MASTER")
    assert "ledgermq_node_failed 1.0" in (await node.http.get("/metrics")).text


async def test_a_dispatcher_that_dies_fails_the_node(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the dispatcher task died silently (a consume-queue invariant) and the node
    went on acknowledging produces that never became readable, /healthz ok."""

    def broken(_max: int) -> int:
        raise ConsumeQueueError("a unit that disagrees with the log")

    monkeypatch.setattr(node.broker.dispatcher, "dispatch_some", broken)
    await until(lambda: node.broker.failed is not None, what="the node fails")
    assert isinstance(node.broker.failed, ConsumeQueueError)
    assert (await node.http.get("/healthz")).status_code == 503


async def test_unknown_route_and_method_have_error_bodies(node: Node) -> None:
    r = await node.http.get("/v1/nope")
    assert r.status_code == 404 and error_of(r)["code"] == "NOT_FOUND"
    r = await node.http.patch("/v1/topics")
    assert r.status_code == 405 and error_of(r)["code"] == "METHOD_NOT_ALLOWED"


# ---- cluster -------------------------------------------------------------------------------


async def test_cluster_describes_this_node(node: Node) -> None:
    c = (await node.http.get("/v1/cluster")).json()
    assert c["node_id"] == "n0" and c["group"] == "g0"
    assert (c["raft_role"], c["broker_role"], c["leader_id"]) == ("LEADER", "MASTER", "n0")
    assert c["leader_url"] == node.broker.settings.advertised_url
    assert c["nodes"][0]["node_id"] == "n0" and c["nodes"][0]["http_url"] == c["leader_url"]
    assert c["committed_index"] == c["dispatched_index"] >= 0


async def test_cluster_shows_the_disk(node: Node) -> None:
    d = (await node.http.get("/v1/cluster")).json()["disk"]
    assert d["total_bytes"] > 0 and 0 <= d["free_bytes"] <= d["total_bytes"]
    assert 0 <= d["used_ratio"] <= 1 and d["full_ratio"] == 0.90
    assert d["reserve_bytes"] == node.broker.settings.disk_reserve and d["full"] is False
    before = d["log_bytes"]
    r = await node.http.post("/v1/topics/disk/messages", json={"messages": [{"body": "x" * 5000}]})
    assert r.status_code == 200, r.text
    after = (await node.http.get("/v1/cluster")).json()["disk"]["log_bytes"]
    assert after >= before + 5000


async def test_cluster_history_tells_the_elections_and_the_promotion(node: Node) -> None:
    h = (await node.http.get("/v1/cluster/history")).json()
    assert h["node_id"] == "n0" and h["size"] == 200 and h["recorded"] == len(h["events"])
    events = h["events"]
    # A single node (it starts as a candidate): it leads, then is MASTER once caught up.
    assert [(e["event"], e["raft_role"]) for e in events] == [
        ("role", "LEADER"),
        ("master", "LEADER"),
    ]
    assert all(e["term"] == events[-1]["term"] >= 0 for e in events)
    assert events[-1]["leader_id"] == "n0"
    times = [e["at_ms"] for e in events]
    assert times == sorted(times) and abs(times[-1] - time.time() * 1000) < 60_000
    # A transfer to itself is no transfer: nothing recorded.
    r = await node.http.post("/v1/cluster/leadership", json={"to": "n0"})
    assert r.status_code == 200
    assert (await node.http.get("/v1/cluster/history")).json()["recorded"] == len(events)


async def test_leadership_to_self_and_to_a_stranger(node: Node) -> None:
    r = await node.http.post("/v1/cluster/leadership", json={"to": "n0"})
    assert r.status_code == 200 and r.json()["leader_id"] == "n0"
    r = await node.http.post("/v1/cluster/leadership", json={"to": "n9"})
    assert r.status_code == 409 and error_of(r)["code"] == "UNKNOWN_NODE"
    r = await node.http.post("/v1/cluster/leadership", json={})
    assert r.status_code == 422 and error_of(r)["code"] == "INVALID_ARGUMENT"


# ---- topics --------------------------------------------------------------------------------


async def test_topic_lifecycle(node: Node) -> None:
    r = await node.http.post("/v1/topics", json={"name": "orders", "queues": 4})
    assert r.status_code == 201 and r.json() == {"name": "orders", "queues": 4}
    r = await node.http.post("/v1/topics", json={"name": "orders", "queues": 4})
    assert r.status_code == 200
    r = await node.http.post("/v1/topics", json={"name": "orders", "queues": 5})
    assert r.status_code == 409 and error_of(r)["code"] == "TOPIC_CONFLICT"
    topics = (await node.http.get("/v1/topics")).json()["topics"]
    assert {"name": "orders", "queues": 4} in topics
    d = (await node.http.get("/v1/topics/orders")).json()
    assert d == {
        "name": "orders",
        "queues": [{"queue_id": q, "min_offset": 0, "max_offset": 0} for q in range(4)],
    }
    assert (await node.http.delete("/v1/topics/orders")).status_code == 204
    r = await node.http.get("/v1/topics/orders")
    assert r.status_code == 404 and error_of(r)["code"] == "TOPIC_NOT_FOUND"
    r = await node.http.delete("/v1/topics/orders")
    assert r.status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"name": "bad name"},
        {"name": ""},
        {"name": "x" * 128},
        {"name": "%SYS%mine"},
        {"name": "ok", "queues": 0},
        {"name": "ok", "queues": "many"},
        {"name": "ok", "extra": 1},
    ],
)
async def test_bad_topic_requests_are_422_and_write_nothing(node: Node, body: Any) -> None:
    before = node.log_state()
    r = await node.http.post("/v1/topics", json=body)
    assert r.status_code == 422, r.text
    assert error_of(r)["code"] == "INVALID_ARGUMENT"
    assert node.log_state() == before


# ---- produce -------------------------------------------------------------------------------


async def test_produce_and_pull_round_trip_with_all_fields(node: Node) -> None:
    results = await produce(
        node,
        "rt",
        {
            "body": "héllo",
            "key": "k1",
            "keys": ["k2"],
            "tags": "TagA",
            "properties": {"a": "b"},
            "queue_id": 2,
        },
    )
    assert results[0]["queue_id"] == 2 and results[0]["queue_offset"] == 0
    r = (await node.http.get("/v1/topics/rt/queues/2/messages", params={"offset": 0})).json()
    assert r["status"] == "FOUND" and r["next_offset"] == 1 and r["max_offset"] == 1
    (m,) = r["messages"]
    assert m["body"] == "héllo" and m["encoding"] == "utf-8"
    assert (m["key"], m["keys"], m["tags"]) == ("k1", ["k1", "k2"], "TagA")
    assert m["properties"] == {"a": "b"} and m["msg_id"] == results[0]["msg_id"]
    assert m["store_timestamp"] >= m["born_timestamp"] > 0
    one = (await node.http.get(f"/v1/messages/{m['msg_id']}")).json()
    assert one == m
    by_key = (await node.http.get("/v1/topics/rt/messages", params={"key": "k2"})).json()
    assert [x["msg_id"] for x in by_key["messages"]] == [m["msg_id"]]


async def test_binary_bodies_base64_both_ways(node: Node) -> None:
    raw = bytes(range(256))
    await produce(node, "bin", {"body": base64.b64encode(raw).decode(), "encoding": "base64"})
    for enc in ("utf-8", "base64"):
        r = await node.http.get(
            "/v1/topics/bin/queues/0/messages", params={"encoding": enc, "offset": 0}
        )
        (m,) = r.json()["messages"]
        assert m["encoding"] == "base64"  # not valid UTF-8: falls back, and says so
        assert base64.b64decode(m["body"]) == raw
    r = await node.http.get("/v1/topics/bin/queues/0/messages", params={"encoding": "latin-1"})
    assert r.status_code == 422


async def test_ndjson_bulk_produce(node: Node) -> None:
    lines = b"".join(orjson.dumps({"body": f"m{i}", "queue_id": 0}) + b"\n" for i in range(50))
    r = await node.http.post(
        "/v1/topics/bulk/messages",
        content=lines,
        headers={"content-type": "application/x-ndjson"},
        params={"producer_id": "bulk-1", "sequence": 0},
    )
    assert r.status_code == 200, r.text
    assert [x["queue_offset"] for x in r.json()["results"]] == list(range(50))
    before = node.log_state()
    again = await node.http.post(  # the same session and sequence: answered, not appended
        "/v1/topics/bulk/messages",
        content=lines,
        headers={"content-type": "application/x-ndjson"},
        params={"producer_id": "bulk-1", "sequence": 0},
    )
    assert again.json() == r.json() and node.log_state() == before
    bad = await node.http.post(
        "/v1/topics/bulk/messages",
        content=b'{"body": "ok"}\n{"body": 5}\n',
        headers={"content-type": "application/x-ndjson"},
    )
    assert bad.status_code == 422 and "line 2" in error_of(bad)["message"]
    assert node.log_state() == before


async def test_a_retried_session_batch_returns_the_same_results(node: Node) -> None:
    batch = {
        "messages": [{"body": f"b{i}"} for i in range(10)],
        "producer_id": "p-1",
        "sequence": 7,
    }
    first = await node.http.post("/v1/topics/s/messages", json=batch)
    assert first.status_code == 200
    before = node.log_state()
    second = await node.http.post("/v1/topics/s/messages", json=batch)
    assert second.json() == first.json()
    assert node.log_state() == before
    older = await node.http.post("/v1/topics/s/messages", json={**batch, "sequence": 6})
    assert older.status_code == 409 and error_of(older)["code"] == "SEQUENCE_TOO_OLD"
    half = await node.http.post(
        "/v1/topics/s/messages", json={"messages": [{"body": "x"}], "producer_id": "p-2"}
    )
    assert half.status_code == 422  # producer_id without sequence
    assert node.log_state() == before


@pytest.mark.parametrize(
    ("request_body", "status"),
    [
        ({"messages": [{"body": "x" * (TEST_LIMITS.max_body_bytes + 1)}]}, 413),
        ({"messages": [{"body": "x"}] * (TEST_LIMITS.max_messages_per_request + 1)}, 413),
        ({"messages": [{"body": "x", "properties": {"p": "v" * 5000}}]}, 413),
        ({"messages": []}, 422),
        ({"messages": [{"body": "x", "queue_id": 99}]}, 422),
        ({"messages": [{"body": "x", "queue_id": -1}]}, 422),
        ({"messages": [{"body": "%%%", "encoding": "base64"}]}, 422),
        ({"messages": [{"body": "x", "encoding": "utf-16"}]}, 422),
        ({"messages": [{"body": "x", "colour": "red"}]}, 422),
        ({"messages": [{"body": "x", "properties": {"TAGS": "sneaky"}}]}, 422),
        ({"messages": "nope"}, 422),
        ({"messages": [{"body": "x"}], "sequence": -1, "producer_id": "p"}, 422),
    ],
)
async def test_bad_produce_requests_change_nothing(
    node: Node, request_body: Any, status: int
) -> None:
    await produce(node, "lim", {"body": "first", "queue_id": 0})
    before = node.log_state()
    r = await node.http.post("/v1/topics/lim/messages", json=request_body)
    assert r.status_code == status, r.text
    error_of(r)
    assert node.log_state() == before


async def test_oversized_and_malformed_raw_bodies(node: Node) -> None:
    before = node.log_state()
    big = b'{"messages": [{"body": "' + b"x" * (TEST_LIMITS.max_request_bytes + 10) + b'"}]}'
    r = await node.http.post("/v1/topics/raw/messages", content=big)
    assert r.status_code == 413 and error_of(r)["code"] == "PAYLOAD_TOO_LARGE"
    for junk in (b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"messages": [null]}'):
        r = await node.http.post("/v1/topics/raw/messages", content=junk)
        assert r.status_code == 422, (junk, r.text)
        assert error_of(r)["code"] == "INVALID_ARGUMENT"
    r = await node.http.post("/v1/topics/bad%20name/messages", json={"messages": [{"body": "x"}]})
    assert r.status_code == 422
    assert node.log_state() == before


async def test_auto_create_off_answers_404(node: Node) -> None:
    object.__setattr__(node.broker.settings, "auto_create_topics", False)
    r = await node.http.post("/v1/topics/ghost/messages", json={"messages": [{"body": "x"}]})
    assert r.status_code == 404 and error_of(r)["code"] == "TOPIC_NOT_FOUND"


# ---- pull ----------------------------------------------------------------------------------


async def test_pull_statuses_and_tag_filter(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "p", "queues": 1})
    url = "/v1/topics/p/queues/0/messages"
    r = (await node.http.get(url)).json()
    assert r["status"] == "NO_NEW_MSG" and r["messages"] == [] and r["next_offset"] == 0
    await produce(node, "p", {"body": "a", "tags": "A"}, {"body": "b", "tags": "B"})
    r = (await node.http.get(url, params={"tags": "B"})).json()
    assert r["status"] == "FOUND" and [m["body"] for m in r["messages"]] == ["b"]
    r = (await node.http.get(url, params={"tags": "C", "offset": 0})).json()
    assert r["status"] == "NO_MATCHED_MSG" and r["next_offset"] == 2
    r = (await node.http.get(url, params={"offset": 5})).json()
    assert r["status"] == "OFFSET_ILLEGAL" and r["max_offset"] == 2
    r = (await node.http.get(url, params={"max_messages": 1})).json()
    assert len(r["messages"]) == 1 and r["next_offset"] == 1
    for params in ({"max_messages": 0}, {"max_messages": 10_000}, {"wait_ms": -1}, {"offset": -1}):
        bad = await node.http.get(url, params=params)
        assert bad.status_code == 422, params
    assert (await node.http.get("/v1/topics/p/queues/7/messages")).status_code == 422
    assert (await node.http.get("/v1/topics/none/queues/0/messages")).status_code == 404


async def test_long_poll_wakes_on_commit(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "lp", "queues": 1})
    pull = asyncio.create_task(
        node.http.get("/v1/topics/lp/queues/0/messages", params={"wait_ms": 5000})
    )
    await until(lambda: node.broker.dispatcher.arrivals.waiting_on("lp", 0), what="pull waits")
    assert not pull.done()
    await produce(node, "lp", {"body": "wake"})
    produced = time.monotonic()
    r = await asyncio.wait_for(pull, 5)
    woke_after = time.monotonic() - produced
    assert r.json()["status"] == "FOUND" and r.json()["messages"][0]["body"] == "wake"
    assert woke_after < 0.1, f"long poll woke {woke_after * 1000:.0f} ms after the commit"
    started = time.monotonic()
    r = await node.http.get("/v1/topics/lp/queues/0/messages", params={"offset": 1, "wait_ms": 200})
    assert r.json()["status"] == "NO_NEW_MSG" and time.monotonic() - started >= 0.19


async def test_offset_for_time(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "t", "queues": 1})
    await produce(node, "t", {"body": "a"})
    mid = (await node.http.get("/v1/topics/t/queues/0/messages")).json()["messages"][0]
    url = "/v1/topics/t/queues/0/offset"
    assert (await node.http.get(url, params={"timestamp": 0})).json() == {"offset": 0}
    after = mid["store_timestamp"] + 1
    assert (await node.http.get(url, params={"timestamp": after})).json() == {"offset": 1}
    assert (await node.http.get(url)).status_code == 422
    assert (await node.http.get("/v1/topics/t/queues/3/offset?timestamp=0")).status_code == 422


async def test_query_errors(node: Node) -> None:
    r = await node.http.get("/v1/messages/zz")
    assert r.status_code == 422 and error_of(r)["code"] == "INVALID_ARGUMENT"
    r = await node.http.get("/v1/messages/6730000000000000FFFF")
    assert r.status_code == 404 and error_of(r)["code"] == "MESSAGE_NOT_FOUND"
    assert (await node.http.get("/v1/topics/none/messages", params={"key": "k"})).status_code == (
        404
    )
    await produce(node, "q", {"body": "x"})
    assert (await node.http.get("/v1/topics/q/messages")).status_code == 422  # key missing


# ---- consumer groups -----------------------------------------------------------------------


async def test_group_offsets_commit_reset_and_pull(node: Node) -> None:
    await node.http.post("/v1/topics", json={"name": "g", "queues": 2})
    await produce(node, "g", *({"body": f"m{i}", "queue_id": i % 2} for i in range(6)))
    r = await node.http.get("/v1/groups/billing/offsets")
    assert r.status_code == 404 and error_of(r)["code"] == "GROUP_NOT_FOUND"
    r = await node.http.put(
        "/v1/groups/billing/offsets", json={"topic": "g", "offsets": {"0": 1, "1": 2}}
    )
    assert r.status_code == 200 and r.json() == {"offsets": {"0": 1, "1": 2}}
    assert (await node.http.get("/v1/groups")).json() == {"groups": ["billing"]}
    offs = (await node.http.get("/v1/groups/billing/offsets", params={"topic": "g"})).json()
    assert offs["offsets"] == [
        {"topic": "g", "queue_id": 0, "committed_offset": 1, "max_offset": 3, "lag": 2},
        {"topic": "g", "queue_id": 1, "committed_offset": 2, "max_offset": 3, "lag": 1},
    ]
    pulled = (
        await node.http.post(
            "/v1/groups/billing/pull", json={"topic": "g", "max_messages": 10, "auto_commit": True}
        )
    ).json()
    assert sorted(m["body"] for m in pulled["messages"]) == ["m2", "m4", "m5"]
    assert pulled["next_offsets"] == {"0": 3, "1": 3}
    again = (await node.http.post("/v1/groups/billing/pull", json={"topic": "g"})).json()
    assert again["messages"] == []
    r = await node.http.post(
        "/v1/groups/billing/offsets/reset", json={"topic": "g", "to": "earliest"}
    )
    assert r.json() == {"offsets": {"0": 0, "1": 0}}
    r = await node.http.post(
        "/v1/groups/billing/offsets/reset", json={"topic": "g", "to": "latest"}
    )
    assert r.json() == {"offsets": {"0": 3, "1": 3}}
    r = await node.http.post(
        "/v1/groups/billing/offsets/reset",
        json={"topic": "g", "to": int(time.time() * 1000) + 10**6},
    )
    assert r.json() == {"offsets": {"0": 3, "1": 3}}


async def test_a_stale_commit_never_moves_a_group_back(node: Node) -> None:
    """Issue 32: commits were last-writer-wins, so a second consumer committing from a
    stale pull moved the group back, while docs/guarantees.md says offsets never move
    backwards. A commit behind leaves the offset (the answer says where it stands); a
    reset still moves it anywhere."""
    await node.http.post("/v1/topics", json={"name": "st", "queues": 2})
    await produce(node, "st", *[{"body": f"m{i}", "queue_id": i % 2} for i in range(8)])

    async def commit(offsets: dict[str, int]) -> Any:
        r = await node.http.put("/v1/groups/sg/offsets", json={"topic": "st", "offsets": offsets})
        assert r.status_code == 200, r.text
        return r.json()["offsets"]

    assert await commit({"0": 3, "1": 2}) == {"0": 3, "1": 2}
    assert await commit({"0": 1, "1": 4}) == {"0": 3, "1": 4}  # queue 0: stale, kept at 3
    assert node.broker.meta.offsets["sg"]["st"] == {0: 3, 1: 4}
    r = await node.http.post("/v1/groups/sg/offsets/reset", json={"topic": "st", "to": "earliest"})
    assert r.json() == {"offsets": {"0": 0, "1": 0}}
    assert await commit({"0": 2}) == {"0": 2}


@pytest.mark.parametrize(
    "body",
    [
        {"topic": "g2", "offsets": {}},
        {"topic": "g2", "offsets": {"zero": 1}},
        {"topic": "g2", "offsets": {"0": -1}},
        {"topic": "g2", "offsets": {"5": 1}},
        {"topic": "g2"},
        {"offsets": {"0": 1}},
    ],
)
async def test_bad_offset_commits_change_nothing(node: Node, body: Any) -> None:
    await node.http.post("/v1/topics", json={"name": "g2", "queues": 2})
    before = node.log_state()
    r = await node.http.put("/v1/groups/grp/offsets", json=body)
    assert r.status_code == 422, r.text
    assert node.log_state() == before
    r = await node.http.post("/v1/groups/grp/offsets/reset", json={"topic": "g2", "to": "middle"})
    assert r.status_code == 422
    r = await node.http.put(
        "/v1/groups/bad group/offsets", json={"topic": "g2", "offsets": {"0": 1}}
    )
    assert r.status_code in (404, 422)
    assert node.log_state() == before


# ---- the OpenAPI document ------------------------------------------------------------------


async def test_openapi_document_is_complete(node: Node) -> None:
    doc = (await node.http.get("/openapi.json")).json()
    paths = doc["paths"]
    expected = {
        ("get", "/v1/cluster"),
        ("post", "/v1/cluster/leadership"),
        ("get", "/v1/cluster/history"),
        ("get", "/v1/cluster/members"),
        ("post", "/v1/cluster/members"),
        ("post", "/v1/cluster/members/{node_id}/promote"),
        ("delete", "/v1/cluster/members/{node_id}"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("post", "/v1/topics"),
        ("get", "/v1/topics"),
        ("get", "/v1/topics/{topic}"),
        ("delete", "/v1/topics/{topic}"),
        ("post", "/v1/topics/{topic}/messages"),
        ("get", "/v1/topics/{topic}/messages"),
        ("get", "/v1/topics/{topic}/queues/{queue_id}/messages"),
        ("get", "/v1/topics/{topic}/queues/{queue_id}/offset"),
        ("get", "/v1/groups"),
        ("get", "/v1/groups/{group}/offsets"),
        ("put", "/v1/groups/{group}/offsets"),
        ("post", "/v1/groups/{group}/offsets/reset"),
        ("post", "/v1/groups/{group}/pull"),
        ("put", "/v1/groups/{group}"),
        ("get", "/v1/groups/{group}"),
        ("post", "/v1/groups/{group}/receive"),
        ("post", "/v1/groups/{group}/ack"),
        ("post", "/v1/groups/{group}/nack"),
        ("post", "/v1/groups/{group}/invisible"),
        ("post", "/v1/groups/{group}/dlq"),
        ("post", "/v1/groups/{group}/dlq/redrive"),
        ("delete", "/v1/delayed/{recall_handle}"),
        ("post", "/v1/transactions/{transaction_id}"),
        ("get", "/v1/transactions/checks"),
        ("get", "/v1/transactions"),
        ("get", "/v1/messages/{msg_id}"),
    }
    assert {(m, p) for p, ops in paths.items() for m in ops} == expected
    produce_op = paths["/v1/topics/{topic}/messages"]["post"]
    content = produce_op["requestBody"]["content"]
    assert set(content) == {
        "application/json",
        "application/x-ndjson",
        "application/vnd.ledgermq.batch",
    }
    schemas = doc["components"]["schemas"]
    assert "ProduceRequest" in schemas and "ProduceMessage" in schemas
    assert schemas["ProduceRequest"]["examples"]
    assert "307" in produce_op["responses"] and "413" in produce_op["responses"]


# ---- auth (docs/operations.md) -------------------------------------------------------------------


async def test_bearer_token_guards_v1_but_not_the_probes(node: Node) -> None:
    app = create_app(node.broker.settings, node.broker, auth_token="s3cret")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
        before = node.log_state()
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic x"}):
            r = await http.post("/v1/topics", json={"name": "sec", "queues": 1}, headers=headers)
            assert r.status_code == 401 and error_of(r)["code"] == "UNAUTHENTICATED"
            assert r.headers["www-authenticate"] == "Bearer"
        assert node.log_state() == before
        ok = await http.post(
            "/v1/topics",
            json={"name": "sec", "queues": 1},
            headers={"authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 201
        for open_path in ("/healthz", "/readyz"):
            assert (await http.get(open_path)).status_code == 200, open_path
        # /metrics names every topic: with tokens it needs one by default (issue 17).
        assert (await http.get("/metrics")).status_code == 401
        r = await http.get("/metrics", headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200
        doc = (await http.get("/openapi.json")).json()
        assert "HTTPBearer" in doc["components"]["securitySchemes"]
    opened = create_app(
        node.broker.settings, node.broker, auth_token="s3cret", metrics_need_auth=False
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=opened), base_url="http://node"
    ) as http:
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/v1/topics")).status_code == 401


async def test_token_scopes_allow_what_they_name_and_answer_403_otherwise(
    node: Node, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(
        "# token       scopes\n"
        "boss-token    admin\n"
        "writer-token  produce:orders   # one topic\n"
        "reader-token  consume:orders\n"
        "all-readers   consume\n"
        "g-owner       consume:orders group:g\n"
    )
    app = create_app(
        node.broker.settings, node.broker, auth_tokens=TokenTable.from_file(tokens_file)
    )

    def bearer(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node"
    ) as http:
        boss, writer, reader, readers = (
            bearer(t) for t in ("boss-token", "writer-token", "reader-token", "all-readers")
        )
        for name in ("orders", "clicks"):
            r = await http.post("/v1/topics", json={"name": name, "queues": 1}, headers=boss)
            assert r.status_code == 201, r.text
        before = node.log_state()
        forbidden = [
            (writer, "post", "/v1/topics", {"name": "x", "queues": 1}),
            (reader, "delete", "/v1/topics/orders", None),
            (writer, "post", "/v1/topics/clicks/messages", {"messages": [{"body": "b"}]}),
            (reader, "post", "/v1/topics/orders/messages", {"messages": [{"body": "b"}]}),
            (writer, "get", "/v1/topics/orders/queues/0/messages", None),
            (reader, "get", "/v1/topics/clicks/queues/0/messages", None),
            (reader, "put", "/v1/groups/g/offsets", {"topic": "clicks", "offsets": {"0": 0}}),
            (reader, "post", "/v1/groups/g/pull", {"topic": "clicks"}),
            (reader, "get", "/v1/groups", None),
            (readers, "post", "/v1/cluster/leadership", {"to": node.broker.settings.node_id}),
            # a reset may rewind or skip a group: admin, or the group's own scope
            (readers, "post", "/v1/groups/g/offsets/reset", {"topic": "orders", "to": "latest"}),
            (bearer("g-owner"), "post", "/v1/groups/h/offsets/reset", {"topic": "orders", "to": 0}),
        ]
        for headers, method, path, body in forbidden:
            r = await http.request(method, path, json=body, headers=headers)
            assert r.status_code == 403, (method, path, r.text)
            assert error_of(r)["code"] == "FORBIDDEN"
        assert node.log_state() == before
        r = await http.post(
            "/v1/topics/orders/messages", json={"messages": [{"body": "hi"}]}, headers=writer
        )
        assert r.status_code == 200, r.text
        msg_id = r.json()["results"][0]["msg_id"]
        for headers in (reader, readers, boss):
            r = await http.get("/v1/topics/orders/queues/0/messages", headers=headers)
            assert [m["body"] for m in r.json()["messages"]] == ["hi"]
            assert (await http.get(f"/v1/messages/{msg_id}", headers=headers)).status_code == 200
        assert (await http.get(f"/v1/messages/{msg_id}", headers=writer)).status_code == 403
        r = await http.put(
            "/v1/groups/g/offsets", json={"topic": "orders", "offsets": {"0": 1}}, headers=reader
        )
        assert r.status_code == 200, r.text
        assert (await http.get("/v1/groups", headers=readers)).json()["groups"] == ["g"]
        for headers in (bearer("g-owner"), boss):
            r = await http.post(
                "/v1/groups/g/offsets/reset",
                json={"topic": "orders", "to": "earliest"},
                headers=headers,
            )
            assert r.status_code == 200 and r.json() == {"offsets": {"0": 0}}, r.text
        for headers in (writer, reader):  # any valid token reads the cluster and topics
            assert (await http.get("/v1/cluster", headers=headers)).status_code == 200
            assert (await http.get("/v1/topics", headers=headers)).status_code == 200
        r = await http.get("/v1/topics", headers=bearer("nobody"))
        assert r.status_code == 401
    # The client raises typed errors for both.
    url = "http://node"
    transport = httpx.ASGITransport(app=app)
    async with AsyncProducer(url, transport=transport, auth_token="reader-token") as p:
        with pytest.raises(ForbiddenError):
            await p.send("orders", [b"x"])
    async with AsyncProducer(url, transport=transport, auth_token="nobody") as p:
        with pytest.raises(UnauthenticatedError):
            await p.send("orders", [b"x"])


async def test_a_client_gone_before_its_body_arrived_is_no_internal_error(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 16 (chaos): a client that gave up on a paused node disconnected before the
    node read its produce body; the node logged an INTERNAL error with two tracebacks
    (its own and uvicorn's) for each one. Now: an INFO line, nothing appended."""
    sent: list[dict[str, Any]] = []
    before = node.log_state()

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/topics/gone/messages",
        "raw_path": b"/v1/topics/gone/messages",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"40")],
        "client": ("127.0.0.1", 1),
        "server": ("node", 80),
    }
    with caplog.at_level("INFO"):
        await node.app(scope, receive, send)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert "went away" in caplog.text
    assert sent[0]["status"] == 499
    assert node.log_state() == before
